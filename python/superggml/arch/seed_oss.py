"""seed_oss family: ByteDance's Seed-OSS, llama's block with NeoX RoPE, Q/K/V biases where the GGUF has them, its own
head_dim (attention.key_length) and the FFN's pre-norm named post_attention_norm (llama.cpp's
src/models/seed-oss.cpp)."""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from .common import ROPE_NEOX, Architecture, HParams


class SeedOssArch(Architecture):
    rope_mode = ROPE_NEOX
    rope_factors = False
    ffn_norm = "post_attention_norm"

    def __init__(self, hp: HParams, meta: Mapping[str, Any] | None = None, names: Iterable[str] = ()):
        super().__init__(hp, meta, names)
        # llama.cpp reads the biases as optional (create_tensor_qkv): all three, or none
        self.has_qkv_bias = not self.names or "blk.0.attn_q.bias" in self.names
