"""Compressed K/V: DeepSeek V4's sequence memory (llama.cpp's llama_kv_cache_dsv4).

Per sequence and block: the raw K of every token [head_dim, ctx_size] (the blocks attend over a sliding window
of it), and for a compressing block (ratio 4 or 128) its compressed rows, one per `ratio` tokens, the lightning
indexer's rows (ratio 4), and the compressors' rings: F32 values and scores of the last ring_rows(ratio) tokens,
token p at row p mod ring_rows, which the next blocks' compressors read. Every tensor of a sequence lies in one
zeroed buffer per device; a pass's graphs read lane tensors that bind points at the sequence.

With paged_kv the raw keys, the bulk of it, are a PagedKV's pages (the sliding window frees those no query sees
again, unless swa_full); the rest stays in each sequence's buffers.

A sequence goes back by up to RING_SPARE tokens (the rings still hold what its next blocks read; stale compressed
rows are masked until written again) or to its start; further back it is fed again from its start.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from ... import native
from ...arch.base import CompressedLayer
from ...arch.deepseek4_attention import CSA, RING_SPARE, comp_rows, ring_rows
from ...settings import Settings
from ..plan.memory_plan import kv_type
from .base import Lane, SequenceMemory
from .paged import PagedKV

F32 = native.GGMLType.F32


@dataclass(frozen=True)
class LayerShapes:
    """One block's tensors as (type, shape): raw K, then the CompressedLayer's fields in order (None: absent)."""

    raw: tuple[Any, list[int]]
    parts: tuple[tuple[Any, list[int]] | None, ...]


class CompressedKV(SequenceMemory):
    """The memory of a deepseek4 model: `ratios` per block, `head_dim` and `idx_dim` (the indexer's head) wide,
    each block on its layer_device's backend. One sequence a pass (max_lanes 1)."""

    max_lanes = 1

    def __init__(
        self,
        settings: Settings,
        ratios: Sequence[int],
        head_dim: int,
        idx_dim: int,
        backends: Sequence[Any],
        layer_device: Sequence[int],
        check_available: Callable[[int, int, str], None],
        raw: PagedKV | None = None,
    ):
        """`raw`: the raw keys in pages (paged_kv), else in each sequence's buffers with the rest."""
        c = settings.context
        self.raw = raw
        t = kv_type(c.cache_type_k)
        if head_dim % native.blck_size(t) or idx_dim % native.blck_size(t):
            raise ValueError(f"cache_type_k={c.cache_type_k} stores blocks that do not divide deepseek4's heads")
        self.ctx_size, self.backends, self.layer_device = c.ctx_size, backends, list(layer_device)
        self.check_available = check_available
        self.shapes = []
        for r in ratios:
            csa = r == CSA
            ring = [(2 if csa else 1) * head_dim, ring_rows(r)] if r else None
            lid_ring = [2 * idx_dim, ring_rows(r)] if csa else None
            self.shapes.append(
                LayerShapes(
                    (t, [head_dim, self.ctx_size]),
                    (
                        (t, [head_dim, comp_rows(self.ctx_size, r)]) if r else None,
                        (t, [idx_dim, comp_rows(self.ctx_size, r)]) if csa else None,
                        (F32, ring) if ring else None,
                        (F32, ring) if ring else None,
                        (F32, lid_ring) if lid_ring else None,
                        (F32, lid_ring) if lid_ring else None,
                    ),
                )
            )
        self.lane_ctx = native.Context(max_tensors=7 * len(self.shapes))
        self.lanes = [self.new_layer(self.lane_ctx, s, raw is None) for s in self.shapes]
        self.storage: dict[int, tuple[list[tuple[Any, CompressedLayer]], list[Any]]] = {}
        self.length: dict[int, int] = {}
        self.bound: int | None = None

    @staticmethod
    def new_layer(cx: Any, s: LayerShapes, with_raw: bool) -> tuple[Any, CompressedLayer]:
        parts = [None if p is None else cx.new_tensor(p[0], p[1]) for p in s.parts]
        return (cx.new_tensor(*s.raw) if with_raw else None), CompressedLayer(*parts)

    def sequence_bytes(self) -> int:
        total = 0
        for s in self.shapes:
            for p in ((s.raw,) if self.raw is None else ()) + s.parts:
                if p is not None:
                    total += int(native.row_size(p[0], p[1][0])) * p[1][1]
        return total

    def tensors(self, seq: int) -> list[tuple[Any, CompressedLayer]]:
        """`seq`'s tensors per block, allocated (zeroed) when it first runs."""
        got = self.storage.get(seq)
        if got is None:
            self.check_available(0, self.sequence_bytes(), f"the compressed K/V of sequence {seq}")
            ctxs = {d: native.Context(max_tensors=7 * len(self.shapes)) for d in set(self.layer_device)}
            layers = [self.new_layer(ctxs[d], s, self.raw is None) for d, s in zip(self.layer_device, self.shapes)]
            keep: list[Any] = list(ctxs.values())
            for d, cx in ctxs.items():
                buf = self.backends[d].alloc_tensors(cx)
                buf.clear(0)  # masked rows are read too: finite zeros, as llama.cpp clears its caches
                keep.append(buf)
            got = self.storage[seq] = (layers, keep)
        return got[0]

    def layer_tensors(self, il: int, n_lanes: int, streams: bool = False) -> tuple[Any, Any]:
        if n_lanes > 1 or streams:
            raise ValueError("deepseek4's compressed K/V runs one sequence a pass")
        raw, comp = self.lanes[il]
        if self.raw is not None:
            raw = self.raw.lanes.layer(il, 0)[0]
        return ([raw] if n_lanes else raw), comp

    def bind(self, seqs: Sequence[int], streams: bool = False) -> None:
        if len(seqs) != 1 or streams:
            raise ValueError("deepseek4's compressed K/V runs one sequence a pass")
        seq = seqs[0]
        if self.raw is not None:
            self.raw.bind(seqs)
        if self.bound == seq and seq in self.storage:
            return
        for (raw, comp), (sraw, scomp) in zip(self.lanes, self.tensors(seq)):
            if raw is not None:
                native.tensor_alias(raw, sraw)
            for a, b in zip(vars(comp).values(), vars(scomp).values()):
                if a is not None:
                    native.tensor_alias(a, b)
        self.bound = seq

    def begin(self, seq: int, p0: int, n: int = 1) -> None:
        self.length[seq] = p0 + n
        if self.raw is not None:
            self.raw.begin(seq, p0, n)

    def use(self, layer: int, lanes: Sequence[Lane]) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext() if self.raw is None else self.raw.use(layer, lanes)

    def can_truncate(self, seq: int, n: int) -> bool:
        back = n >= self.length.get(seq, 0) - RING_SPARE and (self.raw is None or self.raw.can_truncate(seq, n))
        return n == 0 or back

    def truncate(self, seq: int, n: int) -> None:
        if not self.can_truncate(seq, n):
            raise ValueError(f"sequence {seq} can go back by {RING_SPARE} tokens at most, or to its start")
        self.length[seq] = min(n, self.length.get(seq, 0))
        if self.raw is not None:
            self.raw.truncate(seq, n)
        if n == 0 and seq in self.storage:
            self.drop(seq)

    def drop(self, seq: int) -> None:
        self.storage.pop(seq, None)
        self.length.pop(seq, None)
        if self.bound == seq:
            self.bound = None

    def stats(self) -> dict[str, Any]:
        raw = self.raw.stats() if self.raw is not None else {}
        return {**raw, "compressed_kv_sequences": len(self.storage)}
