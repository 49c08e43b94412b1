"""What a pass's graphs are built from: the pieces the executor fixes when it starts (PassContext), and the output
buffers every plan shares (HeadBuffers), whose growth makes the plans built before it stale."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any, Sequence

from ... import native
from ...arch import Architecture
from ...arch.base import PassInputs
from ...arch.common import HParams
from ...arch.mtp import MtpArch
from ...settings import Settings
from ..memory.base import SequenceMemory
from ..weights.placement import WeightPlacement, WeightView

F32 = native.GGMLType.F32


class HeadBuffers:
    """The streamed head's input and output buffers, and keep_hidden's rows, shared by every plan. Growing them
    bumps `generation`: a plan built before holds the old buffers, and the executor builds it again."""

    def __init__(self, n_embd: int, n_vocab: int, backend: native.Backend):
        self.n_embd, self.n_vocab, self.backend = n_embd, n_vocab, backend
        self.generation = 0
        self.head: tuple[int, list[Any]] | None = None  # rows, [ctx, buffer, head_in, logits]
        self.hidden: native.Tensor | None = None  # keep_hidden's rows, F32 [width, n_batch]
        self.keep: list[Any] = []

    def head_out(self, n_out: int) -> list[Any]:
        """[context, buffer, head_in (F32 [n_embd, rows]), logits (F32 [n_vocab, rows])] for at least n_out rows;
        grown (to a power of two up to 16 rows, a multiple of 16 above) when a plan needs more rows."""
        if self.head is None or self.head[0] < n_out:
            rows = 1 << (n_out - 1).bit_length() if n_out <= 16 else -(-n_out // 16) * 16
            self.head = None
            self.generation += 1
            native.host_memory_trim()
            hctx = native.Context(max_tensors=2)
            head_in = hctx.new_tensor(F32, [self.n_embd, rows])
            lb = hctx.new_tensor(F32, [self.n_vocab, rows])
            self.head = (rows, [hctx, self.backend.alloc_tensors(hctx), head_in, lb])
        return self.head[1]

    def keep_hidden(self, n_batch: int, width: int) -> None:
        """Rows for the hidden rows (`width` values: the output norm, or the residual) of every row of a pass (made
        once)."""
        if self.hidden is None:
            cx = native.Context(max_tensors=1)
            self.hidden = cx.new_tensor(F32, [width, n_batch])
            self.keep += [cx, self.backend.alloc_tensors(cx)]
            self.generation += 1


@dataclass(frozen=True)
class PassContext:
    """What a pass's graphs are built from, fixed when the executor starts: the architecture, the settings, the
    weights (`weights`: as the device being built for holds them; `placement`: where each lives), the sequence
    memory, the devices (`backends`; the embedding's, `embed_dev`, and each block's, `layer_device`), the
    activations and the cache's rotations per device, and the shared output buffers."""

    arch: Architecture | MtpArch
    settings: Settings
    weights: WeightView
    placement: WeightPlacement
    memory: SequenceMemory
    backends: Sequence[native.Backend]
    embed_dev: int
    layer_device: Sequence[int]
    n_split: int
    acts: Sequence[native.Tensor]
    rot: Sequence[dict[str, native.Tensor]]
    buffers: HeadBuffers

    @property
    def hp(self) -> HParams:
        return self.arch.hp

    @cached_property
    def family_inputs(self) -> PassInputs | None:
        """The architecture where it has inputs of its own (PassInputs), else None: checked once, since a
        Protocol's isinstance costs microseconds each decoded token."""
        return self.arch if isinstance(self.arch, PassInputs) else None
