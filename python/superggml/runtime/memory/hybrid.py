"""The hybrid memory of models that mix recurrent layers with attention layers (llama.cpp's llama_memory_hybrid):
each layer is routed to a K/V memory or to the recurrent states."""

from __future__ import annotations

import contextlib
from typing import Any, Sequence

from .base import MAX_LANES, Lane, SequenceMemory
from .recurrent import RecurrentStates


class HybridMemory(SequenceMemory):
    """A K/V memory for the attention layers and RecurrentStates for the recurrent ones (`recurrent`: a flag per
    layer), each indexed by its own layers in order; `stateless` layers (a flag per layer) have neither."""

    def __init__(
        self,
        kv: SequenceMemory,
        states: RecurrentStates,
        recurrent: Sequence[bool],
        stateless: Sequence[bool] | None = None,
    ):
        self.kv, self.states, self.recurrent = kv, states, list(recurrent)
        none = list(stateless) if stateless is not None else [False] * len(self.recurrent)
        self.kind = ["state" if r else "none" if s else "kv" for r, s in zip(self.recurrent, none)]
        self.index = [sum(1 for k in self.kind[:il] if k == kind) for il, kind in enumerate(self.kind)]
        self.max_lanes = min(kv.max_lanes, MAX_LANES, states.max_device or MAX_LANES)

    def layer_tensors(self, il: int, n_lanes: int, streams: bool = False) -> tuple[Any, Any]:
        if self.kind[il] == "none":
            return None, None
        if self.recurrent[il]:
            return self.states.layer_tensors(self.index[il], n_lanes)
        return self.kv.layer_tensors(self.index[il], n_lanes, streams)

    def bind(self, seqs: Sequence[int], streams: bool = False) -> None:
        self.kv.bind(seqs, streams)
        self.states.bind(seqs)

    def order(self, seq: int) -> int:
        return self.kv.order(seq)

    def begin(self, seq: int, p0: int, n: int = 1) -> None:
        self.kv.begin(seq, p0, n)
        self.states.begin(seq, p0, n)

    def checkpoint(self, seq: int) -> None:
        self.states.checkpoint(seq)

    def restored(self, seq: int, n: int) -> None:
        self.kv.restored(seq, n)
        self.states.restored(seq, n)

    def record_tensor(self, il: int) -> Any:
        return self.states.record[self.index[il]] if self.recurrent[il] and self.states.record else None

    def use(self, layer: int, lanes: Sequence[Lane]) -> contextlib.AbstractContextManager[None]:
        if self.kind[layer] != "kv":
            return contextlib.nullcontext()
        return self.kv.use(self.index[layer], lanes)

    def truncate_point(self, seq: int, n: int) -> int:
        p = self.states.truncate_point(seq, n)
        return p if self.kv.can_truncate(seq, p) else 0

    def can_truncate(self, seq: int, n: int) -> bool:
        return self.truncate_point(seq, n) == n

    def truncate(self, seq: int, n: int) -> None:
        self.kv.truncate(seq, n)
        self.states.truncate(seq, n)

    def drop(self, seq: int) -> None:
        self.kv.drop(seq)
        self.states.drop(seq)

    def stats(self) -> dict[str, Any]:
        return {**self.kv.stats(), **self.states.stats()}
