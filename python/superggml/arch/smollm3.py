"""smollm3 family: SmolLM3, llama's block without RoPE in every 4th layer (llama.cpp's src/models/smollm3.cpp:
n_no_rope_layer_step 4, no rope factors)."""

from __future__ import annotations

from ..native import Context, Tensor
from .base import StepInputs, Weights
from .common import ROPE_NORM, Architecture

NO_ROPE_STEP = 4  # llama.cpp's n_no_rope_layer_step for smollm3, fixed there too


class SmolLM3Arch(Architecture):
    rope_mode = ROPE_NORM
    rope_factors = False

    def rope(self, ctx: Context, w: Weights, inp: StepInputs, il: int, x: Tensor) -> Tensor:
        return x if (il + 1) % NO_ROPE_STEP == 0 else super().rope(ctx, w, inp, il, x)

    def describe(self) -> list[str]:
        return [f"no RoPE in every {NO_ROPE_STEP}th layer"]
