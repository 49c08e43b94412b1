"""Settings resolved once, before a model's runtime exists.

`open_devices` opens the ggml devices the blocks split over (RPC servers added and probed first). `resolve`
plans the memory of the model's device (memory_plan.py) and settles what that plan decides: device_budget
"auto" becomes a size when the blocks must stream, async_prefetch None becomes on when they stream. The
executor, the weights' placement and the sequence memory take the result and never rewrite it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from .. import native
from ..arch.common import HParams
from ..devices import DEFAULT_DEVICE, devices_for
from ..settings import Settings, check_split, layer_split
from ..telemetry import device_memory_fn, host_memory
from .memory_plan import MemoryPlan, plan_memory, too_small, with_host_tier


@dataclass
class Devices:
    """The devices a model runs on: the split's devices first (n_split of them; block il runs on
    layer_device[il]), then this machine's CPU for the embedding if none of them is host memory (embed_dev)."""

    backends: list[Any]  # native.Backend
    n_split: int
    layer_device: list[int]
    embed_dev: int
    endpoints: set[str]  # the RPC servers among them

    @property
    def names(self) -> str:
        return ", ".join(b.name for b in self.backends[: self.n_split])


def open_devices(settings: Settings, store: Any, n_layer: int) -> Devices:
    """The devices of settings.devices (devices.devices_for) for a model of n_layer blocks whose weights are in
    `store` (a native.WeightStore), with their share of the blocks; ValueError when the paging options do not
    suit the split."""
    c = settings.context
    names, shares = devices_for(settings.devices, store, c.threads)
    backends = [native.Backend(d, c.threads) for d in names]
    n_split = len(backends)
    layer_device = [i for i, k in enumerate(layer_split(n_layer, n_split, shares)) for _ in range(k)]
    hosts = [i for i, b in enumerate(backends) if b.is_host]
    if not hosts:  # the embedding rows come from the file mapping: its graph runs on the CPU
        backends.append(native.Backend(DEFAULT_DEVICE, c.threads))
        hosts = [n_split]
    for b in backends:
        b.use_ref = c.batch_invariant
    devices = Devices(backends, n_split, layer_device, hosts[0], {b.endpoint for b in backends if b.endpoint})
    check_split(settings.paging, n_split, devices.names)
    return devices


def resolve(
    settings: Settings, hp: HParams, weights: int, devices: Devices, *, reserve: int = 0
) -> tuple[Settings, MemoryPlan | None]:
    """The settings with device_budget and async_prefetch settled, and the memory plan they come from (None for
    a multi-device split or a budget per device: each device takes a size of its own, auto keeps their blocks
    resident). `weights`: the bytes of the model's tensors; `reserve`: what the device keeps for a draft."""
    plan = device_plan(settings, hp, weights, devices, reserve)
    p = settings.paging
    if plan is not None and plan.mode == "auto" and plan.budget is not None:
        left = plan.budget - (p.expert_cache_bytes or 0)
        if left <= 0:
            raise too_small(plan, 0, "the weights' pool" + (" and expert_cache" if p.expert_cache else ""))
        p = dataclasses.replace(p, device_budget=left)
    if p.async_prefetch is None:
        p = dataclasses.replace(p, async_prefetch=p.paged(hp.n_layer))
    return dataclasses.replace(settings, paging=p), plan


def device_plan(settings: Settings, hp: HParams, weights: int, devices: Devices, reserve: int) -> MemoryPlan | None:
    """device_budget resolved against the memory the device has free, with a host tier when the device is not
    host memory; None for a split."""
    p = settings.paging
    if devices.n_split > 1 or isinstance(p.device_budget, tuple):
        return None
    b = devices.backends[0]
    used, total = device_memory_fn(b.device_type, b.device_name)()
    plan = plan_memory(hp, weights, settings.context, p.device_budget, max(0, total - used), reserve=reserve)
    if b.is_host or b.endpoint:  # the host is the device (an RPC server holds its own copy)
        return plan
    h_used, h_total = host_memory()
    return with_host_tier(plan, p.host_cache, max(0, h_total - h_used))
