"""qwen3moe family (llama.cpp's src/models/qwen3moe.cpp): the qwen3 block (Q/K head norms) with a mixture of
experts (expert_feed_forward_length) whose chosen weights are renormalised."""

from __future__ import annotations

from typing import Any, Mapping

from .moe import qwen_expert_ff
from .qwen3 import Qwen3Arch


class Qwen3MoeArch(Qwen3Arch):
    def load_hparams(self, meta: Mapping[str, Any]) -> None:
        self.n_ff_exp = qwen_expert_ff(self, meta)
