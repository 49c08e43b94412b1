"""The layer loop: the one place that talks to both the graphs and the paging primitives.

A forward pass of n tokens runs as: an embedding graph, one graph per
transformer block, an output graph. Activations persist between graphs in
a device buffer; each block's K/V rows are written into that layer's cache.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from . import _core
from .arch import Architecture
from .arch.common import StepInputs
from .scheduler import LayerScheduler, MemoryFn, SchedulerParams, device_memory_fn

F32 = _core.GGMLType.F32
F16 = _core.GGMLType.F16
I32 = _core.GGMLType.I32
I64 = _core.GGMLType.I64

KV_PAD = 256          # n_kv is padded to this so graph shapes change rarely
GRAPH_NODES = 1024    # room for one block graph
PLAN_CACHE = 4        # micro-batch shapes whose graphs are kept
SLOT_ALIGN_ROOM = 256 # bytes kept free in a slot for alignment padding
DIRECT_ROOM = 3 * 4096  # and with direct_io, for widening a chunk to O_DIRECT alignment


def stream_slots(async_prefetch: bool, prefetch_depth: int) -> int:
    """Slots (or KV frames) a streaming layer cycles through: the one computing, plus the prefetched ones."""
    return (prefetch_depth + 1) if async_prefetch else 1


def plan_slots(budget: int, slot: int, n_keys: int, n_stream: int) -> tuple[int, int]:
    """(pool slots, pinned keys) for a budget: as many slots as fit (at most one per key); if not every key
    has one, the last n_stream slots stream and the first keys keep the others. 0 slots: the budget is
    smaller than one layer."""
    n_slots = min(budget // slot, n_keys)
    if n_slots >= n_keys:
        return n_slots, n_keys
    return n_slots, max(0, n_slots - min(n_slots, n_stream))


@dataclass(frozen=True)
class ExecutorParams:
    n_ctx: int = 4096
    n_batch: int = 512
    n_threads: int = 4
    n_threads_auto: bool = False       # n_threads was not chosen by the user: leave a core to the prefetcher
    flash_attn: bool = False
    device: str = ""
    kv_type: str = "f16"   # "f16" (as llama.cpp) or "f32"
    device_budget: int | None = None   # bytes for transformer blocks; None: all resident
    n_gpu_layers: int | None = None    # keys pinned resident on the device (llama.cpp's meaning); None: all that fit
    async_prefetch: bool = False       # load the next layers while this one computes
    prefetch_depth: int = 2            # layers ahead with async_prefetch
    n_io_workers: int = 1
    direct_io: bool = False            # O_DIRECT reads into host slots (bypass the page cache)
    staged_io: bool = False            # host slots too load via staging + async device copies (the GPU path)
    paged_kv: bool = False             # K/V in pages that spill to host memory and a file
    kv_page_size: int = 256            # tokens per page, 16..8192
    kv_device_layers: int | None = None  # K/V frames on the device, one layer each (None: one per layer;
                                         # n_layer per sequence keeps several sequences on the device)
    kv_host_budget: int | None = None  # bytes of host KV pages (None: no limit)
    kv_spill_dir: str | None = None    # where pages beyond the host budget go
    devices: tuple[str, ...] = ()      # with two or more: blocks split over these ggml devices (pipeline)
    layer_split: tuple[int, ...] = ()  # blocks per device, in order (default: even)
    dynamic_layers: bool = False       # re-plan residency from memory pressure while running
    mem_pressure: float = 0.85         # the pressure above which pinned blocks are demoted


class _WeightView:
    """name -> paged tensor, as the architecture sees it."""

    def __init__(self, store: Any):
        self._store = store
        self._cache: dict[str, Any] = {}

    def __call__(self, name: str) -> Any:
        t = self._cache.get(name)
        if t is None:
            t = self._cache[name] = self._store.get(name)
        return t

    def has(self, name: str) -> bool:
        return self._store.has(name)


class Executor:
    """Runs an architecture layer by layer on one or more backends (a pipeline by blocks), its weights
    resident (loaded in the background, start_loading) or paged through a LayerPager, its K/V contiguous
    or paged (KVCache)."""

    def __init__(self, arch: Architecture, store: Any, params: ExecutorParams, *, memory: MemoryFn | None = None,
                 preload_repack: bool | None = None):
        """`preload_repack` (True/False: with or without ggml-cpu's re-laid weights) starts the background
        load of resident weights (start_loading) as early as possible; None leaves binding to the caller."""
        self.arch = arch
        self.hp = hp = arch.hp
        self.params = params
        devices = list(params.devices) or [params.device]
        self.backends = [_core.Backend(d, params.n_threads) for d in devices]
        self.backend = self.backends[0]
        self.layer_backend = self._split_layers(len(devices))
        multi = len(devices) > 1
        if multi and (params.paged_kv or params.device_budget is not None or params.n_gpu_layers is not None
                      or params.dynamic_layers):
            raise ValueError("a multi-device split does not combine with paging options yet")
        self.weights = _WeightView(store)
        self.n_past = 0
        self._store = store
        self.loader: Any = None                       # background load of resident weights (start_loading)
        paged = params.dynamic_layers or params.device_budget is not None or (
            params.n_gpu_layers is not None and params.n_gpu_layers < hp.n_layer)
        self.pager: Any = None
        self.repacked_bytes = 0
        if preload_repack is not None and not paged:
            self.repacked_bytes = self.start_loading(preload_repack)   # reads overlap everything below
        try:
            self._setup(store, params, paged, devices, memory)
        except BaseException:
            self.close()       # the loader's threads must stop before the caller unmaps the file
            raise

    def _setup(self, store: Any, params: ExecutorParams, paged: bool, devices: list[str],
               memory: MemoryFn | None) -> None:
        hp = self.hp

        # persistent tensors, per device: activations F32 [n_embd, n_batch]; per layer K, V F16
        # [n_embd_gqa, n_ctx] on its layer's device (with paged_kv, bound to the KV cache's frames instead)
        ctxs = [_core.Context(max_tensors=2 * hp.n_layer + 4) for _ in devices]
        self.acts = []
        for i, c in enumerate(ctxs):
            a = c.new_tensor(F32, [hp.n_embd, params.n_batch])
            a.name = f"act_d{i}"
            self.acts.append(a)
        kv_type = {"f16": F16, "f32": F32}.get(params.kv_type)
        if kv_type is None:
            raise ValueError(f"kv_type must be 'f16' or 'f32', not {params.kv_type!r}")
        kctx = _core.Context(max_tensors=2 * hp.n_layer) if params.paged_kv else None
        self.k_cache, self.v_cache = [], []
        for il in range(hp.n_layer):
            c = kctx or ctxs[self.layer_backend[il]]
            k = c.new_tensor(kv_type, [hp.n_embd_gqa, params.n_ctx])
            v = c.new_tensor(kv_type, [hp.n_embd_gqa, params.n_ctx])
            k.name, v.name = f"cache_k_l{il}", f"cache_v_l{il}"
            self.k_cache.append(k)
            self.v_cache.append(v)
        self._pbufs = [b.alloc_tensors(c) for b, c in zip(self.backends, ctxs)]
        self._pctxs = ctxs
        for buf in self._pbufs:
            buf.clear(0)
        self.seq = 0
        self._n_past: dict[int, int] = {}
        self.record_timings = False                   # fill self.timings on every forward pass (metrics)
        self.timings: list[dict[str, Any]] = []
        self._released: dict[int, float] = {}        # key -> when it was last released (timings)
        self.kv: Any = None
        if params.paged_kv:
            if not 16 <= params.kv_page_size <= 8192:
                raise ValueError(f"kv_page_size must be in 16..8192 tokens, not {params.kv_page_size}")
            if params.kv_host_budget is not None and params.kv_host_budget > int(_core.host_memory()["available"]):
                h = _core.host_memory()
                raise ValueError(f"host_budget of {params.kv_host_budget} bytes is more than the "
                                 f"{h['available']} bytes of host memory available (total {h['total']} bytes)")
            n_frames = hp.n_layer if params.kv_device_layers is None else params.kv_device_layers
            if not 1 <= n_frames <= 64 * hp.n_layer:
                raise ValueError(f"kv_device_layers must be in 1..{64 * hp.n_layer} (n_layer per sequence "
                                 f"kept on the device), not {params.kv_device_layers}")
            self.kv = _core.KVCache(self.k_cache, self.v_cache, page_size=params.kv_page_size, n_frames=n_frames,
                                    host_budget=params.kv_host_budget, spill_dir=params.kv_spill_dir or "",
                                    v_trans=not params.flash_attn, backend=self.backend, n_workers=1,
                                    n_stream=stream_slots(params.async_prefetch, params.prefetch_depth))
        self._plans: dict[tuple[int, int, int], _Plan] = {}
        self.head_chunks: list[str] = []
        self.scheduler: LayerScheduler | None = None
        self._decode_threads: int | None = None       # compute threads for single-token steps while streaming
        self.pager = self._make_pager(store) if paged else None
        if self.pager is not None and params.dynamic_layers:
            n_keys = hp.n_layer + len(self.head_chunks)
            self.scheduler = LayerScheduler(
                self.pager, planned=list(range(self.n_pinned)), n_keys=n_keys,
                stream_slots=self.pager.n_slots - self.n_pinned, params=SchedulerParams(params.mem_pressure),
                memory=memory or device_memory_fn(self.backend.device_type, self.backend.device_name))

    def load_groups(self) -> list[list[str]]:
        """The weights in the order a forward pass uses them: block 0 (with the global tensors every block
        reads), block 1, ..., then the output head. The token embedding is left out (a pass reads only its
        prompt's rows, straight from the mapping) unless the head is tied to it."""
        hp, has = self.hp, self._store.has
        out = self.arch.output_tensor(has)
        groups = [self.arch.block_tensors(il) for il in range(hp.n_layer)]
        listed = {n for g in groups for n in g} | {out, "output_norm.weight", "token_embd.weight"}
        groups[0] = [n for n in self._store.names() if n not in listed] + groups[0]
        groups.append(["output_norm.weight", out])
        return groups

    def start_loading(self, repack: bool) -> int:
        """Resident weights: binds them to the file mapping, places the re-laid ones (ggml-cpu repack) and
        starts worker threads that load them group by group (load_groups), so the first pass computes
        block i while block i+1 loads. Returns the bytes of the re-laid buffers."""
        if self.pager is not None:
            raise RuntimeError("a paged model streams its blocks: nothing to load ahead")
        self.loader = _core.WeightLoader(self._store, self.load_groups(),
                                         self.arch.matmul_weights(self._store.has) if repack else [],
                                         self.backend, n_workers=max(1, min(2, self.params.n_threads)))
        return int(self.loader.repacked_bytes)

    def close(self) -> None:
        """Stops the background load (before the file's mapping goes away)."""
        if self.loader is not None:
            self.loader.cancel()
            self.loader = None

    def _loaded(self, group: int | None) -> None:
        """Waits for a group of the background load; the loader goes away once everything is in place."""
        if group is not None and self.loader is not None:
            self.loader.wait(group)

    def _loading_done(self) -> None:
        if self.loader is not None and self.loader.done():
            self.loader = None

    def _make_pager(self, store: Any) -> Any:
        """Blocks go through a pool of slots within the budget; the first ones that fit stay pinned."""
        p, hp = self.params, self.hp
        layers = [self.arch.block_tensors(il) for il in range(hp.n_layer)]
        names = {n for layer in layers for n in layer}
        store.bind_mmap([n for n in store.names() if n not in names])
        sizes = [store.slot_bytes(layer, self.backend, p.direct_io) for layer in layers]
        slot = max(sizes)
        # the lm head (the largest tensor of small models) streams in row chunks of a slot each
        # (less the room a chunk's size may take when padded to the buffer alignment)
        room = SLOT_ALIGN_ROOM + (DIRECT_ROOM if p.direct_io else 0)
        self.head_chunks = store.add_row_chunks(self.arch.output_tensor(store.has), slot - room)
        layers += [[c] for c in self.head_chunks]
        n_stream = stream_slots(p.async_prefetch, p.prefetch_depth)
        n_keys = len(layers)
        if p.device_budget is not None:
            budget = p.device_budget
            self._check_available(budget, "device_budget")
        elif p.n_gpu_layers is not None:
            budget = (p.n_gpu_layers + n_stream) * slot
        else:
            budget = n_keys * slot         # dynamic layers alone: start with everything pinned
        n_slots, self.n_pinned = plan_slots(budget, slot, n_keys, n_stream)
        if n_slots < 1:
            big = sizes.index(slot)
            raise ValueError(f"device_budget of {budget} bytes is smaller than one layer: "
                             f"block {big} needs {slot} bytes")
        pager = _core.LayerPager(store, layers, n_slots=n_slots, slot_size=slot,
                                 n_workers=p.n_io_workers, backend=self.backend, direct_io=p.direct_io,
                                 staged=p.staged_io)
        if p.n_gpu_layers is not None:
            self.n_pinned = min(self.n_pinned, max(0, p.n_gpu_layers))
        for key in range(self.n_pinned):
            pager.pin(key)
        if p.n_threads_auto and p.async_prefetch and self.n_pinned < n_keys and self.backend.device_type == "cpu":
            # blocks stream while others compute: when decoding, the prefetch worker needs a core of its own
            # (2 cores, Qwen2.5-1.5B at a 25% budget: 14.0 tok/s with 1 compute thread, 8.8 with 2); prefill
            # is compute-bound and keeps them all
            self._decode_threads = max(1, p.n_threads - p.n_io_workers)
        return pager

    def _check_available(self, nbytes: int, what: str) -> None:
        """Refuses a budget larger than the memory the device has free now (host: as this process sees
        it, cgroup limit included), before anything is loaded."""
        used, total = device_memory_fn(self.backend.device_type, self.backend.device_name)()
        if total <= 0:
            return
        free = total - used
        if nbytes > free:
            h = _core.host_memory()
            where = (f"the host (total {total} bytes" + (f", cgroup limit {h['cgroup_limit']} bytes"
                                                         if h["cgroup_limit"] else "") + ")"
                     if self.backend.device_type == "cpu" else f"{self.backend.device_name} (total {total} bytes)")
            raise ValueError(f"{what} of {nbytes} bytes is more than the {free} bytes available on {where}")

    def _split_layers(self, n_dev: int) -> list[int]:
        """Device index of every block: contiguous ranges, `layer_split` blocks each (default: even)."""
        n = self.hp.n_layer
        split = list(self.params.layer_split)
        if not split:
            split = [n // n_dev + (1 if i < n % n_dev else 0) for i in range(n_dev)]
        if len(split) != n_dev or sum(split) != n or min(split) < 0:
            raise ValueError(f"layer_split must give {n_dev} block counts summing to {n}, not {split}")
        return [i for i, k in enumerate(split) for _ in range(k)]

    @property
    def kv_bytes(self) -> int:
        """Bytes of a contiguous K/V cache for the whole context (what paged_kv pages)."""
        return 2 * self.hp.n_layer * self.hp.n_embd_gqa * self.params.n_ctx * self.k_cache[0].element_size

    def reset(self, n_past: int = 0) -> None:
        """Forget cached positions >= n_past of the current sequence (the cache rows are overwritten later)."""
        if not 0 <= n_past <= self.n_past:
            raise ValueError(f"n_past must be in [0, {self.n_past}]")
        if self.kv is not None:
            self.kv.seq_truncate(self.seq, n_past)
        self.n_past = n_past

    def use_sequence(self, seq: int) -> None:
        """Makes `seq` the sequence later evals extend (paged_kv keeps several; without it only 0)."""
        if seq != 0 and self.kv is None:
            raise ValueError("several sequences need paged_kv")
        if seq < 0:
            raise ValueError("sequence ids are >= 0")
        self._n_past[self.seq] = self.n_past
        self.seq = seq
        self.n_past = self._n_past.get(seq, 0)

    def drop_sequence(self, seq: int) -> None:
        """Frees every page of `seq`."""
        if self.kv is not None:
            self.kv.seq_truncate(seq, 0)
        self._n_past.pop(seq, None)
        if seq == self.seq:
            self.n_past = 0

    # -- one micro-batch ---------------------------------------------------
    def _plan(self, n: int, n_kv: int, n_out: int) -> "_Plan":
        """The graphs for micro-batches of this shape, built once and reused."""
        key = (n, n_kv, n_out)
        plan = self._plans.pop(key, None)
        if plan is None:
            plan = _Plan.build(self, n, n_kv, n_out)
        self._plans[key] = plan            # most recently used last
        while len(self._plans) > PLAN_CACHE:
            self._plans.pop(next(iter(self._plans)))
        return plan

    def _ubatch(self, tokens: Sequence[int], out_rows: Sequence[int]) -> np.ndarray | None:
        hp, p = self.hp, self.params
        n = len(tokens)
        p0 = self.n_past
        n_kv = min(p.n_ctx, -(-(p0 + n) // KV_PAD) * KV_PAD)
        plan = self._plan(n, n_kv, len(out_rows))
        pos = np.arange(p0, p0 + n, dtype=np.int32)
        mask = np.where(np.arange(n_kv)[None, :] <= pos[:, None], 0.0, -np.inf)
        mask = mask.astype(np.float16 if p.flash_attn else np.float32)
        if p.flash_attn:
            v_idxs = pos.astype(np.int64)
        else:
            chan = np.arange(hp.n_embd_gqa, dtype=np.int64)
            v_idxs = (chan[None, :] * p.n_ctx + pos[:, None]).reshape(-1)
        for inp in plan.all_inputs:
            _core.tensor_set(inp.tokens, np.asarray(tokens, dtype=np.int32))
            _core.tensor_set(inp.positions, pos)
            _core.tensor_set(inp.mask, mask)
            _core.tensor_set(inp.k_idxs, pos.astype(np.int64))
            _core.tensor_set(inp.v_idxs, v_idxs)
            _core.tensor_set(inp.out_ids, np.asarray(out_rows or [0], dtype=np.int32))
        logits = self._compute(plan, n)
        self.n_past += n
        if not out_rows:
            return None
        return _core.tensor_get(logits).reshape(len(out_rows), hp.n_vocab)

    def _compute(self, plan: "_Plan", n: int) -> Any:
        """Runs the micro-batch; returns the tensor that holds its logits (if it has any)."""
        pager, kv = self.pager, self.kv
        if len(self.backends) > 1:
            self._compute_split(plan)
            return plan.logits
        if pager is None and kv is None and not self.record_timings:
            if self.loader is None:
                self.backend.compute(plan.whole(self))     # one graph per micro-batch, as llama.cpp runs it
                return plan.whole_logits
            for g, group in zip(plan.graphs, plan.groups):
                self._loaded(group)
                self.backend.compute(g)
            self._loading_done()
            return plan.logits
        if self.scheduler is not None:
            self.scheduler.step()
        if self._decode_threads is not None:
            want = self._decode_threads if n == 1 else self.params.n_threads
            if self.backend.n_threads != want:
                self.backend.n_threads = want
        n_layer = self.hp.n_layer
        n_keys = n_layer + len(self.head_chunks)
        depth = self.params.prefetch_depth if self.params.async_prefetch else 0
        seq, p0 = self.seq, self.n_past
        rec = self.timings if self.record_timings else None
        if rec is not None:
            rec.clear()
        clock = time.time
        for i, (key, g) in enumerate(zip(plan.keys, plan.graphs)):
            t0 = clock()
            self._loaded(plan.groups[i])
            if key is None:
                self.backend.compute(g)
                if rec is not None:
                    t1 = clock()
                    rec.append(dict(layer=i, kind="embed" if i == 0 else "head", t_start=t0, t_end=t1,
                                    wait_ms=0.0, load_ms=0.0, compute_ms=(t1 - t0) * 1e3))
                continue
            paged_kv = kv is not None and key < n_layer
            if pager is not None:
                pager.acquire(key)
            try:
                if pager is not None:
                    for j in range(1, depth + 1):
                        pager.prefetch((key + j) % n_keys)   # wraps to the next pass; False when no slot is free
                if paged_kv:
                    kv.acquire(seq, key, p0)
                    try:
                        for j in range(1, min(depth, n_layer - 1 - key) + 1):
                            kv.prefetch(seq, key + j, p0)
                        tc = clock()
                        self.backend.compute(g)
                    finally:
                        kv.release(seq, key, p0 + n)
                else:
                    tc = clock()
                    self.backend.compute(g)
            finally:
                if pager is not None:
                    pager.release(key)
            if rec is not None:
                t1 = clock()
                r = dict(layer=i, kind="block" if key < n_layer else "head", t_start=t0, t_end=t1,
                         wait_ms=(tc - t0) * 1e3, load_ms=0.0, compute_ms=(t1 - tc) * 1e3)
                last = pager.last_load(key) if pager is not None else None
                if last is not None and last[0] >= self._released.get(key, 0.0):   # loaded for this use
                    r.update(load_start=last[0], load_end=last[1], load_ms=(last[1] - last[0]) * 1e3)
                self._released[key] = t1
                rec.append(r)
        self._loading_done()
        return plan.logits

    def _compute_split(self, plan: "_Plan") -> None:
        """Graphs on their devices; activations copied where the device changes (a pipeline by layers)."""
        rec = self.timings if self.record_timings else None
        if rec is not None:
            rec.clear()
        prev = 0
        for i, (g, d) in enumerate(zip(plan.graphs, plan.devs)):
            t0 = time.time()
            self._loaded(plan.groups[i])
            if d != prev:
                _core.tensor_copy(self.acts[prev], self.acts[d])
                prev = d
            tc = time.time()
            self.backends[d].compute(g)
            if rec is not None:
                t1 = time.time()
                kind = "embed" if i == 0 else ("block" if i <= self.hp.n_layer else "head")
                rec.append(dict(layer=i, kind=kind, t_start=t0, t_end=t1, wait_ms=(tc - t0) * 1e3, load_ms=0.0,
                                compute_ms=(t1 - tc) * 1e3))
        self._loading_done()

    # -- public --------------------------------------------------------------
    def eval(self, tokens: Sequence[int], *, logits_all: bool = False) -> np.ndarray:
        """Feeds tokens at positions n_past..; returns F32 logits [n_out, n_vocab]
        (every position if logits_all, else the last one)."""
        n = len(tokens)
        if n == 0:
            raise ValueError("eval needs at least one token")
        if self.n_past + n > self.params.n_ctx:
            raise ValueError(
                f"context overflow: {self.n_past} cached + {n} new tokens > ctx_size {self.params.n_ctx}")
        bad = [t for t in tokens if not 0 <= int(t) < self.hp.n_vocab]
        if bad:
            raise ValueError(f"token id {bad[0]} out of range [0, {self.hp.n_vocab})")
        outs = []
        b = self.params.n_batch
        start = self.n_past
        try:
            for i in range(0, n, b):
                chunk = tokens[i:i + b]
                last = i + len(chunk) == n
                rows = list(range(len(chunk))) if logits_all else ([len(chunk) - 1] if last else [])
                r = self._ubatch(chunk, rows)
                if r is not None:
                    outs.append(r)
        except BaseException:
            self.n_past = start      # all or nothing: rows written past it are overwritten later
            raise
        return np.concatenate(outs, axis=0)


class _Plan:
    """Step inputs plus the embedding, block and output graphs for one micro-batch shape."""

    def __init__(self) -> None:
        self.keep: list[Any] = []       # contexts and buffers the graphs point into
        self.graphs: list[Any] = []
        self.keys: list[int | None] = []  # the paged layer each graph needs, if any
        self.devs: list[int] = []       # the device each graph runs on
        self.groups: list[int | None] = []  # the group of the background load (Executor.load_groups) it needs
        self._whole: Any = None
        self.whole_logits: Any = None
        self.logits: Any = None
        self.inputs: StepInputs
        self.all_inputs: list[StepInputs] = []   # one set per device, filled alike

    @classmethod
    def build(cls, ex: Executor, n: int, n_kv: int, n_out: int) -> "_Plan":
        hp, p, arch, w = ex.hp, ex.params, ex.arch, ex.weights
        self = cls()
        for b in ex.backends:
            ictx = _core.Context(max_tensors=8)
            t = {
                "tokens": ictx.new_tensor(I32, [n]),
                "positions": ictx.new_tensor(I32, [n]),
                "mask": ictx.new_tensor(F16 if p.flash_attn else F32, [n_kv, n]),
                "k_idxs": ictx.new_tensor(I64, [n]),
                "v_idxs": ictx.new_tensor(I64, [n] if p.flash_attn else [n * hp.n_embd_gqa]),
                "out_ids": ictx.new_tensor(I32, [max(n_out, 1)]),
            }
            for name, x in t.items():
                x.name = "inp_" + name
            self.keep += [ictx, b.alloc_tensors(ictx)]
            self.all_inputs.append(StepInputs(n_tokens=n, n_kv=n_kv, n_outputs=n_out, flash_attn=p.flash_attn, **t))
        self.inputs = self.all_inputs[0]

        def graph(build: Any, rows_in: int = n, rows_out: int = n, key: int | None = None, dev: int = 0,
                  group: int | None = None) -> Any:
            ctx = _core.Context(max_tensors=GRAPH_NODES, graph_size=GRAPH_NODES)
            gf = ctx.new_graph()
            a = ex.acts[dev]
            act = ctx.view(a, [hp.n_embd, rows_in], [a.nb[1]], 0)
            act_out = act if rows_out == rows_in else ctx.view(a, [hp.n_embd, rows_out], [a.nb[1]], 0)
            out = build(ctx, gf, act, act_out, self.all_inputs[dev])
            gf.expand(out)
            self.keep.append(ctx)
            self.graphs.append(gf)
            self.keys.append(key)
            self.devs.append(dev)
            self.groups.append(group)
            return out

        n_last = min(n, max(n_out, 1))           # rows the last block keeps
        graph(lambda ctx, gf, act, act_out, inp: ctx.cpy(arch.build_embed(ctx, w, inp), act))
        for il in range(hp.n_layer):
            graph(lambda ctx, gf, act, act_out, inp, il=il: ctx.cpy(
                arch.build_block(ctx, gf, w, inp, il, act, ex.k_cache[il], ex.v_cache[il]), act_out),
                rows_out=n_last if il == hp.n_layer - 1 else n, key=il if ex.pager or ex.kv else None,
                dev=ex.layer_backend[il], group=il)
        if n_out and ex.pager:
            self._build_chunked_head(ex, graph, n_out)
        elif n_out:
            def head(ctx: Any, gf: Any, act: Any, act_out: Any, inp: StepInputs) -> Any:
                out = arch.build_output(ctx, w, inp, act)
                out.set_output()
                return out
            self.logits = graph(head, rows_in=n_out, rows_out=n_out, dev=ex.layer_backend[-1], group=hp.n_layer)
        return self

    def whole(self, ex: Executor) -> Any:
        """The micro-batch as one graph, built on first use, as llama.cpp builds it: each block's output is
        the next block's input (no copy through the activation buffer), one allocation and one thread-pool
        launch per step. The same operations as the per-block graphs: the same results. Only for resident
        weights on one device (the paged paths need to act between blocks); whole_logits holds the logits."""
        if self._whole is None:
            hp, arch, w, inp = ex.hp, ex.arch, ex.weights, self.inputs
            size = 2 * sum(g.n_nodes for g in self.graphs) + 512
            ctx = _core.Context(max_tensors=size, graph_size=size)
            gf = ctx.new_graph()
            x = arch.build_embed(ctx, w, inp)
            for il in range(hp.n_layer):
                x = arch.build_block(ctx, gf, w, inp, il, x, ex.k_cache[il], ex.v_cache[il])
            if inp.n_outputs:
                x = arch.build_output(ctx, w, inp, x)
                x.set_output()
                self.whole_logits = x
            gf.expand(x)
            self.keep.append(ctx)
            self._whole = gf
        return self._whole

    def _build_chunked_head(self, ex: Executor, graph: Any, n_out: int) -> None:
        """Output norm into head_in (F32 [n_embd, n_out]), then one graph per streamed row chunk
        of the lm head, each writing its rows of the logits (F32 [n_vocab, n_out])."""
        hp, w = ex.hp, ex.weights
        hctx = _core.Context(max_tensors=2)
        head_in = hctx.new_tensor(F32, [hp.n_embd, n_out])
        lb = hctx.new_tensor(F32, [hp.n_vocab, n_out])
        self.keep += [hctx, ex.backend.alloc_tensors(hctx)]
        graph(lambda ctx, gf, act, act_out, inp: ctx.cpy(ex.arch.build_output_norm(ctx, w, act), head_in),
              rows_in=n_out, rows_out=n_out)
        row0 = 0
        for c, name in enumerate(ex.head_chunks):
            rows = w(name).ne[1]

            def chunk(ctx: Any, gf: Any, act: Any, act_out: Any, inp: StepInputs, name: str = name,
                      r0: int = row0, rows: int = rows) -> Any:
                dst = ctx.view(lb, [rows, n_out], [lb.nb[1]], r0 * lb.element_size)
                return ctx.cpy(ctx.mul_mat(w(name), head_in), dst)

            graph(chunk, rows_in=n_out, rows_out=n_out, key=hp.n_layer + c)
            row0 += rows
        self.logits = lb

