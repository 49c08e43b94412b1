"""DeepSeek V4's attention over its compressed K/V (llama.cpp's src/models/deepseek4.cpp, build_attention_impl and
its compressors; arch/deepseek4.py is the rest of the family): the raw sliding-window keys, the compressors that
turn windows of 4 (CSA, overlapped) or 128 (HCA) tokens into keys, the lightning indexer that picks each query's
compressed rows, and the rows a pass of one sequence reads and writes (pass_shape, compressor_rows)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..native import Context, Tensor
from .base import BlockGraph, CompressedLayer, CompressorInputs, CompressorShape, HParams, StepInputs, Weights, f32
from .common import F16, F32, ROPE_NORM, inv_sqrt, top_k_mask

CSA, HCA = 4, 128  # the compression ratios llama.cpp knows
RING_SPARE = 16  # tokens a sequence can go back by while its compressors' rings still hold what they need


def ring_rows(ratio: int) -> int:
    """Rows of a compressor's ring: the tokens its next block reads (CSA: two windows), and RING_SPARE more."""
    return (2 * ratio if ratio == CSA else ratio) + RING_SPARE


def comp_rows(ctx_size: int, ratio: int) -> int:
    """Compressed rows of a sequence of ctx_size tokens, padded to 256 as llama.cpp sizes its caches."""
    return -(-(-(-ctx_size // ratio)) // 256) * 256


def comp_width(p_end: int, ratio: int) -> int:
    """The compressed rows a pass ending at position p_end - 1 attends over (llama.cpp's plan.n_kv)."""
    return max(-(-(p_end // ratio) // 256) * 256, 256)


def pass_shape(ratios: tuple[int, ...], p0: int, n: int) -> tuple[CompressorShape, ...]:
    """What a pass of one sequence over positions p0..p0+n-1 computes per compression ratio (of `ratios`)."""
    out = []
    for r in sorted({x for x in ratios if x}):
        blocks = sum(1 for p in range(p0, p0 + n) if (p + 1) % r == 0)
        reads = (2 if r == CSA else 1) * r * blocks
        out.append(CompressorShape(r, blocks, reads, min(n, ring_rows(r)), comp_width(p0 + n, r), r == CSA))
    return tuple(out)


def compressor_rows(shape: CompressorShape, p0: int, n: int, flash_attn: bool) -> dict[str, np.ndarray]:
    """The arrays of CompressorInputs for a pass over p0..p0+n-1 (llama.cpp's dsv4_build_comp_plan): sources
    index [ring rows R | the pass's n rows | a zero row]."""
    r, R = shape.ratio, ring_rows(shape.ratio)
    pos = np.arange(p0, p0 + n)

    def source(t: int) -> int:
        return R + n if t < 0 else R + (t - p0) if t >= p0 else t % R

    ends = [p for p in pos if (p + 1) % r == 0]
    starts = [int(p) + 1 - r for p in ends]
    if r == CSA:
        reads = [source(s - r + j) for s in starts for j in range(r)] + [
            source(s + j) for s in starts for j in range(r)
        ]
    else:
        reads = [source(s + j) for s in starts for j in range(r)]
    last: dict[int, int] = {}
    for i, p in enumerate(pos):
        last[int(p) % R] = i
    dst = sorted(last)
    mtype = np.float16 if flash_attn else np.float32
    visible = (pos + 1) // r
    cols = np.arange(shape.width)[None, :]
    mask = np.where(cols < visible[:, None], 0.0, -np.inf)
    return dict(
        state_pos=(pos % r).astype(np.int32),
        read_idxs=np.asarray(reads, dtype=np.int32),
        write_rows=np.asarray([s // r for s in starts], dtype=np.int64),
        comp_pos=np.asarray(starts, dtype=np.int32),
        persist_src=np.asarray([last[d] for d in dst], dtype=np.int32),
        persist_dst=np.asarray(dst, dtype=np.int64),
        mask=mask.astype(mtype),
        lid_mask=mask.astype(np.float16),
    )


@dataclass(frozen=True)
class AttentionShape:
    """What the attention reads of the family's keys."""

    hp: HParams
    ratios: tuple[int, ...]
    n_swa: int
    o_groups: int
    o_rank: int
    idx_heads: int
    idx_dim: int
    idx_top_k: int
    comp_base: float
    comp_attn_factor: float
    yarn_beta: tuple[float, float]


class CompressedAttention:
    """Block il's attention (`attention`) and its compressors, for the family's shape."""

    def __init__(self, shape: AttentionShape):
        self.shape = shape
        self.hp, self.ratios, self.n_swa = shape.hp, shape.ratios, shape.n_swa
        self.o_groups, self.o_rank = shape.o_groups, shape.o_rank
        self.idx_heads, self.idx_dim, self.idx_top_k = shape.idx_heads, shape.idx_dim, shape.idx_top_k
        self.comp_base, self.comp_attn_factor, self.yarn_beta = shape.comp_base, shape.comp_attn_factor, shape.yarn_beta

    def norm(self, ctx: Context, w: Weights, x: Tensor, name: str) -> Tensor:
        return ctx.mul(ctx.rms_norm(x, self.hp.rms_eps), w(name))

    def roped(self, ctx: Context, inp: StepInputs, il: int, x: Tensor, back: bool = False) -> Tensor:
        """RoPE of the last n_rot values of each head of x [d, heads, n] with block il's parameters: the
        compressed blocks' base and YaRN, or plain rope.freq_base in a raw block."""
        assert inp.positions is not None
        return self.rope_at(ctx, x, inp.positions, self.ratios[il] != 0, back)

    def rope_at(self, ctx: Context, x: Tensor, pos: Tensor, compressed: bool, back: bool = False) -> Tensor:
        """RoPE (or its inverse) of the last n_rot values of x's rows at `pos`: the compressed parameters, or
        rope.freq_base alone."""
        hp = self.hp
        f = ctx.rope_ext_back if back else ctx.rope_ext
        if compressed:
            args = (hp.n_ctx_orig, self.comp_base, hp.rope_scale, hp.rope_ext_factor, self.comp_attn_factor)
            beta = self.yarn_beta
        else:
            args = (0, hp.rope_base, 1.0, 0.0, 1.0)
            beta = (0.0, 0.0)
        return f(x, pos, None, hp.n_rot, ROPE_NORM, *args, *beta, offset=x.ne[0] - hp.n_rot)

    def attention(self, blk: BlockGraph, cur: Tensor, raw_k: Tensor, mem: CompressedLayer) -> Tensor:
        """Block il's attention over its normed input cur F32 [n_embd, n] -> F32 [n_embd, n] (after the
        output projection)."""
        ctx, gf, w, inp, il = blk.ctx, blk.gf, blk.w, blk.inp, blk.il
        hp, p, r = self.hp, f"blk.{il}.", self.ratios[il]
        D, H, n = hp.head_dim, hp.n_head, inp.n_tokens
        qr = self.norm(ctx, w, ctx.mul_mat(w(p + "attn_q_a.weight"), cur), p + "attn_q_a_norm.weight")
        q = ctx.reshape(ctx.mul_mat(w(p + "attn_q_b.weight"), qr), [D, H, n])
        q = self.roped(ctx, inp, il, ctx.rms_norm(q, hp.rms_eps))
        kv = self.norm(ctx, w, ctx.mul_mat(w(p + "attn_kv.weight"), cur), p + "attn_kv_a_norm.weight")
        kv = self.roped(ctx, inp, il, ctx.reshape(kv, [D, 1, n]))
        if inp.k_rot is not None:  # a quantized cache: Q and K turned, the output turned back (llama.cpp's k_rot)
            q, kv = ctx.mul_mat_hadamard(q, inp.k_rot), ctx.mul_mat_hadamard(kv, inp.k_rot)
        comp = inp.compressed[r] if r and inp.compressed is not None else None
        if comp is not None:
            self.compress(blk, cur, comp, mem, "attn_compressor", D, mem.comp, mem.ring_kv, mem.ring_score, False)
            if r == CSA:
                self.compress(
                    blk, cur, comp, mem, "indexer_compressor", self.idx_dim, mem.lid, mem.lid_kv, mem.lid_score, True
                )
        assert inp.k_idxs is not None and inp.mask_swa is not None
        n_kv = inp.n_kv
        gf.expand(ctx.set_rows(raw_k, ctx.reshape(kv, [D, n]), inp.k_idxs))
        rs = raw_k.nb[1]
        k_all = ctx.view(raw_k, [D, 1, n_kv], [rs, rs], 0)
        mask = inp.mask_swa
        n_kv_max = 0
        if comp is not None:
            assert mem.comp is not None
            cs = mem.comp.nb[1]
            ck = ctx.view(mem.comp, [D, 1, comp.mask.ne[0]], [cs, cs], 0)
            cmask = comp.mask
            if r == CSA:
                top, scores = self.lid_top_k(blk, qr, cur, comp, mem)
                n_c, n = comp.mask.ne[0], comp.mask.ne[1]
                tk = ctx.view(top, [top.ne[0], n, 1], [top.nb[1], top.nb[2]], 0)
                cmask = ctx.reshape(top_k_mask(ctx, ctx.reshape(comp.mask, [n_c, n, 1, 1]), tk, scores), [n_c, n])
                n_kv_max = min(n_kv, self.n_swa) + top.ne[0]
            k_all = ctx.concat(k_all, ck, 2)
            mask = ctx.concat(mask, cmask, 0)
        out = self.attend(ctx, inp, q, k_all, mask, w(p + "attn_sinks.weight"), n_kv_max)
        if inp.k_rot is not None:
            out = ctx.mul_mat_hadamard(out, inp.k_rot)
        out = self.roped(ctx, inp, il, ctx.reshape(out, [D, H, n]), back=True)
        g = self.o_groups
        out = ctx.permute(ctx.reshape(out, [H * D // g, g, n]), 0, 2, 1, 3)  # [H*D/g, n, g]
        wo_a = w(p + "attn_output_a.weight")
        oa = ctx.mul_mat(ctx.reshape(wo_a, [H * D // g, self.o_rank, g]), out)  # [o_rank, n, g]
        oa = ctx.reshape(ctx.cont(ctx.permute(oa, 0, 2, 1, 3)), [self.o_rank * g, n])
        return ctx.mul_mat(w(p + "attn_output_b.weight"), oa)

    def attend(
        self, ctx: Context, inp: StepInputs, q: Tensor, k: Tensor, mask: Tensor, sinks: Tensor, n_kv_max: int
    ) -> Tensor:
        """llama.cpp's build_attn_mha with K = V = k [D, 1, n_kv]: q [D, H, n] -> F32 [D * H, n]."""
        D, H, n = q.ne[0], q.ne[1], q.ne[2]
        scale = inv_sqrt(D)
        qp = ctx.permute(q, 0, 2, 1, 3)  # [D, n, H]
        kp = ctx.permute(k, 0, 2, 1, 3)  # [D, n_kv, 1]
        if inp.flash_attn:
            kf = ctx.cast(kp, F16) if kp.type == F32 else kp  # as llama.cpp: an F32 cache is cast, others read
            cur = ctx.flash_attn_ext(qp, kf, kf, mask, scale, sinks=sinks, n_kv_max=n_kv_max)  # [D, H, n]
            return ctx.reshape(cur, [D * H, n])
        kq = ctx.mul_mat(kp, qp)  # [n_kv, n, H]
        ctx.mul_mat_set_prec_f32(kq)
        kq = ctx.soft_max_ext(kq, mask, scale, sinks=sinks)
        v = ctx.cont(ctx.transpose(kp))  # [n_kv, D, 1]
        kqv = ctx.mul_mat(v, kq)  # [D, n, H]
        return ctx.reshape(ctx.cont(ctx.permute(kqv, 0, 2, 1, 3)), [D * H, n])

    def compress(
        self,
        blk: BlockGraph,
        cur: Tensor,
        comp: CompressorInputs,
        mem: CompressedLayer,
        name: str,
        d: int,
        rows: Tensor | None,
        ring_kv: Tensor | None,
        ring_score: Tensor | None,
        rotate: bool,
    ) -> None:
        """One compressor of block il over the pass's normed input cur: this pass's values and scores, the blocks
        that complete in it compressed into `rows`, then the pass's values and scores kept in the rings."""
        ctx, gf, w, inp, il = blk.ctx, blk.gf, blk.w, blk.inp, blk.il
        p, r = f"blk.{il}.{name}", comp.ratio
        assert rows is not None and ring_kv is not None and ring_score is not None
        kv = ctx.mul_mat(w(p + "_kv.weight"), cur)  # [c * d, n]
        score = ctx.add(ctx.mul_mat(w(p + "_gate.weight"), cur), ctx.get_rows(w(p + "_ape.weight"), comp.state_pos))
        if comp.read_idxs is not None:
            assert comp.write_rows is not None and comp.comp_pos is not None
            src_kv, src_score = ctx.concat(ring_kv, kv, 1), ctx.concat(ring_score, score, 1)
            nb = comp.comp_pos.ne[0]
            if r == CSA:
                src_kv, src_score = self.zero_row(ctx, src_kv, False), self.zero_row(ctx, src_score, True)
                kr, sr = ctx.get_rows(src_kv, comp.read_idxs), ctx.get_rows(src_score, comp.read_idxs)

                def halves(t: Tensor) -> Tensor:
                    m = r * nb
                    prev = ctx.reshape(ctx.cont(ctx.view(t, [d, m], [t.nb[1]], 0)), [d, r, nb])
                    off = m * t.nb[1] + d * t.element_size
                    now = ctx.reshape(ctx.cont(ctx.view(t, [d, m], [t.nb[1]], off)), [d, r, nb])
                    return ctx.concat(prev, now, 1)

                values, scores = halves(kr), halves(sr)
            else:
                values = ctx.reshape(ctx.get_rows(src_kv, comp.read_idxs), [d, r, nb])
                scores = ctx.reshape(ctx.get_rows(src_score, comp.read_idxs), [d, r, nb])
            values = ctx.cont(ctx.permute(values, 1, 0, 2, 3))
            scores = ctx.cont(ctx.permute(scores, 1, 0, 2, 3))
            c = ctx.sum_rows(ctx.mul(values, ctx.soft_max_ext(scores, None, 1.0)))
            c = ctx.cont(ctx.permute(c, 1, 0, 2, 3))  # [d, 1, nb]
            c = self.norm(ctx, w, c, p + "_norm.weight")
            c = self.rope_at(ctx, c, comp.comp_pos, True)
            rot = inp.indexer_rot if rotate else inp.k_rot  # the indexer's keys always, others in a quantized cache
            if rot is not None:
                c = ctx.mul_mat_hadamard(c, rot)
            gf.expand(ctx.set_rows(rows, ctx.reshape(c, [d, nb]), comp.write_rows))
        gf.expand(ctx.set_rows(ring_kv, ctx.get_rows(kv, comp.persist_src), comp.persist_dst))
        gf.expand(ctx.set_rows(ring_score, ctx.get_rows(score, comp.persist_src), comp.persist_dst))

    def zero_row(self, ctx: Context, t: Tensor, neg_inf: bool) -> Tensor:
        """t with a row of zeros (-inf) after its rows, as llama.cpp's dsv4_append_zero_row makes it."""
        row = ctx.view(t, [t.ne[0]], [], 0)
        row = ctx.scale_bias(row, 0.0, float("-inf")) if neg_inf else ctx.scale(row, 0.0)
        return ctx.concat(t, ctx.reshape(row, [t.ne[0], 1]), 1)

    def lid_top_k(
        self, blk: BlockGraph, qr: Tensor, cur: Tensor, comp: CompressorInputs, mem: CompressedLayer
    ) -> tuple[Tensor, Tensor]:
        """The lightning indexer's choice of compressed rows for each query, I32 [k, n], and its scores F32
        [n_comp, n]."""
        ctx, w, inp, il = blk.ctx, blk.w, blk.inp, blk.il
        p, d, h, n = f"blk.{il}.", self.idx_dim, self.idx_heads, inp.n_tokens
        assert inp.positions is not None and inp.indexer_rot is not None and mem.lid is not None
        assert comp.lid_mask is not None
        q = ctx.reshape(ctx.mul_mat(w(p + "indexer.attn_q_b.weight"), qr), [d, h, n])
        q = ctx.mul_mat_hadamard(self.rope_at(ctx, q, inp.positions, True), inp.indexer_rot)
        iw = ctx.mul_mat(w(p + "indexer.proj.weight"), cur)
        iw = ctx.scale(iw, float(f32(1.0) / np.sqrt(f32(d * h))))
        n_lid = comp.lid_mask.ne[0]
        ls = mem.lid.nb[1]
        k = ctx.view(mem.lid, [d, 1, n_lid, 1], [ls, ls, ls * n_lid], 0)
        q4 = ctx.view(q, [d, h, n, 1], [q.nb[1], q.nb[2], q.nb[2] * n], 0)
        w4 = ctx.view(iw, [h, n, 1, 1], [iw.nb[1], iw.nb[1] * n, iw.nb[1] * n], 0)
        m4 = ctx.reshape(comp.lid_mask, [n_lid, n, 1, 1])
        scores = ctx.lightning_indexer(q4, k, w4, m4)
        return ctx.cont(ctx.top_k(scores, min(n_lid, self.idx_top_k))), scores
