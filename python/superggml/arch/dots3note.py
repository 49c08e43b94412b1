"""dots3note family (llama.cpp's src/models/dots3note.cpp; docs/dev/dots3note.md): absorbed latent attention in two
kinds of block, by attention.sliding_window_pattern:

- full blocks: deepseek32's sparse attention (a lightning indexer, NeoX-roped and Hadamard-rotated, picks each
  query's top k keys; arch/deepseek32.py), every full block its own indexer;
- sliding blocks: the latent attention over a window, with MLA shapes of their own (kv_lora_rank_swa,
  key_length_mla_swa, value_length_mla_swa) and rope.freq_base_swa;

both with an RMS norm of the rope key (attn_k_norm) before RoPE, a sigmoid gate per head on the output, head
counts per block, and a scale of 1/sqrt(key_length_mla) of their kind. The memory rows are as wide as the widest
kind's latent row plus the indexer's key (HParams.kv_width). DeepSeek-V3-style experts with a shared one."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from ..errors import GGUFError, UnsupportedModelError
from ..native import Tensor
from .base import BlockGraph, HParams, Memory, StepInputs, one_memory, f32
from .common import Rows, attend_latent, each_lane, inv_sqrt, whole
from .base import lane_memory
from .deepseek2 import Deepseek2Arch
from .deepseek32 import Deepseek32Arch


class Dots3NoteArch(Deepseek32Arch):
    heads_per_layer = True

    def load_hparams(self, meta: Mapping[str, Any]) -> None:
        hp = self.hp
        n = hp.n_layer
        for name in (
            "leading_dense_block_count",
            "expert_gating_func",
            "rope.freq_base_swa",
            "attention.indexer.types",
        ):
            self.need(meta, name)  # llama.cpp requires them
        Deepseek2Arch.load_hparams(self, meta)
        if self.legacy or not self.q_lora:
            raise GGUFError(f"{hp.arch} needs the absorbed latent layout with low-rank queries")
        self.n_swa = int(self.need(meta, "attention.sliding_window"))
        pattern = self.need(meta, "attention.sliding_window_pattern")
        if not isinstance(pattern, (list, tuple)):
            raise GGUFError(f"'{hp.arch}.attention.sliding_window_pattern' must be an array, as llama.cpp reads it")
        flags = [bool(x) for x in list(pattern)[:n]]
        if len(flags) < n:  # llama.cpp reads the missing entries as sliding... then fails to load their shapes
            raise GGUFError(f"'{hp.arch}.attention.sliding_window_pattern' has {len(flags)} entries for {n} blocks")
        self.swa_layers = tuple(flags)
        if all(self.swa_layers) or not any(self.swa_layers):  # llama.cpp: SIGFPE, or an assert at the first decode
            raise UnsupportedModelError(f"{hp.arch} with blocks of one kind only: llama.cpp cannot run it either")
        self.rope_base_swa = float(f32(self.key(meta, "rope.freq_base_swa", hp.rope_base)))
        self.rope_scale_swa = hp.rope_scale  # the context's scale in both kinds
        self.kv_lora_swa = int(self.need(meta, "attention.kv_lora_rank_swa"))
        self.k_mla_swa = int(self.need(meta, "attention.key_length_mla_swa"))
        self.v_mla_swa = int(self.need(meta, "attention.value_length_mla_swa"))
        if int(self.key(meta, "attention.key_length_swa", hp.n_embd // hp.n_head)) != self.kv_lora_swa + hp.n_rot:
            # the sliding cache's rows: llama.cpp aborts writing them
            raise GGUFError(f"'{hp.arch}.attention.key_length_swa' must be kv_lora_rank_swa + rope.dimension_count")
        self.n_head_of = hp.n_head_per_layer[:n] if hp.n_head_per_layer else (hp.n_head,) * n
        self.idx_heads = int(self.need(meta, "attention.indexer.head_count"))
        self.idx_dim = int(self.need(meta, "attention.indexer.key_length"))
        self.idx_top_k = int(self.need(meta, "attention.indexer.top_k"))
        if self.idx_heads <= 0 or self.idx_top_k <= 0 or self.idx_dim < 64 or self.idx_dim & (self.idx_dim - 1):
            # llama.cpp's rotation of the indexer's keys is as wide as the key: a power of 2 from 64
            raise GGUFError(f"{hp.arch} indexer: {self.idx_heads} heads of {self.idx_dim}, top {self.idx_top_k}")
        self.indexer_rot_size = self.idx_dim
        types = self.key(meta, "attention.indexer.types", None)
        typed = [bool(x) for x in types] if isinstance(types, (list, tuple)) else [not s for s in self.swa_layers]
        for il in range(n):
            owns = il < len(typed) and typed[il]
            if owns == self.swa_layers[il]:  # llama.cpp segfaults (a full block without) or aborts (a sliding one with)
                raise GGUFError(
                    f"{hp.arch}: block {il} is {'sliding' if self.swa_layers[il] else 'full'} but its "
                    f"attention.indexer.types entry is {int(owns)}"
                )
        self.idx_full = tuple(not s for s in self.swa_layers)
        self.keeps_mask = False
        dims = [self.dims(il) for il in range(n)]
        widest = max(r for r, _, _ in dims) + hp.n_rot
        self.latent_hp = dataclasses.replace(self.hp, kv_width=widest)
        self.layer_hps = tuple(
            dataclasses.replace(self.hp, n_head=h, kv_width=r + hp.n_rot, head_dim_v=r, n_head_per_layer=())
            for h, (r, _, _) in zip(self.n_head_of, dims)
        )
        self.hp = dataclasses.replace(self.hp, n_head=max(self.n_head_of), kv_width=widest + self.idx_dim)

    def dims(self, il: int) -> tuple[int, int, int]:
        """Block il's latent rank, Q.K head size and V head size."""
        if self.swa_layers[il]:
            return self.kv_lora_swa, self.k_mla_swa, self.v_mla_swa
        return self.kv_lora, self.k_mla, self.v_mla

    def attention_scale(self, meta: Mapping[str, Any]) -> float:
        return inv_sqrt(self.k_mla)  # per kind in build_attention; no DeepSeek YaRN mscale

    def layer_hp(self, il: int) -> HParams:
        return self.layer_hps[il]

    def describe(self) -> list[str]:
        n_swa = sum(self.swa_layers)
        return super().describe() + [
            f"{n_swa} sliding block(s) over {self.n_swa} tokens with latent rows of {self.kv_lora_swa} + "
            f"{self.hp.n_rot}; sigmoid gates per head"
        ]

    def block_tensor_shapes(self, il: int) -> dict[str, tuple[int, ...]]:
        hp, p = self.hp, f"blk.{il}."
        shapes = Deepseek2Arch.block_tensor_shapes(self, il) if self.swa_layers[il] else super().block_tensor_shapes(il)
        r, dq, dv = self.dims(il)
        h, nope = self.n_head_of[il], dq - hp.n_rot
        shapes.update(
            {
                p + "attn_q_b.weight": (self.q_lora, h * dq),
                p + "attn_kv_a_mqa.weight": (hp.n_embd, r + hp.n_rot),
                p + "attn_kv_a_norm.weight": (r,),
                p + "attn_k_norm.weight": (hp.n_rot,),
                p + "attn_k_b.weight": (nope, r, h),
                p + "attn_v_b.weight": (r, dv, h),
                p + "attn_gate.weight": (hp.n_embd, h),
                p + "attn_output.weight": (h * dv, hp.n_embd),
            }
        )
        return shapes

    def build_attention(self, blk: BlockGraph, cur: Tensor, k_cache: Memory, v_cache: Memory) -> Tensor:
        ctx, gf, w, inp, il = blk.ctx, blk.gf, blk.w, blk.inp, blk.il
        hp, p, n, swa = self.hp, f"blk.{il}.", inp.n_tokens, self.swa_layers[il]
        r, dq, dv = self.dims(il)
        h, nope = self.n_head_of[il], dq - hp.n_rot
        qr = self.norm(ctx, w, ctx.mul_mat(w(p + "attn_q_a.weight"), cur), p + "attn_q_a_norm.weight")
        sparse = None if swa else self.build_indexer(ctx, w, inp, il, cur, qr)
        q = ctx.reshape(ctx.mul_mat(w(p + "attn_q_b.weight"), qr), [dq, h, n])
        kv_pe = ctx.mul_mat(w(p + "attn_kv_a_mqa.weight"), cur)  # [r + n_rot, n]
        row = kv_pe.nb[1]
        kv = self.norm(ctx, w, ctx.view(kv_pe, [r, n], [row], 0), p + "attn_kv_a_norm.weight")
        k_pe = ctx.view(kv_pe, [hp.n_rot, 1, n], [row, row], r * kv_pe.element_size)
        k_pe = self.rope(ctx, w, inp, il, self.norm(ctx, w, k_pe, p + "attn_k_norm.weight"))
        q_nope = ctx.view(q, [nope, h, n], [q.nb[1], q.nb[2]], 0)
        q_pe = self.rope(ctx, w, inp, il, ctx.view(q, [hp.n_rot, h, n], [q.nb[1], q.nb[2]], nope * q.element_size))
        absorbed = ctx.mul_mat(w(p + "attn_k_b.weight"), ctx.permute(q_nope, 0, 2, 1, 3))  # [r, n, h]
        q = ctx.concat(ctx.permute(absorbed, 0, 2, 1, 3), q_pe, 0)  # [r + n_rot, h, n]
        k = ctx.concat(ctx.reshape(kv, [r, 1, n]), k_pe, 0)
        v_b, lhp, scale = w(p + "attn_v_b.weight"), self.layer_hps[il], inv_sqrt(dq)

        def attend(lane: StepInputs, rows: Rows, cache: Tensor) -> Tensor:
            if swa:
                mask = lane.mask_swa
            else:
                assert sparse
                mask = self.sparse_mask(ctx, gf, lane, sparse, rows, cache)
            return attend_latent(ctx, gf, lhp, lane, rows(q), rows(k), cache, scale, mask, v_b)

        if inp.lanes is None:
            out = attend(inp, whole, one_memory(k_cache))
        else:
            out = each_lane(ctx, inp, lambda j, lane, rows: attend(lane, rows, lane_memory(k_cache, j)))
        gate = ctx.sigmoid(ctx.reshape(ctx.mul_mat(w(p + "attn_gate.weight"), cur), [1, h, n]))
        return ctx.reshape(ctx.mul(ctx.reshape(out, [dv, h, n]), gate), [dv * h, n])
