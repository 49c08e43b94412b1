"""qwen3 family: the qwen2 block without q/k/v biases, with an RMS norm of every head of Q and K before RoPE
(llama.cpp's src/models/qwen3.cpp); head_dim comes from attention.key_length."""

from __future__ import annotations

from .common import ROPE_NEOX, Architecture


class Qwen3Arch(Architecture):
    rope_mode = ROPE_NEOX
    rope_factors = False
    qk_norm = True
