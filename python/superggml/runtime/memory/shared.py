"""Shared K/V: layers that read an earlier layer's K/V instead of keeping their own (gemma4's last blocks)."""

from __future__ import annotations

import contextlib
from typing import Any, Sequence

from .base import Lane, SequenceMemory


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
