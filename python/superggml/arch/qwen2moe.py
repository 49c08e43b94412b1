"""qwen2moe family (llama.cpp's src/models/qwen2moe.cpp): the qwen2 block (Q/K/V biases) with a mixture of
experts whose weights are not renormalised, plus a shared expert (expert_shared_feed_forward_length) scaled by
a sigmoid gate."""

from __future__ import annotations

from typing import Any, Mapping

from .moe import qwen_expert_ff
from .qwen2 import Qwen2Arch


class Qwen2MoeArch(Qwen2Arch):
    rope_factors = False

    def load_hparams(self, meta: Mapping[str, Any]) -> None:
        self.moe.norm_w = False
        self.n_ff_exp = qwen_expert_ff(self, meta)
        self.n_ff_shexp = int(self.key(meta, "expert_shared_feed_forward_length", 0)) or self.hp.n_ff
