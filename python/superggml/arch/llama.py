"""llama family: Llama 2/3, Mistral, SmolLM2, TinyLlama (GQA, RoPE, RMSNorm, SwiGLU)."""

from __future__ import annotations

from .common import ROPE_NORM, Architecture


class LlamaArch(Architecture):
    rope_mode = ROPE_NORM
    has_qkv_bias = False
