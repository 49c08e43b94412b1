"""The weight pagers a forward pass drives: blocks and head chunks (WeightPager), and experts (ExpertPager).

A forward pass is a list of steps (graphs). A step that needs paged weights
names them with a key: ``Block(b)`` (transformer block b) or ``HeadChunk(c)``
(row chunk c of the lm head). The executor wraps each step in
``pager.use(key)``; with every block resident the pager is a NullPager that
does nothing. The K/V a step reads is the sequence memory's (memory.py).
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass
from typing import Any, Collection, Iterator, Sequence, Union

from ... import native
from .routing import RoutingTrace
from ...arch import Architecture
from ...arch.mtp import MtpArch


@dataclass(frozen=True)
class Block:
    """Transformer block b's weights."""

    b: int


@dataclass(frozen=True)
class HeadChunk:
    """Row chunk c of the lm head (streamed in slot-sized chunks)."""

    c: int


Key = Union[Block, HeadChunk]


class NullPager:
    """Every layer resident: nothing to acquire, prefetch or time."""

    def use(self, key: Key | None) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def last_load(self, key: Key | None) -> tuple[float, float] | None:
        return None

    def stats(self) -> dict[str, Any]:
        return {}

    def places(self) -> dict[int, str]:
        return {}


class WeightPager:
    """A native.LayerPager over `keys`, the ones one device holds in pass order (its blocks, then the head
    chunks if the head is on it), prefetching `depth` keys ahead of the one in use (wrapping into the next
    pass)."""

    def __init__(self, pager: Any, keys: Sequence[Key], depth: int):
        self.core = pager
        self.keys = list(keys)
        self.n_keys = len(self.keys)
        self._index = {k: i for i, k in enumerate(self.keys)}
        self.depth = depth
        self.skip: frozenset[int] = frozenset()  # keys this pass computes elsewhere: not prefetched
        self._released: dict[int, float] = {}  # core key -> when it was last released

    def index(self, key: Key) -> int:
        """The LayerPager's key."""
        return self._index[key]

    def key(self, index: int) -> Key:
        return self.keys[index]

    @contextlib.contextmanager
    def use(self, key: Key | None) -> Iterator[None]:
        if key is None:
            yield
            return
        i = self.index(key)
        self.core.acquire(i)
        try:
            ahead = 0
            for j in range(1, self.n_keys):
                if ahead == self.depth:
                    break
                if (i + j) % self.n_keys not in self.skip:
                    self.core.prefetch((i + j) % self.n_keys)  # False when no slot is free: it loads on use
                    ahead += 1
            yield
        finally:
            self.core.release(i)

    def last_load(self, key: Key | None) -> tuple[float, float] | None:
        """(start, end) of the load that brought `key` in for the use that just ended, if it was loaded for it."""
        if key is None:
            return None
        i = self.index(key)
        last = self.core.last_load(i)
        since = self._released.get(i, 0.0)
        self._released[i] = time.time()
        return last if last is not None and last[0] >= since else None

    def pin(self, key: Key) -> None:
        self.core.pin(self.index(key))

    def places(self) -> dict[int, str]:
        """Where each block's weights are now: "pinned" (a slot they keep), "slot" (a slot until evicted) or
        "file" (read again on use). The native pager answers from any thread."""
        p = self.core
        return {
            k.b: "pinned" if p.pinned(i) else "slot" if p.resident(i) else "file"
            for i, k in enumerate(self.keys)
            if isinstance(k, Block)
        }

    def stats(self) -> dict[str, Any]:
        p = self.core
        return {
            **p.stats(),
            "n_slots": p.n_slots,
            "slot_size": p.slot_size,
            "direct_io": p.direct_io,
            "staged_io": p.staged,
            "layers_pinned": sum(p.pinned(k) for k in range(p.n_layers)),
            "pinned_bytes": sum(p.layer_bytes(k) for k in range(p.n_layers) if p.pinned(k)),
            "host_slots": p.host_slots,
            "host_tier_bytes": p.host_bytes,
        }


