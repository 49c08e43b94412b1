"""llama4 family: Meta's Llama 4 (Scout, Maverick). Three of every four layers attend within chunks of 8192 tokens
with RoPE (rope.freq_base_swa) and, except in the 128-expert model, an RMS norm of Q and K after it; every fourth
layer attends over everything without RoPE, its Q scaled by the attention temperature. Every
interleave_moe_layer_step-th block is a mixture of experts: top-k by the router's logits, sigmoid weights applied
to each expert's input, plus an ungated shared expert; Llama 3's rope_freqs (llama.cpp's src/models/llama4.cpp)."""

from __future__ import annotations

from typing import Any, Mapping

from ..errors import GGUFError, UnsupportedModelError
from ..native import Context, Tensor
from .base import StepInputs, Weights
from .common import ROPE_NORM, Architecture
from .moe import uniform_expert_ff

CHUNK = 8192  # llama.cpp fixes the chunk, the temperature's floor, scale and offset for llama4
TEMPERATURE = (0.1, CHUNK, 1.0)


class Llama4Arch(Architecture):
    rope_mode = ROPE_NORM
    rope_whole_heads = True

    def load_hparams(self, meta: Mapping[str, Any]) -> None:
        hp = self.hp
        if not hp.n_expert:
            raise GGUFError("llama4 model cannot have zero experts")
        self.n_ff_exp = self.n_ff_shexp = uniform_expert_ff(self, meta)
        self.shexp_gate = False
        self.moe_step = int(self.need(meta, "interleave_moe_layer_step"))
        if int(self.key(meta, "attention.sliding_window", CHUNK)) == 0:
            # llama.cpp then runs without chunks, but still reads the temperature it leaves unset, and aborts
            raise UnsupportedModelError(
                "llama4 with 'llama4.attention.sliding_window' 0 (MobileLLM-R1) is not supported: llama.cpp aborts "
                "on it (its attention temperature is 0)"
            )
        self.n_swa, self.swa_chunked = CHUNK, True
        self.set_swa_pattern(meta, 4)  # 3 chunked, 1 full
        self.rope_base_swa = float(self.key(meta, "rope.freq_base_swa", hp.rope_base))
        self.attn_temp = TEMPERATURE
        self.kq_norm = hp.n_expert != 128  # Maverick (128 experts) has none
        self.moe.gating = "sigmoid"
        self.moe.norm_w = False
        self.moe.select_logits = self.moe.weight_before = True

    def is_moe(self, il: int) -> bool:
        return self.moe_step > 0 and (il + 1) % self.moe_step == 0

    def uses_rope(self, il: int) -> bool:
        return (il + 1) % 4 != 0  # llama.cpp's n_no_rope_layer_step

    def rope(self, ctx: Context, w: Weights, inp: StepInputs, il: int, x: Tensor) -> Tensor:
        if not self.uses_rope(il):
            return x
        x = super().rope(ctx, w, inp, il, x)
        return ctx.rms_norm(x, self.hp.rms_eps) if self.kq_norm else x

    def temperature(self, ctx: Context, inp: StepInputs, il: int, q: Tensor) -> Tensor:
        return q if self.uses_rope(il) else super().temperature(ctx, inp, il, q)

    def describe(self) -> list[str]:
        norm = ", Q/K RMS-normed after RoPE" if self.kq_norm else ""
        return [
            f"attention: chunks of {self.n_swa} tokens with RoPE{norm} in 3 of 4 layers; every 4th layer over "
            "everything without RoPE, with the attention temperature",
            f"mixture of experts in every {self.moe_step}th block: top {self.hp.n_expert_used} by logits, sigmoid "
            f"weights on the expert's input, a shared expert of {self.n_ff_shexp}",
        ]
