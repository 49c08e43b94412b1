"""MiniMax Sparse Attention (MSA), minimax-m3's attention in its blocks past the dense ones with flash attention on,
op for op as llama.cpp's src/models/minimax-m3.cpp builds it (docs/dev/minimax-m3.md §3.4-3.5).

An indexer (one head per K/V head) scores every position of the sequence; the scores, max-pooled over blocks of
`block` positions, pick each token's top blocks per K/V head (its own block and the `local` - 1 before it always);
attention runs over those blocks only. A pass of several rows (batch) masks the other blocks' cells; a pass of
one row (decode) gathers the chosen blocks' keys. The indexer's keys are kept in the K memory rows after the
layer's keys, as llama_kv_cache_msa's indexer cache holds them (one key per cell, the K cache's type).

The pass's inputs (llama.cpp's llm_graph_input_msa, one sequence whose cell j holds position j):
    msa_bias       F32 [nblk, n]   1e30 at the token's own block and the local - 1 before it
    msa_pos_mask   F32 [n_ps, n]   0 at the positions the token sees, -inf elsewhere
    msa_pos_slot_i I32 [n_ps]      position -> cell (0 where none)
    msa_pos_slot_f F32 [n_ps]      the same as floats (decode)
    msa_cell_blk   I32 [n_kv]      cell -> its position's block (batch; 0 where empty)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np

from .. import native
from ..native import Context, Graph, Tensor
from .base import HParams, StepInputs
from .common import row_size, unrotated, write_kv

F16, F32, I32 = native.GGMLType.F16, native.GGMLType.F32, native.GGMLType.I32
N_POS_PAD = 256  # llama_kv_cache_msa_context::get_n_pos pads the positions to at least this
LOCAL_BIAS = 1e30


@dataclass(frozen=True)
class Msa:
    """A model's MSA: blocks of `block` positions, `top_k` kept per token, the last `local` forced; indexer heads
    of `dim` (one per K/V head)."""

    block: int
    top_k: int
    local: int
    dim: int

    def n_pos(self, n_kv: int) -> int:
        """n_ps, the positions a pass scores: every position the memory holds, padded to N_POS_PAD, then to whole
        blocks (a function of the pass's n_kv, which is padded alike)."""
        n = max(N_POS_PAD, -(-n_kv // N_POS_PAD) * N_POS_PAD)
        return -(-n // self.block) * self.block

    def shapes(self, n: int, n_kv: int) -> dict[str, tuple[native.GGMLType, list[int]]]:
        n_ps = self.n_pos(n_kv)
        out = {
            "msa_bias": (F32, [n_ps // self.block, n]),
            "msa_pos_mask": (F32, [n_ps, n]),
            "msa_pos_slot_i": (I32, [n_ps, 1]),
        }
        if n == 1:
            out["msa_pos_slot_f"] = (F32, [n_ps, 1])
        else:
            out["msa_cell_blk"] = (I32, [n_kv, 1])
        return out

    def values(self, positions: np.ndarray, n_kv: int) -> dict[str, np.ndarray]:
        """The inputs of a pass of one sequence at `positions` (its last is the last the memory holds)."""
        pos = positions.astype(np.int64)
        n, n_ps = len(pos), self.n_pos(n_kv)
        assert np.array_equal(pos, pos[0] + np.arange(n)), "one sequence's run of positions"
        nblk, end = n_ps // self.block, int(pos.max()) + 1
        p = np.arange(n_ps)
        slot = np.where(p < end, p, 0).astype(np.int32)
        bias = np.zeros((n, nblk), np.float32)
        for back in range(self.local):
            b = pos // self.block - back
            ok = (b >= 0) & (b < nblk)
            bias[np.nonzero(ok)[0], b[ok]] = np.float32(LOCAL_BIAS)
        out = {
            "msa_bias": bias,
            "msa_pos_mask": causal_rows(int(pos[0]), n, n_ps),
            "msa_pos_slot_i": slot,
        }
        if n == 1:
            out["msa_pos_slot_f"] = slot.astype(np.float32)
        else:
            cells = np.arange(n_kv)
            out["msa_cell_blk"] = np.where(cells < end, cells // self.block, 0).astype(np.int32)
        return out


def causal_rows(p0: int, n: int, width: int) -> np.ndarray:
    """F32 [n, width]: row i 0 up to position p0 + i, -inf after; each row a window into one run of zeros then
    -infs (a copy, no compare per value)."""
    z = np.concatenate([np.zeros(width, np.float32), np.full(width, -np.inf, np.float32)])
    start = width - p0 - 1  # row 0 keeps p0 + 1 zeros
    windows = np.lib.stride_tricks.sliding_window_view(z, width)
    return np.ascontiguousarray(windows[start - n + 1 : start + 1][::-1])


@dataclass(frozen=True)
class MsaBlock:
    """One sparse block's pass: its graph, inputs and memory (K rows [n_embd_gqa | indexer key])."""

    ctx: Context
    gf: Graph
    hp: HParams  # the attention's (K rows of n_embd_gqa before the indexer key)
    inp: StepInputs
    own: Mapping[str, Tensor]
    k_cache: Tensor
    v_cache: Tensor


def indexer_keys(blk: MsaBlock, dim: int, rows: int) -> Tensor:
    """The memory's first `rows` indexer keys [dim, rows]: each K row's values after the layer's keys."""
    kc = blk.k_cache
    return blk.ctx.view(kc, [dim, rows], [kc.nb[1]], row_size(kc.type, blk.hp.n_embd_gqa))


def msa_attention(blk: MsaBlock, msa: Msa, q: Tensor, k: Tensor, v: Tensor, iq: Tensor, ik: Tensor) -> Tensor:
    """Writes this pass's keys, values and indexer keys, then attends sparsely: q F32 [D, H, n], k [D, Hkv, n],
    v [D * Hkv, n], iq F32 [dim, Hkv, n], ik [dim, 1, n] (roped) -> F32 [D * H, n]."""
    ctx, inp, hp = blk.ctx, blk.inp, blk.hp
    assert inp.k_idxs is not None
    keys = indexer_keys(blk, msa.dim, blk.k_cache.ne[1])
    blk.gf.expand(ctx.set_rows(keys, ctx.reshape(ik, [msa.dim, inp.n_tokens]), inp.k_idxs))
    k_rot = inp.k_rots.get(hp.head_dim, inp.k_rot) if inp.k_rots else inp.k_rot
    if k_rot is not None:  # a quantized cache's rotations, as build_attn (never the indexer's)
        q, k = ctx.mul_mat_hadamard(q, k_rot), ctx.mul_mat_hadamard(k, k_rot)
    if inp.v_rot is not None:
        v = ctx.mul_mat_hadamard(v, inp.v_rot)
    write_kv(ctx, blk.gf, hp, inp, k, v, blk.k_cache, blk.v_cache)
    n_ps = blk.own["msa_pos_mask"].ne[0]
    scores = block_scores(blk, msa, iq, n_ps)
    top = ctx.top_k(scores, min(msa.top_k, n_ps // msa.block))  # I32 [K, Hkv, n]
    out = decode_attention(blk, msa, q, top) if inp.n_tokens == 1 else batch_attention(blk, msa, q, top)
    return unrotated(ctx, inp, out)


def block_scores(blk: MsaBlock, msa: Msa, iq: Tensor, n_ps: int) -> Tensor:
    """The indexer's scores of every position, max-pooled per block, the local blocks forced: F32 [nblk, Hkv, n]."""
    ctx, own, n, h = blk.ctx, blk.own, blk.inp.n_tokens, blk.hp.n_head_kv
    nblk = n_ps // msa.block
    kp = ctx.get_rows(indexer_keys(blk, msa.dim, blk.inp.n_kv), own["msa_pos_slot_i"])  # [dim, n_ps]
    sc = ctx.mul_mat(kp, ctx.reshape(iq, [msa.dim, h * n]))
    ctx.mul_mat_set_prec_f32(sc)
    pm, bias = own["msa_pos_mask"], own["msa_bias"]
    sc = ctx.add_inplace(ctx.reshape(sc, [n_ps, h, n]), ctx.view(pm, [n_ps, 1, n], [pm.nb[1], pm.nb[1]], 0))
    bs = ctx.pool_2d_max(sc, msa.block, 1, msa.block, 1)
    return ctx.add(bs, ctx.view(bias, [nblk, 1, n], [bias.nb[1], bias.nb[1]], 0))


def grouped_fa(blk: MsaBlock, q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
    """llama.cpp's build_attn_msa_fa: q F32 [D, H, T] over k, v [D, n_keys, 1, C] with mask F16 [n_keys, R, 1, C],
    each K/V head's query heads as one channel -> F32 [D * H, T]."""
    ctx, hp = blk.ctx, blk.hp
    d, h, t = q.ne[0], q.ne[1], q.ne[2]
    c = k.ne[3]
    g = hp.n_head // hp.n_head_kv
    qp = ctx.permute(ctx.reshape(q, [d, g, c, h * t // (g * c)]), 0, 2, 3, 1)
    o = ctx.flash_attn_ext(qp, k, v, mask, float(np.float32(1.0) / np.sqrt(np.float32(hp.head_dim))))
    return ctx.reshape(ctx.cont(ctx.permute(o, 0, 1, 3, 2)), [d * h, t])


def cache_heads(blk: MsaBlock, cache: Tensor) -> Tensor:
    """A cache's first n_kv rows as [D, Hkv, n_kv, 1] (not transposed: flash attention)."""
    hp, rs = blk.hp, cache.nb[1]
    d = hp.head_dim
    return blk.ctx.view(cache, [d, hp.n_head_kv, blk.inp.n_kv, 1], [row_size(cache.type, d), rs, rs * cache.ne[1]], 0)


def batch_attention(blk: MsaBlock, msa: Msa, q: Tensor, top: Tensor) -> Tensor:
    """Several rows: the chosen blocks as a per-K/V-head mask over the cells, with the causal one."""
    ctx, own, inp = blk.ctx, blk.own, blk.inp
    n, h, n_kv = inp.n_tokens, blk.hp.n_head_kv, inp.n_kv
    bias = own["msa_bias"]
    nblk, k = bias.ne[0], top.ne[0]
    bias3 = ctx.view(bias, [nblk, 1, n], [bias.nb[1], bias.nb[1]], 0)
    ninf = ctx.repeat_4d(ctx.cast(ctx.scale_bias(bias3, 0.0, -1e30), F16), [nblk, h, n, 1])
    zero = ctx.scale(ctx.cast(top, F32), 0.0)
    bm = ctx.set_rows(
        ctx.reshape(ninf, [1, nblk, h * n]), ctx.reshape(zero, [1, k, h * n]), ctx.reshape(top, [k, h * n])
    )
    bm = ctx.cont(ctx.permute(ctx.reshape(bm, [nblk, h, n]), 0, 2, 1, 3))  # [nblk, n, h]
    bm2 = ctx.cont(ctx.transpose(ctx.reshape(bm, [nblk, n * h])))  # [n * h, nblk]
    cells = ctx.get_rows(bm2, ctx.reshape(own["msa_cell_blk"], [n_kv]))  # [n * h, n_kv]
    bmx = ctx.reshape(ctx.cont(ctx.transpose(cells)), [n_kv, n, h])
    assert inp.mask is not None
    mask = ctx.add_inplace(bmx, ctx.cast(inp.mask, F32))
    mask = ctx.cast(ctx.reshape(mask, [n_kv, n, 1, h]), F16)
    kfa = ctx.permute(cache_heads(blk, blk.k_cache), 0, 3, 1, 2)  # [D, n_kv, 1, Hkv]
    vfa = ctx.permute(cache_heads(blk, blk.v_cache), 0, 3, 1, 2)
    return grouped_fa(blk, q, kfa, vfa, mask)


def decode_attention(blk: MsaBlock, msa: Msa, q: Tensor, top: Tensor) -> Tensor:
    """One row: the chosen blocks' B * K keys gathered per K/V head, the positions it does not see masked."""
    ctx, own, hp = blk.ctx, blk.own, blk.hp
    b, k, h, d = msa.block, top.ne[0], hp.n_head_kv, hp.head_dim
    n_ps = own["msa_pos_mask"].ne[0]
    first = ctx.reshape(ctx.scale(ctx.cast(top, F32), float(b)), [1, k, h, 1])
    tj = ctx.add(ctx.repeat_4d(first, [b, k, h, 1]), ctx.reshape(ctx.arange(0.0, float(b), 1.0), [b, 1, 1]))
    tokj = ctx.cast(ctx.reshape(tj, [b * k * h, 1]), I32)  # the positions
    cs = ctx.get_rows(ctx.reshape(own["msa_pos_slot_f"], [1, n_ps, 1]), tokj)  # their cells, [1, b * k * h, 1]
    cells = ctx.cast(ctx.reshape(cs, [b * k, h, 1]), I32)
    mg = ctx.get_rows(ctx.reshape(own["msa_pos_mask"], [1, n_ps, 1]), tokj)
    mask = ctx.cast(ctx.reshape(mg, [b * k, 1, 1, h]), F16)

    def gathered(cache: Tensor) -> Tensor:  # head j's keys at cells[:, j]: [D, b * k, 1, Hkv]
        rs = cache.nb[1]
        per_head = ctx.view(cache, [d, blk.inp.n_kv, h, 1], [rs, row_size(cache.type, d), rs * cache.ne[1]], 0)
        g = ctx.reshape(ctx.get_rows(per_head, cells), [d, b * k, 1, h])
        t = F16 if cache.type not in (F32, F16, native.GGMLType.BF16) else cache.type
        return g if t == F32 else ctx.cast(g, t)

    return grouped_fa(blk, q, gathered(blk.k_cache), gathered(blk.v_cache), mask)