def merge_stats(parts: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One dict of several devices' counters: numbers added, flags or-ed, the rest from the first."""
    if len(parts) <= 1:
        return dict(parts[0]) if parts else {}
    out: dict[str, Any] = {}
    for k, v in parts[0].items():
        vals = [p.get(k) for p in parts]
        if isinstance(v, bool):
            out[k] = any(vals)
        elif isinstance(v, (int, float)):
            out[k] = sum(x for x in vals if isinstance(x, (int, float)))
        else:
            out[k] = v
    return out


SLOT_QUANTUM = 256  # a GPU's expert slots: a multiple of this (any backend's buffer alignment) and of the types
MATRIX_ROW_PADDING = 512  # ggml-cuda's (common.cuh): quantized rows are read in multiples of it
LOOKAHEAD_TRIAL = 256  # guessed experts before the lookahead's precision is judged
LOOKAHEAD_MIN_PRECISION = 0.5
# expert_lookahead "auto": decoded tokens timed with the lookahead on and off, in phases on, off, off, on (after a
# warm-up), the faster kept. Its guesses cost reads and evictions: bench/moe_limited.py measured it slower at
# localities 0, 0.5 and 0.9 where the disk is the bottleneck (a 2.7 GiB qwen3moe in a 685 MiB cgroup, 70% precision)
LOOKAHEAD_WARMUP = 8
LOOKAHEAD_PHASE = 16
LOOKAHEAD_PHASES = (True, False, False, True)
LOOKAHEAD_MARGIN = 0.05  # kept only when faster by this much: its wrong guesses cost reads others may need


class ExpertPager:
    """A native.ExpertCache: the experts of a mixture-of-experts model, paged one by one.

    Every slot holds one expert of one layer: its gate, up and down matrices at the offsets that layer's
    types give (a slot is as large as the largest layer's triple). Per layer, three tensors view the cache
    buffer as [K, M, n_slots + zero_slots] expert tensors (nb[2] = slot size), so the FFN graph runs
    ggml_mul_mat_id on them with the router's ids remapped to slots (map). The zero slots (`zero_slots`, never
    loaded) stand for the positions computed elsewhere (split), distinct from each other and every loaded
    slot, since ggml-cuda's mul_mat_id wants a row's ids distinct."""

    def __init__(
        self,
        store: native.WeightStore,
        path: str,
        arch: Architecture | MtpArch,
        budget: int,
        backend: Any,
        *,
        n_workers: int = 2,
        direct_io: bool = False,
        lookahead: bool | None = True,
        loan: int = 0,
        staged: bool = False,
        host_tier: int = 0,
        split: bool = False,
    ):
        """`lookahead`: load the next router's guesses (lookahead()) always (True), never (False), or as a
        timed trial of the first decoded tokens finds faster (None). `loan`: bytes beyond the budget that the
        cache holds until they are owed back (lend()). `staged`: loads go through staging buffers and async
        copies, as into a device; `host_tier`: bytes of host memory that keep experts between the file and a
        device (or staged) cache. `split`: some routed positions are computed off the cache
        (runtime/exec/placement.py's split_experts): n_expert_used zero slots stand for them."""
        hp = arch.hp
        self.n_layer = hp.n_layer
        strided = staged or not backend.is_host
        self.parts = self.layout(store, arch, direct=direct_io, strided=strided)
        self.expert_bytes = slot = self.slot_bytes(store, arch, direct=direct_io, strided=strided)
        self.zero_slots = hp.n_expert_used if split else 0
        self.base_slots = n_slots = budget // slot - self.zero_slots
        need = hp.n_expert_used
        if n_slots < need:
            zeros = f" besides {self.zero_slots} zero slots (experts computed on the host)" if split else ""
            raise ValueError(
                f"expert_cache of {budget} bytes holds {max(n_slots, 0)} experts{zeros}; a token is routed to "
                f"{hp.n_expert_used} of {slot} bytes each: give it at least {(need + self.zero_slots) * slot} bytes"
            )
        n_experts = hp.n_expert * sum(1 for parts in self.parts if parts)
        n_slots = max(n_slots, min(n_slots + loan // slot, n_experts))  # never more slots than experts on loan
        self.spare = loan - (n_slots - self.base_slots) * slot  # the loan's bytes no slot took: owed first
        self.tier_slots = min(host_tier // slot, n_experts) if staged or not backend.is_host else 0
        self.core = native.ExpertCache(
            path,
            n_slots=n_slots,
            slot_size=slot,
            backend=backend,
            n_workers=n_workers,
            direct_io=direct_io,
            staged=staged,
            host_slots=self.tier_slots,
            zero_slots=self.zero_slots,
        )
        for il, parts in enumerate(self.parts):
            if parts:  # a block with a dense FFN has none
                self.core.set_layer(il, hp.n_expert, parts)
        self.ctx = native.Context(max_tensors=3 * hp.n_layer)
        self.views: list[list[Any]] = []
        for il in range(hp.n_layer):
            vs = []
            for name, (_, _, _, off) in zip(arch.expert_tensors(il), self.parts[il]):
                t = store.get(name)
                v = self.ctx.new_tensor(t.type, [t.ne[0], t.ne[1], n_slots + self.zero_slots])
                v.name = name + ".cache"
                self.core.bind_view(v, off)
                vs.append(v)
            self.views.append(vs)
        self._pinned: list[int] = []
        self._guess: dict[int, set[int]] = {}  # layer -> experts the lookahead predicted for it
        self.trace: RoutingTrace | None = None  # the requests and loads while recording (record_routing)
        self.guessed = self.guessed_right = self.routed = 0
        self.lookahead_mode = lookahead
        self.lookahead_on = lookahead is not False
        self._trial_tokens = 0
        self._trial = {True: [0.0, 0], False: [0.0, 0]}  # lookahead on/off -> [seconds, decoded tokens]

    @staticmethod
    def layout(
        store: native.WeightStore, arch: Architecture | MtpArch, *, direct: bool = False, strided: bool = False
    ) -> list[list[tuple[int, int, int, int]]]:
        """Per layer, its expert matrices: (file offset of expert 0, stride, bytes, offset inside a slot).
        Packed 64-byte aligned; with `direct`, where every stride is whole O_DIRECT blocks, each matrix gets a
        region of whole blocks and sits in it at its file offset's place inside a block, so O_DIRECT reads the
        blocks around it straight into the slot (csrc/expert-cache.h). `strided` (a cache a GPU reads): each
        matrix followed by the row padding ggml-cuda reads past it (row_padding)."""
        blk = native.DIRECT_ALIGN
        out = []
        for il in range(arch.hp.n_layer):
            names = arch.expert_tensors(il)
            ranges = [store.file_range(name) for name in names]
            strides = [nbytes // arch.hp.n_expert for _, nbytes in ranges]
            aligned = direct and all(s % blk == 0 for s in strides)
            parts: list[tuple[int, int, int, int]] = []
            off = 0
            for name, (file_off, _), stride in zip(names, ranges, strides):
                room = stride + (row_padding(store.get(name)) if strided else 0)
                if aligned:
                    lead = file_off % blk
                    off = -(-off // blk) * blk
                    parts.append((file_off, stride, stride, off + lead))
                    off += -(-(lead + room) // blk) * blk
                else:
                    parts.append((file_off, stride, stride, off))
                    off += -(-room // 64) * 64  # each matrix 64-byte aligned inside the slot
            out.append(parts)
        return out

    @staticmethod
    def slot_bytes(
        store: native.WeightStore, arch: Architecture | MtpArch, *, direct: bool = False, strided: bool = False
    ) -> int:
        """Bytes of one slot: the largest layer's expert, its matrices aligned (to whole blocks if direct);
        strided (a cache a GPU reads): a multiple of every expert matrix's type size (expert_slot_size)."""
        layout = ExpertPager.layout(store, arch, direct=direct, strided=strided)
        end = max(
            off + size + (row_padding(store.get(name)) if strided else 0)
            for il, parts in enumerate(layout)
            for name, (_, _, size, off) in zip(arch.expert_tensors(il), parts)
        )
        types = {store.get(n).type for il in range(arch.hp.n_layer) for n in arch.expert_tensors(il)}
        return expert_slot_size(end, direct, [native.type_size(t) for t in types] if strided else [])

    def map(self, layer: int, ids: Any, held_only: bool = False) -> Any:
        """The slots of the experts `ids` (I32 [k, n]) of `layer`, loaded and pinned until release() (held_only:
        those not held are not loaded, their slots -1)."""
        guess = self._guess.pop(layer, None)
        if guess is not None:  # how good the lookahead was for this layer
            routed = {int(e) for e in ids}
            self.guessed += len(guess)
            self.routed += len(routed)
            self.guessed_right += len(guess & routed)
        if self.trace is None:
            slots, pinned = self.core.map(layer, ids, held_only)
        else:  # the request, and the misses it cost
            self.trace.requests.append((layer, tuple(int(e) for e in ids)))
            missed = int(self.core.stats()["expert_misses"])
            slots, pinned = self.core.map(layer, ids, held_only)
            missed = int(self.core.stats()["expert_misses"]) - missed
            self.trace.loads[layer] = self.trace.loads.get(layer, 0) + missed
        self._pinned += pinned
        return slots

    def load(self, layer: int, experts: Collection[int]) -> int:
        """Starts loading `experts` of `layer` (a map() waits for them); returns how many it started."""
        started = int(self.core.prefetch(layer, sorted(experts))) if experts else 0
        if self.trace is not None:
            self.trace.loads[layer] = self.trace.loads.get(layer, 0) + started
        return started

    def record_routing(self, on: bool) -> RoutingTrace | None:
        """Starts recording a new trace (on) or stops; returns the trace recorded until now."""
        trace = self.trace
        self.trace = RoutingTrace(self.core.n_active) if on else None
        return trace

    def lookahead(self, layer: int, ids: Any) -> None:
        """Starts loading the experts `ids` that the next router is predicted to pick for `layer`; once enough
        guesses are in and too few were right (LOOKAHEAD_MIN_PRECISION), it stops: wrong guesses evict."""
        if not self.lookahead_on:
            return
        if self.guessed >= LOOKAHEAD_TRIAL and self.guessed_right < LOOKAHEAD_MIN_PRECISION * self.guessed:
            return
        guess = {int(e) for e in ids}
        self._guess[layer] = guess
        self.load(layer, guess)

    @property
    def lookahead_state(self) -> str:
        if (
            self.lookahead_mode is None
            and self._trial_tokens < LOOKAHEAD_WARMUP + len(LOOKAHEAD_PHASES) * LOOKAHEAD_PHASE
        ):
            return "trial"
        return "on" if self.lookahead_on else "off"

    def pass_done(self, n_tokens: int, seconds: float) -> None:
        """A forward pass of n_tokens took `seconds`: with lookahead None, decoded tokens (passes of one) time
        the trial, which switches the lookahead by phase and then keeps whichever was faster."""
        if self.lookahead_mode is not None or n_tokens != 1 or self.lookahead_state != "trial":
            return
        i = self._trial_tokens - LOOKAHEAD_WARMUP
        if i >= 0:
            t = self._trial[self.lookahead_on]
            t[0] += seconds
            t[1] += 1
        self._trial_tokens += 1
        j = (i + 1) // LOOKAHEAD_PHASE
        if j < len(LOOKAHEAD_PHASES):
            self.lookahead_on = LOOKAHEAD_PHASES[max(j, 0)]
        else:
            (on_s, on_n), (off_s, off_n) = self._trial[True], self._trial[False]
            self.lookahead_on = on_s / on_n < (1.0 - LOOKAHEAD_MARGIN) * off_s / off_n

    def release(self) -> None:
        pinned, self._pinned = self._pinned, []
        self.core.release(pinned)

    def lend(self, owed: int) -> None:
        """`owed` bytes of the loan are due: the slots past the budget's that cover them are set aside (between
        passes: nothing is pinned)."""
        due = max(0, owed - self.spare)
        n = max(self.base_slots, self.core.n_slots - -(-due // self.expert_bytes))
        if n != self.core.n_active:
            self.core.set_active(n)

    def stats(self) -> dict[str, Any]:
        """The cache's counters, and the lookahead's precision (predicted experts that were routed to) and
        recall (routed experts that were predicted), over the layers it predicted."""
        d = dict(self.core.stats())
        d["expert_slots_lent"] = d["expert_slots_active"] - self.base_slots  # held on the plan's loan now
        d["expert_zero_slots"] = self.zero_slots
        d["expert_lookahead_precision"] = self.guessed_right / self.guessed if self.guessed else 0.0
        d["expert_lookahead_recall"] = self.guessed_right / self.routed if self.routed else 0.0
        d["expert_lookahead"] = self.lookahead_state
        for on in (True, False):
            s, n = self._trial[on]
            d[f"expert_lookahead_trial_ms_{'on' if on else 'off'}"] = 1e3 * s / n if n else 0.0
        return d


def row_padding(t: Any) -> int:
    """Bytes a GPU's kernels may read past a quantized matrix's last row (ggml-cuda pads rows to
    MATRIX_ROW_PADDING elements, and allocates and zeroes that much after each such tensor): kept free after
    each expert matrix in a slot, so that the reads stay inside the cache's zeroed buffer."""
    q = native.blck_size(t.type) > 1
    extra = -t.ne[0] % MATRIX_ROW_PADDING
    return native.row_size(t.type, extra) if q and extra else 0


def expert_slot_size(end: int, direct: bool, type_sizes: Sequence[int] = ()) -> int:
    """Bytes of a slot whose expert ends at `end` (rounded to whole O_DIRECT blocks if direct). With the type
    sizes of the expert matrices (a cache a GPU reads): a multiple of each, and of SLOT_QUANTUM, since ggml-cuda
    takes a matrix's expert stride (the slot) in whole blocks of its type (nb[2] / type size)."""
    unit = native.DIRECT_ALIGN if direct else 1
    if type_sizes:
        unit = math.lcm(unit, SLOT_QUANTUM, *type_sizes)
    return -(-end // unit) * unit
