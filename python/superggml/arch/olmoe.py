"""olmoe family (llama.cpp's src/models/olmoe.cpp): RMS norms of the whole Q and K projections (not per head)
before RoPE, NeoX RoPE, a mixture of experts of feed_forward_length each, weights not renormalised."""

from __future__ import annotations

from typing import Any, Callable, Mapping

from ..native import Context, Tensor
from .base import Weights
from .common import ROPE_NEOX, Architecture


class OlmoeArch(Architecture):
    rope_mode = ROPE_NEOX
    rope_factors = False

    def load_hparams(self, meta: Mapping[str, Any]) -> None:
        self.moe.norm_w = False

    def block_tensor_shapes(self, il: int) -> dict[str, tuple[int, ...]]:
        shapes = super().block_tensor_shapes(il)
        p = f"blk.{il}."
        shapes[p + "attn_q_norm.weight"] = (self.hp.n_head * self.hp.head_dim,)
        shapes[p + "attn_k_norm.weight"] = (self.hp.n_embd_gqa,)
        return shapes

    def output_tensor(self, has: Callable[[str], bool]) -> str:
        return "output.weight"

    def build_qkv(self, ctx: Context, w: Weights, p: str, cur: Tensor, n: int) -> tuple[Tensor, Tensor, Tensor]:
        hp = self.hp
        q = self.norm(ctx, w, ctx.mul_mat(w(p + "attn_q.weight"), cur), p + "attn_q_norm.weight")
        k = self.norm(ctx, w, ctx.mul_mat(w(p + "attn_k.weight"), cur), p + "attn_k_norm.weight")
        v = ctx.mul_mat(w(p + "attn_v.weight"), cur)
        return ctx.reshape(q, [hp.head_dim, hp.n_head, n]), ctx.reshape(k, [hp.head_dim, hp.n_head_kv, n]), v
