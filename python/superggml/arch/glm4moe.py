"""glm4moe family (llama.cpp's src/models/glm4-moe.cpp): GLM-4.5, GLM-4.5-Air, GLM-4.6, GLM-4.7.

Attention with Q/K/V biases (where the GGUF has them) and optional Q/K head norms, NeoX RoPE over the first
rope.dimension_count values of each head (partial), the attention output's matmul accumulated in F32; the FFN's
pre-norm is post_attention_norm. The first leading_dense_block_count blocks have a dense FFN, the others a
mixture of experts with sigmoid gating on the probabilities plus exp_probs_b, shared experts, and the chosen
weights renormalised and scaled."""

from __future__ import annotations

from typing import Any, Mapping

from ..errors import GGUFError, UnsupportedModelError
from .common import ROPE_NEOX, Architecture
from .moe import load_routing, routing_note


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
            raise UnsupportedModelError(
                f"this {hp.arch} GGUF uses multi-section RoPE (a vision model's): only text models are supported"
            )
        self.has_qkv_bias = "blk.0.attn_q.bias" in self.names
        self.qk_norm = "blk.0.attn_q_norm.weight" in self.names
        self.n_ff_exp = int(self.key(meta, "expert_feed_forward_length", 0)) or hp.n_ff // hp.n_expert_used
        load_routing(self, meta, 2)  # llama.cpp's default here: sigmoid
        self.moe.probs_bias = True

    def describe(self) -> list[str]:
        hp = self.hp
        return [
            f"attention: RoPE over {hp.n_rot} of {hp.head_dim} values per head"
            f"{', Q/K/V biases' if self.has_qkv_bias else ''}{', Q/K head norms' if self.qk_norm else ''}; "
            + routing_note(self)
        ]
