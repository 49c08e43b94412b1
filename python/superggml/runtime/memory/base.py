"""Sequence memory: what each sequence keeps between forward passes, behind one interface (llama.cpp's
llama_memory_i).

A pass holds up to `max_lanes` sequences, each in a lane. Graphs read and write a layer's memory through the
lane's tensors (`layer_tensors`); before a pass `bind` points the lanes at the sequences' storage, `begin` tells
each sequence where its rows start, and every block's step runs inside `use(layer, lanes)`. The kinds, one
per file: contiguous.py (ContiguousKV, a slot per sequence), paged.py (PagedKV, pages in a native.KVCache),
shared.py (layers reading an earlier layer's K/V), recurrent.py (recurrent states) and hybrid.py (K/V and
recurrent layers side by side); factory.py is the one place that chooses among them.

A latent K/V (multi-head latent attention, hp.latent_kv) is a K/V of K only: one [kv_lora_rank + n_rot, ctx]
tensor per layer, V read from it.
"""

from __future__ import annotations

import abc
import contextlib
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from ... import native
from ...arch.common import HParams
from ...settings import Settings
from ..plan.memory_plan import kv_type
from .rotation import check_blocks

MAX_LANES = 64  # sequences one pass holds at most
Lane = tuple[int, int, int]  # (sequence, rows valid before the step, rows valid after it)


@dataclass(frozen=True)
class KVLayers:
    """The layers a K/V memory holds, numbered 0.. in order: their hyperparameters (n_layer the count) and which
    of them slide over a window of n_swa tokens."""

    hp: HParams
    n_swa: int
    swa: Sequence[bool]


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
        check_blocks(c, "cache_type_k", [hp.head_dim])
        check_blocks(c, "cache_type_v", [hp.head_dim_v or hp.head_dim])
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
