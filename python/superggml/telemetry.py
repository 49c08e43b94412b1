"""Memory telemetry: host (cgroup-aware), ggml devices, and NVIDIA GPUs through NVML when present."""

from __future__ import annotations

from dataclasses import dataclass, field

from . import _core


@dataclass(frozen=True)
class DeviceMemory:
    name: str
    type: str          # "cpu", "gpu", "igpu", "accel"
    free: int
    total: int
    source: str = "ggml"

    @property
    def pressure(self) -> float:
        return 1.0 - self.free / self.total if self.total else 0.0


@dataclass(frozen=True)
class MemorySnapshot:
    host_total: int          # MemTotal, clipped by the cgroup limit
    host_available: int      # MemAvailable, clipped by what the cgroup has left
    cgroup_limit: int        # 0: none found
    process_rss: int
    process_peak: int
    devices: list[DeviceMemory] = field(default_factory=list)

    @property
    def host_pressure(self) -> float:
        return 1.0 - self.host_available / self.host_total if self.host_total else 0.0


def nvml_devices() -> list[DeviceMemory]:
    """NVIDIA GPUs through pynvml; empty without pynvml or a driver."""
    try:
        import pynvml  # type: ignore[import-not-found]
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
            out.append(DeviceMemory(name=name.decode() if isinstance(name, bytes) else str(name), type="gpu",
                                    free=int(mem.free), total=int(mem.total), source="nvml"))
        return out
    finally:
        pynvml.nvmlShutdown()


def snapshot(*, nvml: bool = True) -> MemorySnapshot:
    h = _core.host_memory()
    devs = [DeviceMemory(name=d["name"], type=d["type"], free=int(d["memory_free"]), total=int(d["memory_total"]))
            for d in _core.devices()]
    if nvml:
        devs += nvml_devices()
    return MemorySnapshot(host_total=int(h["total"]), host_available=int(h["available"]),
                          cgroup_limit=int(h["cgroup_limit"]), process_rss=int(h["process_rss"]),
                          process_peak=int(h["process_peak"]), devices=devs)
