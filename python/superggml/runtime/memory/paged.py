"""Paged K/V: pages of kv_page_size tokens in a native.KVCache per device, a layer's frame bound to the lanes
while the layer runs, host and spill tiers behind it."""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, Sequence

from ... import native
from ...settings import Settings
from ..weights.pagers import merge_stats
from .base import MAX_LANES, KVLanes, KVLayers, Lane, LanedKV


class KVPages:
    """One device's native.KVCache: a layer's K/V page frame is bound while the layer runs, the next `depth`
    layers of the sequence are filled ahead. Sliding-window layers (`swa_layers`, a window of `n_swa` tokens)
    free the pages no later query of theirs sees, as a pass begins."""

    def __init__(self, kv: Any, n_layer: int, depth: int, *, n_swa: int = 0, swa_layers: Sequence[int] = ()):
        self.core = kv
        self.n_frames = int(kv.stats()["kv_frames"])
        self.n_layer = n_layer
        self.depth = depth
        self.n_swa = n_swa
        self.swa_layers = list(swa_layers) if n_swa > 0 else []
        self.floor: dict[int, int] = {}  # seq -> first token the sliding-window layers still hold

    def begin(self, seq: int, p0: int) -> None:
        """A pass of `seq` starts at position p0: its first query sees keys from p0 - n_swa + 1 on."""
        first = p0 - self.n_swa + 1
        if not self.swa_layers or first <= 0:
            return
        for il in self.swa_layers:
            self.core.seq_forget(seq, il, first)
        page = self.core.page_size
        self.floor[seq] = max(self.floor.get(seq, 0), first // page * page)

    def can_truncate(self, seq: int, n: int) -> bool:
        """Whether the keys a query at position n needs are still held."""
        return self.floor.get(seq, 0) <= max(0, n - self.n_swa + 1)

    @contextlib.contextmanager
    def use(self, layer: int, lanes: Sequence[tuple[int, int, int, Any, Any]]) -> Iterator[None]:
        """While a step of `layer` runs: per sequence of the pass (seq, n_valid, n_end, k, v), the frame of
        (seq, layer) bound to the lane's tensors k, v (None: the layer's own, the first lane), rows [0, n_valid)
        valid before the step and [0, n_end) after it; the sequence's next `depth` layers filled ahead."""
        held = []
        try:
            for seq, n_valid, n_end, k, v in lanes:
                self.core.acquire(seq, layer, n_valid, k, v)
                held.append((seq, n_end))
            for seq, n_valid, _, _, _ in lanes:
                for j in range(1, min(self.depth, self.n_layer - 1 - layer) + 1):
                    self.core.prefetch(seq, layer + j, n_valid)
            yield
        finally:
            for seq, n_end in held:
                self.core.release(seq, layer, n_end)

    def truncate(self, seq: int, n: int) -> None:
        self.core.seq_truncate(seq, n)
        if n == 0:
            self.floor.pop(seq, None)

    def stats(self) -> dict[str, Any]:
        return dict(self.core.stats())


class PagedKV(LanedKV):
    """Paged K/V: each device's KVPages pages the layers of its blocks (`parts`: (KVPages, its first layer), in
    layer order); lanes are bound to frames as each layer runs."""

    def __init__(self, lanes: KVLanes, parts: Sequence[tuple[KVPages, int]]):
        self.lanes = lanes
        self.parts = [p for p, _ in parts]
        self.first = [f for _, f in parts]
        # each sequence of a pass needs a frame per layer at once: with fewer frames than layers, only one
        self.max_lanes = (
            1
            if any(p.n_frames < p.n_layer for p in self.parts)
            else min(MAX_LANES, min(p.n_frames for p in self.parts))
        )

    def part(self, layer: int) -> tuple[KVPages, int]:
        for p, f in zip(reversed(self.parts), reversed(self.first)):
            if layer >= f:
                return p, layer - f
        raise IndexError(layer)

    def bind(self, seqs: Sequence[int], streams: bool = False) -> None:
        self.lanes.ensure(len(seqs))

    def begin(self, seq: int, p0: int, n: int = 1) -> None:
        for p in self.parts:
            p.begin(seq, p0)

    def can_truncate(self, seq: int, n: int) -> bool:
        return all(p.can_truncate(seq, n) for p in self.parts)

    def use(self, layer: int, lanes: Sequence[Lane]) -> contextlib.AbstractContextManager[None]:
        p, local = self.part(layer)
        k, v = self.lanes.k, self.lanes.v
        return p.use(
            local,
            [
                (seq, n_valid, n_end, k[j][layer] if j else None, v[j][layer] if j and v[j] else None)
                for j, (seq, n_valid, n_end) in enumerate(lanes)
            ],
        )

    def truncate(self, seq: int, n: int) -> None:
        for p in self.parts:
            p.truncate(seq, n)

    def stats(self) -> dict[str, Any]:
        per = [p.stats() for p in self.parts]
        return {**merge_stats(per), "kv_per_device": per} if len(per) > 1 else per[0]


def paged_kv(
    settings: Settings, layers: KVLayers, backends: Sequence[native.Backend], layer_device: Sequence[int], n_split: int
) -> PagedKV:
    """The paged K/V of settings.kv: each device pages the K/V of its own blocks."""
    hp, kvs = layers.hp, settings.kv
    host_budget = kvs.host_budget_bytes
    if host_budget is not None and host_budget > int(native.host_memory()["available"]):
        h = native.host_memory()
        raise ValueError(
            f"host_budget of {host_budget} bytes is more than the "
            f"{h['available']} bytes of host memory available (total {h['total']} bytes)"
        )
    n_frames = hp.n_layer if kvs.kv_device_layers is None else kvs.kv_device_layers
    if n_frames > 64 * hp.n_layer:
        raise ValueError(
            f"kv_device_layers must be in 1..{64 * hp.n_layer} (n_layer per sequence "
            f"kept on the device), not {kvs.kv_device_layers}"
        )
    lanes = KVLanes(settings, hp)
    parts = []
    for d in range(n_split):
        ls = [il for il, dev in enumerate(layer_device) if dev == d]
        if not ls:
            continue
        frames = n_frames if len(ls) == hp.n_layer or kvs.kv_device_layers is not None else len(ls)
        host = host_budget if host_budget is None else host_budget * len(ls) // hp.n_layer
        core = native.KVCache(
            [lanes.k[0][il] for il in ls],
            [lanes.v[0][il] for il in ls if lanes.v_width],
            page_size=kvs.kv_page_size,
            n_frames=frames,
            host_budget=host,
            spill_dir=kvs.kv_spill_dir or "",
            v_trans=not settings.context.flash_attn,
            backend=backends[d],
            n_workers=1,
            n_stream=settings.paging.stream_slots,
        )
        parts.append(
            (
                KVPages(
                    core,
                    len(ls),
                    settings.paging.ahead,
                    n_swa=0 if kvs.swa_full else layers.n_swa,
                    swa_layers=[j for j, il in enumerate(ls) if layers.swa[il]],
                ),
                ls[0],
            )
        )
    return PagedKV(lanes, parts)
