"""granitehybrid family: IBM's Granite 4.0-H (and Bamba), a hybrid of Mamba-2 layers and attention layers
(llama.cpp's src/models/granite-hybrid.cpp). A layer whose attention.head_count_kv is 0 is a Mamba-2 mixer
(arch/mamba2.py); the others attend, with RoPE only where rope.scaling.finetuned is set (Bamba; Granite 4.0-H
has none) and optional Q/K/V and output biases. Every block's FFN is SwiGLU, or softmax-routed experts of
feed_forward_length plus an optional shared expert (expert_shared_feed_forward_length).

Granite's scales: the embedding times embedding_scale, each block's attention (or mixer) and FFN outputs times
residual_scale before the residual, KQ times attention.scale, the logits divided by logit_scale (each where set).
"""

from __future__ import annotations

from typing import Any, Mapping

from ..errors import GGUFError, UnsupportedModelError
from ..native import Context, Tensor
from .base import StepInputs, Weights, f32
from .hybrid import ATTENTION_TENSORS
from .mamba2 import Mamba2Layers


class GraniteHybridArch(Mamba2Layers):
    def load_hparams(self, meta: Mapping[str, Any]) -> None:
        hp = self.hp
        self.load_ssm(meta)
        if self.d_inner != 2 * hp.n_embd:  # llama.cpp asserts it
            raise GGUFError(f"{hp.arch}: ssm.inner_size {self.d_inner} must be twice embedding_length {hp.n_embd}")
        self.recurrent = tuple(x == 0 for x in self.per_layer(meta, "attention.head_count_kv", hp.n_head))
        self.use_rope = bool(self.key(meta, "rope.scaling.finetuned", True))

        def scale(name: str) -> float:
            return float(f32(self.key(meta, name, 0.0)))

        self.embedding_scale, self.logit_scale = scale("embedding_scale"), scale("logit_scale")
        self.residual_scale, self.f_attention_scale = scale("residual_scale"), scale("attention.scale")
        self.n_ff_shexp = int(self.key(meta, "expert_shared_feed_forward_length", 0)) if hp.n_expert else 0
        self.shexp_gate = False
        if not self.n_ff_shexp and any("_shexp." in n for n in self.names):  # llama.cpp: tensors it did not load
            raise GGUFError(f"GGUF has shared experts but no '{hp.arch}.expert_shared_feed_forward_length'")
        attn = next((il for il in range(hp.n_layer) if not self.recurrent[il]), None)
        if attn is not None:
            p = f"blk.{attn}."
            self.has_qkv_bias = all(p + n + ".bias" in self.names for n in ATTENTION_TENSORS[:3])
            self.out_bias = p + "attn_output.bias" in self.names
        unused = next((n for n in self.names if n.endswith(("ffn_gate.bias", "ffn_up.bias", "ffn_down.bias"))), None)
        if unused is not None:
            raise UnsupportedModelError(f"{hp.arch}: FFN biases ('{unused}') are not supported")
        self.count_states()

    def attention_note(self) -> str:
        return "attention layers with a K/V cache" + ("" if self.use_rope else " and no RoPE")

    # -- tensors ---------------------------------------------------------
    def block_tensor_shapes(self, il: int) -> dict[str, tuple[int, ...]]:
        return self.mixer_shapes(il, super().block_tensor_shapes(il), self.ssm_tensor_shapes(f"blk.{il}."))

    # -- graphs ------------------------------------------------------------
    def build_embed(self, ctx: Context, w: Weights, inp: StepInputs) -> Tensor:
        x = super().build_embed(ctx, w, inp)
        return ctx.scale(x, self.embedding_scale) if self.embedding_scale else x

    @property
    def reshapes_logits(self) -> bool:
        return bool(self.logit_scale)

    def build_logits(self, ctx: Context, logits: Tensor) -> Tensor:
        return ctx.scale(logits, float(f32(1.0) / f32(self.logit_scale))) if self.logit_scale else logits

    def rope(self, ctx: Context, w: Weights, inp: StepInputs, il: int, x: Tensor) -> Tensor:
        return super().rope(ctx, w, inp, il, x) if self.use_rope else x
