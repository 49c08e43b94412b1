"""glm4moe family (llama.cpp's src/models/glm4-moe.cpp): GLM-4.5, GLM-4.5-Air, GLM-4.6, GLM-4.7.

Attention with Q/K/V biases (where the GGUF has them) and optional Q/K head norms, NeoX RoPE over the first
rope.dimension_count values of each head (partial), the attention output's matmul accumulated in F32; the FFN's
pre-norm is post_attention_norm. The first leading_dense_block_count blocks have a dense FFN, the others a
mixture of experts with sigmoid gating on the probabilities plus exp_probs_b, shared experts, and the chosen
weights renormalised and scaled."""

from __future__ import annotations

from typing import Any, Mapping

from ..errors import GGUFError, UnsupportedModelError
from .common import ROPE_NEOX, Architecture, f32
from .deepseek2 import GATING


class Glm4MoeArch(Architecture):
    rope_mode = ROPE_NEOX
    rope_factors = False
    ffn_norm = "post_attention_norm"
    out_prec_f32 = True

    def load_hparams(self, meta: Mapping[str, Any]) -> None:
        hp = self.hp
        if not hp.n_expert:
            raise GGUFError(f"{hp.arch} GGUF lacks '{hp.arch}.expert_count'")
        if self.key(meta, "rope.dimension_sections", None) is not None:
            raise UnsupportedModelError(f"this {hp.arch} GGUF uses multi-section RoPE (a vision model's): only text "
                                        f"models are supported")
        self.has_qkv_bias = "blk.0.attn_q.bias" in self.names
        self.qk_norm = "blk.0.attn_q_norm.weight" in self.names
        self.n_lead = int(self.key(meta, "leading_dense_block_count", 0))
        self.n_ff_exp = int(self.key(meta, "expert_feed_forward_length", 0)) or hp.n_ff // hp.n_expert_used
        shared = self.key(meta, "expert_shared_count", None)
        if shared is None:
            raise GGUFError(f"GGUF metadata lacks '{hp.arch}.expert_shared_count'")
        self.n_ff_shexp = self.n_ff_exp * int(shared)
        self.shexp_gate = False
        self.moe_probs_bias = True
        self.moe_norm_w = bool(self.key(meta, "expert_weights_norm", False))
        self.moe_w_scale = float(f32(self.key(meta, "expert_weights_scale", 0.0)))
        gating = int(self.key(meta, "expert_gating_func", 0)) or 2     # llama.cpp's default here: sigmoid
        if gating not in GATING:
            raise UnsupportedModelError(f"'{hp.arch}.expert_gating_func' {gating} is not supported")
        self.moe_gating = GATING[gating]
        self.moe_groups = (int(self.key(meta, "expert_group_count", 0)),
                           int(self.key(meta, "expert_group_used_count", 0)))

    def is_moe(self, il: int) -> bool:
        return il >= self.n_lead

    def describe(self) -> list[str]:
        hp = self.hp
        return [f"attention: RoPE over {hp.n_rot} of {hp.head_dim} values per head"
                f"{', Q/K/V biases' if self.has_qkv_bias else ''}{', Q/K head norms' if self.qk_norm else ''}; "
                f"routing: {self.moe_gating} gating with exp_probs_b; "
                f"{self.n_ff_shexp // max(self.n_ff_exp, 1)} shared expert(s); the first {self.n_lead} block(s) dense"]
