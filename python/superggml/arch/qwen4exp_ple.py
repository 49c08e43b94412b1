"""qwen4exp's PLE n-gram hash embedding (llama.cpp's llm_graph_input_qwen4exp_ple and build_ple), on one delta-net
block's streams before its mixer:

- rows (host side): each token's window of the n - 1 tokens before it in its sequence (an EOS, or no token, cuts
  the window there: everything older reads as EOS; the token's own EOS does not cut); for each order n' = 2..n the
  u64 hash of the first n' of them, XOR of token * multiplier, picks a row of each of its heads' ranges of
  per_layer_token_embd;
- the gathered rows (E values a token) give a key per stream and a value; each stream gets the value times
  sigmoid(signed sqrt of its normed key . its normed streams / sqrt(E)), plus a causal depthwise conv of those
  (RMS-normed per stream) dilated by n, whose history ((K - 1) n rows) the sequence keeps beside its conv window.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from .. import native
from ..errors import GGUFError
from ..native import Context, Tensor
from .base import BlockGraph, Memory, Weights, f32
from .common import conv_input, each_sequence, inv_sqrt

MASK64 = (1 << 64) - 1
F32 = native.GGMLType.F32


@dataclass(frozen=True)
class Ple:
    """The PLE keys of a file."""

    layer: int
    ngram: int
    per_gram: int
    conv: int  # K taps
    eos: int
    dim: int  # one head's width
    multipliers: tuple[int, ...]
    offsets: tuple[int, ...]
    sizes: tuple[int, ...]

    @property
    def n_heads(self) -> int:
        return (self.ngram - 1) * self.per_gram

    @property
    def rows_needed(self) -> int:
        return max(o + s for o, s in zip(self.offsets, self.sizes))

    @property
    def history_rows(self) -> int:
        """Rows of the conv's history a sequence keeps: (K - 1) n."""
        return (self.conv - 1) * self.ngram

    def history(self, hc_dim: int) -> int:
        """Values of the conv's history a sequence keeps: (K - 1) n rows of hc * n_embd."""
        return self.history_rows * hc_dim


def load_ple(
    key: Callable[[Mapping[str, Any], str, Any], Any], meta: Mapping[str, Any], n_embd: int, recurrent: Sequence[bool]
) -> Ple | None:
    """The file's PLE keys (None without ple.layers), checked as llama.cpp checks them (and where it aborts)."""
    layers = key(meta, "ple.layers", None)
    if not layers:
        return None
    if not isinstance(layers, (list, tuple)) or len(layers) != 1:
        raise GGUFError(f"qwen4exp: one PLE layer, not {layers}")
    il = int(layers[0])
    if not 0 <= il < len(recurrent) or not recurrent[il]:
        raise GGUFError(f"qwen4exp: the PLE layer {il} must be a delta-net block")

    def need(name: str) -> Any:
        v = key(meta, name, None)
        if v is None:
            raise GGUFError(f"GGUF metadata lacks 'qwen4exp.{name}'")
        return v

    ngram, per = int(need("ple.ngram_size")), int(need("ple.heads_per_ngram"))
    conv, dim = int(need("ple.conv_kernel")), int(need("embedding_length_per_layer_input"))
    if not 2 <= ngram <= 8 or not 1 <= (ngram - 1) * per <= 64 or conv <= 0 or dim <= 0:
        raise GGUFError(f"qwen4exp PLE: ngram_size {ngram} (2..8), {per} heads per n-gram, conv {conv}, dim {dim}")
    mult = [int(x) & MASK64 for x in need("ple.layer_multipliers")]
    offs, sizes = [int(x) for x in need("ple.head_offsets")], [int(x) for x in need("ple.head_vocab_sizes")]
    n_heads = (ngram - 1) * per
    if len(mult) < ngram or len(offs) < n_heads or len(sizes) < n_heads or min(sizes[:n_heads]) <= 0:
        raise GGUFError("qwen4exp PLE: too few multipliers, head offsets or head sizes, or an empty head")
    if max(o + s for o, s in zip(offs[:n_heads], sizes[:n_heads])) >= 1 << 31:
        raise GGUFError("qwen4exp PLE: head ranges past 2^31 rows")
    if n_heads * dim != n_embd:  # llama.cpp aborts building the graph
        raise GGUFError(f"qwen4exp PLE: {n_heads} heads of {dim} are not embedding_length {n_embd}")
    return Ple(il, ngram, per, conv, int(need("ple.eos_token_id")), dim, tuple(mult), tuple(offs), tuple(sizes))


def ple_rows(ple: Ple, contexts: Sequence[Sequence[int]], rows: Sequence[int]) -> np.ndarray:
    """I32 [n_heads * n]: each row's table rows, token-major (rows[j] of lane j's sequence, its last)."""
    out: list[int] = []
    for seq, m in zip(contexts, rows):
        for p in range(len(seq) - m, len(seq)):
            out += token_rows(ple, seq, p)
    return np.asarray(out, dtype=np.int32)


