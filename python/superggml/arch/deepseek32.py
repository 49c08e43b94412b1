"""deepseek32 and glm-dsa families: DeepSeek-V3.2 and GLM-5 (llama.cpp's src/models/deepseek32.cpp and
glm-dsa.cpp), deepseek2's multi-head latent attention made sparse by a lightning indexer.

Each block's indexer scores every key for every query: its own queries (indexer.attn_q_b over the normed low-rank
queries) and one key per token (indexer.attn_k, a layer norm with bias), both roped over their first n_rot values
(NeoX in deepseek32, plain in glm-dsa) and rotated by a Walsh-Hadamard matrix; the score sums over its heads
relu(q.k) weighted per head (indexer.proj, scaled by 1/sqrt(heads * key_length)). Each query attends only to its
attention.indexer.top_k best keys (llama.cpp's top-k mask). The indexer's keys are kept beside the latent K/V, in
the same memory rows (HParams.kv_width), so they page, stream and save with it. In glm-dsa a block whose
attention.indexer.types entry is 0 reuses the keys the last full indexer picked (all full before GLM-5.2's context
of 2^20 tokens, as llama.cpp defaults them). The MTP block is not run (drafting refuses these families).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import numpy as np

from .. import native
from ..errors import GGUFError
from ..native import Context, Graph, Tensor
from .base import HParams, StepInputs, Weights, f32
from .common import ROPE_NEOX, ROPE_NORM, Rows, row_size, top_k_mask
from .deepseek2 import Deepseek2Arch
from .moe import set_gating

# GLM-5.2's indexer types by layer (its config.json), llama.cpp's default for a context of 2^20 tokens or more
GLM_5_2_INDEXER_TYPES = (1, 1) + (1, 0, 0, 0) * 19


class Deepseek32Arch(Deepseek2Arch):
    indexer_rope = ROPE_NEOX
    indexer_rope_last = False  # the indexer's RoPE turns the first n_rot values of a head (else the last)
    indexer_norm_eps = 1e-6  # llama.cpp fixes deepseek32's layer-norm epsilon
    default_gating = 0  # expert_gating_func required

    def load_hparams(self, meta: Mapping[str, Any]) -> None:
        hp = self.hp
        if not self.default_gating:
            self.need(meta, "expert_gating_func")
        super().load_hparams(meta)
        if self.legacy:
            raise GGUFError(f"{hp.arch} requires multi-head latent attention ('{hp.arch}.attention.key_length_mla')")
        self.q_lora = int(self.need(meta, "attention.q_lora_rank"))  # the indexer reads the low-rank queries
        if self.q_lora <= 0:
            raise GGUFError(f"{hp.arch} needs low-rank queries ('{hp.arch}.attention.q_lora_rank' > 0)")
        if self.default_gating and not self.key(meta, "expert_gating_func", 0):
            set_gating(self, self.default_gating)
        self.attn_temp = None  # llama.cpp reads no temperature keys here
        self.moe.fused_gate_up = False
        self.idx_heads = int(self.need(meta, "attention.indexer.head_count"))
        self.idx_dim = int(self.need(meta, "attention.indexer.key_length"))
        self.idx_top_k = int(self.need(meta, "attention.indexer.top_k"))
        if min(self.idx_heads, self.idx_dim, self.idx_top_k) <= 0 or hp.n_rot > self.idx_dim or self.idx_dim % 64:
            raise GGUFError(
                f"{hp.arch} indexer: {self.idx_heads} heads of {self.idx_dim} (a multiple of 64, at least "
                f"rope.dimension_count {hp.n_rot}), top {self.idx_top_k}"
            )
        n = 64
        while self.idx_dim % (2 * n) == 0:  # llama.cpp's rotation: the largest power of 2 dividing the key
            n *= 2
        self.indexer_rot_size = n
        self.idx_full = self.indexer_types(meta)
        self.keeps_mask = not all(self.idx_full)
        latent = self.hp.n_embd_gqa
        self.latent_hp = dataclasses.replace(self.hp)
        self.hp = dataclasses.replace(self.hp, kv_width=latent + self.idx_dim)  # the indexer's keys after the latent

    def indexer_types(self, meta: Mapping[str, Any]) -> tuple[bool, ...]:
        """Whether each block's indexer picks its own keys (a full indexer): all, in deepseek32."""
        return (True,) * self.hp.n_layer

    def describe(self) -> list[str]:
        n_full = sum(self.idx_full)
        shared = (
            f"; {self.hp.n_layer - n_full} block(s) reuse the last full indexer's choice"
            if n_full < len(self.idx_full)
            else ""
        )
        return super().describe() + [
            f"sparse attention: each query attends to its top {self.idx_top_k} keys, chosen by a lightning indexer "
            f"of {self.idx_heads} heads of {self.idx_dim} (its keys kept beside the latent K/V){shared}"
        ]

    def layer_hp(self, il: int) -> HParams:
        return self.latent_hp

    def block_tensor_shapes(self, il: int) -> dict[str, tuple[int, ...]]:
        shapes = super().block_tensor_shapes(il)
        p, d, h = f"blk.{il}.", self.idx_dim, self.idx_heads
        own = {
            p + "indexer.k_norm.weight": (d,),
            p + "indexer.k_norm.bias": (d,),
            p + "indexer.proj.weight": (self.hp.n_embd, h),
            p + "indexer.attn_k.weight": (self.hp.n_embd, d),
            p + "indexer.attn_q_b.weight": (self.q_lora, h * d),
        }
        if self.idx_full[il]:
            shapes.update(own)
        else:  # optional where the block reuses another's choice: loaded where present, as llama.cpp
            shapes.update({n: s for n, s in own.items() if n in self.names})
        return shapes

    # -- graphs ------------------------------------------------------------
    def build_indexer(
        self, ctx: Context, w: Weights, inp: StepInputs, il: int, cur: Tensor, qr: Tensor | None
    ) -> tuple[Tensor, ...] | None:
        """The indexer's queries F32 [d, heads, n] and keys [d, 1, n] (roped, rotated) and its per-head weights
        F32 [heads, n], prescaled; () where the block reuses the last full indexer's choice."""
        if not self.idx_full[il]:
            return ()
        p, n, d = f"blk.{il}.", inp.n_tokens, self.idx_dim
        assert qr is not None and inp.indexer_rot is not None
        iq = ctx.reshape(ctx.mul_mat(w(p + "indexer.attn_q_b.weight"), qr), [d, self.idx_heads, n])
        ik = ctx.norm(ctx.mul_mat(w(p + "indexer.attn_k.weight"), cur), self.indexer_norm_eps)
        ik = ctx.add(ctx.mul(ik, w(p + "indexer.k_norm.weight")), w(p + "indexer.k_norm.bias"))
        iq, ik = self.indexer_roped(ctx, inp, iq), self.indexer_roped(ctx, inp, ctx.reshape(ik, [d, 1, n]))
        iq, ik = ctx.mul_mat(inp.indexer_rot, iq), ctx.mul_mat(inp.indexer_rot, ik)
        iw = ctx.mul_mat(w(p + "indexer.proj.weight"), cur)
        return iq, ik, ctx.scale(iw, float(f32(1.0) / np.sqrt(f32(d * self.idx_heads))))

    def indexer_roped(self, ctx: Context, inp: StepInputs, x: Tensor) -> Tensor:
        hp = self.hp
        assert inp.positions is not None
        return ctx.rope_ext(
            x,
            inp.positions,
            None,
            hp.n_rot,
            self.indexer_rope,
            hp.n_ctx_orig,
            hp.rope_base,
            hp.rope_scale,
            hp.rope_ext_factor,
            hp.rope_attn_factor,
            *self.yarn_beta,
            offset=x.ne[0] - hp.n_rot if self.indexer_rope_last else 0,
        )

    def sparse_mask(
        self, ctx: Context, gf: Graph, inp: StepInputs, sparse: tuple[Tensor, ...], rows: Rows, k_cache: Tensor
    ) -> Tensor:
        """Writes the indexer's keys into this pass's memory rows (after the latent values), scores every key for
        every query, and unmasks each query's top keys: the pass's mask, of the mask's type, F32 [n_kv, t, 1, S]
        (F16 with flash attention). A block that reuses a choice reads the mask the last full block left in
        inp.kept_mask."""
        assert inp.mask is not None and inp.k_idxs is not None
        d, S, n_kv, n = self.idx_dim, inp.n_streams, inp.n_kv, inp.n_tokens
        t, n_ctx = n // S, k_cache.ne[1] // S
        if not sparse:
            assert inp.kept_mask is not None
            return ctx.reshape(inp.kept_mask, [n_kv, t, 1, S])
        iq, ik, iw = rows(sparse[0]), rows(sparse[1]), rows(sparse[2], 2)
        off = row_size(k_cache.type, self.latent_hp.n_embd_gqa)
        keys = ctx.view(k_cache, [d, k_cache.ne[1]], [k_cache.nb[1]], off)
        gf.expand(ctx.set_rows(keys, ctx.reshape(ik, [d, n]), inp.k_idxs))
        rs = k_cache.nb[1]
        k4 = ctx.view(k_cache, [d, 1, n_kv, S], [row_size(k_cache.type, d), rs, rs * n_ctx], off)
        q4 = ctx.view(iq, [d, self.idx_heads, t, S], [iq.nb[1], iq.nb[2], iq.nb[2] * t])
        w4 = ctx.view(iw, [self.idx_heads, t, 1, S], [iw.nb[1], iw.nb[1] * t, iw.nb[1] * t])
        mask = ctx.reshape(inp.mask, [n_kv, t, 1, S])
        f16 = native.GGMLType.F16
        scores = ctx.lightning_indexer(q4, k4, w4, mask if mask.type == f16 else ctx.cast(mask, f16))
        k = min(n_kv, self.idx_top_k)
        top = ctx.top_k(scores, k)  # I32 [k, t, 1, S]
        out = top_k_mask(ctx, mask, ctx.view(top, [k, t, S], [top.nb[1], top.nb[3]]), scores)
        if inp.kept_mask is not None:  # for the blocks that reuse this choice
            gf.expand(ctx.cpy(out, inp.kept_mask))
        return out


class GlmDsaArch(Deepseek32Arch):
    indexer_rope = ROPE_NORM
    indexer_norm_eps = 0.0  # llama.cpp's glm-dsa leaves f_norm_eps at its zero
    default_gating = 2  # sigmoid where expert_gating_func is absent

    def attention_scale(self, meta: Mapping[str, Any]) -> float:
        """glm-dsa reads no rope.scaling.yarn_log_multiplier."""
        return super().attention_scale({k: v for k, v in meta.items() if not k.endswith(".yarn_log_multiplier")})

    def indexer_types(self, meta: Mapping[str, Any]) -> tuple[bool, ...]:
        hp = self.hp
        n = hp.n_layer
        default = (1,) * n if hp.n_ctx_train < 1 << 20 else (GLM_5_2_INDEXER_TYPES + (0,) * n)[:n]
        v = self.key(meta, "attention.indexer.types", None)
        full = tuple(bool(x) for x in self.per_layer(meta, "attention.indexer.types", 0.0)) if v is not None else None
        types = full if full is not None else tuple(bool(x) for x in default)
        if not types[0]:
            raise GGUFError(f"{hp.arch}: block 0's indexer reuses a choice no earlier block made")
        return types
