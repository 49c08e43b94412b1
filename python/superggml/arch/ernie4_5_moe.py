"""ernie4_5-moe family: Baidu's ERNIE 4.5 MoE, llama's block without rope factors and a mixture of experts after
leading dense blocks: softmax routing (the choice made with exp_probs_b where the GGUF has it), renormalised
weights, and an ungated shared expert added (llama.cpp's src/models/ernie4-5-moe.cpp)."""

from __future__ import annotations

from typing import Any, Mapping

from ..errors import GGUFError, UnsupportedModelError
from .common import ROPE_NORM, Architecture
from .moe import uniform_expert_ff


class Ernie45MoeArch(Architecture):
    rope_mode = ROPE_NORM
    rope_whole_heads = True
    rope_factors = False

    def load_hparams(self, meta: Mapping[str, Any]) -> None:
        hp = self.hp
        if not hp.n_expert:
            raise GGUFError(f"GGUF metadata lacks '{hp.arch}.expert_count'")
        self.n_ff_exp = uniform_expert_ff(self, meta)
        self.n_ff_shexp = int(self.key(meta, "expert_shared_feed_forward_length", 0))
        self.n_lead = int(self.key(meta, "leading_dense_block_count", 0))
        if not self.n_ff_shexp and f"blk.{self.n_lead}.ffn_up_shexp.weight" in self.names:
            raise GGUFError(f"GGUF has shared experts but no '{hp.arch}.expert_shared_feed_forward_length'")
        self.shexp_gate = False
        step = int(self.need(meta, "interleave_moe_layer_step"))
        if step < 1:
            raise GGUFError(f"Ernie 4.5 MoE requires '{hp.arch}.interleave_moe_layer_step' > 0 (it is {step})")
        if step != 1:  # llama.cpp loads experts into every block after the dense ones but runs dense FFNs between
            raise UnsupportedModelError(
                f"'{hp.arch}.interleave_moe_layer_step' {step}: dense blocks between the MoE ones have no weights "
                "in llama.cpp's layout (it fails on them too)"
            )
        self.moe.probs_bias = f"blk.{self.n_lead}.exp_probs_b.bias" in self.names

    def describe(self) -> list[str]:
        shared = f"a shared expert of {self.n_ff_shexp}" if self.n_ff_shexp else "no shared expert"
        bias = " with exp_probs_b" if self.moe.probs_bias else ""
        return [f"routing: softmax gating{bias}; {shared}; the first {self.n_lead} block(s) dense"]
