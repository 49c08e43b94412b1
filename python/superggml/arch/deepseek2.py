"""deepseek2 family (llama.cpp's src/models/deepseek2.cpp): DeepSeek-V2/V2.5/V3/R1, Kimi-K2, GLM-4.7-Flash.

Multi-head latent attention in its absorbed form (attn_k_b, attn_v_b): each token's K/V is one latent row of
kv_lora_rank values plus a shared RoPE key of n_rot, and attention runs as MQA over it. The memory holds only
that row (HParams.latent_kv; V is its first kv_lora_rank values); queries are absorbed into the latent space by
attn_k_b and the output decompressed by attn_v_b. Queries come from a low-rank attn_q_a -> attn_q_a_norm ->
attn_q_b path, or one attn_q (the "lite" layouts). Older GGUFs have the legacy layout (one attn_kv_b, no
key_length_mla): llama.cpp decompresses the latent into plain heads there, K and V cached per head, and so does
this. YaRN with llama.cpp's mscale. The first
leading_dense_block_count blocks have a dense FFN; the others a mixture of experts with shared experts, softmax
or sigmoid gating, exp_probs_b, expert groups, and the chosen weights renormalised and scaled.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import numpy as np

from ..errors import GGUFError
from ..native import Context, Graph, Tensor
from .base import BlockGraph, Memory, StepInputs, Weights, f32, lane_memory, logf, one_memory
from .common import Architecture, Rows, attend_lanes, attend_latent, each_lane, whole
from .moe import load_routing, routing_note, uniform_expert_ff


class Deepseek2Arch(Architecture):
    rope_factors = False

    def load_hparams(self, meta: Mapping[str, Any]) -> None:
        hp = self.hp

        def need(name: str) -> Any:
            return self.need(meta, name)

        lite = hp.n_layer in (26, 27) or (hp.n_layer == 48 and hp.n_vocab == 128256)  # llama.cpp's rule
        self.q_lora = 0 if lite else int(need("attention.q_lora_rank"))
        self.kv_lora = int(need("attention.kv_lora_rank"))
        self.k_mla = int(self.key(meta, "attention.key_length_mla", 0))
        self.v_mla = int(self.key(meta, "attention.value_length_mla", 0))
        # no key_length_mla: the legacy layout (attn_kv_b), whose K/V llama.cpp decompresses into plain heads
        self.legacy = not (self.k_mla and self.v_mla)
        if self.legacy:
            self.k_mla, self.v_mla = hp.head_dim, hp.head_dim_v or hp.head_dim
            self.own_v_heads = True
        self.n_nope = self.k_mla - hp.n_rot
        # the absorbed layout's V is the latent row: llama.cpp runs whatever value_length says
        if self.n_nope < 1 or (
            hp.n_head_kv != hp.n_head if self.legacy else (hp.n_head_kv != 1 or hp.head_dim != self.kv_lora + hp.n_rot)
        ):
            raise GGUFError(
                f"{hp.arch} MLA hyperparameters are inconsistent: key_length {hp.head_dim}, "
                f"value_length {hp.head_dim_v}, kv_lora_rank {self.kv_lora}, rope {hp.n_rot}, "
                f"key_length_mla {self.k_mla}, head_count_kv {hp.n_head_kv}"
            )
        temp = float(self.key(meta, "attention.temperature_scale", 0.0))
        if temp:  # Mistral-Large 3, Mistral 4: over temperature_length positions, as llama.cpp reads it
            floor = int(self.key(meta, "attention.temperature_length", 0))
            if not floor:  # llama.cpp asserts on it
                raise GGUFError(
                    f"'{hp.arch}.attention.temperature_scale' without '{hp.arch}.attention.temperature_length'"
                )
            self.attn_temp = (temp, floor, 0.0)
        self.n_ff_exp = uniform_expert_ff(self, meta)
        # DeepSeek V2/V2.5 GGUFs lack expert_gating_func (softmax); GLM-4.7-Flash's are known by their shape
        load_routing(self, meta, 2 if hp.n_layer in (47, 48) and hp.n_vocab == 154880 else 1)
        self.moe.probs_bias = f"blk.{self.n_lead}.exp_probs_b.bias" in self.names
        self.moe.fused_gate_up = f"blk.{self.n_lead}.ffn_gate_up_exps.weight" in self.names
        self.kq_scale = self.attention_scale(meta)
        self.hp = dataclasses.replace(  # the absorbed layout's V is the latent row
            self.hp, latent_kv=not self.legacy, head_dim_v=self.hp.head_dim_v if self.legacy else self.kv_lora
        )

    def attention_scale(self, meta: Mapping[str, Any]) -> float:
        """KQ's scale, as deepseek2.cpp pre-scales it for YaRN (mscale^2 / sqrt(key_length_mla)); with
        rope.scaling.yarn_log_multiplier, the attn_factor RoPE gets is llama_context's for that case."""
        hp = self.hp
        log_mul = f32(self.key(meta, "rope.scaling.yarn_log_multiplier", 0.0)) / f32(0.1)
        attn_factor = f32(hp.rope_attn_factor)
        log = logf(f32(1.0) / f32(hp.rope_scale))
        if hp.rope_ext_factor and log_mul:  # get_mscale(f, m) / get_mscale(f, m) = 1, then the cancelling factor
            attn_factor = f32(1.0) * (f32(1.0) / (f32(1.0) + f32(0.1) * log))
            attn_factor *= f32(self.key(meta, "rope.scaling.attn_factor", 1.0))
            self.hp = dataclasses.replace(hp, rope_attn_factor=float(attn_factor))
        org = attn_factor * (f32(1.0) + f32(0.1) * log)
        mscale = org * (f32(1.0) + f32(0.1) * log_mul * log)
        return float(f32(1.0) * mscale * mscale / np.sqrt(f32(self.k_mla)))

    def describe(self) -> list[str]:
        hp = self.hp
        q = f"queries through a rank-{self.q_lora} projection" if self.q_lora else "queries from one attn_q"
        if self.legacy:
            lines = [
                f"multi-head latent attention in the legacy attn_kv_b layout: kv_lora_rank {self.kv_lora} "
                f"decompressed into {hp.n_head} heads of {self.k_mla} (K) and {self.v_mla} (V), a plain K/V "
                f"cache of them (convert again for the absorbed layout's smaller cache); {q}"
            ]
        else:
            lines = [
                f"multi-head latent attention: {hp.n_head} heads of {self.k_mla} (K) and {self.v_mla} (V) over "
                f"one latent row per token and layer, kv_lora_rank {self.kv_lora} + rope {hp.n_rot} values, no "
                f"V; {q}"
            ]
        if hp.n_expert:
            lines.append(routing_note(self))
        return lines

    # -- tensors ---------------------------------------------------------
    def block_tensor_shapes(self, il: int) -> dict[str, tuple[int, ...]]:
        hp, p = self.hp, f"blk.{il}."
        shapes = super().block_tensor_shapes(il)
        for n in ("attn_q", "attn_k", "attn_v", "attn_output"):
            del shapes[p + n + ".weight"]
        if self.q_lora:
            shapes[p + "attn_q_a.weight"] = (hp.n_embd, self.q_lora)
            shapes[p + "attn_q_a_norm.weight"] = (self.q_lora,)
            shapes[p + "attn_q_b.weight"] = (self.q_lora, hp.n_head * self.k_mla)
        else:
            shapes[p + "attn_q.weight"] = (hp.n_embd, hp.n_head * self.k_mla)
        shapes.update(
            {
                p + "attn_kv_a_mqa.weight": (hp.n_embd, self.kv_lora + hp.n_rot),
                p + "attn_kv_a_norm.weight": (self.kv_lora,),
                p + "attn_output.weight": (hp.n_head * self.v_mla, hp.n_embd),
            }
        )
        if self.legacy:
            shapes[p + "attn_kv_b.weight"] = (self.kv_lora, hp.n_head * (self.n_nope + self.v_mla))
        else:
            shapes[p + "attn_k_b.weight"] = (self.n_nope, self.kv_lora, hp.n_head)
            shapes[p + "attn_v_b.weight"] = (self.kv_lora, self.v_mla, hp.n_head)
        return shapes

    # -- graphs ------------------------------------------------------------
    def build_attention(self, blk: BlockGraph, cur: Tensor, k_cache: Memory, v_cache: Memory) -> Tensor:
        ctx, gf, w, inp, il = blk.ctx, blk.gf, blk.w, blk.inp, blk.il
        hp, p, n = self.hp, f"blk.{il}.", inp.n_tokens
        qr = None  # the low-rank queries, normed
        if self.q_lora:
            qr = self.norm(ctx, w, ctx.mul_mat(w(p + "attn_q_a.weight"), cur), p + "attn_q_a_norm.weight")
            q = ctx.mul_mat(w(p + "attn_q_b.weight"), qr)
        else:
            q = ctx.mul_mat(w(p + "attn_q.weight"), cur)
        sparse = self.build_indexer(ctx, w, inp, il, cur, qr)
        q = ctx.reshape(q, [self.k_mla, hp.n_head, n])
        kv_pe = ctx.mul_mat(w(p + "attn_kv_a_mqa.weight"), cur)  # [kv_lora + n_rot, n]
        row = kv_pe.nb[1]
        kv = ctx.view(kv_pe, [self.kv_lora, n], [row], 0)
        k_pe = ctx.view(kv_pe, [hp.n_rot, 1, n], [row, row], self.kv_lora * kv_pe.element_size)
        k_pe = self.rope(ctx, w, inp, il, k_pe)
        kv = self.norm(ctx, w, kv, p + "attn_kv_a_norm.weight")
        q_nope = ctx.view(q, [self.n_nope, hp.n_head, n], [q.nb[1], q.nb[2]], 0)
        q_pe = ctx.view(q, [hp.n_rot, hp.n_head, n], [q.nb[1], q.nb[2]], self.n_nope * q.element_size)
        q_pe = self.rope(ctx, w, inp, il, q_pe)
        if self.legacy:
            return self.attend_heads(blk, q_nope, q_pe, kv, k_pe, k_cache, v_cache)
        absorbed = ctx.mul_mat(w(p + "attn_k_b.weight"), ctx.permute(q_nope, 0, 2, 1, 3))  # [kv_lora, n, n_head]
        q = ctx.concat(ctx.permute(absorbed, 0, 2, 1, 3), q_pe, 0)  # [kv_lora + n_rot, n_head, n]
        q = self.temperature(ctx, inp, il, q)
        k = ctx.concat(ctx.reshape(kv, [self.kv_lora, 1, n]), k_pe, 0)  # [kv_lora + n_rot, 1, n]
        v_b = w(p + "attn_v_b.weight")
        lhp = self.layer_hp(il)

        sinks = self.latent_sinks(w, p)

        def attend(lane: StepInputs, rows: Rows, cache: Tensor) -> Tensor:
            mask = lane.mask if sparse is None else self.sparse_mask(ctx, gf, lane, sparse, rows, cache)
            return attend_latent(ctx, gf, lhp, lane, rows(q), rows(k), cache, self.kq_scale, mask, v_b, sinks)

        if inp.lanes is None:
            return attend(inp, whole, one_memory(k_cache))
        return each_lane(ctx, inp, lambda j, lane, rows: attend(lane, rows, lane_memory(k_cache, j)))

    def latent_sinks(self, w: Weights, p: str) -> Tensor | None:
        """Block p's per-head sink logits in the latent attention's softmax (hy_v4); None: none."""
        return None

    def build_indexer(
        self, ctx: Context, w: Weights, inp: StepInputs, il: int, cur: Tensor, qr: Tensor | None
    ) -> tuple[Tensor, ...] | None:
        """What picks the keys each query of block il attends to, over the pass's rows (DeepSeek sparse attention:
        deepseek32); None: every key."""
        return None

    def sparse_mask(
        self, ctx: Context, gf: Graph, inp: StepInputs, sparse: tuple[Tensor, ...], rows: Rows, k_cache: Tensor
    ) -> Tensor:
        """The mask of a pass (or lane) whose queries attend only to the keys build_indexer's output picks."""
        raise NotImplementedError

    def attend_heads(
        self, blk: BlockGraph, q_nope: Tensor, q_pe: Tensor, kv: Tensor, k_pe: Tensor, k_cache: Memory, v_cache: Memory
    ) -> Tensor:
        """The legacy layout's plain path: attn_kv_b decompresses the normed latent kv [kv_lora, n] into every
        head's K (no-rope part) and V; K's rope part is the shared k_pe, repeated per head. Q's rope part is roped
        where it lies (llama.cpp's ggml_rope_set_offset: the same values)."""
        ctx, w, inp, il = blk.ctx, blk.w, blk.inp, blk.il
        hp, n, p = self.hp, inp.n_tokens, f"blk.{il}."
        kvb = ctx.mul_mat(w(p + "attn_kv_b.weight"), kv)  # [n_head * (n_nope + v), n]
        es, head = kvb.element_size, (self.n_nope + self.v_mla) * kvb.element_size
        k_nope = ctx.view(kvb, [self.n_nope, hp.n_head, n], [head, kvb.nb[1]], 0)
        v = ctx.reshape(
            ctx.cont(ctx.view(kvb, [self.v_mla, hp.n_head, n], [head, kvb.nb[1]], self.n_nope * es)),
            [self.v_mla * hp.n_head, n],
        )
        q = self.temperature(ctx, inp, il, ctx.concat(q_nope, q_pe, 0))  # [k_mla, n_head, n]
        k = ctx.concat(k_nope, ctx.repeat_4d(k_pe, [hp.n_rot, hp.n_head, n, 1]), 0)
        return attend_lanes(blk, hp, q, k, v, k_cache, v_cache, self.kq_scale)
