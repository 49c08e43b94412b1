"""deepseek4 family: DeepSeek V4 (llama.cpp's src/models/deepseek4.cpp; docs/dev/deepseek4.md cites it line by line).

- The residual is 4 streams of n_embd per token (hyper-connections): before each sublayer the streams are mixed
  into its input by weights computed from them (dsv4_hc_pre), after it they are recombined by a Sinkhorn-normalized
  matrix (dsv4_hc_comb, dsv4_hc_post); the head mixes them once more.
- Attention has one K=V head shared by every query head, RoPE on the last n_rot values of a head, per-head sinks,
  and a sliding window over the raw keys. A block of ratio 128 (HCA) also attends over one compressed key per 128
  tokens; a block of ratio 4 (CSA) over one per 4 tokens (overlapping windows of 8), of which a lightning indexer
  picks each query's top k. A compressor turns each window into a key: a softmax over the window's tokens of
  learned scores, per channel, then an RMS norm and RoPE at the window's first position. The output is rotated
  back (rope_ext_back), then projected in groups through a low rank.
- Mixture of experts with sqrt-softplus routing and a selection bias, a shared expert, SwiGLU clamped by a fused
  op; the first hash_layer_count blocks route each token by a table of its id.

The memory (runtime/memory/compressed.py) keeps per block the raw K, the compressed rows, the indexer's rows and
the compressors' rings of recent tokens; each pass gets the rows its compressors read and write from the positions
alone (compressor_rows). MTP blocks are not run (drafting refuses this family).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping


from ..errors import GGUFError, UnsupportedModelError
from ..native import Context, Graph, Tensor
from .base import BlockGraph, CompressedLayer, Memory, StepInputs, Weights, f32, logf, one_memory
from .common import ROPE_NORM, Architecture
from .deepseek4_attention import CSA, HCA, AttentionShape, CompressedAttention
from .moe import build_expert_outputs, build_router, moe_tensor_shapes, sum_experts

HC = 4  # residual streams (hyper_connection.count): llama.cpp's graph asserts 4


class Deepseek4Arch(Architecture):
    rope_mode = ROPE_NORM
    rope_factors = False
    attn_sinks = True
    late_gather = True  # the head picks its rows from the last block's streams, as llama.cpp

    def load_hparams(self, meta: Mapping[str, Any]) -> None:
        hp = self.hp
        n_all = hp.n_layer + hp.n_nextn
        if hp.n_nextn and f"blk.{hp.n_layer}.nextn.eh_proj.weight" not in self.names and self.names:
            hp = self.hp = dataclasses.replace(hp, n_layer=n_all, n_nextn=0)  # llama.cpp runs them as trunk blocks
        if not 0 < n_all <= 512:
            raise GGUFError(f"deepseek4: block_count {n_all} is not in 1..512")
        if hp.n_head_kv != 1:
            raise GGUFError(f"deepseek4 has one K=V head: attention.head_count_kv is {hp.n_head_kv}")
        # llama.cpp asserts them equal; an absent value_length is n_embd / n_head there
        if int(self.key(meta, "attention.value_length", hp.n_embd // hp.n_head)) != hp.head_dim:
            raise GGUFError("deepseek4: attention.key_length and value_length differ")
        self.q_lora = int(self.need(meta, "attention.q_lora_rank"))
        self.n_swa = int(self.need(meta, "attention.sliding_window"))
        self.swa_layers = (True,) * hp.n_layer
        self.o_groups = int(self.need(meta, "attention.output_group_count"))
        self.o_rank = int(self.need(meta, "attention.output_lora_rank"))
        if self.o_groups <= 0 or hp.n_head % self.o_groups or min(self.q_lora, self.o_rank) <= 0:
            raise GGUFError(
                f"deepseek4: {hp.n_head} heads in {self.o_groups} output groups of rank {self.o_rank}, "
                f"q_lora_rank {self.q_lora}"
            )
        ratios = self.need(meta, "attention.compress_ratios")
        ratios = [int(r) for r in ratios] if isinstance(ratios, (list, tuple)) else []
        if len(ratios) < n_all:
            raise GGUFError(f"'deepseek4.attention.compress_ratios' has {len(ratios)} entries for {n_all} blocks")
        if any(r not in (0, CSA, HCA) for r in ratios[:n_all]):
            raise GGUFError(f"deepseek4: compression ratios must be 0, 4 or 128: {ratios[:n_all]}")
        self.ratios = tuple(ratios[: hp.n_layer])
        self.all_ratios = tuple(ratios[:n_all])  # the MTP blocks' too
        if CSA not in ratios[:n_all]:
            # llama.cpp's empty indexer cache divides by zero creating the context (SIGFPE)
            raise UnsupportedModelError("deepseek4 without a ratio-4 block: llama.cpp cannot run such a file either")
        self.comp_base = float(self.need(meta, "attention.compress_rope_freq_base"))
        self.idx_heads = int(self.need(meta, "attention.indexer.head_count"))
        self.idx_dim = int(self.need(meta, "attention.indexer.key_length"))
        self.idx_top_k = int(self.need(meta, "attention.indexer.top_k"))
        if (
            min(self.idx_heads, self.idx_top_k) <= 0
            or self.idx_dim < 64
            or self.idx_dim % 64
            or hp.n_rot > self.idx_dim
        ):
            raise GGUFError(
                f"deepseek4 indexer: {self.idx_heads} heads of {self.idx_dim} (a multiple of 64, at least "
                f"rope.dimension_count {hp.n_rot}), top {self.idx_top_k}"
            )
        if self.idx_dim == hp.head_dim:
            raise UnsupportedModelError(
                "deepseek4 with an indexer head as wide as the attention head (llama.cpp then rotates every cache): "
                "not supported yet"
            )
        n = 64
        while self.idx_dim % (2 * n) == 0:
            n *= 2
        self.indexer_rot_size = n
        self.load_ffn_keys(meta)
        self.load_hc_keys(meta)
        comp_attn = f32(1.0) / (f32(1.0) + f32(0.1) * logf(f32(1.0) / f32(hp.rope_scale)))
        self.hp = dataclasses.replace(
            hp, latent_kv=True, k_only_rot=True, n_residual=HC * hp.n_embd, n_ffn_inp=HC * hp.n_embd + HC + HC * HC
        )
        self.attn = CompressedAttention(
            AttentionShape(
                self.hp,
                self.all_ratios,
                self.n_swa,
                self.o_groups,
                self.o_rank,
                self.idx_heads,
                self.idx_dim,
                self.idx_top_k,
                self.comp_base,
                float(comp_attn) if hp.rope_ext_factor else 1.0,
                self.yarn_beta,
            )
        )

    def load_ffn_keys(self, meta: Mapping[str, Any]) -> None:
        """The experts' keys: sqrt-softplus routing with a selection bias, hash-routed leading blocks, clamps."""
        hp = self.hp
        gating = int(self.need(meta, "expert_gating_func"))
        if gating != 4:
            raise GGUFError(f"deepseek4 routes by sqrt-softplus (expert_gating_func 4), not {gating}")
        self.n_ff_exp = self.uniform(meta, "expert_feed_forward_length", None)
        self.n_ff_shexp = self.n_ff_exp * int(self.need(meta, "expert_shared_count"))
        if self.n_ff_shexp <= 0:
            raise GGUFError("deepseek4 needs a shared expert (expert_shared_count > 0)")
        used = self.key(meta, "expert_used_count", hp.n_expert_used)
        if isinstance(used, (list, tuple)) and len({int(x) for x in used}) > 1:
            raise UnsupportedModelError("'deepseek4.expert_used_count' varies by layer: not supported")
        self.shexp_gate = False
        self.moe.gating = "sqrt_softplus"
        self.moe.probs_bias = True
        self.moe.clamp_fused = True
        self.moe.norm_w = bool(self.need(meta, "expert_weights_norm"))
        self.moe.w_scale = float(f32(self.need(meta, "expert_weights_scale")))
        self.n_hash = int(self.need(meta, "hash_layer_count"))
        self.moe.token_table = frozenset(range(min(self.n_hash, hp.n_layer)))
        exp = self.every_block(meta, "swiglu_clamp_exp", self.need(meta, "swiglu_clamp_exp"))
        sh = self.every_block(meta, "swiglu_clamp_shexp", self.key(meta, "swiglu_clamp_shexp", None)) or exp
        self.limits = list(zip(exp, sh))

    def every_block(self, meta: Mapping[str, Any], name: str, v: Any) -> list[float]:
        """A float key per block, the MTP blocks' included (llama.cpp's get_key_or_arr over n_layer_all); [] where
        absent."""
        n = self.hp.n_layer + self.hp.n_nextn
        if v is None:
            return []
        per = [float(f32(x)) for x in v] if isinstance(v, (list, tuple)) else [float(f32(v))] * n
        if len(per) < n:
            raise GGUFError(f"'deepseek4.{name}' has {len(per)} entries for {n} blocks")
        return per[:n]

    def load_hc_keys(self, meta: Mapping[str, Any]) -> None:
        """The hyper-connections' keys: 4 streams, Sinkhorn iterations (> 0: llama.cpp aborts on 0), epsilon."""
        if int(self.need(meta, "hyper_connection.count")) != HC:
            raise GGUFError(f"deepseek4 has {HC} residual streams (hyper_connection.count)")
        self.hc_iters = int(self.need(meta, "hyper_connection.sinkhorn_iterations"))
        if self.hc_iters <= 0:
            raise GGUFError("deepseek4: hyper_connection.sinkhorn_iterations must be > 0")
        self.hc_eps = float(f32(self.need(meta, "hyper_connection.epsilon")))

    def uniform(self, meta: Mapping[str, Any], name: str, default: Any) -> int:
        v = self.need(meta, name) if default is None else self.key(meta, name, default)
        vals = {int(x) for x in v} if isinstance(v, (list, tuple)) else {int(v)}
        if len(vals) != 1:
            raise UnsupportedModelError(f"'deepseek4.{name}' varies by layer: not supported")
        return vals.pop()

    def describe(self) -> list[str]:
        counts = {r: self.ratios.count(r) for r in (0, CSA, HCA)}
        return [
            f"hyper-connections: {HC} residual streams of {self.hp.n_embd}",
            f"compressed K/V: {counts[CSA]} block(s) of ratio 4 (CSA, top {self.idx_top_k} by a lightning indexer "
            f"of {self.idx_heads} heads of {self.idx_dim}), {counts[HCA]} of ratio 128 (HCA), {counts[0]} raw only; "
            f"a sliding window of {self.n_swa} raw keys",
            f"routing: sqrt-softplus with exp_probs_b; the first {self.n_hash} block(s) by token id",
        ]

    def is_moe(self, il: int) -> bool:
        return True

    def swiglu_limits(self, il: int) -> tuple[float, float]:
        return self.limits[il] if il < len(self.limits) else (0.0, 0.0)

    # -- tensors ---------------------------------------------------------
    def global_tensor_shapes(self, has: Any) -> dict[str, tuple[int, ...]]:
        hp = self.hp
        return {
            "token_embd.weight": (hp.n_embd, hp.n_vocab),
            "output_norm.weight": (hp.n_embd,),
            "output.weight": (hp.n_embd, hp.n_vocab),
            "output_hc_fn.weight": (HC * hp.n_embd, HC),
            "output_hc_base.weight": (HC,),
            "output_hc_scale.weight": (1,),
        }

    def output_tensor(self, has: Any) -> str:
        return "output.weight"

    def block_tensor_shapes(self, il: int) -> dict[str, tuple[int, ...]]:
        hp, p, r = self.hp, f"blk.{il}.", self.all_ratios[il]
        E, H, D, mix = hp.n_embd, hp.n_head, hp.head_dim, (2 + HC) * HC
        s = {
            p + "attn_norm.weight": (E,),
            p + "attn_sinks.weight": (H,),
            p + "attn_q_a.weight": (E, self.q_lora),
            p + "attn_q_a_norm.weight": (self.q_lora,),
            p + "attn_q_b.weight": (self.q_lora, H * D),
            p + "attn_kv.weight": (E, D),
            p + "attn_kv_a_norm.weight": (D,),
            p + "attn_output_a.weight": (H * D // self.o_groups, self.o_groups * self.o_rank),
            p + "attn_output_b.weight": (self.o_groups * self.o_rank, E),
            p + "ffn_norm.weight": (E,),
        }
        for part in ("attn", "ffn"):
            s.update(
                {
                    p + f"hc_{part}_fn.weight": (HC * E, mix),
                    p + f"hc_{part}_base.weight": (mix,),
                    p + f"hc_{part}_scale.weight": (3,),
                }
            )
        if r:
            c = 2 if r == CSA else 1
            s.update(
                {
                    p + "attn_compressor_kv.weight": (E, c * D),
                    p + "attn_compressor_gate.weight": (E, c * D),
                    p + "attn_compressor_ape.weight": (c * D, r),
                    p + "attn_compressor_norm.weight": (D,),
                }
            )
        if r == CSA:
            d = self.idx_dim
            s.update(
                {
                    p + "indexer.proj.weight": (E, self.idx_heads),
                    p + "indexer.attn_q_b.weight": (self.q_lora, self.idx_heads * d),
                    p + "indexer_compressor_kv.weight": (E, 2 * d),
                    p + "indexer_compressor_gate.weight": (E, 2 * d),
                    p + "indexer_compressor_ape.weight": (2 * d, CSA),
                    p + "indexer_compressor_norm.weight": (d,),
                }
            )
        s.update(moe_tensor_shapes(self, il))
        if il in self.moe.token_table:
            del s[p + "exp_probs_b.bias"]
            s[p + "ffn_gate_tid2eid.weight"] = (hp.n_expert_used, hp.n_vocab)
        return s

    def matmul_weights(self, has: Any) -> list[str]:
        out = super().matmul_weights(has)
        skip = ("attn_output_a.weight", "ffn_gate_tid2eid.weight", "_ape.weight", "hc_")
        return [n for n in out if not any(x in n for x in skip)]

    # -- the compressed memory's layout and a pass's rows --------------------------
    def compressed_layout(self) -> tuple[tuple[int, ...], int] | None:
        return self.ratios, self.idx_dim

    # -- graphs ------------------------------------------------------------
    def build_embed(self, ctx: Context, w: Weights, inp: StepInputs) -> Tensor:
        """The embedding repeated in every stream: F32 [4 * n_embd, n_tokens]."""
        x = super().build_embed(ctx, w, inp)
        E, n = self.hp.n_embd, inp.n_tokens
        x = ctx.repeat_4d(ctx.reshape(x, [E, 1, n]), [E, HC, n, 1])
        return ctx.reshape(x, [HC * E, n])

    def hc_mix(self, ctx: Context, w: Weights, x: Tensor, name: str) -> Tensor:
        """The mixes of the streams x F32 [n_embd, 4, n]: fn times their RMS norm over all streams."""
        E, n = self.hp.n_embd, x.ne[2]
        flat = ctx.rms_norm(ctx.reshape(x, [HC * E, n]), self.hp.rms_eps)
        return ctx.mul_mat(w(name), flat)

    def affine_sigmoid(self, ctx: Context, m: Tensor, scale: Tensor, base: Tensor) -> Tensor:
        return ctx.sigmoid(ctx.add(ctx.mul(m, scale), base))

    def hc_pre(self, ctx: Context, w: Weights, x: Tensor, p: str) -> tuple[Tensor, Tensor, Tensor]:
        """(the sublayer's input F32 [n_embd, n], post F32 [4, n], comb F32 [4, 4, n]) of streams x [n_embd, 4, n]
        (llama.cpp's build_hc_pre with the fused ops)."""
        n = x.ne[2]
        scale, base = w(p + "_scale.weight"), w(p + "_base.weight")
        m = self.hc_mix(ctx, w, x, p + "_fn.weight")  # [(2 + 4) * 4, n]
        es = m.element_size

        def part(t: Tensor, n0: int, at: int) -> Tensor:
            return ctx.view(t, [n0], [], at * t.element_size)

        pre = self.affine_sigmoid(ctx, ctx.view(m, [HC, n], [m.nb[1]], 0), part(scale, 1, 0), part(base, HC, 0))
        pre = ctx.scale_bias(pre, 1.0, self.hc_eps)
        post = self.affine_sigmoid(ctx, ctx.view(m, [HC, n], [m.nb[1]], HC * es), part(scale, 1, 1), part(base, HC, HC))
        post = ctx.scale(post, 2.0)
        comb = ctx.dsv4_hc_comb(m, scale, base, self.hc_eps, self.hc_iters)
        return ctx.dsv4_hc_pre(x, pre), post, comb

    def build_block(
        self, ctx: Context, gf: Graph, w: Weights, inp: StepInputs, il: int, x: Tensor, k_cache: Memory, v_cache: Memory
    ) -> Tensor:
        """Block il over the streams x F32 [4 * n_embd, n] -> same shape (every row: the head picks its rows)."""
        p = f"blk.{il}."
        ffn_inp, cur = self.build_attn_part(ctx, gf, w, inp, il, x, k_cache, v_cache)
        sel, weights = build_router(self, ctx, w, p, cur, inp.tokens)
        exps = [w(name) for name in self.expert_tensors(il)]
        out = sum_experts(ctx, build_expert_outputs(self, ctx, w, p, cur, sel, sel, weights, *exps))
        shared = self.shared_ffn(ctx, w, p, cur)
        assert shared is not None
        return self.build_ffn_out(ctx, w, p, ctx.add(out, shared), ffn_inp)

    def build_attn_part(
        self, ctx: Context, gf: Graph, w: Weights, inp: StepInputs, il: int, x: Tensor, k_cache: Memory, v_cache: Memory
    ) -> tuple[Tensor, Tensor]:
        """(the streams after attention with the FFN's post weights and mixing matrix, F32 [4 * n_embd + 4 + 16,
        n]; the FFN's normed input F32 [n_embd, n])."""
        hp, p = self.hp, f"blk.{il}."
        E, n = hp.n_embd, inp.n_tokens
        assert isinstance(v_cache, CompressedLayer)
        x = ctx.reshape(x, [E, HC, n])
        cur, post, comb = self.hc_pre(ctx, w, x, p + "hc_attn")
        cur = self.norm(ctx, w, cur, p + "attn_norm.weight")
        cur = self.attn.attention(BlockGraph(ctx, gf, w, inp, il), cur, one_memory(k_cache), v_cache)
        x = ctx.dsv4_hc_post(cur, x, post, comb)
        cur, post, comb = self.hc_pre(ctx, w, x, p + "hc_ffn")
        kept = ctx.concat(ctx.concat(ctx.reshape(x, [HC * E, n]), post, 0), ctx.reshape(comb, [HC * HC, n]), 0)
        return kept, self.norm(ctx, w, cur, p + "ffn_norm.weight")

    def build_ffn_out(self, ctx: Context, w: Weights, p: str, ffn_out: Tensor, ffn_inp: Tensor) -> Tensor:
        """The FFN's output F32 [n_embd, n] recombined with the streams build_attn_part kept: F32 [4 * n_embd, n]."""
        E, n, rs, es = self.hp.n_embd, ffn_inp.ne[1], ffn_inp.nb[1], ffn_inp.element_size
        streams = ctx.cont(ctx.view(ffn_inp, [E, HC, n], [E * es, rs], 0))
        post = ctx.cont(ctx.view(ffn_inp, [HC, n], [rs], HC * E * es))
        comb = ctx.cont(ctx.view(ffn_inp, [HC, HC, n], [HC * es, rs], (HC * E + HC) * es))
        return ctx.reshape(ctx.dsv4_hc_post(ffn_out, streams, post, comb), [HC * E, n])

    def build_output_norm(self, ctx: Context, w: Weights, x: Tensor) -> Tensor:
        """The streams x F32 [4 * n_embd, n] mixed by the head's weights, RMS-normed: F32 [n_embd, n]."""
        return self.hc_head(ctx, w, x, "output_norm.weight")

    def hc_head(self, ctx: Context, w: Weights, x: Tensor, norm: str) -> Tensor:
        """build_output_norm with the norm `norm` (an MTP block's shared_head_norm)."""
        E, n = self.hp.n_embd, x.ne[1]
        x3 = ctx.reshape(x, [E, HC, n])
        m = self.hc_mix(ctx, w, x3, "output_hc_fn.weight")  # [4, n]
        pre = self.affine_sigmoid(ctx, m, w("output_hc_scale.weight"), w("output_hc_base.weight"))
        pre = ctx.scale_bias(pre, 1.0, self.hc_eps)
        out: Tensor | None = None
        for h in range(HC):  # llama.cpp's unfused build_hc_pre (the head has no fused node)
            xh = ctx.view(x3, [E, n], [x3.nb[2]], h * x3.nb[1])
            wh = ctx.view(pre, [1, n], [pre.nb[1]], h * pre.element_size)
            t = ctx.mul(xh, wh)
            out = t if out is None else ctx.add(out, t)
        assert out is not None
        return ctx.mul(ctx.rms_norm(out, self.hp.rms_eps), w(norm))
