"""mistral4 family: Mistral 4, deepseek2's layout and graph under its own name (llama.cpp's llama_model_mistral4
reuses deepseek2's loader and graph): multi-head latent attention with YaRN and the attention temperature, experts
with their gate and up fused in one ffn_gate_up_exps."""

from __future__ import annotations

from .deepseek2 import Deepseek2Arch


class Mistral4Arch(Deepseek2Arch):
    pass
