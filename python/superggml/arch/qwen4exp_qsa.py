"""qwen4exp's QSA inputs of a pass (llama.cpp's llama_memory_hybrid_idx::set_input_qsa), for K/V rows that hold
one sequence's positions 0..P-1 in order, P the position after the pass's last. Per compress ratio r, with
n_blocks = ceil(n_kv / r) and the complete blocks b < P // r:

- cell_blk  I32 [n_kv, S]        each cell's block: its own where complete, else the spare block (the tail's)
- blk_cells I32 [r * n_blocks, S] each complete block's cells (0 elsewhere)
- blk_pos   I32 [4 * n_blocks * S] each complete block's first position, in the 4 RoPE sections (0 elsewhere)
- bias      F32 [n_blocks, t, S]  per query: 0 for a complete block before its tail, 1e9 at or after the tail's
  start (future blocks, which the mask then drops), -inf for the others; the spare block 1e9
"""

from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np

from .. import native

I32 = native.GGMLType.I32
F32 = native.GGMLType.F32
TAIL = np.float32(1e9)


def qsa_inputs(ratios: Iterable[int], n: int, n_kv: int, streams: int) -> dict[str, tuple[native.GGMLType, list[int]]]:
    out: dict[str, tuple[native.GGMLType, list[int]]] = {}
    for r in sorted(ratios):
        nb = -(-n_kv // r)
        out |= {
            f"qsa{r}_cell_blk": (I32, [n_kv, streams]),
            f"qsa{r}_blk_cells": (I32, [r * nb, streams]),
            f"qsa{r}_blk_pos": (I32, [4 * nb * streams]),
            f"qsa{r}_bias": (F32, [nb, n // streams, streams]),
        }
    return out


def qsa_values(ratios: Iterable[int], positions: Sequence[np.ndarray], n_kv: int) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for r in sorted(ratios):
        parts = [stream_values(r, np.asarray(pos, dtype=np.int64), n_kv) for pos in positions]
        nb = -(-n_kv // r)
        blk_pos = np.stack([p[2] for p in parts])  # [S, nb]
        out |= {
            f"qsa{r}_cell_blk": np.concatenate([p[0] for p in parts]).astype(np.int32),
            f"qsa{r}_blk_cells": np.concatenate([p[1] for p in parts]).astype(np.int32),
            f"qsa{r}_blk_pos": np.tile(blk_pos.reshape(-1), 4).astype(np.int32),
            f"qsa{r}_bias": np.concatenate([p[3] for p in parts]).astype(np.float32),
        }
        assert out[f"qsa{r}_blk_cells"].size == r * nb * len(positions)
    return out


def stream_values(r: int, pos: np.ndarray, n_kv: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One stream's cell_blk [n_kv], blk_cells [r * nb], blk_pos [nb] and bias [t, nb] for its queries at pos."""
    nb = -(-n_kv // r)
    n_bid = (int(pos.max()) + 1) // r  # complete blocks
    dead = n_bid if n_bid < nb else nb - 1
    cells = np.arange(n_kv)
    cell_blk = np.where(cells < n_bid * r, cells // r, dead)
    blk_cells = np.zeros(r * nb, dtype=np.int64)
    blk_cells[: n_bid * r] = np.arange(n_bid * r)
    blk_pos = np.zeros(nb, dtype=np.int64)
    blk_pos[:n_bid] = np.arange(n_bid) * r
    tail = (pos + 1) // r * r  # each query's tail start
    starts = np.arange(nb) * r
    bias = np.where(starts[None, :] >= tail[:, None], TAIL, np.float32(0.0)).astype(np.float32)
    bias[:, n_bid:] = -np.inf
    if n_bid < nb:
        bias[:, dead] = TAIL
    return cell_blk, blk_cells, blk_pos, bias
