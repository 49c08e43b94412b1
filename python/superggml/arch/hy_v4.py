"""hy_v4 family (llama.cpp's src/models/hy-v4.cpp; docs/dev/hy-v4.md part 1): Hunyuan HY V4, DeepSeek-V3's absorbed
latent attention and experts with independent hyper-connections (iHC): `hc` residual streams, mixed into each
sublayer's input by a sigmoid gate and each given the sublayer's output by a sigmoid gate of its own (no Sinkhorn
mixing between streams), the head mixing them once more; per-head sinks in the latent attention and a sigmoid gate
on its output; the routed experts' SwiGLU clamped by the fused op (swiglu_clamp_exp), the shared and dense FFNs not.
The sums over streams are mul and add chains, as llama.cpp writes them (not dsv4_hc_pre's loop). With
attention.indexer.top_k > 0, DeepSeek sparse attention as deepseek32's (arch/deepseek32.py) but for the indexer's
keys: no Hadamard rotation, RoPE on their last n_rot values, a layer norm of the RMS epsilon."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import numpy as np

from ..errors import GGUFError
from ..native import Context, Graph, Tensor
from .base import BlockGraph, HParams, Memory, StepInputs, Weights, f32
from .common import ROPE_NORM, inv_sqrt
from .deepseek2 import Deepseek2Arch
from .deepseek32 import Deepseek32Arch


class HyV4Arch(Deepseek32Arch):
    late_gather = True  # the head picks its rows from the last block's streams
    indexer_rope = ROPE_NORM
    indexer_rope_last = True  # the indexer's RoPE turns the last n_rot values of a head

    def load_hparams(self, meta: Mapping[str, Any]) -> None:
        hp = self.hp
        if not int(self.key(meta, "expert_gating_func", 0)):  # llama.cpp aborts on gating "none"
            raise GGUFError(f"GGUF metadata lacks '{hp.arch}.expert_gating_func'")
        Deepseek2Arch.load_hparams(self, meta)  # DeepSeek sparse attention where indexer.top_k > 0 (load_dsa)
        self.dsa = int(self.key(meta, "attention.indexer.top_k", 0)) > 0
        self.latent_hp = self.hp
        if self.dsa:
            self.load_dsa(meta)
        if self.legacy or not self.q_lora:
            raise GGUFError(f"{hp.arch} needs the absorbed latent layout with low-rank queries")
        self.hc = int(self.need(meta, "hyper_connection.count"))
        self.hc_eps = float(f32(self.need(meta, "hyper_connection.epsilon")))
        self.hc_magnitude = float(f32(self.need(meta, "hyper_connection.magnitude")))
        if self.hc < 1:
            raise GGUFError(f"{hp.arch}: hyper_connection.count must be >= 1")
        limits = self.key(meta, "swiglu_clamp_exp", 0.0)
        per = (
            [float(f32(x)) for x in limits] if isinstance(limits, (list, tuple)) else [float(f32(limits))] * hp.n_layer
        )
        if len(per) < hp.n_layer:
            raise GGUFError(f"'{hp.arch}.swiglu_clamp_exp' has {len(per)} entries for {hp.n_layer} blocks")
        self.limits = per[: hp.n_layer]
        self.moe.clamp_fused = True
        self.hp = dataclasses.replace(self.hp, n_residual=self.hc * hp.n_embd, n_ffn_inp=self.hc * (hp.n_embd + 1))

    def load_dsa(self, meta: Mapping[str, Any]) -> None:
        """The indexer's keys: no Hadamard rotation, RoPE on the last n_rot values of a key, a layer norm of the
        RMS epsilon; its keys kept beside the latent rows (HParams.kv_width), as deepseek32's."""
        hp = self.hp
        self.idx_heads = int(self.need(meta, "attention.indexer.head_count"))
        self.idx_dim = int(self.need(meta, "attention.indexer.key_length"))
        self.idx_top_k = int(self.need(meta, "attention.indexer.top_k"))
        if self.idx_heads <= 0 or self.idx_dim <= hp.n_rot:  # llama.cpp throws
            raise GGUFError(f"{hp.arch}: bad indexer head count / key length ({self.idx_heads}, {self.idx_dim})")
        if self.key(meta, "attention.indexer.types", None) is None:  # llama.cpp's default: every block shared
            raise GGUFError(f"{hp.arch}: layer 0 must own an indexer ('{hp.arch}.attention.indexer.types')")
        self.idx_full = tuple(bool(x) for x in self.per_layer(meta, "attention.indexer.types", 0.0))
        if not self.idx_full[0]:
            raise GGUFError(f"{hp.arch}: layer 0 must own an indexer")
        self.keeps_mask = not all(self.idx_full)
        self.indexer_norm_eps = hp.rms_eps
        self.hp = dataclasses.replace(hp, kv_width=hp.n_embd_gqa + self.idx_dim)

    def layer_hp(self, il: int) -> HParams:
        return self.latent_hp

    def build_indexer(
        self, ctx: Context, w: Weights, inp: StepInputs, il: int, cur: Tensor, qr: Tensor | None
    ) -> tuple[Tensor, ...] | None:
        if not self.dsa:
            return None
        if not self.idx_full[il]:
            return ()
        p, n, d = f"blk.{il}.", inp.n_tokens, self.idx_dim
        assert qr is not None
        iq = self.indexer_roped(
            ctx, inp, ctx.reshape(ctx.mul_mat(w(p + "indexer.attn_q_b.weight"), qr), [d, self.idx_heads, n])
        )
        ik = ctx.norm(ctx.mul_mat(w(p + "indexer.attn_k.weight"), cur), self.indexer_norm_eps)
        ik = ctx.add(ctx.mul(ik, w(p + "indexer.k_norm.weight")), w(p + "indexer.k_norm.bias"))
        ik = self.indexer_roped(ctx, inp, ctx.reshape(ik, [d, 1, n]))
        iw = ctx.mul_mat(w(p + "indexer.proj.weight"), cur)
        return iq, ik, ctx.scale(iw, float(f32(1.0) / np.sqrt(f32(d * self.idx_heads))))

    def attention_scale(self, meta: Mapping[str, Any]) -> float:
        return inv_sqrt(self.k_mla)  # hy_v4 reads no DeepSeek YaRN mscale

    def swiglu_limits(self, il: int) -> tuple[float, float]:
        return self.limits[il], 0.0

    def describe(self) -> list[str]:
        lines = super().describe() if self.dsa else Deepseek2Arch.describe(self)
        return lines + [
            f"independent hyper-connections: {self.hc} residual streams of {self.hp.n_embd}; sinks and a sigmoid "
            "output gate in the latent attention"
        ]

    def block_tensor_shapes(self, il: int) -> dict[str, tuple[int, ...]]:
        hp, p, hc = self.hp, f"blk.{il}.", self.hc
        shapes = super().block_tensor_shapes(il) if self.dsa else Deepseek2Arch.block_tensor_shapes(self, il)
        shapes[p + "attn_sinks.weight"] = (hp.n_head,)
        shapes[p + "attn_gate.weight"] = (hp.n_embd, hp.n_head * self.v_mla)
        for part in ("attn", "ffn"):
            shapes[p + f"hc_{part}_fn.weight"] = (hc * hp.n_embd, 2 * hc)
            shapes[p + f"hc_{part}_base.weight"] = (2 * hc,)
            shapes[p + f"hc_{part}_scale.weight"] = (2,)
        return shapes

    def global_tensor_shapes(self, has: Any) -> dict[str, tuple[int, ...]]:
        hp, hc = self.hp, self.hc
        return super().global_tensor_shapes(has) | {
            "output_hc_fn.weight": (hc * hp.n_embd, hc),
            "output_hc_base.weight": (hc,),
            "output_hc_scale.weight": (1,),
        }

    def output_tensor(self, has: Any) -> str:
        return "output.weight"

    # -- the streams ----------------------------------------------------------
    def reduce(self, ctx: Context, x: Tensor, pre: Tensor) -> Tensor:
        """The streams x [n_embd, hc, n] summed by their weights pre [hc, n], in stream order (llama.cpp's chain)."""
        E, n = self.hp.n_embd, x.ne[2]
        out: Tensor | None = None
        for h in range(self.hc):
            t = ctx.mul(
                ctx.view(x, [E, n], [x.nb[2]], h * x.nb[1]), ctx.view(pre, [1, n], [pre.nb[1]], h * pre.element_size)
            )
            out = t if out is None else ctx.add(out, t)
        assert out is not None
        return out

    def gate(self, ctx: Context, m: Tensor, scale: Tensor, base: Tensor) -> Tensor:
        return ctx.sigmoid(ctx.add(ctx.mul(m, scale), base))

    def hc_pre(self, ctx: Context, w: Weights, x: Tensor, p: str) -> tuple[Tensor, Tensor]:
        """(the sublayer's input F32 [n_embd, n], its output's gate per stream F32 [hc, n]) of the streams x."""
        E, n, hc = self.hp.n_embd, x.ne[2], self.hc
        m = ctx.mul_mat(w(p + "_fn.weight"), ctx.rms_norm(ctx.reshape(x, [hc * E, n]), self.hp.rms_eps))
        scale, base = w(p + "_scale.weight"), w(p + "_base.weight")
        es = scale.element_size

        def part(t: Tensor, k: int, at: int) -> Tensor:
            return ctx.view(t, [k], [], at * es)

        pre = self.gate(ctx, ctx.view(m, [hc, n], [m.nb[1]], 0), part(scale, 1, 0), part(base, hc, 0))
        pre = ctx.scale_bias(pre, 1.0, self.hc_eps)
        post = self.gate(
            ctx, ctx.view(m, [hc, n], [m.nb[1]], hc * m.element_size), part(scale, 1, 1), part(base, hc, hc)
        )
        post = ctx.scale_bias(ctx.scale(post, self.hc_magnitude), 1.0, self.hc_eps)
        return self.reduce(ctx, x, pre), post

    def hc_post(self, ctx: Context, y: Tensor, x: Tensor, post: Tensor) -> Tensor:
        """Each stream plus y times its gate, F32 [n_embd * hc, n]."""
        E, n = self.hp.n_embd, y.ne[1]
        out: Tensor | None = None
        for i in range(self.hc):
            res = ctx.view(x, [E, n], [x.nb[2]], i * x.nb[1])
            t = ctx.reshape(
                ctx.add(res, ctx.mul(y, ctx.view(post, [1, n], [post.nb[1]], i * post.element_size))), [E, 1, n]
            )
            out = t if out is None else ctx.concat(out, t, 1)
        assert out is not None
        return ctx.reshape(out, [self.hc * E, n])

    # -- graphs ------------------------------------------------------------
    def build_embed(self, ctx: Context, w: Weights, inp: StepInputs) -> Tensor:
        x = super().build_embed(ctx, w, inp)
        E, n = self.hp.n_embd, inp.n_tokens
        return ctx.reshape(ctx.repeat_4d(ctx.reshape(x, [E, 1, n]), [E, self.hc, n, 1]), [self.hc * E, n])

    def latent_sinks(self, w: Weights, p: str) -> Tensor | None:
        return w(p + "attn_sinks.weight")

    def build_attention(self, blk: BlockGraph, cur: Tensor, k_cache: Memory, v_cache: Memory) -> Tensor:
        out = super().build_attention(blk, cur, k_cache, v_cache)
        return blk.ctx.mul(out, blk.ctx.sigmoid(blk.ctx.mul_mat(blk.w(f"blk.{blk.il}.attn_gate.weight"), cur)))

    def build_attn_part(
        self, ctx: Context, gf: Graph, w: Weights, inp: StepInputs, il: int, x: Tensor, k_cache: Memory, v_cache: Memory
    ) -> tuple[Tensor, Tensor]:
        """(the streams after attention with the FFN's output gates, F32 [hc * n_embd + hc, n]; the FFN's normed
        input)."""
        E, n, hc, p = self.hp.n_embd, inp.n_tokens, self.hc, f"blk.{il}."
        x = ctx.reshape(x, [E, hc, n])
        cur, post = self.hc_pre(ctx, w, x, p + "hc_attn")
        cur = self.norm(ctx, w, cur, p + "attn_norm.weight")
        cur = self.build_attention(BlockGraph(ctx, gf, w, inp, il), cur, k_cache, v_cache)
        x = ctx.reshape(self.hc_post(ctx, ctx.mul_mat(w(p + "attn_output.weight"), cur), x, post), [E, hc, n])
        cur, post = self.hc_pre(ctx, w, x, p + "hc_ffn")
        return ctx.concat(ctx.reshape(x, [hc * E, n]), post, 0), self.norm(ctx, w, cur, p + "ffn_norm.weight")

    def build_ffn_out(self, ctx: Context, w: Weights, p: str, ffn_out: Tensor, ffn_inp: Tensor) -> Tensor:
        E, hc, n, rs, es = self.hp.n_embd, self.hc, ffn_inp.ne[1], ffn_inp.nb[1], ffn_inp.element_size
        x = ctx.cont(ctx.view(ffn_inp, [E, hc, n], [E * es, rs], 0))
        post = ctx.cont(ctx.view(ffn_inp, [hc, n], [rs], hc * E * es))
        return self.hc_post(ctx, ffn_out, x, post)

    def build_output_norm(self, ctx: Context, w: Weights, x: Tensor) -> Tensor:
        E, n, hc = self.hp.n_embd, x.ne[1], self.hc
        m = ctx.mul_mat(w("output_hc_fn.weight"), ctx.rms_norm(x, self.hp.rms_eps))
        pre = ctx.scale_bias(
            self.gate(ctx, m, w("output_hc_scale.weight"), w("output_hc_base.weight")), 1.0, self.hc_eps
        )
        return self.norm(ctx, w, self.reduce(ctx, ctx.reshape(x, [E, hc, n]), pre), "output_norm.weight")
