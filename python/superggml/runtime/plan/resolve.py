"""Settings resolved once, before a model's runtime exists.

`resolve` opens the ggml devices the blocks split over (runtime/devices.py: RPC servers added and probed first),
plans the memory of the model's device (memory_plan.device_plan: a draft's share included, or the draft dropped
where it cannot pay for its memory) and settles what that plan decides: device_budget "auto" becomes a size when
the blocks must stream, async_prefetch None becomes on when they stream, direct_io None becomes on when the file
cannot stay in the page cache (direct_reads). The executor, the weights' placement and the sequence memory take
the result and never rewrite it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ...settings import Settings
from .devices import Devices, open_devices, store_bytes
from .memory_plan import MemoryPlan, device_plan, direct_reads
from ... import native
from ...arch import Architecture
from ...arch.mtp import MtpArch


@dataclass(frozen=True)
class Resolved:
    """What a runtime starts from: the settings settled, the devices open, the memory plan (None for a
    multi-device split or a budget per device: each device takes a size of its own, auto keeps their blocks
    resident)."""

    settings: Settings
    devices: Devices
    memory_plan: MemoryPlan | None


def resolve(settings: Settings, arch: Architecture | MtpArch, store: native.WeightStore) -> Resolved:
    """The devices of settings.devices opened for `arch`'s blocks, and the settings settled against the memory
    plan of the first one for the weights of `store` (a native.WeightStore) and the drafter settings ask for."""
    p, hp = settings.paging, arch.hp
    devices = open_devices(settings, store, hp.n_layer)
    weights = store_bytes(store)
    bb = p.budget_bytes
    if bb is not None:  # an explicit budget is refused before anything loads when the device lacks it
        for d, b in enumerate(devices.backends[: devices.n_split]):
            what = "device_budget" + (f" of {b.name}" if devices.n_split > 1 else "")
            devices.check_available(d, bb[d] if isinstance(bb, tuple) else bb, what)
    plan = device_plan(settings, arch, store, devices, weights)
    if plan is not None and plan.draft_dropped:  # a draft model that cannot pay for its memory is not loaded
        settings = dataclasses.replace(
            settings, speculative=dataclasses.replace(settings.speculative, draft_model=None)
        )
    if plan is not None and plan.mode == "auto" and plan.budget is not None:
        left = plan.budget - (p.expert_cache_bytes or 0)
        if left <= 0:
            raise plan.too_small(0, "the weights' pool" + (" and expert_cache" if p.expert_cache else ""))
        p = dataclasses.replace(p, device_budget=left)
    if p.async_prefetch is None:
        p = dataclasses.replace(p, async_prefetch=p.paged(hp.n_layer))
    if p.direct_io is None:
        p = dataclasses.replace(p, direct_io=direct_reads(store.path, plan))
    return Resolved(dataclasses.replace(settings, paging=p), devices, plan)


def reopen(settings: Settings, plan: MemoryPlan | None, store: native.WeightStore, n_layer: int) -> Resolved:
    """Settings and a memory plan that resolve gave, on the devices opened again (after an RPC server failed)
    for a new store."""
    return Resolved(settings, open_devices(settings, store, n_layer), plan)
