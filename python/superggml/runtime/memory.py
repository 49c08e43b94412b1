"""Sequence memory: what each sequence keeps between forward passes, behind one interface (llama.cpp's
llama_memory_i).

A pass holds up to `max_lanes` sequences, each in a lane. Graphs read and write a layer's memory through the
lane's tensors (`layer_tensors`); before a pass `bind` points the lanes at the sequences' storage, `begin` tells
each sequence where its rows start, and every block's step runs inside `use(layer, lanes)`. Two kinds exist:

- ContiguousKV: K/V F16 (or the cache type) [n_embd_gqa, ctx_size] per layer and per sequence, a slot of a
  pool per layer taken when the sequence first runs; `use` does nothing. The sequences of a pass on consecutive
  slots are read as one stream tensor per layer (`streams`).
- PagedKV: pages of `kv_page_size` tokens in a native.KVCache per device; a layer's frame is bound to the lane's
  tensors while the layer runs, host and spill tiers behind it.

A latent K/V (multi-head latent attention, hp.latent_kv) is a ContiguousKV of K only: one [kv_lora_rank + n_rot,
ctx] tensor per layer, V read from it (PagedKV pages it the same way, K only). The recurrent state of gated
delta-net layers, and the hybrid memory that routes each layer to it or to a K/V memory, are in recurrent.py.
"""

from __future__ import annotations

import abc
import contextlib
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from .. import native
from ..settings import KV_QUANTIZED, Settings
from .pagers import merge_stats
from .devices import Devices
from .memory_plan import kv_type

MAX_LANES = 64  # sequences one pass holds at most
Lane = tuple[int, int, int]  # (sequence, rows valid before the step, rows valid after it)


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


def check_latent_types(hp: Any, type_k: str, type_v: str) -> None:
    """ValueError unless a latent K/V (V read from K) can be held in these cache types: the same one for K and V
    (llama.cpp's rule), whose blocks divide V's values as well as K's."""
    if type_k != type_v:
        raise ValueError(
            f"the latent K/V of {hp.arch} is one cache: cache_type_k ({type_k}) and cache_type_v "
            f"({type_v}) must be the same, as llama.cpp requires (kv_type sets both)"
        )
    if hp.head_dim_v % native.blck_size(kv_type(type_k)):
        raise ValueError(
            f"cache_type_k={type_k} stores blocks of {native.blck_size(kv_type(type_k))} values, which "
            f"this model's latent V of {hp.head_dim_v} does not divide into"
        )


RECORD_ROWS = 16  # passes of one sequence of 2..this many rows leave their inputs (record_tensor)


def records(n: int, one_sequence: bool) -> bool:
    """Whether a pass of n rows leaves its inputs in the record tensors: one sequence's speculative check, or a
    short run of prompt tokens (their memory can then go back to any row of it)."""
    return one_sequence and 1 < n <= RECORD_ROWS


class SequenceMemory(abc.ABC):
    """The memory of every sequence, for the executor."""

    max_lanes: int = MAX_LANES

    @abc.abstractmethod
    def layer_tensors(self, il: int, n_lanes: int, streams: bool = False) -> tuple[Any, Any]:
        """Layer il's memory tensors for a graph: the first lane's, or (n_lanes > 0) lists of n_lanes lanes', or
        (streams) one tensor holding n_lanes sequences' memory one after another."""

    @abc.abstractmethod
    def bind(self, seqs: Sequence[int], streams: bool = False) -> None:
        """Before a pass: lane j's tensors reach sequence seqs[j]'s memory (streams: the stream tensors reach
        all of them)."""

    def streams(self, seqs: Sequence[int]) -> bool:
        """Whether a pass over these sequences (in lane order) can read their memory as one tensor per layer,
        each sequence a stream of it (layer_tensors(il, len(seqs), streams=True))."""
        return False

    def order(self, seq: int) -> int:
        """Where `seq`'s memory lies: a pass puts its sequences in this order (then streams may hold)."""
        return 0

    def begin(self, seq: int, p0: int, n: int = 1) -> None:
        """A pass of `seq` starts at position p0 and feeds n of its tokens."""

    def restored(self, seq: int, n: int) -> None:
        """`seq`, empty, is about to hold n tokens written into its tensors directly (a saved sequence)."""
        self.begin(seq, 0, n)

    def record_tensor(self, il: int) -> Any:
        """Where layer il's graph leaves a pass's inputs so that memory can go back into the pass (a recurrent
        state replays them), or None; only for the passes `records` names."""
        return None

    def checkpoint(self, seq: int) -> None:
        """`seq` can come back to where it is now (truncate_point), until it is truncated before that."""

    def use(self, layer: int, lanes: Sequence[Lane]) -> contextlib.AbstractContextManager[None]:
        """While a step of `layer` runs over `lanes` (the pass's, in lane order)."""
        return contextlib.nullcontext()

    def mirror(self, layers: Sequence[int], backend: Any) -> bool:
        """Keeps the memory of `layers` on `backend` (the host) too, so that their blocks can compute there or on
        their own device, pass by pass (place); False where this memory cannot."""
        return False

    def place(self, layer: int, host: bool) -> int:
        """Before a pass whose graph of `layer` runs on the host (host) or on the layer's device: its tensors
        reach that copy, brought up to date from the other if that one was written last. Returns the bytes
        moved."""
        return 0

    def can_truncate(self, seq: int, n: int) -> bool:
        """Whether `seq` can go back to its first n tokens."""
        return True

    def truncate_point(self, seq: int, n: int) -> int:
        """The most of its first n tokens `seq` can go back to (the rest are fed again)."""
        return n if self.can_truncate(seq, n) else 0

    @abc.abstractmethod
    def truncate(self, seq: int, n: int) -> None:
        """`seq` keeps its first n tokens (n = 0: it is emptied)."""

    def drop(self, seq: int) -> None:
        """`seq` is gone: its memory is freed."""
        self.truncate(seq, 0)

    def stats(self) -> dict[str, Any]:
        return {}


