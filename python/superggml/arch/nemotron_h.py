"""nemotron_h family: NVIDIA's Nemotron-H and Nemotron Nano 2, hybrids whose every block is one of three kinds
(llama.cpp's src/models/nemotron-h.cpp): a Mamba-2 mixer (arch/mamba2.py; attention.head_count_kv and
feed_forward_length both 0 for the layer), attention without RoPE (feed_forward_length 0), or an MLP of
up -> ReLU squared -> down (feed_forward_length > 0), each pre-normed by attn_norm and added to the residual.
Only the attention blocks keep a K/V cache and only the mixers a state; the MLP blocks keep nothing per sequence.

nemotron_h_moe (Nemotron 3 Nano) is the same graph with experts in the MLP blocks: sigmoid routing chosen with
exp_probs_b, ungated experts (up, ReLU squared, down) and an ungated shared expert of the same kind. The latent
projections of the larger models (moe_latent_size) are not supported.

The norms' epsilon is attention.layer_norm_rms_epsilon, else attention.layer_norm_epsilon (which llama.cpp
requires). The last block keeps every row and the head picks its rows, as llama.cpp gathers them after the
block."""

from __future__ import annotations

from typing import Any, Mapping

from ..errors import GGUFError, UnsupportedModelError
from ..native import Context, Graph, Tensor
from .base import BlockGraph, Memory, StepInputs, Weights
from .common import Architecture
from .mamba2 import Mamba2Layers
from .moe import build_moe_ffn, moe_tensor_shapes, uniform_expert_ff

MIXER, ATTENTION, MLP = "mixer", "attention", "mlp"


