"""qwen35moe family (llama.cpp's src/models/qwen35moe.cpp): Qwen3.5's hybrid blocks (arch/qwen35.py) with a
mixture of experts (softmax routing, the chosen weights renormalised) plus a shared expert behind a sigmoid
gate (ffn_gate_inp_shexp), as Qwen3-Next's."""

from __future__ import annotations

from typing import Any, Mapping

from .moe import qwen_expert_ff
from .qwen35 import Qwen35Arch


class Qwen35MoeArch(Qwen35Arch):
    def load_hparams(self, meta: Mapping[str, Any]) -> None:
        super().load_hparams(meta)
        self.n_ff_exp = qwen_expert_ff(self, meta)
        self.n_ff_shexp = int(self.key(meta, "expert_shared_feed_forward_length", 0)) or self.hp.n_ff
        self.moe.w_scale = float(self.key(meta, "expert_weights_scale", 0.0))
        self.shexp_sigmoid = True
