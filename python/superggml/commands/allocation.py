"""Devices and the layer-to-device allocation (`superggml plan`, `superggml analyze`).

`allocate()` is a pure function: given devices with their free memory and
the real per-layer sizes, it splits the layers into contiguous ranges, one
per device (a pipeline by layers), in the chosen device order. A device gets
`free - reserve` bytes; a device left with less than `min_budget` is skipped
with the reason. Layers that fit nowhere are left to stream from the host.
The split is also given as llama.cpp's tensor split (each device's share of
the layers).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

ORDERS = ("free_desc", "total_desc", "index")


@dataclass(frozen=True)
class Device:
    index: int
    name: str
    free: int  # bytes
    total: int  # bytes
    type: str = "gpu"  # cpu, gpu, igpu, accel
    source: str = "ggml"


@dataclass(frozen=True)
class Placement:
    device: Device
    budget: int  # bytes the plan may use on it
    first_layer: int
    n_layers: int
    bytes: int  # of the layers placed there

    @property
    def layers(self) -> range:
        return range(self.first_layer, self.first_layer + self.n_layers)


@dataclass(frozen=True)
class Allocation:
    placements: tuple[Placement, ...]
    skipped: tuple[tuple[Device, str], ...]  # devices not used, and why
    streamed: tuple[int, ...]  # layers on no device: they stream from the host
    tensor_split: tuple[float, ...]  # per placement, the share of the layers
    notes: tuple[str, ...] = field(default_factory=tuple)

    def device_of(self, layer: int) -> Device | None:
        for p in self.placements:
            if layer in p.layers:
                return p.device
        return None


def allocate(
    devices: Sequence[Device],
    layer_sizes: Sequence[int],
    *,
    reserve: int = 1 << 30,
    min_budget: int = 1 << 30,
    order: str = "free_desc",
    select: Sequence[int] | None = None,
) -> Allocation:
    """Splits layers 0..n-1 (in order) over the devices. Raises ValueError for an unknown order or a
    selected device index that does not exist."""
    if order not in ORDERS:
        raise ValueError(f"device order must be one of {', '.join(ORDERS)}, not {order!r}")
    if reserve < 0 or min_budget < 0:
        raise ValueError("reserve and min_budget must be >= 0")
    devs = list(devices)
    if select is not None:
        known = {d.index for d in devs}
        missing = [i for i in select if i not in known]
        if missing:
            raise ValueError(f"no device with index {missing[0]} (have {sorted(known) or 'none'})")
        devs = [d for d in devs if d.index in set(select)]
    if order == "free_desc":
        devs.sort(key=lambda d: (-d.free, d.index))
    elif order == "total_desc":
        devs.sort(key=lambda d: (-d.total, d.index))
    else:
        devs.sort(key=lambda d: d.index)
    skipped: list[tuple[Device, str]] = []
    usable: list[tuple[Device, int]] = []
    for d in devs:
        budget = d.free - reserve
        if budget < min_budget:
            why = (
                f"reserve {reserve >> 20} MiB is more than its free {d.free >> 20} MiB"
                if budget < 0
                else f"{budget >> 20} MiB after the reserve is below the minimum of {min_budget >> 20} MiB"
            )
            skipped.append((d, why))
        else:
            usable.append((d, budget))
    placements: list[Placement] = []
    layer = 0
    n = len(layer_sizes)
    for d, budget in usable:
        first, used = layer, 0
        while layer < n and used + layer_sizes[layer] <= budget:
            used += layer_sizes[layer]
            layer += 1
        if layer > first:
            placements.append(Placement(d, budget, first, layer - first, used))
        else:
            skipped.append(
                (d, f"layer {layer} ({layer_sizes[layer] >> 20} MiB) does not fit its {budget >> 20} MiB")
                if layer < n
                else (d, "no layers left")
            )
    streamed = tuple(range(layer, n))
    split = tuple(p.n_layers / n for p in placements) if n else ()
    notes = (f"{len(streamed)} layers fit no device: they stream from the host",) if streamed else ()
    return Allocation(tuple(placements), tuple(skipped), streamed, split, notes)


def visible_devices(*, nvml: bool = True) -> list[Device]:
    """The ggml device registry (plus NVIDIA GPUs through NVML when pynvml finds any the build lacks)."""
    from .. import native
    from ..telemetry import nvml_devices

    out = [
        Device(
            index=i,
            name=d["name"] + (f"[{d['description']}]" if d["name"].startswith("RPC") else ""),
            free=int(d["memory_free"]),
            total=int(d["memory_total"]),
            type=d["type"],
        )
        for i, d in enumerate(native.devices())
    ]
    if nvml:
        have = {d.name for d in out}
        for g in nvml_devices():
            if g.name not in have:
                out.append(Device(index=len(out), name=g.name, free=g.free, total=g.total, type="gpu", source="nvml"))
    return out


def format_allocation(a: Allocation, layer_sizes: Sequence[int]) -> str:
    rows = [f"{'device':<28} {'free MiB':>9} {'budget MiB':>10} {'layers':>10} {'MiB':>8}"]
    for p in a.placements:
        rows.append(
            f"{p.device.name[:28]:<28} {p.device.free >> 20:>9} {p.budget >> 20:>10} "
            f"{f'{p.first_layer}-{p.first_layer + p.n_layers - 1}':>10} {p.bytes >> 20:>8}"
        )
    for d, why in a.skipped:
        rows.append(f"{d.name[:28]:<28} {d.free >> 20:>9} {'-':>10} {'-':>10} {'-':>8}  skipped: {why}")
    if a.streamed:
        b = sum(layer_sizes[i] for i in a.streamed)
        rows.append(f"{'(host, streamed)':<28} {'':>9} {'':>10} {f'{a.streamed[0]}-{a.streamed[-1]}':>10} {b >> 20:>8}")
    rows.append("tensor split: " + (",".join(f"{s:.3f}" for s in a.tensor_split) or "(none)"))
    return "\n".join(rows)
