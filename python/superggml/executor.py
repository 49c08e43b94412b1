"""The layer loop: the one place that talks to both the graphs and the paging primitives.

A forward pass of n tokens runs as: an embedding graph, one graph per
transformer block, an output graph. Activations persist between graphs in
a device buffer; each block's K/V rows are written into that layer's cache.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from . import _core
from .arch import Architecture
from .arch.common import StepInputs
from .budget import MemoryPlan, kv_bytes, kv_type, off_error, plan_memory, too_small
from .errors import SuperggmlError
from .arch import moe
from .layers import Block, ExpertPager, HeadChunk, Key, NullKV, NullPager, PagedKV, SplitKV, WeightPager, merge_stats
from .scheduler import LayerScheduler, MemoryFn, device_memory_fn
from .settings import KV_QUANTIZED, DeviceSettings, Settings, layer_split

F32 = _core.GGMLType.F32
F16 = _core.GGMLType.F16
I32 = _core.GGMLType.I32
I64 = _core.GGMLType.I64

KV_PAD = 256          # n_kv is padded to this so graph shapes change rarely
GRAPH_NODES = 192     # room for one block graph to start with (and LANE_NODES more per sequence of a pass over
LANE_NODES = 48       # several); doubled while it does not fit, up to GRAPH_NODES_MAX
GRAPH_NODES_MAX = 1 << 16
PLAN_CACHE = 6        # micro-batch shapes whose graphs are kept
MAX_LANES = 64        # sequences one pass holds at most
SLOT_ALIGN_ROOM = 256 # bytes kept free in a slot for alignment padding
DIRECT_ROOM = 3 * 4096  # and with direct_io, for widening a chunk to O_DIRECT alignment
N_IO_WORKERS = 1      # threads reading streamed blocks
DEFAULT_DEVICE = ""   # ggml's first device
RPC_CONNECT_TIMEOUT = 5.0   # seconds to reach an RPC server and get its HELLO


def attn_rot_size(head_dim: int, cache_type: str, *, largest: bool) -> int:
    """The Walsh-Hadamard rotation llama.cpp applies for a quantized cache type (0: none): heads of a multiple of
    64; for K the largest power of 2 dividing the head, for V 64."""
    if cache_type not in KV_QUANTIZED or head_dim % 64:
        return 0
    n = 64
    while largest and head_dim % (2 * n) == 0:
        n *= 2
    return n


def hadamard(n: int) -> np.ndarray:
    """The orthonormal Walsh-Hadamard matrix F32 [n, n] as llama.cpp builds it (Sylvester's, times 1/sqrtf(n))."""
    i = np.arange(n)
    parity = np.vectorize(lambda x: bin(x).count("1") & 1)(i[:, None] & i[None, :])
    val = np.float32(1.0 / float(np.sqrt(np.float32(n))))
    return np.where(parity == 1, -val, val).astype(np.float32)


def plan_slots(budget: int, slot: int, n_keys: int, n_stream: int) -> tuple[int, int]:
    """(pool slots, pinned keys) for a budget: as many slots as fit (at most one per key); if not every key
    has one, the last n_stream slots stream and the first keys keep the others. 0 slots: the budget is
    smaller than one layer."""
    n_slots = min(budget // slot, n_keys)
    if n_slots >= n_keys:
        return n_slots, n_keys
    return n_slots, max(0, n_slots - min(n_slots, n_stream))


def resolve_devices(d: DeviceSettings) -> tuple[list[str], tuple[float, ...]]:
    """The ggml devices the blocks split over, and their shares. RPC servers are probed and their devices
    added first (DeviceError names a server that cannot be used). `devices` may name them as ggml does
    ("RPC0": numbered in the order servers were added to this process) or by server: "RPC[host:port]" (its
    device, if it has one) or "RPC0[host:port]" (as superggml shows them); a server named there is added if
    `rpc` does not list it. With servers and no devices: this machine's CPU and the servers' devices, by free
    memory, as llama.cpp splits."""
    def add(ep: str) -> list[dict[str, Any]]:
        return list(_core.rpc_add_server(ep, connect_timeout=min(RPC_CONNECT_TIMEOUT, d.rpc_timeout),
                                         timeout=d.rpc_timeout))

    rpc: list[dict[str, Any]] = [x for ep in d.rpc for x in add(ep)]
    if d.devices:
        names = []
        for n in d.devices:
            if "[" not in n or not n.endswith("]"):
                names.append(n)
                continue
            name, ep = n[:-1].split("[", 1)
            on = add(ep) if ep not in d.rpc else [x for x in rpc if x["endpoint"] == ep]
            pick = [x for x in on if x["name"] == name] or (on if len(on) == 1 else [])
            if not pick:
                raise ValueError(f"device {n!r}: the server at {ep} has devices "
                                 f"{', '.join(x['name'] for x in on)}; name one of them")
            names.append(pick[0]["name"])
        return names, d.tensor_split
    if not rpc:
        return [DEFAULT_DEVICE], ()
    names = ["CPU"] + [r["name"] for r in rpc]
    if d.tensor_split:
        if len(d.tensor_split) != len(names):
            raise ValueError(f"tensor_split needs {len(names)} shares (CPU and {len(rpc)} RPC devices), not "
                             f"{list(d.tensor_split)}")
        return names, d.tensor_split
    free = {x["name"]: int(x["memory_free"]) for x in _core.devices()}
    free["CPU"] = int(_core.host_memory()["available"])
    return names, tuple(float(max(1, free.get(n, 0))) for n in names)


@dataclass
class SequenceState:
    """One sequence's cached context: the tokens its K/V holds, and the logits of its last eval."""
    id: int
    tokens: list[int] = field(default_factory=list)
    scores: np.ndarray | None = None

    @property
    def n_past(self) -> int:
        return len(self.tokens)


@dataclass
class Step:
    """One graph of a forward pass and what it needs: paged weights (key), a K/V page (layer), a device, a
    group of the background load."""
    graph: Any
    kind: str                       # "embed", "block" or "head"
    rows_in: int = 0                # activation rows it reads (what moves when the device changes before it)
    key: Key | None = None
    layer: int | None = None        # the block whose K/V the graph reads and writes
    dev: int = 0
    group: int | None = None
    experts: int | None = None      # the block whose routed experts come from the expert cache first
    expert_ids: Any = None          # I32 [k, rows]: the routed experts as cache slots (filled before it runs)
    expert_row0: int = 0            # the first of the pass's rows it computes (a pass splits into row chunks)
    expert_ahead: int = 0           # rows whose lookahead guess it starts loading once mapped (0: none)


class _WeightView:
    """name -> paged tensor, as the architecture sees it from the device whose graph is being built
    (`device`): a device that is not host memory reads its own copies of the weights other devices read too
    (`copies`: device -> name -> the copy's name)."""

    def __init__(self, store: Any):
        self._store = store
        self._cache: dict[str, Any] = {}
        self.copies: dict[int, dict[str, str]] = {}
        self.device = 0

    def __call__(self, name: str) -> Any:
        name = self.copies.get(self.device, {}).get(name, name)
        t = self._cache.get(name)
        if t is None:
            t = self._cache[name] = self._store.get(name)
        return t

    def has(self, name: str) -> bool:
        return self._store.has(name)


class Executor:
    """Runs an architecture layer by layer on one or more backends (a pipeline by blocks), its weights
    resident (loaded in the background, start_loading) or paged through a LayerPager, its K/V contiguous
    or paged (KVCache). It owns the sequences: what each one's K/V holds."""

    def __init__(self, arch: Architecture, store: Any, settings: Settings, *, direct_io: bool = False,
                 memory: MemoryFn | None = None, preload_repack: bool | None = None, reserve: int = 0):
        """`direct_io` is the paging's read mode, resolved (settings.paging.direct_io may say "auto").
        `preload_repack` (True/False: with or without ggml-cpu's re-laid weights) starts the background
        load of resident weights (start_loading) as early as possible; None leaves binding to the caller.
        `reserve`: bytes of the device's memory an automatic budget leaves to something else (a draft model).
        `self.settings` are the settings with device_budget and async_prefetch resolved (memory_plan)."""
        self.arch = arch
        self.hp = arch.hp
        self.settings = settings
        arch.set_context(settings.context.ctx_size)
        self.direct_io = direct_io
        ctx = settings.context
        names, shares = resolve_devices(settings.devices)
        self.backends = [_core.Backend(d, ctx.threads) for d in names]
        self.n_split = len(self.backends)              # the devices the blocks are split over
        self.layer_backend = [i for i, k in enumerate(layer_split(self.hp.n_layer, self.n_split, shares))
                              for _ in range(k)]
        hosts = [i for i, b in enumerate(self.backends) if b.is_host]
        if not hosts:      # the embedding rows come from the file mapping: its graph runs on the CPU
            self.backends.append(_core.Backend(DEFAULT_DEVICE, ctx.threads))
            hosts = [self.n_split]
        for b in self.backends:
            b.use_ref = ctx.batch_invariant
        self.embed_dev = hosts[0]
        self.head_dev = self.layer_backend[-1]
        self.backend = self.backends[0]
        self.memory_plan = self._plan_memory(store, reserve)
        settings = self.settings = self._resolved(settings)
        self.weights = _WeightView(store)
        self.store = store                             # the weights (a _core.WeightStore)
        self.loader: Any = None                        # background load of resident weights (start_loading)
        self.pagers: list[WeightPager | NullPager] = [NullPager() for _ in self.backends]   # per device
        self.kv: PagedKV | SplitKV | NullKV = NullKV()
        self.scheduler: LayerScheduler | None = None
        self.repacked_bytes = 0
        self.remote_bytes = 0                          # weights copied to devices that are not host memory
        self.paged = settings.paging.paged(self.hp.n_layer)
        self.experts: ExpertPager | None = None        # experts paged one by one (expert_cache)
        pg = settings.paging
        if pg.expert_cache is not None and not self.hp.n_expert:
            raise ValueError("expert_cache applies to mixture-of-experts models; this model is dense")
        # a MoE model under a device_budget pages its experts too: its dense part is planned first, the rest of
        # the budget is the expert cache (_make_pager splits it)
        self.expert_budget: int | None = pg.expert_cache
        self.experts_paged = pg.expert_cache is not None or (self.hp.n_expert > 0 and pg.budget_bytes is not None)
        if self.experts_paged and (self.n_split > 1 or not self.backend.is_host):
            raise ValueError("paged experts run on one host device for now, not a multi-device split or an RPC "
                             "device")
        if self.n_split > 1 and (pg.dynamic_layers or pg.n_gpu_layers is not None or pg.expert_cache is not None):
            raise ValueError("a multi-device split pages with a device_budget per device, not dynamic_layers, "
                             "n_gpu_layers or expert_cache")
        if isinstance(pg.device_budget, tuple) and len(pg.device_budget) != self.n_split:
            raise ValueError(f"device_budget gives {len(pg.device_budget)} sizes for {self.n_split} devices "
                             f"({', '.join(b.name for b in self.backends[:self.n_split])})")
        self._plan_copies(store)
        if preload_repack is not None and not self.paged:
            try:
                self.repacked_bytes = self.start_loading(preload_repack)   # reads overlap everything below
            except SuperggmlError as e:
                if self.memory_plan is None or "cannot allocate" not in str(e):
                    raise
                raise off_error(self.memory_plan, str(e)) from e
        try:
            self._setup(store, memory)
        except BaseException:
            self.close()       # the loader's threads must stop before the caller unmaps the file
            raise

    def _plan_memory(self, store: Any, reserve: int) -> MemoryPlan | None:
        """device_budget 'auto' or 'off' resolved against the memory the device has free (budget.plan); None
        for a multi-device split (each device takes a size of its own; auto keeps their blocks resident)."""
        p = self.settings.paging
        if self.n_split > 1 or isinstance(p.device_budget, tuple):
            return None
        b = self.backend
        used, total = device_memory_fn(b.device_type, b.device_name)()
        weights = sum(int(store.file_range(n)[1]) for n in store.names())
        c = self.settings.context
        return plan_memory(self.hp, weights, dict(device_budget=p.device_budget, ctx_size=c.ctx_size,
                                                  n_batch=c.n_batch, cache_type_k=c.cache_type_k,
                                                  cache_type_v=c.cache_type_v, flash_attn=c.flash_attn),
                           max(0, total - used), reserve=reserve)

    def _resolved(self, s: Settings) -> Settings:
        """The settings with the plan's budget (auto: a size when the blocks must stream) and async_prefetch
        (auto: on when blocks stream)."""
        p, plan = s.paging, self.memory_plan
        if plan is not None and plan.mode == "auto" and plan.budget is not None:
            left = plan.budget - (p.expert_cache or 0)
            if left <= 0:
                raise too_small(plan, 0, "the weights' pool" + (" and expert_cache" if p.expert_cache else ""))
            p = dataclasses.replace(p, device_budget=left)
        if p.async_prefetch is None:
            p = dataclasses.replace(p, async_prefetch=p.paged(self.hp.n_layer))
        return dataclasses.replace(s, paging=p)

    def _setup(self, store: Any, memory: MemoryFn | None) -> None:
        hp, s = self.hp, self.settings
        c, kvs = s.context, s.kv
        # persistent tensors, per device: activations F32 [n_embd, n_batch]; per layer K, V F16
        # [n_embd_gqa, n_ctx] on its layer's device (with paged_kv, bound to the KV cache's frames instead)
        ctxs = [_core.Context(max_tensors=2 * hp.n_layer + 4) for _ in self.backends]
        self.acts = []
        for i, cx in enumerate(ctxs):
            a = cx.new_tensor(F32, [hp.n_embd, c.n_batch])
            a.name = f"act_d{i}"
            self.acts.append(a)
        type_k, type_v = kv_type(c.cache_type_k), kv_type(c.cache_type_v)
        for name, t in (("cache_type_k", type_k), ("cache_type_v", type_v)):
            if hp.head_dim % _core.blck_size(t):
                raise ValueError(f"{name}={getattr(c, name)} stores blocks of {_core.blck_size(t)} values, which "
                                 f"this model's heads of {hp.head_dim} do not divide into")
        kctx = _core.Context(max_tensors=2 * hp.n_layer) if kvs.paged_kv else None
        self.k_cache, self.v_cache = [], []
        for il in range(hp.n_layer):
            cx = kctx or ctxs[self.layer_backend[il]]
            k = cx.new_tensor(type_k, [hp.n_embd_gqa, c.ctx_size])
            v = cx.new_tensor(type_v, [hp.n_embd_gqa, c.ctx_size])
            k.name, v.name = f"cache_k_l{il}", f"cache_v_l{il}"
            self.k_cache.append(k)
            self.v_cache.append(v)
        # a quantized cache holds Q, K and V rotated by Walsh-Hadamard matrices, as llama.cpp's does
        n_rot = {"k": attn_rot_size(hp.head_dim, c.cache_type_k, largest=True),
                 "v": attn_rot_size(hp.head_dim, c.cache_type_v, largest=False)}
        self.rot = [{x: cx.new_tensor(F32, [n, n]) for x, n in n_rot.items() if n} for cx in ctxs]
        self._pbufs = [b.alloc_tensors(cx) for b, cx in zip(self.backends, ctxs)]
        self._pctxs = ctxs
        for buf in self._pbufs:
            buf.clear(0)
        for rot in self.rot:
            for t in rot.values():
                _core.tensor_set(t, hadamard(t.ne[0]), 0)
        # lanes: the K/V tensors a pass over several sequences binds, one set per sequence in it (lane 0: k_cache).
        # With the paged KV cache they are bound to its frames; without it each sequence has K/V storage of its
        # own (sequence 0: the memory k_cache was allocated in), aliased into the lanes before a pass
        self._lane_k: list[list[Any]] = [self.k_cache]
        self._lane_v: list[list[Any]] = [self.v_cache]
        self._lane_keep: list[Any] = []
        self._kv_store: dict[int, tuple[list[Any], list[Any], list[Any]]] = {}
        self._bound: list[int | None] = [0]            # the sequence each lane's tensors point at (contiguous)
        if not kvs.paged_kv:
            sctx = _core.Context(max_tensors=2 * hp.n_layer)
            ks, vs = self._kv_tensors(lambda il: sctx)
            for t, src in zip(ks + vs, self.k_cache + self.v_cache):
                _core.tensor_alias(t, src)
            self._kv_store[0] = (ks, vs, [sctx])
        self.seq = SequenceState(0)
        self._seqs: dict[int, SequenceState] = {0: self.seq}
        self.n_passes = self.pass_sequences = self.pass_tokens = 0   # forward passes and what they held
        self.record_timings = False                   # fill self.timings on every forward pass (metrics)
        self.timings: list[dict[str, Any]] = []
        if kvs.paged_kv:
            self.kv = self._make_kv()
        self._plans: dict[tuple[Any, ...], _Plan] = {}
        self._head_out: tuple[int, list[Any]] | None = None   # rows, [context, buffer] of the streamed head's output
        self.head_chunks: list[str] = []
        self._decode_threads: int | None = None       # compute threads for single-token steps while streaming
        if self.paged:
            self._make_pagers(store)
            if s.paging.dynamic_layers:
                self.scheduler = LayerScheduler(
                    self.pager.core, planned=list(range(self.n_pinned)), n_keys=self.pager.n_keys,
                    stream_slots=self.pager.core.n_slots - self.n_pinned, mem_pressure=s.paging.mem_pressure,
                    memory=memory or device_memory_fn(self.backend.device_type, self.backend.device_name))
        if self.experts_paged:
            self._make_experts(store)

    def _make_kv(self) -> PagedKV | SplitKV:
        hp, s = self.hp, self.settings
        kvs = s.kv
        if kvs.host_budget is not None and kvs.host_budget > int(_core.host_memory()["available"]):
            h = _core.host_memory()
            raise ValueError(f"host_budget of {kvs.host_budget} bytes is more than the "
                             f"{h['available']} bytes of host memory available (total {h['total']} bytes)")
        n_frames = hp.n_layer if kvs.kv_device_layers is None else kvs.kv_device_layers
        if n_frames > 64 * hp.n_layer:
            raise ValueError(f"kv_device_layers must be in 1..{64 * hp.n_layer} (n_layer per sequence "
                             f"kept on the device), not {kvs.kv_device_layers}")
        parts = []
        for d in range(self.n_split):       # each device pages the K/V of its own blocks
            ls = self._layers_on(d)
            if not ls:
                continue
            frames = n_frames if len(ls) == hp.n_layer or kvs.kv_device_layers is not None else len(ls)
            host = kvs.host_budget if kvs.host_budget is None else kvs.host_budget * len(ls) // hp.n_layer
            core = _core.KVCache([self.k_cache[il] for il in ls], [self.v_cache[il] for il in ls],
                                 page_size=kvs.kv_page_size, n_frames=frames, host_budget=host,
                                 spill_dir=kvs.kv_spill_dir or "", v_trans=not s.context.flash_attn,
                                 backend=self.backends[d], n_workers=1, n_stream=s.paging.stream_slots)
            parts.append((PagedKV(core, len(ls), s.paging.ahead, n_swa=0 if kvs.swa_full else self.arch.n_swa,
                                  swa_layers=[j for j, il in enumerate(ls) if self.arch.is_swa(il)]), ls[0]))
        return parts[0][0] if len(parts) == 1 else SplitKV(parts)

    def _make_experts(self, store: Any) -> None:
        """The expert cache, and the tensors that carry a MoE block's state from its attention-and-router graph
        to its experts graph: ffn_inp and the FFN input F32 [n_embd, n_batch], the routed experts I32
        [k, n_batch] and their weights F32 [1, k, n_batch]."""
        hp, c = self.hp, self.settings.context
        k = hp.n_expert_used
        self.experts = ExpertPager(store, store.path, self.arch, self.expert_budget, self.backend,
                                    direct_io=self.direct_io, lookahead=self.settings.paging.expert_lookahead)
        # a pass's experts graphs run over chunks of rows whose routed experts the cache can pin at once
        self.expert_rows = max(1, min(c.n_batch, self.experts.core.n_slots // k))
        cx = _core.Context(max_tensors=6)
        # the next block's router's guess, I32 [k, n_batch]: only when every block is resident or pinned (the
        # next router's weights are there)
        ahead = self.settings.paging.expert_lookahead is not False and (not self.paged or self.n_pinned >= hp.n_layer)
        self.moe_guess = cx.new_tensor(I32, [k, c.n_batch]) if ahead else None
        self.moe_inp = cx.new_tensor(F32, [hp.n_embd, c.n_batch])
        self.moe_cur = cx.new_tensor(F32, [hp.n_embd, c.n_batch])
        self.moe_sel = cx.new_tensor(I32, [k, c.n_batch])
        self.moe_w = cx.new_tensor(F32, [1, k, c.n_batch])
        self.moe_shared = cx.new_tensor(F32, [hp.n_embd, c.n_batch]) if self.arch.n_ff_shexp else None
        self._moe_keep = [cx, self.backend.alloc_tensors(cx)]

    def _split_budget(self, store: Any, budget: int, dense: int, slot: int) -> int:
        """A MoE model's device_budget: its dense part (`dense` bytes in slots of `slot`) first, every block
        pinned if the expert cache can still hold what one batch routes to; otherwise the dense part streams
        through the fewest slots and the cache gets the rest, which must hold what one token routes to (a
        batch then runs its experts in chunks of rows). Sets expert_budget; returns the dense part's budget."""
        hp, p = self.hp, self.settings.paging
        es = ExpertPager.slot_bytes(store, self.arch, direct=self.direct_io)
        batch = min(hp.n_expert, hp.n_expert_used * self.settings.context.n_batch) * es
        stream = min(p.stream_slots, dense // slot) * slot      # the fewest slots the dense part streams through
        if budget - batch >= dense:
            dense_budget = dense
        elif budget - batch >= stream:
            dense_budget = budget - batch
        else:
            dense_budget = stream
        if budget - dense_budget < hp.n_expert_used * es:
            raise ValueError(f"device_budget of {budget} bytes cannot hold {stream // slot} blocks without their "
                             f"experts ({slot} bytes each) and the {hp.n_expert_used} experts a token is routed to "
                             f"({es} bytes each): give it at least {stream + hp.n_expert_used * es} bytes")
        self.expert_budget = budget - dense_budget
        return dense_budget

    def block_tensors(self, il: int) -> list[str]:
        """Block il's tensors that load with it (its experts go through the expert cache instead, if any)."""
        names = self.arch.block_tensors(il)
        if not self.experts_paged:
            return names
        experts = set(self.arch.expert_tensors(il))
        return [n for n in names if n not in experts]

    def load_groups(self) -> list[list[str]]:
        """The weights in the order a forward pass uses them: block 0 (with the global tensors every block
        reads), block 1, ..., then the output head. The token embedding is left out (a pass reads only its
        prompt's rows, straight from the mapping) unless the head is tied to it."""
        hp, has = self.hp, self.store.has
        out = self.arch.output_tensor(has)
        groups = [self.block_tensors(il) for il in range(hp.n_layer)]
        listed = ({n for il in range(hp.n_layer) for n in self.arch.block_tensors(il)} |
                  {out, "output_norm.weight", "token_embd.weight"})
        groups[0] = [n for n in self.store.names() if n not in listed] + groups[0]
        groups.append(["output_norm.weight", out])
        return groups

    def _layers_on(self, d: int) -> list[int]:
        """The blocks device d runs, in order."""
        return [il for il, dev in enumerate(self.layer_backend) if dev == d]

    def _plan_copies(self, store: Any) -> None:
        """What each device that is not host memory holds of the weights outside the blocks: a copy of each
        one its blocks read (rope factors and the like) and, on the head's device, of the output norm and
        (resident) the lm head, so a tied head does not take the embedding away from the CPU that reads its
        rows. Fills weights.copies and _remote: device -> the names it loads (its blocks too, if resident)."""
        hp, has = self.hp, store.has
        out = self.arch.output_tensor(has)
        blocks = {n for il in range(hp.n_layer) for n in self.arch.block_tensors(il)}
        shared = [n for n in store.names() if n not in blocks | {out, "output_norm.weight", "token_embd.weight"}]
        self._remote: dict[int, list[str]] = {}
        for d in range(self.n_split):
            if self.backends[d].is_host:
                continue
            head = ["output_norm.weight"] + ([] if self.paged else [out]) if d == self.head_dev else []
            copies = {n: store.add_copy(n, f"dev{d}") for n in shared + head}
            self.weights.copies[d] = copies
            own = [] if self.paged else [n for il in self._layers_on(d) for n in self.block_tensors(il)]
            self._remote[d] = own + list(copies.values())

    def _load_remote(self) -> None:
        """Copies each non-host device's weights (_plan_copies) into a buffer of its own."""
        for d, names in self._remote.items():
            if names:
                self.remote_bytes += int(self.store.load_resident(names, self.backends[d]))

    def start_loading(self, repack: bool) -> int:
        """Resident weights: binds them to the file mapping, places the re-laid ones (ggml-cpu repack) and
        starts worker threads that load them group by group (load_groups), so the first pass computes
        block i while block i+1 loads. The weights of devices that are not host memory are copied there
        first. Returns the bytes of the re-laid buffers."""
        if self.paged:
            raise RuntimeError("a paged model streams its blocks: nothing to load ahead")
        remote = {n for names in self._remote.values() for n in names}
        groups = [[n for n in g if n not in remote] for g in self.load_groups()]
        repacked = [n for n in self.arch.matmul_weights(self.store.has) if n not in remote] if repack else []
        self.loader = _core.WeightLoader(self.store, groups, repacked, self.backends[self.embed_dev],
                                         n_workers=max(1, min(2, self.settings.context.threads)))
        self._load_remote()
        return int(self.loader.repacked_bytes)

    def close(self) -> None:
        """Stops the background load (before the file's mapping goes away)."""
        if self.loader is not None:
            self.loader.cancel()
            self.loader = None

    def _loaded(self, group: int | None) -> None:
        """Waits for a group of the background load."""
        if group is not None and self.loader is not None:
            self.loader.wait(group)

    @property
    def pager(self) -> WeightPager | NullPager:
        """The first device's pager (the only one of a model on one device)."""
        return self.pagers[0]

    def _make_pagers(self, store: Any) -> None:
        """Each device's blocks (the head's device: the lm head's row chunks too) go through a pool of slots
        of its own, within its budget; the first ones that fit stay pinned."""
        p, hp = self.settings.paging, self.hp
        names = {n for il in range(hp.n_layer) for n in self.arch.block_tensors(il)}
        store.bind_mmap([n for n in store.names() if n not in names])
        self._load_remote()
        self.n_pinned = 0
        for d in range(self.n_split):
            blocks = self._layers_on(d)
            if blocks:
                self.pagers[d] = self._make_pager(store, d, blocks)
        c = self.settings.context
        if (c.n_threads is None and p.async_prefetch and self.n_split == 1 and self.n_pinned < self.pager.n_keys
                and self.backend.device_type == "cpu"):
            # blocks stream while others compute: when decoding, the prefetch worker needs a core of its own
            # (2 cores, Qwen2.5-1.5B at a 25% budget: 14.0 tok/s with 1 compute thread, 8.8 with 2); prefill
            # is compute-bound and keeps them all
            self._decode_threads = max(1, c.threads - N_IO_WORKERS)

    def _make_pager(self, store: Any, d: int, blocks: list[int]) -> WeightPager:
        p, b = self.settings.paging, self.backends[d]
        layers = [self.block_tensors(il) for il in blocks]
        keys: list[Key] = [Block(il) for il in blocks]
        sizes = [store.slot_bytes(layer, b, self.direct_io) for layer in layers]
        slot = max(sizes)
        if d == self.head_dev:
            # the lm head (the largest tensor of small models) streams in row chunks of a slot each
            # (less the room a chunk's size may take when padded to the buffer alignment)
            room = SLOT_ALIGN_ROOM + (DIRECT_ROOM if self.direct_io else 0)
            self.head_chunks = store.add_row_chunks(self.arch.output_tensor(store.has), slot - room)
            layers += [[c] for c in self.head_chunks]
            keys += [HeadChunk(c) for c in range(len(self.head_chunks))]
        n_keys = len(layers)
        bb = p.budget_bytes
        budget = bb[d] if isinstance(bb, tuple) else bb
        what = "device_budget" + (f" of {b.name}" if self.n_split > 1 else "")
        plan = self.memory_plan
        if budget is not None:
            if plan is not None and plan.mode == "auto":     # within what is available by construction
                if budget < p.stream_slots * slot:
                    raise too_small(plan, p.stream_slots * slot, f"{p.stream_slots} blocks of {slot} bytes streaming")
            else:
                self._check_available(budget, what, d)
            if self.experts_paged and p.expert_cache is None:
                budget = self._split_budget(store, budget, slot * n_keys, slot)
        elif p.n_gpu_layers is not None:
            budget = (p.n_gpu_layers + p.stream_slots) * slot
        else:
            budget = n_keys * slot         # dynamic layers alone, or a device without a budget: all pinned
        n_slots, n_pinned = plan_slots(budget, slot, n_keys, p.stream_slots)
        if n_slots < 1:
            big = blocks[sizes.index(slot)] if slot in sizes else blocks[0]
            raise ValueError(f"{what} of {budget} bytes is smaller than one layer: block {big} needs {slot} bytes")
        core = _core.LayerPager(store, layers, n_slots=n_slots, slot_size=slot, n_workers=N_IO_WORKERS,
                                backend=b, direct_io=self.direct_io, staged=p.staged_io)
        pager = WeightPager(core, keys, p.ahead)
        if p.n_gpu_layers is not None:
            n_pinned = min(n_pinned, p.n_gpu_layers)
        for i in range(n_pinned):
            pager.pin(keys[i])
        self.n_pinned += n_pinned
        return pager

    def _check_available(self, nbytes: int, what: str, dev: int = 0) -> None:
        """Refuses a budget larger than the memory the device has free now (host: as this process sees
        it, cgroup limit included), before anything is loaded."""
        b = self.backends[dev]
        used, total = device_memory_fn(b.device_type, b.device_name)()
        if total <= 0:
            return
        free = total - used
        if nbytes > free:
            h = _core.host_memory()
            where = (f"the host (total {total} bytes" + (f", cgroup limit {h['cgroup_limit']} bytes"
                                                         if h["cgroup_limit"] else "") + ")"
                     if b.device_type == "cpu" else f"{b.name} (total {total} bytes)")
            raise ValueError(f"{what} of {nbytes} bytes is more than the {free} bytes available on {where}")

    @property
    def kv_bytes(self) -> int:
        """Bytes of a contiguous K/V cache for the whole context (what paged_kv pages)."""
        c = self.settings.context
        return kv_bytes(self.hp, c.ctx_size, c.cache_type_k, c.cache_type_v)

    def stats(self) -> dict[str, Any]:
        """Counters of the sequences, the paged K/V, the layer pager and the scheduler, one dict."""
        d: dict[str, Any] = {"sequence": self.seq.id, "n_sequences": len(self._seqs), "n_tokens": self.seq.n_past,
                             "n_threads": self.backends[self.embed_dev].n_threads,
                             "weights_loading": self.loader is not None,
                             "devices": [b.name for b in self.backends[:self.n_split]],
                             "blocks_per_device": [self.layer_backend.count(i) for i in range(self.n_split)]}
        eps = {b.endpoint for b in self.backends if b.endpoint}
        if eps:              # what went over the wire to this model's servers (all users of them in this process)
            rs = _core.rpc_stats()
            d.update(rpc_bytes_sent=sum(int(rs[e]["bytes_sent"]) for e in eps if e in rs),
                     rpc_bytes_received=sum(int(rs[e]["bytes_received"]) for e in eps if e in rs),
                     remote_bytes=self.remote_bytes)
        d.update(passes=self.n_passes, sequences_per_pass=self.pass_sequences / max(self.n_passes, 1),
                 tokens_per_pass=self.pass_tokens / max(self.n_passes, 1))
        d.update(self.kv.stats())
        if self.memory_plan is not None:
            d["budget"] = self.memory_plan.as_dict()
        paged = [p.stats() for p in self.pagers if isinstance(p, WeightPager)]
        d.update(merge_stats(paged))
        if len(paged) > 1:
            d["pager_per_device"] = paged
        if self.experts is not None:
            d.update(self.experts.stats())
        if self.scheduler is not None:
            d.update(self.scheduler.stats())
        return d

    # -- lanes ----------------------------------------------------------------
    def lane_kv(self, il: int, n_lanes: int) -> tuple[Any, Any]:
        """Layer il's K and V for a graph: its tensors, or (n_lanes > 0) lists of the first n_lanes lanes'."""
        if not n_lanes:
            return self.k_cache[il], self.v_cache[il]
        self._ensure_lanes(n_lanes)
        return [self._lane_k[j][il] for j in range(n_lanes)], [self._lane_v[j][il] for j in range(n_lanes)]

    def _kv_tensors(self, ctx_of: Any) -> tuple[list[Any], list[Any]]:
        """A K and a V tensor per layer, of the cache's type and shape, made in ctx_of(layer)."""
        ks, vs = [], []
        for il in range(self.hp.n_layer):
            for src, out in ((self.k_cache[il], ks), (self.v_cache[il], vs)):
                out.append(ctx_of(il).new_tensor(src.type, src.ne[:2]))
        return ks, vs

    def _ensure_lanes(self, n: int) -> None:
        while len(self._lane_k) < n:
            j = len(self._lane_k)
            cx = _core.Context(max_tensors=2 * self.hp.n_layer)   # no memory: bound before each pass
            ks, vs = self._kv_tensors(lambda il: cx)
            for il, (k, v) in enumerate(zip(ks, vs)):
                k.name, v.name = f"cache_k_l{il}_s{j}", f"cache_v_l{il}_s{j}"
            self._lane_k.append(ks)
            self._lane_v.append(vs)
            self._lane_keep.append(cx)
            self._bound.append(None)

    @property
    def max_lanes(self) -> int:
        """Sequences one pass may hold: each needs a K/V frame per layer at once, so with fewer frames than
        layers (each layer owns one) only one."""
        if not self.settings.kv.paged_kv:
            return MAX_LANES
        parts = self.kv.parts if isinstance(self.kv, SplitKV) else [self.kv]
        if any(p.n_frames < p.n_layer for p in parts):
            return 1
        return min(MAX_LANES, min(p.n_frames for p in parts))

    def _storage(self, seq: int) -> tuple[list[Any], list[Any]]:
        """Without the paged KV cache: the K/V of `seq`, F16 [n_embd_gqa, n_ctx] per layer on its device
        (allocated on first use, zeroed)."""
        st = self._kv_store.get(seq)
        if st is None:
            hp, c = self.hp, self.settings.context
            self._check_available(self.kv_bytes, f"the K/V of sequence {seq} (ctx_size {c.ctx_size} tokens; paged_kv "
                                                 f"holds only the pages a sequence uses)")
            ctxs = [_core.Context(max_tensors=2 * hp.n_layer) for _ in self.backends]
            ks, vs = self._kv_tensors(lambda il: ctxs[self.layer_backend[il]])
            keep: list[Any] = list(ctxs)
            for i, b in enumerate(self.backends):
                if i in self.layer_backend:
                    buf = b.alloc_tensors(ctxs[i])
                    buf.clear(0)
                    keep.append(buf)
            st = self._kv_store[seq] = (ks, vs, keep)
        return st[0], st[1]

    def _bind_lanes(self, seqs: Sequence[int]) -> None:
        """Without the paged KV cache: lane j's tensors point at sequence seqs[j]'s K/V."""
        if self.settings.kv.paged_kv:
            return
        self._ensure_lanes(len(seqs))
        for j, seq in enumerate(seqs):
            if self._bound[j] == seq:
                continue
            ks, vs = self._storage(seq)
            for il in range(self.hp.n_layer):
                _core.tensor_alias(self._lane_k[j][il], ks[il])
                _core.tensor_alias(self._lane_v[j][il], vs[il])
            self._bound[j] = seq

    # -- sequences -----------------------------------------------------------
    def truncate(self, n: int) -> int:
        """Keeps the first n tokens of the current sequence and frees the K/V after them; the sequence has
        no last logits after it. Returns the tokens kept: none when sliding-window layers have already freed
        keys that position n needs (paged_kv without swa_full), as llama.cpp then re-evaluates the prompt."""
        if not 0 <= n <= self.seq.n_past:
            raise ValueError(f"truncate: n must be in [0, {self.seq.n_past}], not {n}")
        if not self.kv.can_truncate(self.seq.id, n):
            n = 0
        self.kv.truncate(self.seq.id, n)
        del self.seq.tokens[n:]
        self.seq.scores = None
        return n

    def use_sequence(self, seq: int) -> None:
        """Makes `seq` the sequence later evals extend (paged_kv keeps several; without it only 0)."""
        if seq < 0:
            raise ValueError("sequence ids are >= 0")
        if not self.seq.tokens:
            self._seqs.pop(self.seq.id)          # nothing cached: forgotten, as a dropped sequence is
        self.seq = self._seqs.setdefault(seq, SequenceState(seq))

    def eval_scratch(self, prompts: Sequence[Sequence[int]], *, logits_all: bool = False,
                     embed: bool = False) -> list[np.ndarray]:
        """eval_batch over sequences of their own (ids above every live one), dropped afterwards: a pass that
        leaves every sequence's cache as it was (echo's prompt logprobs, embeddings)."""
        base = max(self._seqs, default=0) + 1
        ids = list(range(base, base + len(prompts)))
        try:
            return self.eval_batch(list(zip(ids, prompts)), logits_all=logits_all, embed=embed)
        finally:
            for sid in ids:
                self.drop_sequence(sid)

    def drop_sequence(self, seq: int) -> None:
        """Frees every page of `seq` (the current sequence is emptied, the others forgotten); without the paged
        KV cache, its K/V storage (but sequence 0's)."""
        self.kv.truncate(seq, 0)
        if seq != 0 and self._kv_store.pop(seq, None) is not None:
            self._bound = [None if b == seq else b for b in self._bound]
            _core.host_memory_trim()       # K/V of a short context sits on the heap: give it back
        if seq == self.seq.id:
            self.seq.tokens.clear()
            self.seq.scores = None
        else:
            self._seqs.pop(seq, None)

    # -- one micro-batch ---------------------------------------------------
    def _plan(self, n: int, n_kv: int, n_out: int, lanes: tuple[tuple[int, int], ...] | None = None,
              embed: bool = False) -> "_Plan":
        """The graphs for micro-batches of this shape, built once and reused (embed: ending at the output norm,
        not the logits)."""
        key = (n, n_kv, n_out, lanes, embed)
        plan = self._plans.pop(key, None)
        if plan is None:
            plan = _Plan.build(self, n, n_kv, n_out, lanes, embed)
        self._plans[key] = plan            # most recently used last
        if len(self._plans) > PLAN_CACHE:
            while len(self._plans) > PLAN_CACHE:
                self._plans.pop(next(iter(self._plans)))
            _core.host_memory_trim()       # the graphs' contexts are a few MiB: give the heap back
        return plan

    def head_out(self, n_out: int) -> list[Any]:
        """The streamed head's input and output buffers, shared by every plan: [context, buffer, head_in
        (F32 [n_embd, rows]), logits (F32 [n_vocab, rows])] for at least n_out rows. Grown (to a power of two
        up to 16 rows, a multiple of 16 above) when a plan needs more rows; the cached plans then go."""
        if self._head_out is None or self._head_out[0] < n_out:
            rows = 1 << (n_out - 1).bit_length() if n_out <= 16 else -(-n_out // 16) * 16
            self._plans.clear()
            self._head_out = None
            _core.host_memory_trim()
            hctx = _core.Context(max_tensors=2)
            head_in = hctx.new_tensor(F32, [self.hp.n_embd, rows])
            lb = hctx.new_tensor(F32, [self.hp.n_vocab, rows])
            self._head_out = (rows, [hctx, self.backends[self.head_dev].alloc_tensors(hctx), head_in, lb])
        return self._head_out[1]

    def _kv_rows(self, p0: int, n: int, n_kv: int) -> tuple[np.ndarray, ...]:
        """A sequence's rows of a pass at positions p0..p0+n over its first n_kv K/V rows: positions, the
        causal mask (and the sliding-window one, or None), the K rows and V indices written."""
        hp, c = self.hp, self.settings.context
        pos = np.arange(p0, p0 + n, dtype=np.int32)
        kv_pos = np.arange(n_kv)[None, :]
        mtype = np.float16 if c.flash_attn else np.float32
        mask = np.where(kv_pos <= pos[:, None], 0.0, -np.inf).astype(mtype)
        # sliding-window layers: keys more than n_swa - 1 positions back are masked too (llama.cpp's is_masked_swa)
        swa = self.arch.n_swa
        mask_swa = (np.where((kv_pos <= pos[:, None]) & (pos[:, None] - kv_pos < swa), 0.0, -np.inf).astype(mtype)
                    if swa else None)
        if c.flash_attn:
            v_idxs = pos.astype(np.int64)
        else:
            chan = np.arange(hp.n_embd_gqa, dtype=np.int64)
            v_idxs = (chan[None, :] * c.ctx_size + pos[:, None]).reshape(-1)
        return pos, mask, mask_swa, pos.astype(np.int64), v_idxs

    @staticmethod
    def _set_kv_rows(inp: StepInputs, rows: tuple[np.ndarray, ...]) -> None:
        _, mask, mask_swa, k_idxs, v_idxs = rows
        _core.tensor_set(inp.mask, mask)
        if mask_swa is not None:
            _core.tensor_set(inp.mask_swa, mask_swa)
        _core.tensor_set(inp.k_idxs, k_idxs)
        _core.tensor_set(inp.v_idxs, v_idxs)

    def _ubatch(self, tokens: Sequence[int], out_rows: Sequence[int]) -> np.ndarray | None:
        return self._pass([(self.seq, tokens)], out_rows)

    def _pass(self, items: Sequence[tuple[SequenceState, Sequence[int]]], out_rows: Sequence[int],
              embed: bool = False) -> np.ndarray | None:
        """One forward pass over the tokens of one or more sequences (each in its own lane, its rows after the
        previous one's); returns the logits of out_rows (rows of the whole pass), or None. embed: the output
        norm's rows (F32 [n_out, n_embd]) instead of the logits."""
        c = self.settings.context
        rows, shapes, starts, ahead = [], [], [], {}
        for seq, toks in items:               # a sequence may have several lanes, one after another
            p0, n = seq.n_past + ahead.get(seq.id, 0), len(toks)
            ahead[seq.id] = ahead.get(seq.id, 0) + n
            n_kv = min(c.ctx_size, -(-(p0 + n) // KV_PAD) * KV_PAD)
            rows.append(self._kv_rows(p0, n, n_kv))
            shapes.append((n, n_kv))
            starts.append(p0)
        n = sum(x for x, _ in shapes)
        lanes = tuple(shapes) if len(items) > 1 else None
        plan = self._plan(n, 0 if lanes else shapes[0][1], len(out_rows), lanes, embed)
        tokens = np.concatenate([np.asarray(t, dtype=np.int32) for _, t in items])
        pos = np.concatenate([r[0] for r in rows])
        for inp in plan.all_inputs:
            _core.tensor_set(inp.tokens, tokens)
            _core.tensor_set(inp.positions, pos)
            _core.tensor_set(inp.out_ids, np.asarray(out_rows or [0], dtype=np.int32))
            for lane, r in zip(inp.lanes or [inp], rows):
                self._set_kv_rows(lane, r)
        self._bind_lanes([seq.id for seq, _ in items])
        self.n_passes += 1
        self.pass_sequences += len(items)
        self.pass_tokens += n
        logits = self._compute(plan, n, [(seq.id, p0, len(t)) for (seq, t), p0 in zip(items, starts)])
        for seq, toks in items:
            seq.tokens.extend(int(t) for t in toks)
        if not out_rows:
            return None
        return _core.tensor_get(logits).reshape(len(out_rows), self.hp.n_embd if embed else self.hp.n_vocab)

    def _compute(self, plan: "_Plan", n: int, lanes: Sequence[tuple[int, int, int]]) -> Any:
        """Runs the micro-batch's graphs in order; returns the tensor that holds its logits (if any). lanes:
        (sequence, n_past, tokens) of each sequence in the pass."""
        if self._one_graph():
            self.backend.compute(plan.whole(self))     # one graph per micro-batch, as llama.cpp runs it
            return plan.whole_logits
        self._before_pass(n)
        rec = self.timings if self.record_timings else None
        if rec is not None:
            rec.clear()
        dev = plan.steps[0].dev
        t_pass = time.time()
        first: dict[int, int] = {}            # a sequence's first position in the pass
        for seq, p0, _ in lanes:
            first[seq] = min(first.get(seq, p0), p0)
        for seq, p0 in first.items():
            self.kv.begin(seq, p0)
        for i, step in enumerate(plan.steps):
            t0 = time.time()
            dev, tc = self._run_step(plan, step, dev, lanes, first)
            if rec is not None:
                rec.append(self._timing(i, step, t0, tc))
        if self.loader is not None and self.loader.done():
            self.loader = None
        if self.experts is not None:
            self.experts.pass_done(n, time.time() - t_pass)
        return plan.logits

    def _run_step(self, plan: "_Plan", step: Step, dev: int, lanes: Sequence[tuple[int, int, int]],
                  first: dict[int, int]) -> tuple[int, float]:
        """Runs one graph of a pass once its weights, experts and K/V are in; returns the device the activations
        are on after it and when its computation started."""
        self._loaded(step.group)
        if step.dev != dev:                        # a pipeline by blocks: the activations move along
            _core.tensor_copy(*plan.move(self, dev, step.dev, step.rows_in))
            dev = step.dev
        if step.experts is not None:               # the router's choice for its rows, as cache slots
            k, il, r0 = self.hp.n_expert_used, step.experts, step.expert_row0
            rows = step.expert_ids.ne[1]
            sel = _core.tensor_get(self.moe_sel).reshape(-1)[r0 * k:(r0 + rows) * k]
            _core.tensor_set(step.expert_ids, self.experts.map(il, sel))
            if step.expert_ahead:                  # the next block's first chunk loads while this computes
                self.experts.lookahead(il + 1, _core.tensor_get(self.moe_guess).reshape(-1)[:step.expert_ahead * k])
        layer = step.layer
        kv = contextlib.nullcontext() if layer is None else self.kv.use(layer, [
            (seq, first[seq], p0 + m, self._lane_k[j][layer] if j else None, self._lane_v[j][layer] if j else None)
            for j, (seq, p0, m) in enumerate(lanes)])
        with self.pagers[dev].use(step.key), kv:
            tc = time.time()
            try:
                self.backends[dev].compute(step.graph)
            finally:
                if step.experts is not None:
                    self.experts.release()
        return dev, tc

    def time_blocks(self, blocks: Sequence[int], *, repeats: int = 3) -> dict[int | str, float]:
        """Seconds of computation of each of `blocks`, and of the lm head ("head"), for one token decoded after
        the current sequence: the median of `repeats` runs after one that brings the weights in. Only their
        weights are read (nothing is prefetched meanwhile). The sequence keeps its tokens; the K/V row after
        them is written (the next eval writes it again). What analyze scales by the blocks of each shape."""
        seq, c = self.seq, self.settings.context
        p0 = seq.n_past
        if p0 >= c.ctx_size:
            raise ValueError("time_blocks needs a free position in the context")
        if any(not 0 <= il < self.hp.n_layer for il in blocks):
            raise ValueError(f"blocks are in 0..{self.hp.n_layer - 1}")
        n_kv = min(c.ctx_size, -(-(p0 + 1) // KV_PAD) * KV_PAD)
        rows = self._kv_rows(p0, 1, n_kv)
        plan = self._plan(1, n_kv, 1)
        for inp in plan.all_inputs:
            _core.tensor_set(inp.tokens, np.zeros(1, dtype=np.int32))
            _core.tensor_set(inp.positions, rows[0])
            _core.tensor_set(inp.out_ids, np.zeros(1, dtype=np.int32))
            self._set_kv_rows(inp, rows)
        self._bind_lanes([seq.id])
        self._before_pass(1)                      # the threads a decoded token computes with
        lanes, first = [(seq.id, p0, 1)], {seq.id: p0}
        self.kv.begin(seq.id, p0)
        depths = [getattr(pg, "depth", 0) for pg in self.pagers]
        for pg in self.pagers:
            if isinstance(pg, WeightPager):
                pg.depth = 0
        out: dict[int | str, float] = {}
        try:
            dev = plan.steps[0].dev
            dev, _ = self._run_step(plan, plan.steps[0], dev, lanes, first)     # the embedding: acts hold a row
            groups: list[tuple[int | str, list[Step]]] = [
                (il, [st for st in plan.steps if st.group == il and st.kind != "head"]) for il in blocks]
            groups.append(("head", [st for st in plan.steps if st.kind == "head"]))
            for name, steps in groups:
                times = []
                for r in range(repeats + 1):
                    t = 0.0
                    for st in steps:
                        dev, tc = self._run_step(plan, st, dev, lanes, first)
                        t += time.time() - tc
                    if r:
                        times.append(t)
                out[name] = float(np.median(times))
        finally:
            for pg, d in zip(self.pagers, depths):
                if isinstance(pg, WeightPager):
                    pg.depth = d
        return out

    def _one_graph(self) -> bool:
        """Everything resident on one device, loaded, untimed: nothing to do between blocks."""
        return (len(self.backends) == 1 and self.loader is None and not self.record_timings
                and not self.paged and not self.settings.kv.paged_kv and self.experts is None)

    def _before_pass(self, n: int) -> None:
        if self.scheduler is not None:
            self.scheduler.step()
        if self._decode_threads is not None:
            want = self._decode_threads if n == 1 else self.settings.context.threads
            if self.backend.n_threads != want:
                self.backend.n_threads = want

    def _timing(self, i: int, step: Step, t0: float, tc: float) -> dict[str, Any]:
        t1 = time.time()
        r = dict(layer=i, kind=step.kind, t_start=t0, t_end=t1, wait_ms=(tc - t0) * 1e3, load_ms=0.0,
                 compute_ms=(t1 - tc) * 1e3)
        last = self.pagers[step.dev].last_load(step.key)
        if last is not None:
            r.update(load_start=last[0], load_end=last[1], load_ms=(last[1] - last[0]) * 1e3)
        return r

    def _check_feed(self, seq: SequenceState, tokens: Sequence[int], where: str) -> None:
        """ValueError unless `tokens` may extend `seq`: at least one, in the vocabulary, within ctx_size."""
        n, n_ctx = len(tokens), self.settings.context.ctx_size
        if n == 0:
            raise ValueError("eval needs at least one token")
        if seq.n_past + n > n_ctx:
            raise ValueError(f"context overflow{where}: {seq.n_past} cached + {n} new tokens > ctx_size {n_ctx}")
        bad = [t for t in tokens if not 0 <= int(t) < self.hp.n_vocab]
        if bad:
            raise ValueError(f"token id {bad[0]} out of range [0, {self.hp.n_vocab})")

    def _rollback(self, seq: SequenceState, start: int) -> None:
        """After a failed eval: `seq` forgets its tokens from `start` on (all or nothing: rows written past it
        are overwritten later), or all of them when a sliding window already moved past what `start` needs."""
        del seq.tokens[start:]
        if not self.kv.can_truncate(seq.id, start):
            self.kv.truncate(seq.id, 0)
            seq.tokens.clear()
            seq.scores = None

    def keep_prefix(self, tokens: Sequence[int]) -> int:
        """Truncates the current sequence to its longest cached prefix of tokens[:-1] (the last token is always
        fed again, for its logits); returns the tokens kept (see truncate)."""
        keep = 0
        for a, b in zip(self.seq.tokens, tokens[:-1]):
            if a != b:
                break
            keep += 1
        return self.truncate(keep)

    # -- public --------------------------------------------------------------
    def eval(self, tokens: Sequence[int], *, logits_all: bool = False) -> np.ndarray:
        """Feeds tokens to the current sequence at positions n_past..; returns F32 logits [n_out, n_vocab]
        (every position if logits_all, else the last one), also kept as the sequence's scores."""
        n, seq = len(tokens), self.seq
        self._check_feed(seq, tokens, "")
        outs = []
        b = self.settings.context.n_batch
        start = seq.n_past
        try:
            for i in range(0, n, b):
                chunk = tokens[i:i + b]
                last = i + len(chunk) == n
                rows = list(range(len(chunk))) if logits_all else ([len(chunk) - 1] if last else [])
                r = self._ubatch(chunk, rows)
                if r is not None:
                    outs.append(r)
        except BaseException:
            self._rollback(seq, start)
            raise
        seq.scores = np.concatenate(outs, axis=0)
        return seq.scores

    def eval_rows(self, tokens: Sequence[int]) -> np.ndarray:
        """Feeds tokens to the current sequence in passes where each token is a lane of its own over the
        sequence's K/V, as if fed alone: row i of the logits F32 [n, n_vocab] (kept as the scores) is what
        eval() of the tokens one by one gives at token i (bit for bit when the matrix products round alike over
        more rows: batch_invariant, or weights without row-tiled kernels). Checks a speculative draft."""
        seq = self.seq
        self._check_feed(seq, tokens, "")
        start, outs = seq.n_past, []
        step = min(MAX_LANES, self.settings.context.n_batch)
        try:
            for i in range(0, len(tokens), step):
                chunk = tokens[i:i + step]
                outs.append(self._pass([(seq, [t]) for t in chunk], list(range(len(chunk)))))
        except BaseException:
            self._rollback(seq, start)
            raise
        seq.scores = outs[0] if len(outs) == 1 else np.concatenate(outs, axis=0)
        return seq.scores

    def eval_batch(self, batch: Sequence[tuple[int, Sequence[int]]], *, logits_all: bool = False,
                   embed: bool = False) -> list[np.ndarray]:
        """Feeds tokens to several sequences (distinct ids; each at its positions n_past..) in shared forward
        passes: as llama.cpp's llama_batch, each pass holds up to n_batch tokens from up to max_lanes
        sequences, each attending over its own K/V. Returns per item its logits F32 [n_out, n_vocab] (every
        position if logits_all, else the last), also kept as that sequence's scores. The current sequence
        stays current. A sequence's logits are those of eval() on it alone, up to the rounding of matrix
        products over more rows. embed: the output norm's rows F32 [n_out, n_embd] (the hidden states the lm
        head reads; embeddings) instead of logits."""
        seqs = [int(s) for s, _ in batch]
        if len(set(seqs)) != len(seqs):
            raise ValueError("eval_batch: each sequence may appear once")
        states = []
        for sid, toks in batch:
            if sid < 0:
                raise ValueError("sequence ids are >= 0")
            st = self._seqs.get(sid) or SequenceState(sid)
            self._check_feed(st, toks, f" in sequence {sid}")
            states.append(st)
        for st in states:
            self._seqs.setdefault(st.id, st)
        if len(batch) == 1 and states[0] is self.seq and not embed:
            return [self.eval(batch[0][1], logits_all=logits_all)]
        starts = [st.n_past for st in states]
        done = [0] * len(batch)
        outs: list[list[np.ndarray]] = [[] for _ in batch]
        b, lanes = self.settings.context.n_batch, self.max_lanes
        try:
            while any(d < len(t) for d, (_, t) in zip(done, batch)):
                items, owners, out_rows, row, room = [], [], [], 0, b
                for i, (_, toks) in enumerate(batch):
                    if done[i] >= len(toks) or room == 0 or len(items) == lanes:
                        continue
                    chunk = toks[done[i]:done[i] + room]
                    last = done[i] + len(chunk) == len(toks)
                    want = list(range(len(chunk))) if logits_all else ([len(chunk) - 1] if last else [])
                    out_rows += [row + r for r in want]
                    items.append((states[i], chunk))
                    owners.append((i, len(want)))
                    row += len(chunk)
                    room -= len(chunk)
                    done[i] += len(chunk)
                logits = self._pass(items, out_rows, embed)
                at = 0
                for i, k in owners:
                    if k:
                        outs[i].append(logits[at:at + k])   # views of the pass's array: no copy per sequence
                        at += k
        except BaseException:
            for st, start in zip(states, starts):
                self._rollback(st, start)
            raise
        result = []
        for st, o in zip(states, outs):
            st.scores = o[0] if len(o) == 1 else np.concatenate(o, axis=0)
            result.append(st.scores)
        return result


class _Plan:
    """Step inputs plus the embedding, block and output graphs for one micro-batch shape."""

    def __init__(self) -> None:
        self.keep: list[Any] = []       # contexts and buffers the graphs point into
        self.steps: list[Step] = []
        self._whole: Any = None
        self.whole_logits: Any = None
        self.logits: Any = None
        self.all_inputs: list[StepInputs] = []   # one set per device, filled alike
        self.lanes: tuple[tuple[int, int], ...] | None = None
        self.embed = False               # ends at the output norm (embeddings), not the logits
        self._moves: dict[tuple[int, int, int], tuple[Any, Any, Any]] = {}

    def move(self, ex: Executor, a: int, b: int, rows: int) -> tuple[Any, Any]:
        """The first `rows` activation rows of device a and of device b (F32 [n_embd, rows] views): what
        moves from a to b when the pass changes device."""
        v = self._moves.get((a, b, rows))
        if v is None:
            cx = _core.Context(max_tensors=2)
            src, dst = ex.acts[a], ex.acts[b]
            v = self._moves[(a, b, rows)] = (cx.view(src, [ex.hp.n_embd, rows], [src.nb[1]], 0),
                                             cx.view(dst, [ex.hp.n_embd, rows], [dst.nb[1]], 0), cx)
        return v[0], v[1]

    @classmethod
    def build(cls, ex: Executor, n: int, n_kv: int, n_out: int,
              lanes: tuple[tuple[int, int], ...] | None = None, embed: bool = False) -> "_Plan":
        """`lanes`: a pass over several sequences, (tokens, n_kv) of each in row order; each attends over its
        own K/V (lane j's tensors, Executor.lane_kv)."""
        hp, p, arch, w = ex.hp, ex.settings.context, ex.arch, ex.weights
        self = cls()
        self.lanes = lanes
        self.embed = embed
        mtype = F16 if p.flash_attn else F32

        def kv_inputs(ictx: Any, n: int, n_kv: int, tag: str) -> dict[str, Any]:
            t = {
                "mask": ictx.new_tensor(mtype, [n_kv, n]),
                **({"mask_swa": ictx.new_tensor(mtype, [n_kv, n])} if arch.n_swa else {}),
                "k_idxs": ictx.new_tensor(I64, [n]),
                "v_idxs": ictx.new_tensor(I64, [n] if p.flash_attn else [n * hp.n_embd_gqa]),
            }
            for name, x in t.items():
                x.name = "inp_" + name + tag
            return t

        for di, b in enumerate(ex.backends):
            ictx = _core.Context(max_tensors=4 + 4 * (len(lanes) if lanes else 1))
            t = {
                "tokens": ictx.new_tensor(I32, [n]),
                "positions": ictx.new_tensor(I32, [n]),
                "out_ids": ictx.new_tensor(I32, [max(n_out, 1)]),
            }
            for name, x in t.items():
                x.name = "inp_" + name
            rot = {"k_rot": ex.rot[di].get("k"), "v_rot": ex.rot[di].get("v")}
            if lanes is None:
                inp = StepInputs(n_tokens=n, n_kv=n_kv, n_outputs=n_out, flash_attn=p.flash_attn, **t, **rot,
                                 **kv_inputs(ictx, n, n_kv, ""))
            else:
                lane_inputs, r0 = [], 0
                for j, (nj, kvj) in enumerate(lanes):
                    lane_inputs.append(StepInputs(n_tokens=nj, n_kv=kvj, n_outputs=0, tokens=None, positions=None,
                                                  out_ids=None, flash_attn=p.flash_attn, row0=r0, **rot,
                                                  **kv_inputs(ictx, nj, kvj, f"_s{j}")))
                    r0 += nj
                inp = StepInputs(n_tokens=n, n_kv=n_kv, n_outputs=n_out, flash_attn=p.flash_attn, mask=None,
                                 k_idxs=None, v_idxs=None, lanes=lane_inputs, **t)
            self.keep += [ictx, b.alloc_tensors(ictx)]
            self.all_inputs.append(inp)
        n_lanes = len(lanes) if lanes else 0

        def graph(build: Any, kind: str, rows_in: int = n, rows_out: int = n, key: Key | None = None,
                  layer: int | None = None, dev: int = 0, group: int | None = None, experts: int | None = None,
                  expert_ids: Any = None, expert_row0: int = 0, expert_ahead: int = 0) -> Any:
            nodes = GRAPH_NODES + LANE_NODES * n_lanes
            while True:     # a context as small as the graph allows (they are kept with the plan): grown on overflow
                ctx = _core.Context(max_tensors=nodes, graph_size=nodes)
                gf = ctx.new_graph()
                a = ex.acts[dev]
                w.device = dev                  # the weights as this device holds them
                act = ctx.view(a, [hp.n_embd, rows_in], [a.nb[1]], 0)
                act_out = act if rows_out == rows_in else ctx.view(a, [hp.n_embd, rows_out], [a.nb[1]], 0)
                try:
                    out = build(ctx, gf, act, act_out, self.all_inputs[dev])
                    gf.expand(out)
                    break
                except SuperggmlError as e:
                    if "is full" not in str(e) or nodes >= GRAPH_NODES_MAX:
                        raise
                    nodes *= 2
            self.keep.append(ctx)
            self.steps.append(Step(gf, kind, rows_in, key, layer, dev, group, experts, expert_ids, expert_row0,
                                   expert_ahead))
            return out

        n_last = min(n, max(n_out, 1))           # rows the last block keeps
        paged = ex.paged
        graph(lambda ctx, gf, act, act_out, inp: ctx.cpy(arch.build_embed(ctx, w, inp), act), "embed",
              dev=ex.embed_dev)
        for il in range(hp.n_layer):
            rows = n_last if il == hp.n_layer - 1 else n
            if ex.experts is not None:
                self._build_moe_block(ex, graph, il, rows, Block(il) if paged else None)
                continue
            graph(lambda ctx, gf, act, act_out, inp, il=il: ctx.cpy(
                arch.build_block(ctx, gf, w, inp, il, act, *ex.lane_kv(il, n_lanes)), act_out), "block",
                rows_out=rows, key=Block(il) if paged else None, layer=il, dev=ex.layer_backend[il], group=il)
        if n_out and paged and not embed:
            self._build_chunked_head(ex, graph, n_out)
        elif n_out:
            def head(ctx: Any, gf: Any, act: Any, act_out: Any, inp: StepInputs) -> Any:
                out = arch.build_output_norm(ctx, w, act) if embed else arch.build_output(ctx, w, inp, act)
                out.set_output()
                return out
            self.logits = graph(head, "head", rows_in=n_out, rows_out=n_out, dev=ex.layer_backend[-1],
                                group=hp.n_layer)
        return self

    def whole(self, ex: Executor) -> Any:
        """The micro-batch as one graph, built on first use, as llama.cpp builds it: each block's output is
        the next block's input (no copy through the activation buffer), one allocation and one thread-pool
        launch per step. The same operations as the per-block graphs: the same results. Only for resident
        weights on one device (the paged paths need to act between blocks); whole_logits holds the logits."""
        if self._whole is None:
            hp, arch, w, inp = ex.hp, ex.arch, ex.weights, self.all_inputs[0]
            w.device = 0
            size = 2 * sum(s.graph.n_nodes for s in self.steps) + 512
            ctx = _core.Context(max_tensors=size, graph_size=size)
            gf = ctx.new_graph()
            x = arch.build_embed(ctx, w, inp)
            n_lanes = len(self.lanes) if self.lanes else 0
            for il in range(hp.n_layer):
                x = arch.build_block(ctx, gf, w, inp, il, x, *ex.lane_kv(il, n_lanes))
            if inp.n_outputs:
                x = arch.build_output_norm(ctx, w, x) if self.embed else arch.build_output(ctx, w, inp, x)
                x.set_output()
                self.whole_logits = x
            gf.expand(x)
            self.keep.append(ctx)
            self._whole = gf
        return self._whole

    def _build_moe_block(self, ex: Executor, graph: Any, il: int, rows: int, key: Key | None) -> None:
        """A block whose experts come from the expert cache: attention and router in one graph (its state
        kept in the executor's moe_* tensors), then the routed experts, with their ids remapped to cache
        slots in between (Step.experts), in graphs over chunks of ex.expert_rows rows (the experts one chunk
        routes to fit the cache at once; each row's result does not depend on the others in its chunk)."""
        hp, arch, w = ex.hp, ex.arch, ex.weights
        k, p = hp.n_expert_used, f"blk.{il}."

        def rows_of(ctx: Any, t: Any, r0: int = 0, n: int = rows) -> Any:   # columns [r0, r0+n) of a [*, n_batch]
            return ctx.view(t, [t.ne[0], n], [t.nb[1]], r0 * t.nb[1])

        def weights_of(ctx: Any, r0: int = 0, n: int = rows) -> Any:          # F32 [1, k, n]
            t = ex.moe_w
            return ctx.view(t, [1, k, n], [t.nb[1], t.nb[2]], r0 * t.nb[2])

        def attn_router(ctx: Any, gf: Any, act: Any, act_out: Any, inp: StepInputs) -> Any:
            ffn_inp, cur = arch.build_attn_part(ctx, gf, w, inp, il, act,
                                                *ex.lane_kv(il, len(self.lanes) if self.lanes else 0))
            sel, weights = moe.build_router(arch, ctx, w, p, cur)
            pairs = [(ffn_inp, rows_of(ctx, ex.moe_inp)), (cur, rows_of(ctx, ex.moe_cur)),
                     (sel, rows_of(ctx, ex.moe_sel)), (weights, weights_of(ctx))]
            if ex.moe_guess is not None and il + 1 < hp.n_layer:
                pairs.insert(0, (moe.build_router_lookahead(arch, ctx, w, il, cur), rows_of(ctx, ex.moe_guess)))
            shared = moe.build_shared_expert_only(arch, ctx, w, p, cur)     # over every row: a matmul's result
            if shared is not None:                                          # may depend on how many it has
                pairs.insert(0, (shared, rows_of(ctx, ex.moe_shared)))
            outs = [ctx.cpy(src, dst) for src, dst in pairs]
            for o in outs[:-1]:
                gf.expand(o)
            return outs[-1]

        graph(attn_router, "block", rows_out=rows, key=key, layer=il, group=il)
        step = ex.expert_rows
        for r0 in range(0, rows, step):
            n = min(step, rows - r0)
            ictx = _core.Context(max_tensors=1)
            ids = ictx.new_tensor(I32, [k, n])
            ids.name = f"inp_expert_slots_l{il}_r{r0}"
            self.keep += [ictx, ex.backend.alloc_tensors(ictx)]

            def experts(ctx: Any, gf: Any, act: Any, act_out: Any, inp: StepInputs, r0: int = r0, n: int = n,
                        ids: Any = ids) -> Any:
                cur = rows_of(ctx, ex.moe_cur, r0, n)
                out = moe.build_experts(arch, ctx, w, p, cur, ids, rows_of(ctx, ex.moe_sel, r0, n),
                                        weights_of(ctx, r0, n), *ex.experts.views[il])
                if ex.moe_shared is not None:
                    out = ctx.add(out, rows_of(ctx, ex.moe_shared, r0, n))
                return ctx.cpy(arch.build_ffn_out(ctx, w, p, out, rows_of(ctx, ex.moe_inp, r0, n)),
                               rows_of(ctx, act, r0, n))

            last = r0 + n >= rows
            ahead = min(step, rows) if last and ex.moe_guess is not None and il + 1 < hp.n_layer else 0
            graph(experts, "experts", rows_in=rows, rows_out=rows, key=key, group=il, experts=il, expert_ids=ids,
                  expert_row0=r0, expert_ahead=ahead)

    def _build_chunked_head(self, ex: Executor, graph: Any, n_out: int) -> None:
        """Output norm into head_in (F32 [n_embd, n_out]), then one graph per streamed row chunk
        of the lm head, each writing its rows of the logits (F32 [n_vocab, n_out])."""
        hp, w = ex.hp, ex.weights
        shared = ex.head_out(n_out)
        vctx = _core.Context(max_tensors=2)
        head_in = vctx.view(shared[2], [hp.n_embd, n_out], [shared[2].nb[1]], 0)
        lb = vctx.view(shared[3], [hp.n_vocab, n_out], [shared[3].nb[1]], 0)
        self.keep += [shared, vctx]
        dev = ex.head_dev
        graph(lambda ctx, gf, act, act_out, inp: ctx.cpy(ex.arch.build_output_norm(ctx, w, act), head_in),
              "head", rows_in=n_out, rows_out=n_out, dev=dev)
        row0 = 0
        for c, name in enumerate(ex.head_chunks):
            rows = w(name).ne[1]

            def chunk(ctx: Any, gf: Any, act: Any, act_out: Any, inp: StepInputs, name: str = name,
                      r0: int = row0, rows: int = rows) -> Any:
                dst = ctx.view(lb, [rows, n_out], [lb.nb[1]], r0 * lb.element_size)
                return ctx.cpy(ctx.mul_mat(w(name), head_in), dst)

            graph(chunk, "head", rows_in=n_out, rows_out=n_out, key=HeadChunk(c), dev=dev)
            row0 += rows
        if ex.arch.final_softcap:        # what follows the head's matmul, over all of its rows
            graph(lambda ctx, gf, act, act_out, inp: ctx.cpy(ex.arch.build_logits(ctx, lb), lb), "head",
                  rows_in=n_out, rows_out=n_out, dev=dev)
        self.logits = lb