class KVLanes:
    """The K/V tensors graphs read, one set per lane: per layer K [n_embd_gqa, ctx] and V of the cache's
    types, holding no memory of their own (a memory points them at a sequence's storage or a page frame)."""

    def __init__(self, settings: Settings, hp: Any, n_lanes: int = 1):
        c = settings.context
        self.n_layer = hp.n_layer
        self.types = (kv_type(c.cache_type_k), kv_type(c.cache_type_v))
        for name, t, d in zip(
            ("cache_type_k", "cache_type_v"), self.types, (hp.head_dim, hp.head_dim_v or hp.head_dim)
        ):
            if d % native.blck_size(t):
                raise ValueError(
                    f"{name}={getattr(c, name)} stores blocks of {native.blck_size(t)} values, which "
                    f"this model's heads of {d} do not divide into"
                )
        self.shape = [hp.n_embd_gqa, c.ctx_size]
        self.v_width = hp.n_embd_v_gqa  # 0: no V tensors (a latent K/V: V is read from K)
        self.k: list[list[Any]] = []
        self.v: list[list[Any]] = []
        self.keep: list[Any] = []
        self.ensure(n_lanes)

    def new(self, ctx_of: Callable[[int], Any], slots: int = 1) -> tuple[list[Any], list[Any]]:
        """A K and a V tensor per layer (no V for a latent K/V), made in ctx_of(layer), of `slots` sequences one
        after another."""
        n = self.shape[1] * slots
        ks = [ctx_of(il).new_tensor(self.types[0], [self.shape[0], n]) for il in range(self.n_layer)]
        vs = [ctx_of(il).new_tensor(self.types[1], [self.v_width, n]) for il in range(self.n_layer) if self.v_width]
        return ks, vs

    def ensure(self, n: int) -> None:
        while len(self.k) < n:
            j = len(self.k)
            cx = native.Context(max_tensors=2 * self.n_layer)
            ks, vs = self.new(lambda il: cx)  # noqa: B023 (new calls it before the loop moves on)
            for kind, ts in (("k", ks), ("v", vs)):
                for il, t in enumerate(ts):
                    t.name = f"cache_{kind}_l{il}" + (f"_s{j}" if j else "")
            self.k.append(ks)
            self.v.append(vs)
            self.keep.append(cx)

    def layer(self, il: int, n_lanes: int) -> tuple[Any, Any]:
        """Layer il's K and V of the first lane, or lists of n_lanes lanes' (V None for a latent K/V)."""

        def v(j: int) -> Any:
            return self.v[j][il] if self.v_width else None

        if not n_lanes:
            return self.k[0][il], v(0)
        self.ensure(n_lanes)
        return [self.k[j][il] for j in range(n_lanes)], [v(j) for j in range(n_lanes)]


class LanedKV(SequenceMemory):
    """A K/V memory whose graphs read KVLanes."""

    lanes: KVLanes

    def layer_tensors(self, il: int, n_lanes: int, streams: bool = False) -> tuple[Any, Any]:
        return self.lanes.layer(il, n_lanes)


