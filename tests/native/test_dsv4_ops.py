"""The ggml ops DeepSeek V4 needs (docs/dev/deepseek4.md), as bound: each computes what ggml.h says it computes, and
a shape ggml would abort on is an error instead."""

from __future__ import annotations

import numpy as np
import pytest

from superggml import native
from superggml.errors import SuperggmlError

F32, I32 = native.GGMLType.F32, native.GGMLType.I32
RNG = np.random.default_rng(4)


def compute(inputs: dict[str, tuple[list[int], np.ndarray]], build) -> np.ndarray:
    """build(ctx, tensors) over input tensors of the given ggml shapes and values, computed on the CPU."""
    be = native.Backend("", 1)
    pctx = native.Context(len(inputs))
    ts = {name: pctx.new_tensor(I32 if v.dtype == np.int32 else F32, shape) for name, (shape, v) in inputs.items()}
    keep = be.alloc_tensors(pctx)
    for name, (_, v) in inputs.items():
        native.tensor_set(ts[name], np.ascontiguousarray(v))
    ctx = native.Context(64, 64)
    g = ctx.new_graph()
    out = build(ctx, ts)
    out.set_output()
    g.expand(out)
    be.compute(g)
    del keep
    return native.tensor_get(out)


def test_hc_pre_sums_the_streams_by_weight():
    n_embd, hc, n = 8, 4, 3
    x, w = RNG.standard_normal((n, hc, n_embd), np.float32), RNG.standard_normal((n, hc), np.float32)
    got = compute({"x": ([n_embd, hc, n], x), "w": ([hc, n], w)}, lambda c, t: c.dsv4_hc_pre(t["x"], t["w"]))
    np.testing.assert_allclose(got.reshape(n, n_embd), np.einsum("thi,th->ti", x, w), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("with_comb", [True, False])
def test_hc_post_mixes_the_residual_streams(with_comb):
    n_embd, hc, n = 8, 4, 3
    x = RNG.standard_normal((n, n_embd), np.float32)
    res = RNG.standard_normal((n, hc, n_embd), np.float32)
    post = RNG.standard_normal((n, hc), np.float32)
    comb = RNG.standard_normal((n, hc, hc), np.float32)  # numpy [t, src, dst]: ggml [dst, src, t]
    inputs = {"x": ([n_embd, n], x), "r": ([n_embd, hc, n], res), "p": ([hc, n], post), "c": ([hc, hc, n], comb)}
    got = compute(inputs, lambda c, t: c.dsv4_hc_post(t["x"], t["r"], t["p"], t["c"] if with_comb else None))
    mixed = np.einsum("tsi,tsd->tdi", res, comb) if with_comb else res
    want = x[:, None, :] * post[:, :, None] + mixed
    np.testing.assert_allclose(got.reshape(n, hc, n_embd), want, rtol=1e-5, atol=1e-5)


def test_hc_comb_is_a_sinkhorn_normalized_softmax():
    hc, n, eps, n_iter = 4, 3, 1e-6, 5
    mixes = RNG.standard_normal((n, (2 + hc) * hc), np.float32)
    scale, base = np.array([0.5, 0.7, 1.3], np.float32), RNG.standard_normal((2 + hc) * hc).astype(np.float32)
    got = compute(
        {"m": ([(2 + hc) * hc, n], mixes), "s": ([3], scale), "b": ([(2 + hc) * hc], base)},
        lambda c, t: c.dsv4_hc_comb(t["m"], t["s"], t["b"], eps, n_iter),
    ).reshape(n, hc, hc)  # [t, src, dst]
    for t in range(n):
        logits = (mixes[t, 2 * hc :] * scale[2] + base[2 * hc :]).reshape(hc, hc)  # [src, dst]
        p = np.exp(logits - logits.max(1, keepdims=True))
        p = p / p.sum(1, keepdims=True) + eps
        p = p / (p.sum(0, keepdims=True) + eps)  # each dst over its sources
        for _ in range(1, n_iter):
            p = p / (p.sum(1, keepdims=True) + eps)
            p = p / (p.sum(0, keepdims=True) + eps)
        np.testing.assert_allclose(got[t], p, rtol=1e-5, atol=1e-6)


def test_swiglu_clamp_scale_bias_and_sqrt():
    gate, up = (RNG.standard_normal((3, 16), np.float32) * 4 for _ in range(2))
    limit = 2.5
    got = compute({"g": ([16, 3], gate), "u": ([16, 3], up)}, lambda c, t: c.swiglu_clamp(t["g"], t["u"], limit))
    g = np.minimum(gate, limit)
    np.testing.assert_allclose(got, g / (1 + np.exp(-g)) * np.clip(up, -limit, limit), rtol=1e-5, atol=1e-6)
    a = np.abs(gate)
    got = compute({"a": ([16, 3], a)}, lambda c, t: c.sqrt(c.scale_bias(t["a"], 2.0, 0.5)))
    np.testing.assert_allclose(got, np.sqrt(2 * a + 0.5), rtol=1e-6)


def test_rope_ext_back_undoes_rope_ext():
    d, h, n = 16, 2, 5
    x = RNG.standard_normal((n, h, d), np.float32)
    pos = np.arange(7, 7 + n, dtype=np.int32)

    def there_and_back(c, t):
        kw = dict(n_dims=8, mode=0, n_ctx_orig=4096, freq_base=10000.0)
        return c.rope_ext_back(c.rope_ext(t["x"], t["p"], None, **kw), t["p"], None, **kw)

    got = compute({"x": ([d, h, n], x), "p": ([n], pos)}, there_and_back)
    np.testing.assert_allclose(got.reshape(n, h, d), x, rtol=1e-5, atol=1e-5)


def test_shapes_ggml_would_abort_on_are_errors():
    ctx = native.Context(16, 16)
    x, w = ctx.new_tensor(F32, [8, 4, 3]), ctx.new_tensor(F32, [4, 2])
    with pytest.raises(SuperggmlError, match="dsv4_hc_pre"):
        ctx.dsv4_hc_pre(x, w)
    with pytest.raises(SuperggmlError, match="dsv4_hc_comb"):
        ctx.dsv4_hc_comb(ctx.new_tensor(F32, [15, 3]), ctx.new_tensor(F32, [3]), ctx.new_tensor(F32, [15]), 1e-6, 2)
    with pytest.raises(SuperggmlError, match="n_iter"):
        ctx.dsv4_hc_comb(ctx.new_tensor(F32, [24, 3]), ctx.new_tensor(F32, [3]), ctx.new_tensor(F32, [24]), 1e-6, 0)
    with pytest.raises(SuperggmlError, match="dsv4_hc_post"):
        ctx.dsv4_hc_post(ctx.new_tensor(F32, [8, 3]), x, ctx.new_tensor(F32, [3, 3]))
    with pytest.raises(SuperggmlError, match="swiglu_clamp"):
        ctx.swiglu_clamp(ctx.new_tensor(F32, [8, 3]), ctx.new_tensor(F32, [8, 2]), 1.0)
    q = ctx.new_tensor(F32, [8, 3, 2])
    with pytest.raises(SuperggmlError, match="n_kv_max"):
        ctx.flash_attn_ext(q, q, q, None, 1.0, n_kv_max=4)


def test_the_ops_the_later_2026_families_need():
    """exp, abs, sgn, sub, arange, a 2-D max pool (qwen4exp, glm5-next, minimax-m3's MSA) and the gated stream sum
    (qwen4exp's hyper-connections), each against its formula."""
    x, y = RNG.standard_normal((3, 8), np.float32), RNG.standard_normal((3, 8), np.float32)
    xy = {"x": ([8, 3], x), "y": ([8, 3], y)}
    np.testing.assert_allclose(compute(xy, lambda c, t: c.exp(t["x"])).reshape(3, 8), np.exp(x), rtol=1e-6)
    assert np.array_equal(compute(xy, lambda c, t: c.abs(t["x"])).reshape(3, 8), np.abs(x))
    assert np.array_equal(compute(xy, lambda c, t: c.sgn(t["x"])).reshape(3, 8), np.sign(x))
    assert np.array_equal(compute(xy, lambda c, t: c.sub(t["x"], t["y"])).reshape(3, 8), x - y)
    got = compute(
        {"x": ([1], np.zeros(1, np.float32))}, lambda c, t: c.add(c.arange(0.0, 6.0, 2.0), c.scale(t["x"], 0.0))
    )
    assert np.array_equal(got, [0.0, 2.0, 4.0])
    grid = RNG.standard_normal((4, 6), np.float32)  # numpy [rows, cols]: ggml [6, 4]
    pooled = compute({"g": ([6, 4], grid)}, lambda c, t: c.pool_2d_max(t["g"], 2, 2, 2, 2)).reshape(2, 3)
    assert np.array_equal(pooled, grid.reshape(2, 2, 3, 2).max(axis=(1, 3)))
    n_embd, hc, n = 8, 4, 3
    s, g = RNG.standard_normal((n, hc, n_embd), np.float32), RNG.standard_normal((n, hc, n_embd), np.float32)
    got = compute(
        {"s": ([n_embd, hc, n], s), "g": ([n_embd, hc, n], g)}, lambda c, t: c.dsv4_hc_pre_gated(t["s"], t["g"], 0.25)
    )
    want = 0.25 * (s / (1 + np.exp(-g))).sum(axis=1)
    np.testing.assert_allclose(got.reshape(n, n_embd), want, rtol=1e-5, atol=1e-6)
    with pytest.raises(SuperggmlError, match="arange"):
        compute(xy, lambda c, t: c.arange(1.0, 1.0))
