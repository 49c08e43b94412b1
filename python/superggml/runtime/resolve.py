"""Settings resolved once, before a model's runtime exists.

`resolve` opens the ggml devices the blocks split over (runtime/devices.py: RPC servers added and probed first),
plans the memory of the model's device (memory_plan.py, a draft's share included) and settles what that plan
decides: device_budget "auto" becomes a size when the blocks must stream, async_prefetch None becomes on when
they stream, direct_io None becomes on when the file cannot stay in the page cache (direct_reads). The executor, the
weights' placement and the sequence memory take the result and never rewrite it.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any

from .. import native
from ..settings import Settings
from ..telemetry import host_memory
from .devices import Devices, open_devices, store_bytes
from .costs import draft_verdict, measure_rates
from .memory_plan import MemoryPlan, draft_bytes, file_shape, plan_memory, with_host_tier


@dataclass(frozen=True)
class Resolved:
    """What a runtime starts from: the settings settled, the devices open, the memory plan (None for a
    multi-device split or a budget per device: each device takes a size of its own, auto keeps their blocks
    resident)."""

    settings: Settings
    devices: Devices
    memory_plan: MemoryPlan | None


def resolve(settings: Settings, arch: Any, store: Any) -> Resolved:
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
    plan = plan_of(settings, arch, store, devices, weights)
    dropped = draft_that_cannot_pay(settings, store, plan)
    if dropped:
        sp = dataclasses.replace(settings.speculative, draft_model=None)
        settings = dataclasses.replace(settings, speculative=sp)
        plan = plan_of(settings, arch, store, devices, weights)
        if plan is not None:
            plan = dataclasses.replace(plan, draft_dropped=dropped)
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


def plan_of(settings: Settings, arch: Any, store: Any, devices: Devices, weights: int) -> MemoryPlan | None:
    """The memory plan of the first device, the drafter's share included (None for a split or a budget per
    device)."""
    p = settings.paging
    if devices.n_split != 1 or isinstance(p.device_budget, tuple):
        return None
    b = devices.backends[0]
    reserve = draft_bytes(settings, arch, store)
    plan = plan_memory(
        arch.hp, weights, settings.context, p.device_budget, devices.free[0], reserve=reserve, n_ff=arch.ffn_width
    )
    if not (b.is_host or b.endpoint):  # a host tier, unless the host is the device or an RPC server is
        used, total = host_memory()
        plan = with_host_tier(plan, p.host_cache, max(0, total - used))
    return plan


def draft_that_cannot_pay(settings: Settings, store: Any, plan: MemoryPlan | None) -> str:
    """Why the draft model cannot pay, or "": where its memory is what pushes the streamed blocks out of the page
    cache (direct_reads chooses O_DIRECT for the plan with it and not for the plan without), the cost model
    (runtime/costs.py) predicts plain decoding against speculative at best. An adaptive draft length only, and
    the read mode left to the plan: draft_k or direct_io keep the draft."""
    sp, p = settings.speculative, settings.paging
    if not sp.draft_model or sp.draft_k is not None or p.direct_io is not None:
        return ""
    if plan is None or plan.budget is None or not plan.reserve or not direct_reads(store.path, plan):
        return ""
    if direct_reads(store.path, dataclasses.replace(plan, reserve=0)):
        return ""
    rates = measure_rates(store.path, settings.context.threads)
    verdict = draft_verdict(rates, plan.weights, plan.weights - plan.budget, file_shape(sp.draft_model)[1])
    return "" if verdict.pays else verdict.line()


def direct_reads(path: str, plan: MemoryPlan | None) -> bool:
    """Whether streamed blocks read with O_DIRECT: when the file cannot stay in the page cache, being larger than
    the memory available; and when a drafter's weights stay beside blocks streamed on the host and the file is
    larger than what the plan leaves the page cache: buffered reads would evict the drafter's mapped weights
    (measured: Qwen2.5-1.5B at a 256 MiB budget beside its 0.5B draft in 1280 MiB, 1.34 tok/s buffered, 10.29
    direct)."""
    size = os.path.getsize(path)
    if size > int(native.host_memory()["available"]):
        return True
    if plan is None or plan.budget is None or not plan.reserve or plan.host_available:
        return False
    return size > plan.available - plan.budget - plan.beside


def reopen(settings: Settings, plan: MemoryPlan | None, store: Any, n_layer: int) -> Resolved:
    """Settings and a memory plan that resolve gave, on the devices opened again (after an RPC server failed)
    for a new store."""
    return Resolved(settings, open_devices(settings, store, n_layer), plan)
