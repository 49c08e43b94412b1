"""minimax-m2 family: MiniMax-M2, RMS norms over all Q and K heads together (olmoe's) before a partial NeoX RoPE,
and a mixture of experts in every block with sigmoid routing chosen with exp_probs_b and renormalised weights; the
experts are feed_forward_length wide (llama.cpp's src/models/minimax-m2.cpp)."""

from __future__ import annotations

from typing import Any, Mapping

from ..errors import GGUFError
from .moe import set_gating
from .olmoe import OlmoeArch


class MiniMaxM2Arch(OlmoeArch):
    def load_hparams(self, meta: Mapping[str, Any]) -> None:
        hp = self.hp
        if not hp.n_expert:
            raise GGUFError(f"GGUF metadata lacks '{hp.arch}.expert_count'")
        self.need(meta, "expert_feed_forward_length")  # required, though the experts are n_ff wide
        gating = int(self.key(meta, "expert_gating_func", 0))
        if not gating:  # llama.cpp aborts in build_moe_ffn on gating "none"
            raise GGUFError(f"GGUF metadata lacks '{hp.arch}.expert_gating_func'")
        set_gating(self, gating)
        self.moe.probs_bias = True

    def describe(self) -> list[str]:
        hp = self.hp
        return [
            f"Q/K norms over all heads; RoPE over {hp.n_rot} of {hp.head_dim} head values",
            f"routing: {self.moe.gating} gating with exp_probs_b, in every block",
        ]