class ContiguousKV(LanedKV):
    """K/V storage of ctx_size tokens per sequence and layer, in slots of one pool per layer on its layer's device
    (`layer_device`): K and V [n_embd_gqa, ctx_size * capacity], a sequence's slot the rows [slot * ctx_size,
    (slot + 1) * ctx_size) (V transposed within it). A sequence takes the lowest free slot when it first runs
    and frees it when dropped. On the host the pools lie in a reservation of address space for RESERVED_SLOTS
    slots (native.HostReservation): a page costs memory once written, and a dropped sequence's pages go back
    to the system. Elsewhere the pool is allocated and zeroed, and doubles when full (its slots copied); a
    freed slot keeps its rows, which a later sequence's queries give no weight (they are finite). Lanes are
    aliased to slots before a pass; the sequences of a pass on consecutive slots, in lane order, are read as
    one stream tensor per layer (`streams`), so one attention covers them all."""

    RESERVED_SLOTS = 256

    def __init__(
        self,
        settings: Settings,
        hp: Any,
        backends: Sequence[Any],
        layer_device: Sequence[int],
        kv_bytes: int,
        check_available: Callable[[int, int, str], None],
    ):
        """`check_available(device, nbytes, what)` refuses what a device has no room for (Devices')."""
        self.lanes = KVLanes(settings, hp)
        self.backends = backends
        self.check_available = check_available
        self.layer_device = list(layer_device)
        self.kv_bytes = kv_bytes
        self.ctx_size = settings.context.ctx_size
        self.capacity = 0
        self.pool: tuple[list[Any], list[Any], list[Any]] = ([], [], [])  # K and V per layer, what holds them
        self.reservation: Any = None  # the host pools' address space (None: allocated pools)
        self.offsets: list[int] = []  # where each pool tensor (K of every layer, then V) lies in it
        self.slots: dict[int, int] = {}  # sequence -> slot
        self.stream_views: dict[int, tuple[list[Any], list[Any], Any]] = {}  # lanes -> K, V [g, ctx * lanes]
        self.bound: list[int | None] = []  # the slot each lane points at
        self.bound_streams: dict[int, int] = {}  # lanes -> the first slot its stream tensors point at
        self.host: Any = None  # the host backend of mirrored layers (mirror)
        self.mirrored: dict[int, tuple[Any, Any]] = {}  # layer -> its K and V pools on the host
        self.on_host: set[int] = set()  # mirrored layers whose host copy is the one written last
        self.mirror_keep: list[Any] = []
        self.moved_bytes = 0
        self.written = False  # whether any K/V was written yet
        self.storage(0, check=False)

    def grow(self, check: bool) -> None:
        """Makes room for more slots: a host reservation of RESERVED_SLOTS at first, else twice the slots,
        the used ones copied over."""
        host = all(self.backends[d].is_host for d in set(self.layer_device))
        cap = self.RESERVED_SLOTS if host and not self.capacity else max(1, 2 * self.capacity)
        ctxs = [native.Context(max_tensors=2 * self.lanes.n_layer) for _ in self.backends]
        ks, vs = self.lanes.new(lambda il: ctxs[self.layer_device[il]], cap)
        keep: list[Any] = list(ctxs)
        reservation = None
        if host:
            sizes = [-(-t.nb[1] * t.ne[1] // 4096) * 4096 for t in ks + vs]
            reservation = native.HostReservation(sum(sizes))
            offsets = [sum(sizes[:i]) for i in range(len(sizes))]
            for t, at in zip(ks + vs, offsets):
                reservation.bind(t, at)
            keep.append(reservation)
            self.offsets = offsets
        else:
            if check:
                self.check_available(
                    0,
                    self.kv_bytes * (cap - self.capacity),
                    f"the K/V of {cap} sequences (ctx_size {self.ctx_size} tokens each; paged_kv holds "
                    f"only the pages a sequence uses)",
                )
            for i, b in enumerate(self.backends):
                if i in self.layer_device:
                    buf = b.alloc_tensors(ctxs[i])
                    buf.clear(0)
                    keep.append(buf)
        if self.capacity:
            for old, new in zip(self.pool[0] + self.pool[1], ks + vs):
                view = native.Context(max_tensors=1)
                native.tensor_copy(old, view.view(new, list(old.ne[:2]), [old.nb[1]], 0))
        self.pool, self.capacity, self.reservation = (ks, vs, keep), cap, reservation
        self.bound, self.bound_streams = [], {}
        if self.mirrored:
            self.grow_mirror(list(self.mirrored))
        native.host_memory_trim()

    def mirror(self, layers: Sequence[int], backend: Any) -> bool:
        if self.reservation is not None or not layers:
            return False  # the pools are host memory already
        self.host = backend
        self.grow_mirror(list(layers))
        return True

    def grow_mirror(self, layers: list[int]) -> None:
        """Host pools of `layers` as large as the device's, what the old ones held copied over."""
        cx = native.Context(max_tensors=2 * len(layers))
        k_pools, v_pools = self.pool[0], self.pool[1]
        new = {
            il: (
                cx.new_tensor(k_pools[il].type, list(k_pools[il].ne[:2])),
                cx.new_tensor(v_pools[il].type, list(v_pools[il].ne[:2])) if v_pools else None,
            )
            for il in layers
        }
        buf = self.host.alloc_tensors(cx)
        buf.clear(0)
        for il, (k, v) in self.mirrored.items():
            for old, t in zip((k, v), new[il]):
                if old is not None and t is not None:
                    view = native.Context(max_tensors=1)
                    native.tensor_copy(old, view.view(t, list(old.ne[:2]), [old.nb[1]], 0))
        self.mirrored, self.mirror_keep = new, [cx, buf]
        self.bound, self.bound_streams = [], {}

    def targets(self) -> list[Any]:
        """Each layer's pool tensor that its lanes reach now, K of every layer, then V: a mirrored layer's on the
        host where it computes there."""
        n = self.lanes.n_layer
        out = []
        for i, t in enumerate(self.pool[0] + self.pool[1]):
            il, kv = i % n, i // n
            out.append(self.mirrored[il][kv] if il in self.on_host else t)
        return out

    def place(self, layer: int, host: bool) -> int:
        if layer not in self.mirrored or (layer in self.on_host) == host:
            return 0
        here = [self.pool[0][layer]] + ([self.pool[1][layer]] if self.pool[1] else [])
        there = [t for t in self.mirrored[layer] if t is not None]
        pairs = list(zip(here, there)) if self.written else []  # before anything is written, nothing to bring over
        moved = 0
        for a, b in pairs:
            src, dst = (a, b) if host else (b, a)
            size = src.nb[1] * self.ctx_size  # a slot's rows
            for slot in sorted(set(self.slots.values())):
                cx = native.Context(max_tensors=2)
                shape = [src.ne[0], self.ctx_size]
                native.tensor_copy(
                    cx.view(src, shape, [src.nb[1]], slot * size), cx.view(dst, shape, [dst.nb[1]], slot * size)
                )
                moved += size
        self.on_host ^= {layer}  # it was on the other side
        self.bound, self.bound_streams = [], {}
        self.moved_bytes += moved
        return moved

    def storage(self, seq: int, check: bool = True) -> int:
        """The slot of `seq`, taken when it first runs."""
        slot = self.slots.get(seq)
        if slot is None:
            used = set(self.slots.values())
            slot = next(i for i in range(len(used) + 1) if i not in used)
            if slot >= self.capacity:
                self.grow(check)
            if check and self.reservation is not None:  # the pages this sequence may come to hold
                self.check_available(
                    0,
                    self.kv_bytes,
                    f"the K/V of sequence {seq} (ctx_size "
                    f"{self.ctx_size} tokens; paged_kv holds only the pages a sequence uses)",
                )
            self.slots[seq] = slot
        return slot

    def order(self, seq: int) -> int:
        return self.storage(seq)

    def streams(self, seqs: Sequence[int]) -> bool:
        """Whether the sequences (distinct, in lane order) can be read as one stream tensor: consecutive slots."""
        if len(seqs) < 2 or len(set(seqs)) != len(seqs):
            return False
        slots = [self.storage(s) for s in seqs]
        return slots == list(range(slots[0], slots[0] + len(slots)))

    def stream_tensors(self, n: int) -> tuple[list[Any], list[Any], Any]:
        """The stream tensors of passes over n sequences: per layer K and V [n_embd_gqa, ctx_size * n], holding
        no memory of their own (bind points them at the first slot), and their context."""
        views = self.stream_views.get(n)
        if views is None:
            cx = native.Context(max_tensors=2 * self.lanes.n_layer)
            views = self.stream_views[n] = (*self.lanes.new(lambda il: cx, n), cx)
        return views

    def layer_tensors(self, il: int, n_lanes: int, streams: bool = False) -> tuple[Any, Any]:
        if not streams:
            return self.lanes.layer(il, n_lanes)
        ks, vs, _ = self.stream_tensors(n_lanes)
        return ks[il], vs[il] if vs else None

    def bind(self, seqs: Sequence[int], streams: bool = False) -> None:
        self.written = True  # a pass (or a restored sequence) writes what it binds
        slots = [self.storage(s) for s in seqs]
        if streams:
            n = len(seqs)
            if self.bound_streams.get(n) != slots[0]:
                ks, vs, _ = self.stream_tensors(n)
                for t, pool in zip(ks + vs, self.targets()):
                    self.alias(t, pool, slots[0])
                self.bound_streams[n] = slots[0]
            return
        self.lanes.ensure(len(seqs))
        self.bound += [None] * (len(seqs) - len(self.bound))
        if all(self.bound[j] == slot for j, slot in enumerate(slots)):
            return  # a decoded token: nothing moves, nothing to do per layer
        pools = self.targets()
        for j, slot in enumerate(slots):
            if self.bound[j] == slot:
                continue
            for t, pool in zip(self.lanes.k[j] + self.lanes.v[j], pools):
                self.alias(t, pool, slot)
            self.bound[j] = slot

    def alias(self, t: Any, pool: Any, slot: int) -> None:
        """Points t at a layer's pool tensor from slot `slot` on."""
        native.tensor_alias(t, pool, slot * pool.nb[1] * self.ctx_size)

    def truncate(self, seq: int, n: int) -> None:
        pass  # rows past n are written again before any query reads them

    def stats(self) -> dict[str, Any]:
        if not self.mirrored:
            return {}
        return {
            "kv_mirrored_layers": len(self.mirrored),
            "kv_on_host": len(self.on_host),
            "kv_moved_bytes": self.moved_bytes,
        }

    def drop(self, seq: int) -> None:
        slot = self.slots.pop(seq, None) if seq != 0 else None
        if slot is not None and self.reservation is not None:  # its pages back to the system
            for t, at in zip(self.pool[0] + self.pool[1], self.offsets):
                size = t.nb[1] * self.ctx_size
                self.reservation.release(at + slot * size, size)


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


class SharedKV(SequenceMemory):
    """Layers that read an earlier layer's K/V instead of keeping their own (llama.cpp's layer reuse: gemma4's
    last blocks): `source[il]`, the index in `kv` (a memory of the layers that keep K/V) of the layer il reads. A
    sharing layer's step writes nothing: it sees the rows its source wrote earlier in the same pass."""

    def __init__(self, kv: SequenceMemory, source: Sequence[int], own: Sequence[bool]):
        self.kv, self.source, self.own = kv, list(source), list(own)
        self.max_lanes = kv.max_lanes

    def layer_tensors(self, il: int, n_lanes: int, streams: bool = False) -> tuple[Any, Any]:
        return self.kv.layer_tensors(self.source[il], n_lanes, streams)

    def bind(self, seqs: Sequence[int], streams: bool = False) -> None:
        self.kv.bind(seqs, streams)

    def streams(self, seqs: Sequence[int]) -> bool:
        return self.kv.streams(seqs)

    def order(self, seq: int) -> int:
        return self.kv.order(seq)

    def begin(self, seq: int, p0: int, n: int = 1) -> None:
        self.kv.begin(seq, p0, n)

    def restored(self, seq: int, n: int) -> None:
        self.kv.restored(seq, n)

    def use(self, layer: int, lanes: Sequence[Lane]) -> contextlib.AbstractContextManager[None]:
        if self.own[layer]:
            return self.kv.use(self.source[layer], lanes)
        return self.kv.use(self.source[layer], [(seq, end, end) for seq, _, end in lanes])  # its rows all written

    def can_truncate(self, seq: int, n: int) -> bool:
        return self.kv.can_truncate(seq, n)

    def truncate(self, seq: int, n: int) -> None:
        self.kv.truncate(seq, n)

    def drop(self, seq: int) -> None:
        self.kv.drop(seq)

    def stats(self) -> dict[str, Any]:
        return self.kv.stats()


def kv_cache(
    settings: Settings, arch: Any, layer_device: Sequence[int], devices: Devices, kv_bytes: int
) -> SequenceMemory:
    """The K/V of `arch`'s layers (each on its layer_device, one of `devices`), paged (settings.kv.paged_kv) or
    contiguous (its growth checked against the device's memory)."""
    if settings.kv.paged_kv:
        return paged_kv(settings, arch, devices.backends, layer_device, devices.n_split)
    return ContiguousKV(settings, arch.hp, devices.backends, layer_device, kv_bytes, devices.check_available)


def paged_kv(
    settings: Settings, arch: Any, backends: Sequence[Any], layer_device: Sequence[int], n_split: int
) -> PagedKV:
    """The paged K/V of settings.kv: each device pages the K/V of its own blocks."""
    hp, kvs = arch.hp, settings.kv
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
                    n_swa=0 if kvs.swa_full else arch.n_swa,
                    swa_layers=[j for j, il in enumerate(ls) if arch.is_swa(il)],
                ),
                ls[0],
            )
        )
    return PagedKV(lanes, parts)
