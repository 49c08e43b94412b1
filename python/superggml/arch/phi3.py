"""phi3 family (llama.cpp's src/models/phi3.cpp): fused Q/K/V in attn_qkv, fused gate and up in ffn_up
(SwiGLU over its two halves), NeoX RoPE, Q scaled by 1/sqrt(head_dim) before attention. The 128k-context
models' LongRoPE factors (rope_factors_long/short) apply as llama.cpp applies them: the long ones when the
context exceeds rope.scaling.original_context_length. llama.cpp disables Phi's sliding window (its GGUFs
do not say which layers slide), and so does this."""

from __future__ import annotations

from typing import Any, Mapping

from ..native import Context, Tensor
from .base import Weights
from .common import ROPE_NEOX, Architecture, inv_sqrt


class Phi3Arch(Architecture):
    rope_mode = ROPE_NEOX

    def load_hparams(self, meta: Mapping[str, Any]) -> None:
        self.q_scale = inv_sqrt(self.hp.head_dim)

    def block_tensor_shapes(self, il: int) -> dict[str, tuple[int, ...]]:
        hp = self.hp
        p = f"blk.{il}."
        n_q = hp.n_head * hp.head_dim
        return {
            p + "attn_norm.weight": (hp.n_embd,),
            p + "attn_qkv.weight": (hp.n_embd, n_q + 2 * hp.n_embd_gqa),
            p + "attn_output.weight": (n_q, hp.n_embd),
            p + "ffn_norm.weight": (hp.n_embd,),
            p + "ffn_up.weight": (hp.n_embd, 2 * hp.n_ff),
            p + "ffn_down.weight": (hp.n_ff, hp.n_embd),
        }

    def build_qkv(self, ctx: Context, w: Weights, p: str, cur: Tensor, n: int) -> tuple[Tensor, Tensor, Tensor]:
        hp = self.hp
        qkv = ctx.mul_mat(w(p + "attn_qkv.weight"), cur)  # F32 [n_q + 2 n_embd_gqa, n]
        es, d = qkv.element_size, hp.head_dim
        n_q = hp.n_head * d
        row = qkv.nb[1]
        q = ctx.view(qkv, [d, hp.n_head, n], [d * es, row], 0)
        k = ctx.view(qkv, [d, hp.n_head_kv, n], [d * es, row], n_q * es)
        v = ctx.view(qkv, [hp.n_embd_gqa, n], [row], (n_q + hp.n_embd_gqa) * es)
        return q, k, v

    def build_ffn(self, ctx: Context, w: Weights, p: str, cur: Tensor) -> Tensor:
        hp = self.hp
        up = ctx.mul_mat(w(p + "ffn_up.weight"), cur)  # F32 [2 n_ff, n]: gate, then up
        n = up.ne[1]
        gate = ctx.view(up, [hp.n_ff, n], [up.nb[1]], 0)
        upv = ctx.view(up, [hp.n_ff, n], [up.nb[1]], hp.n_ff * up.element_size)
        return ctx.mul_mat(w(p + "ffn_down.weight"), ctx.swiglu_split(gate, upv))