def token_rows(ple: Ple, seq: Sequence[int], p: int) -> list[int]:
    window, cut = [int(seq[p])], False
    for s in range(1, ple.ngram):
        t = -1 if cut or p - s < 0 else int(seq[p - s])
        cut = cut or t < 0 or t == ple.eos
        window.append(ple.eos if cut else t)
    out: list[int] = []
    for n in range(2, ple.ngram + 1):
        mixed = 0
        for j in range(n):
            mixed ^= (window[j] & MASK64) * ple.multipliers[j] & MASK64
        base = (n - 2) * ple.per_gram
        out += [mixed % ple.sizes[base + g] + ple.offsets[base + g] for g in range(ple.per_gram)]
    return out


def build_ple(
    blk: BlockGraph,
    ple: Ple,
    hc: int,
    eps: float,
    x: Tensor,
    conv_state: Memory,
    state: Memory,
    at: int,
    record_view: Callable[[Tensor, int], Tensor],
) -> Tensor:
    """The streams x F32 [n_embd, hc, n] after the PLE; `at`: where its history starts in a sequence's conv row;
    `record_view(record, m)`: where a recorded pass of m rows leaves the conv's input with its history."""
    ctx, w, p = blk.ctx, blk.w, f"blk.{blk.il}."
    E, n = x.ne[0], x.ne[2]
    assert blk.inp.own is not None
    rows = blk.inp.own["ple_rows"]
    emb = ctx.reshape(ctx.get_rows(w("per_layer_token_embd.weight"), rows), [ple.dim * ple.n_heads, n])
    key = grouped_norm(ctx, w, ctx.mul_mat(w(p + "ple_key.weight"), emb), p + "ple_norm_key.weight", hc, eps)
    value = ctx.mul_mat(w(p + "ple_value.weight"), emb)
    s = ctx.sum_rows(ctx.mul(key, grouped_norm(ctx, w, x, p + "ple_norm_query.weight", hc, eps)))
    s = ctx.scale(s, inv_sqrt(E))
    mag = ctx.sqrt(ctx.clamp(ctx.abs(s), float(f32(1e-6)), float("inf")))
    gate = ctx.sigmoid(ctx.mul(ctx.sgn(s), mag))
    gated = ctx.mul(ctx.repeat_4d(ctx.reshape(value, [E, 1, n]), [E, hc, n, 1]), gate)
    normed = ctx.reshape(grouped_norm(ctx, w, gated, p + "ple_norm_conv.weight", hc, eps), [hc * E, n])
    conv = each_sequence(
        ctx,
        blk.inp,
        blk.il,
        conv_state,
        state,
        lambda lane, m, cs, _s, r: dilated_conv(
            blk, ple, lane(normed, 2), m, cs, at, record_view(r, m) if r is not None else None
        ),
    )
    return ctx.add(x, ctx.add(gated, ctx.reshape(conv, [E, hc, n])))


def grouped_norm(ctx: Context, w: Weights, x: Tensor, name: str, hc: int, eps: float) -> Tensor:
    """RMS norm of each stream of x (n_embd * hc values a row) times the gammas [n_embd, hc]: [n_embd, hc, n]."""
    t = w(name)
    E = t.nelements // hc
    return ctx.mul(ctx.rms_norm(ctx.reshape(x, [E, hc, x.nelements // (E * hc)]), eps), ctx.reshape(t, [E, hc]))


def history(ctx: Context, ple: Ple, conv_state: Tensor, hcd: int, at: int) -> Tensor:
    """The conv's history in a sequence's conv row, after `at`: F32 [(K - 1) n, hc_dim, 1]."""
    hist, es = ple.history_rows, conv_state.element_size
    return ctx.view(conv_state, [hist, hcd, 1], [hist * es, hist * hcd * es], at * es)


def dilated_conv(
    blk: BlockGraph, ple: Ple, x: Tensor, m: int, conv_state: Tensor, at: int, record: Tensor | None = None
) -> Tensor:
    """One sequence's m rows x [hc_dim, m] through the causal depthwise conv (SiLU): F32 [hc_dim, m]; the last
    (K - 1) n inputs written back after `at` in its conv row (and the history with the rows copied to
    `record`)."""
    ctx, gf, w = blk.ctx, blk.gf, blk.w
    hcd, hist = x.ne[0], ple.history_rows
    padded = conv_input(ctx, gf, history(ctx, ple, conv_state, hcd, at), x, m)  # [hist + m, hcd, 1]
    if record is not None:
        gf.expand(ctx.cpy(padded, record))
    weights = w(f"blk.{blk.il}.ple_conv1d.weight")
    out: Tensor | None = None
    for k in range(ple.conv):
        start = hist - (ple.conv - 1 - k) * ple.ngram
        v = ctx.view(padded, [m, hcd, 1], [padded.nb[1], padded.nb[2]], start * padded.element_size)
        shifted = ctx.cont(ctx.transpose(v))
        wk = ctx.reshape(ctx.cont(ctx.view(weights, [1, hcd], [weights.nb[1]], k * weights.nb[0])), [hcd])
        if wk.type != F32:
            wk = ctx.cast(wk, F32)
        term = ctx.mul(shifted, wk)
        out = term if out is None else ctx.add(out, term)
    assert out is not None
    return ctx.reshape(ctx.cont(ctx.silu(out)), [hcd, m])
