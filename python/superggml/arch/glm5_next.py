"""glm5-next family: GLM-5.3-Flash (llama.cpp's src/models/glm5-next.cpp; docs/dev/glm5-next.md cites it line by
line), kimi-k3's hybrid of KDA and nope-only MLA blocks (by head_count_kv: 0 is KDA) with:

- KDA (arch/kimi_k3_kda.py): Q and K L2-normed with a fixed 1e-6, kimi-linear's low-rank output gate;
- MLA: low-rank queries (their normed rank also feeds the indexer), no RoPE at all, made sparse by a k-pool
  indexer (arch/glm5_next_pools.py); a block whose attention.indexer.types entry is 0 reuses the last full
  indexer's selection;
- deepseek4's hyper-connections: 4 residual streams mixed before each sublayer (Sinkhorn-normalized), the head
  reading their mean;
- DeepSeek-style experts: sigmoid routing with exp_probs_b, a shared expert, SwiGLU clamped by the fused op
  (routed: swiglu_clamp_exp; shared and dense: swiglu_clamp_shexp).

The NextN block is loaded by llama.cpp but never run (its MTP graph is not implemented): superggml skips it.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence, cast

import numpy as np

from .. import native
from ..errors import GGUFError, UnsupportedModelError
from ..native import Context, Graph, Tensor
from .base import BlockGraph, HParams, Memory, StepInputs, Weights, f32, lane_memory, one_memory, swiglu
from .common import Rows, attend_latent, each_lane, inv_sqrt, whole
from .deepseek4 import HC, Deepseek4Arch
from .glm5_next_pools import KpoolBlock, KpoolConfig, KpoolShape, kpool_values
from .hybrid import Shapes
from .kimi_k3 import KimiK3Arch
from .kimi_k3_kda import KdaMixer, KdaShape
from .moe import moe_tensor_shapes, set_gating, uniform_expert_ff

L2_EPS = 1e-6  # llama.cpp's fixed L2-norm epsilon of the KDA queries and keys


class Glm5NextArch(KimiK3Arch):
    k3 = False
    late_gather = True  # the head picks its rows of the streams, then averages them, as llama.cpp

    # deepseek4's hyper-connections, as they are (hc_pre reads these two)
    hc_mix = Deepseek4Arch.hc_mix
    affine_sigmoid = Deepseek4Arch.affine_sigmoid

    def hc_pre(self, ctx: Context, w: Weights, x: Tensor, p: str) -> tuple[Tensor, Tensor, Tensor]:
        return Deepseek4Arch.hc_pre(cast(Deepseek4Arch, self), ctx, w, x, p)

    def build_ffn_out(self, ctx: Context, w: Weights, p: str, ffn_out: Tensor, ffn_inp: Tensor) -> Tensor:
        return Deepseek4Arch.build_ffn_out(cast(Deepseek4Arch, self), ctx, w, p, ffn_out, ffn_inp)

    @classmethod
    def read_hparams(cls, meta: Mapping[str, Any], arch: str) -> HParams:
        """rope.dimension_count must be 0 (the MLA is nope-only): llama.cpp aborts on another value and fails to
        load the tensors without the key."""
        n_rot = meta.get(f"{arch}.rope.dimension_count")
        if n_rot is None or int(n_rot) != 0:
            raise GGUFError(f"GLM5-Next MLA is nope-only: '{arch}.rope.dimension_count' must be 0, not {n_rot}")
        head = meta.get(f"{arch}.attention.key_length", 0)
        meta = {**meta, f"{arch}.rope.dimension_count": max(2, int(head) // 2 * 2)}
        hp = HParams.from_metadata(meta, arch, cls.rms_eps_keys, cls.kv_heads_per_layer)
        return dataclasses.replace(hp, n_rot=0)

    def load_hparams(self, meta: Mapping[str, Any]) -> None:
        hp = self.hp
        n_all = hp.n_layer + hp.n_nextn
        if not 0 < n_all <= 512:
            raise GGUFError(f"glm5-next: block_count {n_all} is not in 1..512")
        kinds = self.key(meta, "attention.head_count_kv", None)
        if not isinstance(kinds, (list, tuple)):
            raise GGUFError("glm5-next needs attention.head_count_kv per block (0: KDA, 1: MLA)")
        kv = [int(x) for x in kinds]
        if len(kv) != n_all or any(x not in (0, 1) for x in kv) or 0 in kv[hp.n_layer :]:
            raise GGUFError(f"glm5-next: head_count_kv must be 0 (KDA) or 1 (MLA) per block, MLA for NextN: {kv}")
        self.recurrent = tuple(x == 0 for x in kv[: hp.n_layer])
        if all(self.recurrent) or not any(self.recurrent):  # llama.cpp asserts at its first decode
            raise UnsupportedModelError("glm5-next with only KDA or only MLA blocks: llama.cpp cannot run it either")
        self.load_mla_keys(meta)
        self.load_kpool_keys(meta)
        self.d_conv = int(self.need(meta, "ssm.conv_kernel"))
        dk = int(self.need(meta, "kda.head_dim"))
        lb = self.key(meta, "kda.gate_lower_bound", None)
        self.conv_channels = 3 * hp.n_head * dk
        self.kda = KdaMixer(
            KdaShape(
                hp.n_head, dk, self.d_conv, None if lb is None else float(f32(lb)), hp.rms_eps, True, l2_eps=L2_EPS
            )
        )
        self.res_block, self.situ, self.n_latent = 0, (0.0, 0.0), 0
        if int(self.need(meta, "hyper_connection.count")) != HC:  # llama.cpp asserts 4
            raise GGUFError(f"glm5-next has {HC} residual streams (hyper_connection.count)")
        Deepseek4Arch.load_hc_keys(cast(Deepseek4Arch, self), meta)
        self.load_moe_keys(meta)
        width = self.kv_lora + 3 * self.kp.dim  # latent | indexer key | pool gate | pooled key
        self.latent_hp = dataclasses.replace(hp, latent_kv=True, head_dim_v=self.kv_lora)
        self.hp = dataclasses.replace(
            hp,
            latent_kv=True,
            head_dim_v=self.kv_lora,
            kv_width=width,
            n_residual=HC * hp.n_embd,
            n_ffn_inp=HC * hp.n_embd + HC + HC * HC,
        )
        self.count_states()

    def load_mla_keys(self, meta: Mapping[str, Any]) -> None:
        hp = self.hp
        self.q_lora = int(self.need(meta, "attention.q_lora_rank"))
        self.kv_lora = int(self.need(meta, "attention.kv_lora_rank"))
        self.k_mla = int(self.need(meta, "attention.key_length_mla"))
        self.v_mla = int(self.need(meta, "attention.value_length_mla"))
        self.n_nope = self.k_mla
        if hp.head_dim != self.kv_lora:  # the latent cache's rows: llama.cpp aborts writing them
            raise GGUFError(f"glm5-next: attention.key_length {hp.head_dim} must be kv_lora_rank {self.kv_lora}")
        if min(self.q_lora, self.kv_lora, self.k_mla, self.v_mla) <= 0:
            raise GGUFError("glm5-next: q_lora_rank, kv_lora_rank, key_length_mla and value_length_mla must be > 0")

    def load_kpool_keys(self, meta: Mapping[str, Any]) -> None:
        hp = self.hp
        self.kp = KpoolConfig(
            int(self.need(meta, "attention.indexer.head_count")),
            int(self.need(meta, "attention.indexer.key_length")),
            int(self.need(meta, "attention.indexer.top_k")),
            int(self.need(meta, "attention.indexer.kpool")),
            bool(self.key(meta, "attention.indexer.kpool_select_tail", True)),
            float(f32(self.key(meta, "attention.layer_norm_epsilon", 0.0))),
        )
        kp = self.kp
        if kp.kpool <= 1 or kp.top_k % kp.kpool:  # llama.cpp asserts at load
            raise GGUFError(f"glm5-next: indexer kpool {kp.kpool} must be > 1 and divide top_k {kp.top_k}")
        if kp.top_k // kp.kpool > 64 and kp.kpool % 4:
            raise UnsupportedModelError(f"glm5-next: top_k {kp.top_k} over pools of {kp.kpool}: not supported yet")
        if min(kp.heads, kp.dim) <= 0:
            raise GGUFError(f"glm5-next indexer: {kp.heads} heads of {kp.dim}")
        types = self.key(meta, "attention.indexer.types", None)
        full = [True] * hp.n_layer
        if isinstance(types, (list, tuple)):
            if len(types) != hp.n_layer:  # read over the trunk's blocks
                raise GGUFError(f"'glm5-next.attention.indexer.types' has {len(types)} entries for {hp.n_layer}")
            full = [bool(x) for x in types]
        elif types is not None:
            full = [bool(types)] * hp.n_layer
        first = next(il for il in range(hp.n_layer) if not self.recurrent[il])
        if not full[first]:  # llama.cpp asserts in the graph
            raise GGUFError("glm5-next: the first MLA block's indexer reuses a selection no earlier block made")
        self.idx_full = tuple(full[il] and not self.recurrent[il] for il in range(hp.n_layer))
        self.keeps_mask = any(not full[il] and not self.recurrent[il] for il in range(hp.n_layer))

    def load_moe_keys(self, meta: Mapping[str, Any]) -> None:
        hp = self.hp
        self.n_lead = int(self.key(meta, "leading_dense_block_count", 0))
        self.n_ff_exp = uniform_expert_ff(self, meta)
        self.n_ff_shexp = self.n_ff_exp * int(self.need(meta, "expert_shared_count"))
        if hp.n_expert and self.n_ff_shexp <= 0:
            raise GGUFError("glm5-next needs a shared expert (expert_shared_count > 0)")
        self.shexp_gate = False
        set_gating(self, int(self.key(meta, "expert_gating_func", 0)) or 2)
        self.moe.probs_bias = True
        self.moe.clamp_fused = True
        self.moe.norm_w = bool(self.key(meta, "expert_weights_norm", False))
        self.moe.w_scale = float(f32(self.key(meta, "expert_weights_scale", 0.0)))
        if hp.n_expert and not 0 < hp.n_expert_used <= hp.n_expert:
            raise GGUFError(f"glm5-next: {hp.n_expert_used} of {hp.n_expert} experts per token")
        exp = self.every_block(meta, "swiglu_clamp_exp")
        sh = self.every_block(meta, "swiglu_clamp_shexp") or exp
        self.limits = list(zip(exp, sh))

    def every_block(self, meta: Mapping[str, Any], name: str) -> list[float]:
        """A float key per block, the NextN blocks' included (as llama.cpp reads it: exactly that many); []
        where absent."""
        n, v = self.hp.n_layer + self.hp.n_nextn, self.key(meta, name, None)
        if v is None:
            return []
        per = [float(f32(x)) for x in v] if isinstance(v, (list, tuple)) else [float(f32(v))] * n
        if len(per) != n:
            raise GGUFError(f"'glm5-next.{name}' has {len(per)} entries for {n} blocks")
        return per

    def glu(self, ctx: Context, gate: Tensor, up: Tensor, limit: float = 0.0) -> Tensor:
        return swiglu(ctx, gate, up, limit, True)  # the dense FFN's clamp is the fused op too

    def swiglu_limits(self, il: int) -> tuple[float, float]:
        return self.limits[il] if self.limits else (0.0, 0.0)

    def attention_note(self) -> str:
        return f"MLA blocks without RoPE (a latent row of {self.kv_lora} and the indexer's {3 * self.kp.dim})"

    def describe(self) -> list[str]:
        kp, n_full = self.kp, sum(self.idx_full)
        shared = self.hp.n_layer - sum(self.recurrent) - n_full
        return super(KimiK3Arch, self).describe() + [
            f"hyper-connections: {HC} residual streams of {self.hp.n_embd}",
            f"sparse attention: each query attends to its top {kp.top_k // kp.kpool} pools of {kp.kpool} tokens "
            f"and its tail, chosen by a k-pool indexer of {kp.heads} heads of {kp.dim}"
            + (f"; {shared} block(s) reuse the last full indexer's choice" if shared else ""),
            "sigmoid routing with exp_probs_b, a shared expert, clamped SwiGLU",
        ]

    # -- the pass's own inputs (base.PassInputs) ---------------------------------
    def own_inputs(self, n: int, n_kv: int, streams: int) -> dict[str, tuple[native.GGMLType, list[int]]]:
        return KpoolShape(self.kp, n, n_kv).inputs(self.keeps_mask)

    def own_values(self, positions: Sequence[np.ndarray], n_kv: int) -> dict[str, np.ndarray]:
        return kpool_values(self.kp, positions, n_kv)

    def pass_inputs(self, n: int) -> dict[str, tuple[native.GGMLType, list[int]]]:
        return {}

    def pass_values(self, contexts: Sequence[Sequence[int]], rows: Sequence[int]) -> dict[str, np.ndarray]:
        return {}

    # -- tensors ---------------------------------------------------------
    def block_tensor_shapes(self, il: int) -> dict[str, tuple[int, ...]]:
        hp, p, E = self.hp, f"blk.{il}.", self.hp.n_embd
        shapes: Shapes = {p + "attn_norm.weight": (E,), p + "ffn_norm.weight": (E,)}
        mix = (2 + HC) * HC
        for part in ("attn", "ffn"):
            shapes[p + f"hc_{part}_fn.weight"] = (HC * E, mix)
            shapes[p + f"hc_{part}_base.weight"] = (mix,)
            shapes[p + f"hc_{part}_scale.weight"] = (3,)
        shapes.update(self.kda.tensor_shapes(p, E) if self.recurrent[il] else self.mla_shapes(il))
        if self.is_moe(il):
            return shapes | moe_tensor_shapes(self, il)
        return shapes | {
            p + "ffn_gate.weight": (E, hp.n_ff),
            p + "ffn_up.weight": (E, hp.n_ff),
            p + "ffn_down.weight": (hp.n_ff, E),
        }

    def mla_shapes(self, il: int) -> Shapes:
        hp, p, E, d = self.hp, f"blk.{il}.", self.hp.n_embd, self.kp.dim
        shapes = {
            p + "attn_q_a.weight": (E, self.q_lora),
            p + "attn_q_a_norm.weight": (self.q_lora,),
            p + "attn_q_b.weight": (self.q_lora, hp.n_head * self.k_mla),
            p + "attn_kv_a_mqa.weight": (E, self.kv_lora),
            p + "attn_kv_a_norm.weight": (self.kv_lora,),
            p + "attn_k_b.weight": (self.k_mla, self.kv_lora, hp.n_head),
            p + "attn_v_b.weight": (self.kv_lora, self.v_mla, hp.n_head),
            p + "attn_output.weight": (hp.n_head * self.v_mla, E),
        }
        own = {
            p + "indexer.k_norm.weight": (d,),
            p + "indexer.k_norm.bias": (d,),
            p + "indexer.proj.weight": (E, self.kp.heads),
            p + "indexer.attn_k.weight": (E, d),
            p + "indexer.attn_q_b.weight": (self.q_lora, self.kp.heads * d),
            p + "indexer_compressor_gate.weight": (E, d),
            p + "indexer_compressor_ape.weight": (d, self.kp.kpool),
        }
        if not self.idx_full[il]:  # loaded where present, unused, as llama.cpp
            own = {n: s for n, s in own.items() if n in self.names}
        return shapes | own

    # -- graphs ------------------------------------------------------------
    def build_embed(self, ctx: Context, w: Weights, inp: StepInputs) -> Tensor:
        """The embedding repeated in every stream: F32 [4 * n_embd, n_tokens]."""
        assert inp.tokens is not None
        E, n = self.hp.n_embd, inp.n_tokens
        x = ctx.reshape(ctx.get_rows(w("token_embd.weight"), inp.tokens), [E, 1, n])
        return ctx.reshape(ctx.repeat_4d(x, [E, HC, n, 1]), [HC * E, n])

    def build_attn_part(
        self, ctx: Context, gf: Graph, w: Weights, inp: StepInputs, il: int, x: Tensor, k_cache: Memory, v_cache: Memory
    ) -> tuple[Tensor, Tensor]:
        """(the streams after the mixer with the FFN's post weights and mixing matrix, F32 [4 * n_embd + 4 + 16,
        n]; the FFN's normed input F32 [n_embd, n]), as deepseek4's."""
        p, E, n = f"blk.{il}.", self.hp.n_embd, inp.n_tokens
        x = ctx.reshape(x, [E, HC, n])
        cur, post, comb = self.hc_pre(ctx, w, x, p + "hc_attn")
        cur = self.mixer(
            BlockGraph(ctx, gf, w, inp, il), self.norm(ctx, w, cur, p + "attn_norm.weight"), k_cache, v_cache
        )
        x = ctx.dsv4_hc_post(cur, x, post, comb)
        cur, post, comb = self.hc_pre(ctx, w, x, p + "hc_ffn")
        kept = ctx.concat(ctx.concat(ctx.reshape(x, [HC * E, n]), post, 0), ctx.reshape(comb, [HC * HC, n]), 0)
        return kept, self.norm(ctx, w, cur, p + "ffn_norm.weight")

    def mla(self, blk: BlockGraph, cur: Tensor, k_cache: Memory) -> Tensor:
        """The absorbed latent attention over the indexer's selection: F32 [n_head * value_length_mla, n]."""
        ctx, w, inp, il = blk.ctx, blk.w, blk.inp, blk.il
        hp, p, n = self.hp, f"blk.{il}.", inp.n_tokens
        qr = self.norm(ctx, w, ctx.mul_mat(w(p + "attn_q_a.weight"), cur), p + "attn_q_a_norm.weight")
        q = ctx.reshape(ctx.mul_mat(w(p + "attn_q_b.weight"), qr), [self.k_mla, hp.n_head, n])
        kv = self.norm(ctx, w, ctx.mul_mat(w(p + "attn_kv_a_mqa.weight"), cur), p + "attn_kv_a_norm.weight")
        kv = ctx.reshape(kv, [self.kv_lora, 1, n])
        q_abs = ctx.mul_mat(w(p + "attn_k_b.weight"), ctx.permute(q, 0, 2, 1, 3))  # [kv_lora, n, n_head]
        q_abs = ctx.permute(q_abs, 0, 2, 1, 3)  # [kv_lora, n_head, n], a view as llama.cpp's

        def attend(lane: StepInputs, rows: Rows, cache: Tensor) -> Tensor:
            return self.sparse_attend(blk, lane, rows, cache, (cur, qr, q_abs, kv))

        if inp.lanes is None:
            return attend(inp, whole, one_memory(k_cache))
        return each_lane(ctx, inp, lambda j, lane, rows: attend(lane, rows, lane_memory(k_cache, j)))

    def sparse_attend(
        self, blk: BlockGraph, lane: StepInputs, rows: Rows, cache: Tensor, t: tuple[Tensor, ...]
    ) -> Tensor:
        """One lane's selection (its own, or the last full indexer's kept one), then its attention over it."""
        ctx, gf, w, p = blk.ctx, blk.gf, blk.w, f"blk.{blk.il}."
        cur, qr, q_abs, kv = t
        shape = KpoolShape(self.kp, lane.n_tokens, lane.n_kv)
        own = lane.own
        assert own is not None
        kept = own.get("kept_sel") if shape.gather else lane.kept_mask
        if self.idx_full[blk.il]:
            block = KpoolBlock(ctx, gf, w, p, self.kp, cache, self.kv_lora, lane)
            sel = block.select(rows(cur, 2), rows(qr, 2))
            if kept is not None:
                gf.expand(ctx.cpy(sel, ctx.reshape(kept, list(sel.ne[:2]))))
        else:
            assert kept is not None
            sel = ctx.reshape(kept, [kept.ne[0], lane.n_tokens])
        v_b, scale = w(p + "attn_v_b.weight"), inv_sqrt(self.k_mla)
        if not shape.gather:
            mask = ctx.reshape(sel, list(lane.mask.ne)) if lane.mask is not None else None
            return attend_latent(ctx, gf, self.latent_hp, lane, rows(q_abs), rows(kv), cache, scale, mask, v_b)
        return self.gathered(ctx, gf, lane, rows(q_abs), rows(kv), cache, sel, scale, v_b)

    def gathered(
        self,
        ctx: Context,
        gf: Graph,
        lane: StepInputs,
        q: Tensor,
        kv: Tensor,
        cache: Tensor,
        sel: Tensor,
        scale: float,
        v_b: Tensor,
    ) -> Tensor:
        """Attention of q [kv_lora, n_head, n] over the latent rows sel I32 [n_sel, n] names (llama.cpp's gather
        path: never flash attention): F32 [n_head * value_length_mla, n]."""
        assert lane.k_idxs is not None and lane.own is not None
        R, n, n_sel = self.kv_lora, lane.n_tokens, sel.ne[0]
        latent = ctx.view(cache, [R, cache.ne[1]], [cache.nb[1]], 0)
        gf.expand(ctx.set_rows(latent, ctx.reshape(kv, [R, n]), lane.k_idxs))
        k_g = ctx.reshape(ctx.get_rows(latent, ctx.reshape(sel, [n_sel * n])), [R, n_sel, 1, n])
        kq = ctx.mul_mat(k_g, ctx.permute(q, 0, 2, 3, 1))  # [n_sel, 1, n_head, n]
        ctx.mul_mat_set_prec_f32(kq)
        kq = ctx.soft_max_ext(kq, lane.own["kp_live"], scale)
        kqv = ctx.mul_mat(ctx.cont(ctx.transpose(k_g)), kq)  # [kv_lora, 1, n_head, n]
        kqv = ctx.mul_mat(v_b, kqv)  # [v_head, 1, n_head, n]
        out = ctx.cont(ctx.permute(kqv, 0, 2, 1, 3))
        return ctx.reshape(out, [kqv.ne[0] * self.hp.n_head, n])

    def build_output_norm(self, ctx: Context, w: Weights, x: Tensor) -> Tensor:
        """The mean of the streams x F32 [4 * n_embd, n] (((s0 + s1) + s2) + s3) / 4, RMS-normed."""
        E, n = self.hp.n_embd, x.ne[1]
        x3 = ctx.reshape(x, [E, HC, n])
        acc = ctx.view(x3, [E, n], [x3.nb[2]], 0)
        for s in range(1, HC):
            acc = ctx.add(acc, ctx.view(x3, [E, n], [x3.nb[2]], s * x3.nb[1]))
        return self.norm(ctx, w, ctx.scale(acc, 1.0 / HC), "output_norm.weight")
