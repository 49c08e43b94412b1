"""mimo2 family (llama.cpp's src/models/mimo2.cpp; docs/dev/mimo2.md): Xiaomi MiMo-V2's sliding-window and full
attention blocks with K/V head counts of their own per block and value heads narrower than the keys (a memory as
wide as the widest block's K, and V, each block its own leading values), NeoX RoPE over the first
rope.dimension_count values of each head (rope.freq_base_swa in the sliding blocks), attention sinks where a block
has them, the attention output scaled by attention.value_scale after its projection; a dense SwiGLU where a block
has no router, else experts with sigmoid routing (exp_probs_b where present) and renormalized weights, no shared
expert. The MTP block (fused attn_qkv, a dense FFN) drafts from the hidden rows before the output norm
(arch/mtp.py)."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from ..errors import GGUFError, UnsupportedModelError
from ..native import Context, Graph, Tensor
from .base import BlockGraph, HParams, Memory, StepInputs, Weights, f32
from .common import ROPE_NEOX, Architecture, attend_lanes, fused_qkv, fused_qkv_shapes, inv_sqrt
from .moe import set_gating, uniform_expert_ff


class Mimo2Arch(Architecture):
    rope_mode = ROPE_NEOX
    heads_per_layer = True
    kv_heads_per_layer = True
    rope_factors = False
    own_v_heads = True

    def load_hparams(self, meta: Mapping[str, Any]) -> None:
        hp = self.hp
        n = hp.n_layer + hp.n_nextn  # the MTP blocks' too
        self.n_head_of = per_block(hp.n_head_per_layer, hp.n_head, n)
        self.n_head_kv_of = per_block(hp.n_head_kv_per_layer, hp.n_head_kv, n)
        if any(not k or h % k for h, k in zip(self.n_head_of, self.n_head_kv_of)):
            raise GGUFError(f"{hp.arch}: heads {list(self.n_head_of)} do not fit K/V heads {list(self.n_head_kv_of)}")
        self.n_swa = int(self.need(meta, "attention.sliding_window"))
        pattern = self.need(meta, "attention.sliding_window_pattern")
        if not isinstance(pattern, (list, tuple)):
            raise GGUFError(f"'{hp.arch}.attention.sliding_window_pattern' must be an array, as llama.cpp reads it")
        flags = [bool(x) for x in list(pattern)[:n]]
        self.swa_layers = tuple(flags + [False] * (n - len(flags)))  # llama.cpp: missing entries are full
        if not any(self.swa_layers):  # llama.cpp aborts creating its sliding-window cache
            raise UnsupportedModelError(f"{hp.arch} without a sliding-window block: llama.cpp cannot run it either")
        self.rope_base_swa = float(f32(self.key(meta, "rope.freq_base_swa", 10000.0)))
        self.rope_scale_swa = 1.0
        self.value_scale = float(f32(self.key(meta, "attention.value_scale", 1.0)))
        self.moe_layers = tuple(f"blk.{il}.ffn_gate_inp.weight" in self.names for il in range(n))
        self.n_ff_exp = uniform_expert_ff(self, meta)
        set_gating(self, 2)  # llama.cpp's mimo2 routes by sigmoid, renormalized, unscaled, whatever the keys say
        self.moe.norm_w = True
        self.moe.groups = (
            int(self.key(meta, "expert_group_count", 0)),
            int(self.key(meta, "expert_group_used_count", 0)),
        )
        biased = {f"blk.{il}.exp_probs_b.bias" in self.names for il in range(n) if self.moe_layers[il]}
        if len(biased) > 1:
            raise UnsupportedModelError(f"{hp.arch}: exp_probs_b in some expert blocks only")
        self.moe.probs_bias = biased == {True}
        self.sinks = tuple(f"blk.{il}.attn_sinks.weight" in self.names for il in range(n))
        dv = hp.head_dim_v or hp.head_dim
        widest = max(self.n_head_kv_of)
        self.hp = dataclasses.replace(
            hp, n_head=max(self.n_head_of), kv_width=hp.head_dim * widest, kv_width_v=dv * widest
        )
        self.layer_hps = tuple(
            dataclasses.replace(self.hp, n_head=h, n_head_kv=k, n_head_kv_per_layer=(), kv_width=0, kv_width_v=0)
            for h, k in zip(self.n_head_of, self.n_head_kv_of)
        )

    def describe(self) -> list[str]:
        hp = self.hp
        return [
            f"attention heads per block {sorted(set(self.n_head_of))}, K/V heads {sorted(set(self.n_head_kv_of))}; "
            f"keys of {hp.head_dim}, values of {hp.head_dim_v or hp.head_dim}; sinks in {sum(self.sinks)} block(s)",
            f"experts in {sum(self.moe_layers)} of {hp.n_layer} blocks (sigmoid routing, no shared expert)",
        ]

    def is_moe(self, il: int) -> bool:
        return self.moe_layers[il]

    def layer_hp(self, il: int) -> HParams:
        return self.layer_hps[il]

    # -- tensors ---------------------------------------------------------
    def block_tensor_shapes(self, il: int) -> dict[str, tuple[int, ...]]:
        hp, p = self.hp, f"blk.{il}."
        shapes = super().block_tensor_shapes(il)
        h, kv, dv = self.n_head_of[il], self.n_head_kv_of[il], hp.head_dim_v or hp.head_dim
        shapes[p + "attn_q.weight"] = (hp.n_embd, h * hp.head_dim)
        shapes[p + "attn_k.weight"] = (hp.n_embd, kv * hp.head_dim)
        shapes[p + "attn_v.weight"] = (hp.n_embd, kv * dv)
        shapes[p + "attn_output.weight"] = (h * dv, hp.n_embd)
        if self.sinks[il]:
            shapes[p + "attn_sinks.weight"] = (h,)
        return fused_qkv_shapes(shapes, p, hp.n_embd) if p + "attn_qkv.weight" in self.names else shapes

    def build_qkv(
        self, ctx: Context, w: Weights, p: str, cur: Tensor, n: int
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        if w.has(p + "attn_qkv.weight"):  # MiMo-V2.5's fused projection: RoPE runs on the views, as llama.cpp
            return fused_qkv(ctx, w, p, cur, self.layer_hp(int(p.split(".")[1])))
        return super().build_qkv(ctx, w, p, cur, n)

    # -- graphs ------------------------------------------------------------
    def rope(self, ctx: Context, w: Weights, inp: StepInputs, il: int, x: Tensor) -> Tensor:
        hp, swa = self.hp, self.is_swa(il)
        assert inp.positions is not None
        return ctx.rope_ext(
            x,
            inp.positions,
            None,
            hp.n_rot,
            self.rope_mode,
            hp.n_ctx_orig,
            self.rope_base_swa if swa else hp.rope_base,
            self.rope_scale_swa if swa else hp.rope_scale,
            hp.rope_ext_factor,
            hp.rope_attn_factor,
            *self.yarn_beta,
        )

    def build_attention(self, blk: BlockGraph, cur: Tensor, k_cache: Memory, v_cache: Memory) -> Tensor:
        ctx, w, inp, il = blk.ctx, blk.w, blk.inp, blk.il
        hp, p = self.layer_hp(il), f"blk.{il}."
        q, k, v = self.build_qkv(ctx, w, p, cur, inp.n_tokens)
        q, k = self.rope(ctx, w, inp, il, q), None if k is None else self.rope(ctx, w, inp, il, k)
        sinks = w(p + "attn_sinks.weight") if self.sinks[il] else None
        return attend_lanes(blk, hp, q, k, v, k_cache, v_cache, inv_sqrt(hp.head_dim), self.is_swa(il), 0.0, sinks)

    def build_attn_part(
        self, ctx: Context, gf: Graph, w: Weights, inp: StepInputs, il: int, x: Tensor, k_cache: Memory, v_cache: Memory
    ) -> tuple[Tensor, Tensor]:
        p = f"blk.{il}."
        cur = self.norm(ctx, w, x, p + "attn_norm.weight")
        cur = ctx.mul_mat(
            w(p + "attn_output.weight"), self.build_attention(BlockGraph(ctx, gf, w, inp, il), cur, k_cache, v_cache)
        )
        if self.value_scale != 1.0:  # after the output projection, as llama.cpp
            cur = ctx.scale(cur, self.value_scale)
        if il == self.hp.n_layer - 1 and inp.n_outputs < inp.n_tokens and not inp.keep_rows:
            assert inp.out_ids is not None
            cur, x = ctx.get_rows(cur, inp.out_ids), ctx.get_rows(x, inp.out_ids)
        ffn_inp = ctx.add(cur, x)
        return ffn_inp, self.norm(ctx, w, ffn_inp, p + "ffn_norm.weight")


def per_block(per: tuple[int, ...], one: int, n: int) -> tuple[int, ...]:
    """A count per block, MTP blocks included: the per-layer array where the file has one, else `one` each."""
    if not per:
        return (one,) * n
    if len(per) < n:
        raise GGUFError(f"a per-layer head count has {len(per)} entries for {n} blocks")
    return tuple(per[:n])
