"""qwen2 family: the llama block with q/k/v biases and NeoX-style RoPE."""

from __future__ import annotations

from .common import ROPE_NEOX, Architecture


class Qwen2Arch(Architecture):
    rope_mode = ROPE_NEOX
    rope_factors = False
    has_qkv_bias = True
