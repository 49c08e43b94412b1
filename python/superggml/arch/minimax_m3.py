"""minimax-m3 family (llama.cpp's src/models/minimax-m3.cpp; docs/dev/minimax-m3.md): MiniMax-M2's GQA attention with
partial NeoX RoPE but per-head Q/K norms and optional Q/K/V biases; DeepSeek-V3's leading dense blocks and routed
experts with a shared one (sigmoid routing with exp_probs_b, the weights' norm and scale from the keys); gpt-oss's
clamped SwiGLU in every FFN.

Its blocks past the dense ones carry a MiniMax Sparse Attention indexer, which llama.cpp runs only with flash
attention (one sequence or per-sequence caches); without flash attention llama.cpp attends densely in every block,
and so does this. With flash attention superggml refuses the sparse blocks for now.
"""

from __future__ import annotations

from typing import Any, Mapping

from ..errors import GGUFError, UnsupportedModelError
from ..native import Context, Tensor
from .base import BlockGraph, Memory, Weights
from .common import ROPE_NEOX, Architecture, fused_qkv, fused_qkv_shapes
from .moe import SWIGLU_OAI_ALPHA, SWIGLU_OAI_LIMIT, load_routing, routing_note, uniform_expert_ff


class MiniMaxM3Arch(Architecture):
    rope_mode = ROPE_NEOX
    qk_norm = True
    rope_factors = False

    def load_hparams(self, meta: Mapping[str, Any]) -> None:
        hp = self.hp
        if hp.head_dim_v:
            raise GGUFError(f"{hp.arch}: attention.value_length must equal key_length, as llama.cpp asserts")
        self.has_qkv_bias = any(n.endswith(".attn_q.bias") for n in self.names)
        self.n_ff_exp = uniform_expert_ff(self, meta)
        if not int(self.key(meta, "expert_gating_func", 0)):
            raise GGUFError(f"GGUF metadata lacks '{hp.arch}.expert_gating_func'")  # llama.cpp aborts on 0
        load_routing(self, meta, 0)
        self.moe.probs_bias = True
        self.moe.act = "swiglu_oai"
        self.idx_heads = int(self.need(meta, "attention.indexer.head_count"))
        self.idx_dim = int(self.need(meta, "attention.indexer.key_length"))
        self.idx_top_k = int(self.need(meta, "attention.indexer.top_k"))
        self.block_size = int(self.need(meta, "attention.indexer.block_size"))
        self.need(meta, "attention.indexer.local_blocks")
        if self.block_size <= 0:
            raise GGUFError(f"'{hp.arch}.attention.indexer.block_size' is 0: llama.cpp aborts on it")

    def describe(self) -> list[str]:
        hp = self.hp
        return [
            f"per-head Q/K norms; NeoX RoPE over {hp.n_rot} of {hp.head_dim} head values; clamped SwiGLU everywhere",
            routing_note(self),
            f"sparse attention (MSA, blocks of {self.block_size}, top {self.idx_top_k}) in blocks {self.n_lead}..: "
            "llama.cpp runs it with flash attention only; superggml attends densely, as llama.cpp without it",
        ]

    def block_tensor_shapes(self, il: int) -> dict[str, tuple[int, ...]]:
        hp, p = self.hp, f"blk.{il}."
        shapes = super().block_tensor_shapes(il)
        if p + "attn_qkv.weight" in self.names:
            shapes = fused_qkv_shapes(shapes, p, hp.n_embd)
        if self.is_moe(il):
            d = self.idx_dim
            shapes.update(
                {
                    p + "indexer.q_proj.weight": (hp.n_embd, self.idx_heads * d),
                    p + "indexer.k_proj.weight": (hp.n_embd, d),
                    p + "indexer.q_norm.weight": (d,),
                    p + "indexer.k_norm.weight": (d,),
                }
            )
        return shapes

    def build_qkv(
        self, ctx: Context, w: Weights, p: str, cur: Tensor, n: int
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        if w.has(p + "attn_qkv.weight"):
            return fused_qkv(ctx, w, p, cur, self.hp)
        return super().build_qkv(ctx, w, p, cur, n)

    def build_attention(self, blk: BlockGraph, cur: Tensor, k_cache: Memory, v_cache: Memory) -> Tensor:
        if blk.inp.flash_attn and self.is_moe(blk.il):
            raise UnsupportedModelError(
                f"{self.hp.arch}'s block-sparse attention (MSA), which llama.cpp runs with flash attention, is not "
                "supported yet: run without flash attention (dense attention, as llama.cpp then runs it)"
            )
        return super().build_attention(blk, cur, k_cache, v_cache)

    def glu(self, ctx: Context, gate: Tensor, up: Tensor, limit: float = 0.0) -> Tensor:
        return ctx.swiglu_oai(gate, up, SWIGLU_OAI_ALPHA, SWIGLU_OAI_LIMIT)

    def shared_ffn(self, ctx: Context, w: Weights, p: str, cur: Tensor) -> Tensor | None:
        gate, up = ctx.mul_mat(w(p + "ffn_gate_shexp.weight"), cur), ctx.mul_mat(w(p + "ffn_up_shexp.weight"), cur)
        return ctx.mul_mat(w(p + "ffn_down_shexp.weight"), self.glu(ctx, gate, up))
