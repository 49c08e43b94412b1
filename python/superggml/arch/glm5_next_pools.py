"""glm5-next's k-pool indexer (llama.cpp's glm5-next.cpp build_kpool_select and llama_memory_hybrid_idx's
set_input_kpool): each MLA block with a full indexer keeps, beside every token's latent row, the indexer's key and
pool gate and a pooled-key slot (HParams.kv_width: latent | key | gate | pooled). Pools are runs of `kpool`
positions from the sequence's start; a pool's key is the softmax(gate + ape)-weighted sum of its members' keys,
computed once by the pass that completes it and cached (of the memory's type) in its last member's pooled slot.
Each query scores the pools that end at or before it (a lightning indexer), keeps the top_k / kpool best and
attends to their cells and the tail of its own incomplete pool: by gathering those latent rows (a few queries
over more rows than that) or through a mask over the whole memory.

Memory rows hold one sequence's positions 0.. in order (cell = position). A pass's tables (KpoolShape.values) come
from its positions; their shapes from its rows and n_kv only: the pools padded to llama.cpp's size at the largest
n_kv can hold (padding that scores -inf and selects nothing), the pools to pool padded with harmless ones."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .. import native
from ..native import Context, Graph, Tensor
from .base import StepInputs, Weights, f32
from .common import F16, F32, row_size

I32 = native.GGMLType.I32
I64 = native.GGMLType.I64
GATHER_MAX = 16  # llama.cpp gathers the selected latent rows for passes of at most this many queries


@dataclass(frozen=True)
class KpoolConfig:
    """The indexer's hyperparameters: heads, key length, top_k (tokens' worth of pools), kpool, select_tail."""

    heads: int
    dim: int
    top_k: int
    kpool: int
    tail: bool
    norm_eps: float


@dataclass(frozen=True)
class KpoolShape:
    """The indexer's work in a pass of n queries over n_kv memory rows."""

    cfg: KpoolConfig
    n: int
    n_kv: int

    @property
    def n_pool(self) -> int:
        """Pool slots scored: llama.cpp's max(64, pad64(pools + 1)) at the most pools n_kv rows hold."""
        return max(64, -(-(self.n_kv // self.cfg.kpool + 1) // 64) * 64)

    @property
    def n_top(self) -> int:
        return min(self.n_pool, self.cfg.top_k // self.cfg.kpool)

    @property
    def n_sel(self) -> int:
        """Cells a query attends: its top pools' and (select_tail) its tail's."""
        P = self.cfg.kpool
        return P * self.n_top + (P - 1 if self.cfg.tail else 0)

    @property
    def gather(self) -> bool:
        return self.n <= GATHER_MAX and self.n_kv > self.n_sel

    @property
    def n_new(self) -> int:
        """Pools pooled: the most n positions complete (at least one, as llama.cpp)."""
        return max(1, -(-self.n // self.cfg.kpool))

    def inputs(self, kept: bool) -> dict[str, tuple[native.GGMLType, list[int]]]:
        P, n = self.cfg.kpool, self.n
        out = {
            "kp_cells": (I32, [self.n_pool]),
            "kp_idxs": (I32, [P, self.n_pool]),
            "kp_mask": (F16, [self.n_pool, n]),
            "kp_tail": (I32, [P - 1, n]),
            "kp_live": (F32, [self.n_sel, 1, 1, n]),
            "kp_new": (I32, [P, self.n_new]),
            "kp_rep": (I64, [self.n_new]),
        }
        if kept and self.gather:  # the selection the blocks that reuse it read (scatter: StepInputs.kept_mask)
            out["kept_sel"] = (I32, [self.n_sel, n])
        return out

    def values(self, pos: np.ndarray) -> dict[str, np.ndarray]:
        """The tables of a pass at positions pos (one sequence's, consecutive)."""
        P, n_pool, n_top = self.cfg.kpool, self.n_pool, self.n_top
        p0, end = int(pos[0]), int(pos[-1]) + 1
        n_real = end // P
        sentinel = p0 if self.gather else self.n_kv  # dead slots: a real row masked, or past the memory
        cells = np.full(n_pool, p0, dtype=np.int32)
        cells[:n_real] = np.arange(n_real) * P + P - 1
        idxs = np.full((n_pool, P), sentinel, dtype=np.int32)
        idxs[:n_real] = np.arange(n_real * P).reshape(n_real, P)
        visible = (pos + 1) // P  # pools ending at or before each query
        mask = np.where(np.arange(n_pool)[None, :] < visible[:, None], 0.0, -np.inf).astype(np.float16)
        n_tail = (pos + 1) % P
        k = np.arange(P - 1)[None, :]
        real = k < n_tail[:, None]
        tail = np.where(real, pos[:, None] - k, sentinel).astype(np.int32)
        slots = np.arange(P * n_top)[None, :]
        live = np.where(slots < np.minimum(visible, n_top)[:, None] * P, 0.0, -np.inf)
        if self.cfg.tail:
            live = np.concatenate([live, np.where(real, 0.0, -np.inf)], axis=1)
        new, rep = self.new_pools(p0, end)
        return {
            "kp_cells": cells,
            "kp_idxs": idxs,
            "kp_mask": mask,
            "kp_tail": tail,
            "kp_live": live.astype(np.float32),
            "kp_new": new,
            "kp_rep": rep,
        }

    def new_pools(self, p0: int, end: int) -> tuple[np.ndarray, np.ndarray]:
        """The members and last cell of each pool the pass completes; padded with pools of p0's row written
        where nothing reads (a cell that ends no pool), as llama.cpp's dummy."""
        P = self.cfg.kpool
        done = np.arange(p0 // P, end // P)
        spare = p0 if (p0 + 1) % P else p0 - 1
        new = np.full((self.n_new, P), p0, dtype=np.int32)
        rep = np.full(self.n_new, spare, dtype=np.int64)
        new[: len(done)] = done[:, None] * P + np.arange(P)[None, :]
        rep[: len(done)] = done * P + P - 1
        return new, rep


def kpool_values(cfg: KpoolConfig, positions: Sequence[np.ndarray], n_kv: int) -> dict[str, np.ndarray]:
    (pos,) = positions  # one sequence a lane: glm5-next passes have no streams
    pos = np.asarray(pos, dtype=np.int64)
    return KpoolShape(cfg, len(pos), n_kv).values(pos)


@dataclass(frozen=True)
class KpoolBlock:
    """One block's indexer graph over a lane: the block's weights (prefix p), its memory rows (cache: latent R,
    then key | gate | pooled), its inputs."""

    ctx: Context
    gf: Graph
    w: Weights
    p: str
    cfg: KpoolConfig
    cache: Tensor
    latent: int
    lane: StepInputs

    def part(self, width: int, at: int) -> Tensor:
        """The values at..at+width of every memory row (at counted in indexer keys after the latent)."""
        c = self.cache
        off = row_size(c.type, self.latent) + row_size(c.type, at * self.cfg.dim)
        return self.ctx.view(c, [width * self.cfg.dim, c.ne[1]], [c.nb[1]], off)

    def select(self, cur: Tensor, qr: Tensor) -> Tensor:
        """The pass's selection from the normed input cur F32 [n_embd, n] and low-rank queries qr F32 [Ql, n]:
        cells I32 [n_sel, n] (gather) or the attention's mask [n_kv, n] (scatter, the causal mask folded in)."""
        ctx, w, p, cfg, own = self.ctx, self.w, self.p, self.cfg, self.lane.own
        assert own is not None
        n, d = cur.ne[1], cfg.dim
        shape = KpoolShape(cfg, n, self.lane.n_kv)
        iq = ctx.reshape(ctx.mul_mat(w(p + "indexer.attn_q_b.weight"), qr), [d, cfg.heads, n, 1])
        ik = ctx.norm(ctx.mul_mat(w(p + "indexer.attn_k.weight"), cur), cfg.norm_eps)
        ik = ctx.add(ctx.mul(ik, w(p + "indexer.k_norm.weight")), w(p + "indexer.k_norm.bias"))
        ig = ctx.mul_mat(w(p + "indexer_compressor_gate.weight"), cur)
        packed = ctx.concat(ctx.concat(ik, ig, 0), ctx.fill(ig, 0.0), 0)
        assert self.lane.k_idxs is not None
        self.gf.expand(ctx.set_rows(self.part(3, 0), packed, self.lane.k_idxs))
        pooled = self.pooled(own["kp_new"], own["kp_rep"], own["kp_cells"], shape)
        iw = ctx.scale(ctx.mul_mat(w(p + "indexer.proj.weight"), cur), float(f32(1.0) / np.sqrt(f32(d * cfg.heads))))
        iw = ctx.reshape(iw, [cfg.heads, n, 1, 1])
        mask = ctx.reshape(own["kp_mask"], [shape.n_pool, n, 1, 1])
        score = ctx.reshape(ctx.lightning_indexer(iq, pooled, iw, mask), [shape.n_pool, n])
        sel = self.top_cells(score, own["kp_idxs"], shape)
        if cfg.tail:
            sel = ctx.concat(sel, own["kp_tail"], 0)
        return sel if shape.gather else self.scatter(sel, own["kp_live"], shape)

    def pooled(self, new: Tensor, rep: Tensor, cells: Tensor, shape: KpoolShape) -> Tensor:
        """Pools the pools the pass completes into their pooled slots; every pool's key F32 [dim, 1, n_pool, 1]."""
        ctx, cfg = self.ctx, self.cfg
        P, d, m = cfg.kpool, cfg.dim, shape.n_new
        rows = ctx.reshape(ctx.get_rows(self.part(2, 0), ctx.reshape(new, [P * m])), [2 * d, P, m])
        pk = ctx.view(rows, [d, P, m], [rows.nb[1], rows.nb[2]], 0)
        pg = ctx.view(rows, [d, P, m], [rows.nb[1], rows.nb[2]], d * rows.element_size)
        logits = ctx.cont(ctx.permute(ctx.add(pg, self.w(self.p + "indexer_compressor_ape.weight")), 1, 0, 2, 3))
        probs = ctx.reshape(ctx.soft_max_ext(ctx.reshape(logits, [P, d * m]), None, 1.0), [P, d, m])
        pk = ctx.cont(ctx.permute(pk, 1, 0, 2, 3))
        fresh = ctx.reshape(ctx.sum_rows(ctx.mul(probs, pk)), [d, m])
        slot = self.part(1, 2)
        self.gf.expand(ctx.set_rows(slot, fresh, rep))
        return ctx.reshape(ctx.get_rows(slot, cells), [d, 1, shape.n_pool, 1])

    def top_cells(self, score: Tensor, idxs: Tensor, shape: KpoolShape) -> Tensor:
        """The cells of each query's best pools, best first: I32 [kpool * n_top, n]."""
        ctx, n, k = self.ctx, score.ne[1], shape.n_top
        top = ctx.top_k(score, k)  # [k, n], in no order
        sel_score = ctx.get_rows(ctx.reshape(score, [1, shape.n_pool, n]), top)
        order = ctx.argsort_top_k(ctx.reshape(sel_score, [k, n]), k)
        top = ctx.get_rows(ctx.reshape(ctx.cast(top, F32), [1, k, n]), order)
        top = ctx.cast(ctx.cont(ctx.reshape(top, [k, n])), I32)
        cells = ctx.get_rows(idxs, ctx.reshape(top, [k * n]))
        return ctx.reshape(cells, [self.cfg.kpool * k, n])

    def scatter(self, sel: Tensor, live: Tensor, shape: KpoolShape) -> Tensor:
        """The selected cells as a mask [n_kv, n] of the lane mask's type, plus that causal mask; dead slots
        write rows of their own past the memory (llama.cpp's dump rows)."""
        ctx, lane = self.ctx, self.lane
        assert lane.mask is not None
        n, n_kv, n_sel = sel.ne[1], lane.n_kv, shape.n_sel
        seed = ctx.cast(ctx.view(sel, [1], [], 0), F32)
        mseed = seed if lane.mask.type == F32 else ctx.cast(seed, lane.mask.type)
        shut = ctx.reshape(ctx.repeat_4d(ctx.fill(mseed, float("-inf")), [1, n_kv + n_sel, n, 1]), [1, n_kv + n_sel, n])
        zeros = ctx.reshape(ctx.repeat_4d(ctx.fill(seed, 0.0), [1, n_sel, n, 1]), [1, n_sel, n])
        alive = ctx.exp(ctx.reshape(live, [n_sel, n]))
        dump = ctx.arange(float(n_kv), float(n_kv + n_sel), 1.0)
        at = ctx.cast(sel, F32)
        at = ctx.cast(ctx.add(ctx.mul(ctx.sub(at, dump), alive), dump), I32)
        opened = ctx.set_rows(shut, zeros, ctx.reshape(at, [n_sel, n, 1]))
        opened = ctx.view(opened, [n_kv, n], [opened.nb[2]], 0)
        return ctx.add(opened, ctx.reshape(lane.mask, [n_kv, n]))
