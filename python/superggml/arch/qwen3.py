"""qwen3 family: the qwen2 block without q/k/v biases, with an RMS norm of every head of Q and K before RoPE
(llama.cpp's src/models/qwen3.cpp); head_dim comes from attention.key_length."""

from __future__ import annotations

from typing import Any

from .common import ROPE_NEOX, Architecture, Weights


class Qwen3Arch(Architecture):
    rope_mode = ROPE_NEOX
    rope_factors = False

    def block_tensor_shapes(self, il: int) -> dict[str, tuple[int, ...]]:
        shapes = super().block_tensor_shapes(il)
        p = f"blk.{il}."
        shapes[p + "attn_q_norm.weight"] = (self.hp.head_dim,)
        shapes[p + "attn_k_norm.weight"] = (self.hp.head_dim,)
        return shapes

    def build_qk_norm(self, ctx: Any, w: Weights, p: str, q: Any, k: Any) -> tuple[Any, Any]:
        eps = self.hp.rms_eps
        q = ctx.mul(ctx.rms_norm(q, eps), w(p + "attn_q_norm.weight"))
        k = ctx.mul(ctx.rms_norm(k, eps), w(p + "attn_k_norm.weight"))
        return q, k
