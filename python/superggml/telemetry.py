"""Memory telemetry: host (cgroup-aware), ggml devices, and NVIDIA GPUs through NVML when present."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from . import native

MemoryFn = Callable[[], "tuple[int, int]"]  # () -> (used bytes, total bytes)


@dataclass(frozen=True)
class DeviceMemory:
    name: str
    type: str  # "cpu", "gpu", "igpu", "accel"
    free: int
    total: int
    source: str = "ggml"

    @property
    def pressure(self) -> float:
        return 1.0 - self.free / self.total if self.total else 0.0


@dataclass(frozen=True)
class MemorySnapshot:
    host_total: int  # MemTotal, clipped by the cgroup limit
    host_available: int  # MemAvailable, clipped by what the cgroup has left
    cgroup_limit: int  # 0: none found
    process_rss: int
    process_peak: int
    devices: list[DeviceMemory] = field(default_factory=list)

    @property
    def host_pressure(self) -> float:
        return 1.0 - self.host_available / self.host_total if self.host_total else 0.0


def nvml_devices() -> list[DeviceMemory]:
    """NVIDIA GPUs through pynvml; empty without pynvml or a driver."""
    try:
        import pynvml
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no driver, no GPU: nothing to report
        return []
    try:
        out = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            name = pynvml.nvmlDeviceGetName(h)
            out.append(
                DeviceMemory(
                    name=name.decode() if isinstance(name, bytes) else str(name),
                    type="gpu",
                    free=int(mem.free),
                    total=int(mem.total),
                    source="nvml",
                )
            )
        return out
    finally:
        pynvml.nvmlShutdown()


def snapshot(*, nvml: bool = True) -> MemorySnapshot:
    h = native.host_memory()
    devs = [
        DeviceMemory(name=d["name"], type=d["type"], free=int(d["memory_free"]), total=int(d["memory_total"]))
        for d in native.devices()
    ]
    if nvml:
        devs += nvml_devices()
    return MemorySnapshot(
        host_total=int(h["total"]),
        host_available=int(h["available"]),
        cgroup_limit=int(h["cgroup_limit"]),
        process_rss=int(h["process_rss"]),
        process_peak=int(h["process_peak"]),
        devices=devs,
    )


def host_memory() -> tuple[int, int]:
    """(used, total) bytes of host memory as this process sees it (cgroup-aware)."""
    h = native.host_memory()
    return int(h["total"]) - int(h["available"]), int(h["total"])


def device_memory_fn(device_type: str, device_name: str) -> MemoryFn:
    """The memory reading that governs a backend: the host for CPU devices, else the device's own."""
    if device_type == "cpu":
        return host_memory

    def read() -> tuple[int, int]:
        for d in native.devices():
            if d["name"] == device_name:
                total = int(d["memory_total"])
                return total - int(d["memory_free"]), total
        return 0, 0

    return read
