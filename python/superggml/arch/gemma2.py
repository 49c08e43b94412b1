"""gemma2 family (llama.cpp's src/models/gemma2.cpp): embeddings scaled by sqrt(n_embd); RMS norms of the
attention and FFN outputs before the residual adds; a GELU-gated FFN; NeoX RoPE; Q scaled before attention;
attention logits soft-capped (c * tanh(x / c)) and so are the final logits; every other layer attends over
a sliding window (attention.sliding_window, 4096 when absent; the last layer of each period is global); the
head is tied to token_embd.

Like llama.cpp, the query scale is 1/sqrt(head_dim), or 1/sqrt(n_embd / n_head) for the 27B model (46
layers); llama.cpp reads no query_pre_attn_scalar key, so neither does this."""

from __future__ import annotations

from typing import Any, Callable, Mapping

import numpy as np

from ..native import Context, Tensor
from .base import StepInputs, Weights, f32
from .common import ROPE_NEOX, Architecture, inv_sqrt


class Gemma2Arch(Architecture):
    rope_mode = ROPE_NEOX
    rope_factors = False
    post_norms = True
    ffn_glu = "geglu"
    swa_period = 2  # llama.cpp's default sliding-window pattern for the family
    big_layers = 46  # the 27B model, whose query scale is 1/sqrt(n_embd / n_head)

    def load_hparams(self, meta: Mapping[str, Any]) -> None:
        hp = self.hp
        self.n_swa = int(self.key(meta, "attention.sliding_window", 4096))
        self.set_swa_pattern(meta, self.swa_period)
        self.rope_base_swa = float(self.key(meta, "rope.freq_base_swa", hp.rope_base))
        self.attn_softcap = float(self.key(meta, "attn_logit_softcapping", 50.0))
        self.final_softcap = float(self.key(meta, "final_logit_softcapping", 30.0))
        self.q_scale = self.query_scale()

    def query_scale(self) -> float:
        hp = self.hp
        return inv_sqrt(hp.n_embd // hp.n_head if hp.n_layer == self.big_layers else hp.head_dim)

    def output_tensor(self, has: Callable[[str], bool]) -> str:
        return "token_embd.weight"  # llama.cpp ignores an output.weight here

    def build_embed(self, ctx: Context, w: Weights, inp: StepInputs) -> Tensor:
        return ctx.scale(super().build_embed(ctx, w, inp), float(np.sqrt(f32(self.hp.n_embd))))  # sqrtf(n_embd)
