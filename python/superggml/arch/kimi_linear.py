"""kimi-linear family (llama.cpp's src/models/kimi-linear.cpp; docs/dev/kimi-linear.md): Kimi-Linear's hybrid of KDA
and nope-only MLA blocks, kimi-k3's without its additions (arch/kimi_k3.py): plain pre-norm residuals (the last
block picks its rows after the mixer), softplus decay, a low-rank KDA output gate (ssm_g_a, ssm_g_b), Q, K and V
from separate projections or one attn_qkv, one attn_q for the MLA queries and no output gate, SwiGLU everywhere,
experts at n_embd with their weights always renormalized and a shared expert."""

from __future__ import annotations

from typing import Any, Mapping

from ..errors import GGUFError, UnsupportedModelError
from ..native import Context, Graph, Tensor
from .base import BlockGraph, Memory, StepInputs, Weights
from .kimi_k3 import KimiK3Arch
from .kimi_k3_kda import KdaShape


class KimiLinearArch(KimiK3Arch):
    late_gather = False
    k3 = False

    def load_hparams(self, meta: Mapping[str, Any]) -> None:
        arch = self.hp.arch
        if any(n.endswith(".attn_kv_b.weight") for n in self.names):
            raise UnsupportedModelError(f"{arch} in the legacy attn_kv_b layout: convert it again (attn_k_b, attn_v_b)")
        if any(n.endswith(".attn_q_a_norm.weight") for n in self.names):  # llama.cpp reads no q_lora_rank here
            raise GGUFError(f"{arch}: low-rank queries (attn_q_a), which llama.cpp's {arch} cannot load")
        super().load_hparams(meta)
        if self.hp.n_expert and not self.n_ff_shexp:
            # llama.cpp adds its shared expert regardless, as silu of the input where the tensors are absent
            raise GGUFError(f"{arch}: MoE blocks without the shared expert llama.cpp's graph always adds")

    def kda_shape(self, n_head: int, head_dim: int, lower_bound: float | None) -> KdaShape:
        fused = any(n.endswith(".attn_qkv.weight") for n in self.names)
        return KdaShape(n_head, head_dim, self.d_conv, None, self.hp.rms_eps, True, fused, (1, n_head))

    def build_attn_part(
        self, ctx: Context, gf: Graph, w: Weights, inp: StepInputs, il: int, x: Tensor, k_cache: Memory, v_cache: Memory
    ) -> tuple[Tensor, Tensor]:
        p = f"blk.{il}."
        cur = self.mixer(
            BlockGraph(ctx, gf, w, inp, il), self.norm(ctx, w, x, p + "attn_norm.weight"), k_cache, v_cache
        )
        if il == self.hp.n_layer - 1 and inp.n_outputs < inp.n_tokens and not inp.keep_rows:
            assert inp.out_ids is not None  # after the mixer's output projection, as llama.cpp
            cur, x = ctx.get_rows(cur, inp.out_ids), ctx.get_rows(x, inp.out_ids)
        ffn_inp = ctx.add(cur, x)
        return ffn_inp, self.norm(ctx, w, ffn_inp, p + "ffn_norm.weight")

    def build_ffn_out(self, ctx: Context, w: Weights, p: str, ffn_out: Tensor, ffn_inp: Tensor) -> Tensor:
        return ctx.add(ffn_out, ffn_inp)
