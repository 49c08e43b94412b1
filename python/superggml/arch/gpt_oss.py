"""gpt-oss family (llama.cpp's src/models/openai-moe.cpp): Q/K/V and output biases; a learned per-head
attention sink in every softmax; every other layer slides (attention.sliding_window, pattern 2); NeoX RoPE
(YaRN in the released models); the FFN's pre-norm is post_attention_norm; a mixture of experts with router
and expert biases, the chosen experts' logits softmaxed among themselves, and a clamped SwiGLU."""

from __future__ import annotations

from typing import Any, Callable, Mapping

from ..errors import GGUFError
from .common import ROPE_NEOX, Architecture


class GptOssArch(Architecture):
    rope_mode = ROPE_NEOX
    rope_factors = False
    has_qkv_bias = True
    attn_sinks = True
    out_bias = True
    ffn_norm = "post_attention_norm"

    def load_hparams(self, meta: Mapping[str, Any]) -> None:
        if not self.hp.n_expert:
            raise GGUFError("gpt-oss GGUF lacks 'gpt-oss.expert_count'")
        self.n_swa = int(self.need(meta, "attention.sliding_window"))
        if self.n_swa <= 0:
            raise GGUFError(
                "'gpt-oss.attention.sliding_window' is 0: the sliding blocks would attend to nothing "
                "(llama.cpp computes them so, from the sinks alone)"
            )
        self.set_swa_pattern(meta, 2)
        self.rope_base_swa = float(self.key(meta, "rope.freq_base_swa", self.hp.rope_base))
        self.n_ff_exp = int(self.key(meta, "expert_feed_forward_length", 0)) or self.hp.n_ff
        self.moe.norm_w = False
        self.moe.gating = "softmax_weight"
        self.moe.act = "swiglu_oai"
        self.moe.biases = True

    def output_tensor(self, has: Callable[[str], bool]) -> str:
        return "output.weight"