class NemotronHArch(Mamba2Layers):
    rms_eps_keys = ("attention.layer_norm_rms_epsilon", "attention.layer_norm_epsilon")
    late_gather = True

    def load_hparams(self, meta: Mapping[str, Any]) -> None:
        hp = self.hp
        self.need(meta, "attention.layer_norm_epsilon")  # required by llama.cpp (its MTP head's norm)
        self.load_ssm(meta)
        if hp.n_expert:
            self.load_experts(meta)
        kv = self.per_layer(meta, "attention.head_count_kv", hp.n_head)
        ff = [int(x) for x in self.per_layer(meta, "feed_forward_length", 0)]
        self.kinds = tuple(MLP if f else MIXER if not k else ATTENTION for k, f in zip(kv, ff))
        self.n_ff_of = tuple(ff)
        attn = next((il for il, k in enumerate(self.kinds) if k == ATTENTION), None)
        if attn is not None:
            p = f"blk.{attn}."
            self.has_qkv_bias = all(p + n + ".bias" in self.names for n in ("attn_q", "attn_k", "attn_v"))
            self.out_bias = p + "attn_output.bias" in self.names
        self.f_attention_scale = float(self.key(meta, "attention.scale", 0.0))
        if any(n.endswith(".attn_qkv.weight") for n in self.names):
            raise UnsupportedModelError(f"{hp.arch}: a fused attn_qkv is not supported")
        self.count_states(self.kinds.count(MIXER), self.kinds.count(ATTENTION))

    def load_experts(self, meta: Mapping[str, Any]) -> None:
        hp = self.hp
        if self.key(meta, "moe_latent_size", 0):
            raise UnsupportedModelError(f"{hp.arch}: experts in a latent space (moe_latent_size) are not supported")
        self.n_ff_exp = uniform_expert_ff(self, meta, hp.n_ff // hp.n_expert_used)
        self.n_ff_shexp = int(self.key(meta, "expert_shared_feed_forward_length", 0))
        if not self.n_ff_shexp:
            raise GGUFError(f"GGUF metadata lacks '{hp.arch}.expert_shared_feed_forward_length'")
        self.shexp_gate, self.moe.relu2, self.moe.probs_bias = False, True, True
        self.moe.gating = "sigmoid"
        self.moe.norm_w = bool(self.key(meta, "expert_weights_norm", False))
        self.moe.w_scale = float(self.key(meta, "expert_weights_scale", 0.0))

    def describe(self) -> list[str]:
        k = self.kinds
        return [
            f"hybrid: {k.count(MIXER)} {self.mixer_note()}, {k.count(ATTENTION)} attention layers with a K/V cache "
            f"and no RoPE, {k.count(MLP)} MLP layers (ReLU squared) that keep nothing per sequence"
        ]

    @property
    def ffn_width(self) -> int:
        return max(self.n_ff_of + (1,))

    # -- memory -------------------------------------------------------------
    def is_moe(self, il: int) -> bool:
        return self.hp.n_expert > 0 and self.kinds[il] == MLP

    def is_recurrent(self, il: int) -> bool:
        return self.kinds[il] == MIXER

    def is_stateless(self, il: int) -> bool:
        return self.kinds[il] == MLP

    # -- tensors ---------------------------------------------------------
    def block_tensor_shapes(self, il: int) -> dict[str, tuple[int, ...]]:
        hp, p, kind = self.hp, f"blk.{il}.", self.kinds[il]
        shapes: dict[str, tuple[int, ...]] = {p + "attn_norm.weight": (hp.n_embd,)}
        if kind == MIXER:
            shapes.update(self.ssm_tensor_shapes(p))
        elif kind == ATTENTION:
            every = Architecture.block_tensor_shapes(self, il)
            shapes.update({n: s for n, s in every.items() if n.startswith(p + "attn_") and "norm" not in n})
        elif self.is_moe(il):
            shapes.update(moe_tensor_shapes(self, il))
        else:
            n_ff = self.n_ff_of[il]
            shapes.update({p + "ffn_up.weight": (hp.n_embd, n_ff), p + "ffn_down.weight": (n_ff, hp.n_embd)})
            for name, n in (("ffn_up.bias", n_ff), ("ffn_down.bias", hp.n_embd)):
                if p + name in self.names:
                    shapes[p + name] = (n,)
        return shapes

    # -- graphs ------------------------------------------------------------
    def rope(self, ctx: Context, w: Weights, inp: StepInputs, il: int, x: Tensor) -> Tensor:
        return x

    def build_attn_part(
        self, ctx: Context, gf: Graph, w: Weights, inp: StepInputs, il: int, x: Tensor, k_cache: Memory, v_cache: Memory
    ) -> tuple[Tensor, Tensor]:
        """An expert block up to its experts (the expert cache's paged block): the residual and the normed input."""
        assert self.is_moe(il)
        return x, self.norm(ctx, w, x, f"blk.{il}.attn_norm.weight")

    def build_block(
        self, ctx: Context, gf: Graph, w: Weights, inp: StepInputs, il: int, x: Tensor, k_cache: Memory, v_cache: Memory
    ) -> Tensor:
        p, kind, blk = f"blk.{il}.", self.kinds[il], BlockGraph(ctx, gf, w, inp, il)
        cur = self.norm(ctx, w, x, p + "attn_norm.weight")
        if self.is_moe(il):
            cur = build_moe_ffn(self, ctx, w, p, cur)
        elif kind == MIXER:
            cur = ctx.mul_mat(w(p + "ssm_out.weight"), self.build_recurrent(blk, cur, k_cache, v_cache))
        elif kind == ATTENTION:
            cur = ctx.mul_mat(w(p + "attn_output.weight"), self.build_attention(blk, cur, k_cache, v_cache))
            if self.out_bias:
                cur = ctx.add(cur, w(p + "attn_output.bias"))
        else:
            up = self.bias(ctx, w, p + "ffn_up", ctx.mul_mat(w(p + "ffn_up.weight"), cur))
            cur = self.bias(ctx, w, p + "ffn_down", ctx.mul_mat(w(p + "ffn_down.weight"), ctx.sqr(ctx.relu(up))))
        return ctx.add(cur, x)

    def bias(self, ctx: Context, w: Weights, name: str, x: Tensor) -> Tensor:
        """x plus the optional `name`.bias."""
        return ctx.add(x, w(name + ".bias")) if name + ".bias" in self.names else x
