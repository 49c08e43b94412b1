"""mistral3 family: Ministral 3 and Mistral Small 3.x, llama's block with YaRN (its beta and log-multiplier keys),
an attention temperature over the original context, head_dim apart from n_embd / n_head, and optional attention
output and FFN biases; a mixture of experts where expert_count is set (llama.cpp's src/models/mistral3.cpp)."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from ..errors import GGUFError
from ..native import Context, Tensor
from .base import Weights, f32, yarn_attn_factor
from .common import ROPE_NORM, Architecture


class Mistral3Arch(Architecture):
    rope_mode = ROPE_NORM
    rope_whole_heads = True
    ffn_bias = False  # ffn_{gate,up,down}.bias in the dense blocks

    def load_hparams(self, meta: Mapping[str, Any]) -> None:
        hp = self.hp
        self.yarn_beta = (
            float(self.key(meta, "rope.scaling.yarn_beta_fast", self.yarn_beta[0])),
            float(self.key(meta, "rope.scaling.yarn_beta_slow", self.yarn_beta[1])),
        )
        log_mul = float(self.key(meta, "rope.scaling.yarn_log_multiplier", 0.0))
        if hp.rope_ext_factor and log_mul:  # llama_context's attn_factor for a log multiplier (mscale 1)
            attn = yarn_attn_factor(hp.rope_scale, log_mul) * f32(self.key(meta, "rope.scaling.attn_factor", 1.0))
            self.hp = dataclasses.replace(hp, rope_attn_factor=float(attn))
        temp = float(self.key(meta, "attention.temperature_scale", 0.0))
        if temp:
            if not hp.n_ctx_orig:
                raise GGUFError("invalid n_ctx_orig_yarn for attention temperature scaling")
            self.attn_temp = (temp, hp.n_ctx_orig, 0.0)
        self.out_bias = "blk.0.attn_output.bias" in self.names
        self.ffn_bias = "blk.0.ffn_up.bias" in self.names

    def block_tensor_shapes(self, il: int) -> dict[str, tuple[int, ...]]:
        shapes = super().block_tensor_shapes(il)
        if self.ffn_bias and not self.is_moe(il):
            p, hp = f"blk.{il}.", self.hp
            shapes.update(
                {p + "ffn_gate.bias": (hp.n_ff,), p + "ffn_up.bias": (hp.n_ff,), p + "ffn_down.bias": (hp.n_embd,)}
            )
        return shapes

    def build_ffn(self, ctx: Context, w: Weights, p: str, cur: Tensor) -> Tensor:
        if not self.ffn_bias or self.is_moe(int(p.split(".")[1])):
            return super().build_ffn(ctx, w, p, cur)
        up = ctx.add(ctx.mul_mat(w(p + "ffn_up.weight"), cur), w(p + "ffn_up.bias"))
        gate = ctx.add(ctx.mul_mat(w(p + "ffn_gate.weight"), cur), w(p + "ffn_gate.bias"))
        return ctx.add(ctx.mul_mat(w(p + "ffn_down.weight"), self.glu(ctx, gate, up)), w(p + "ffn_down.bias"))

    def describe(self) -> list[str]:
        lines = []
        if self.attn_temp:
            lines.append(
                f"attention temperature: Q scaled by 1 + {self.attn_temp[0]:g} * log(1 + floor(pos / "
                f"{self.attn_temp[1]}))"
            )
        return lines
