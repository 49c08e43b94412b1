"""The pass profile (runtime/exec/profile.py): host time apart from the computation, graphs computed again unchanged,
and a host cost per decoded token that does not grow with the model's depth."""

from __future__ import annotations

import time

import numpy as np
import pytest
import synth_gguf

from superggml import Model, native

N_DECODE = 48
# The host's own time per decoded token may grow by this much from 2 to 24 blocks (a fixed bound, not per block: a
# resident pass is one graph computed again as it was, so the host does no work per block)
HOST_GROWTH_MS = 0.25


def decode_profile(path, **kw):
    """The decode part of the pass profile over N_DECODE tokens after a short prompt (its plans built before), the
    graphs of the last pass, and each pass's host milliseconds."""
    with Model(path, ctx_size=256, n_threads=1, **kw) as m:
        m.eval([1, 2, 3, 4])
        m.eval([5])
        hosts = []
        for t in range(N_DECODE):
            m.runtime.profile.reset()
            m.eval([6 + t])
            hosts.append(m.stats()["pass_profile"]["decode"]["host_ms"])
        m.runtime.profile.reset()
        for t in range(N_DECODE):
            m.eval([6 + N_DECODE + t])
        st = m.stats()
        return st["pass_profile"]["decode"], st["graphs_per_pass"], hosts


@pytest.fixture(scope="module")
def depths(tmp_path_factory, small_vocab):
    d = tmp_path_factory.mktemp("depth")
    return {
        n: synth_gguf.synth(d / f"llama{n}.gguf", small_vocab, arch="llama", n_layer=n, n_embd=64, n_ff=128)
        for n in (2, 24)
    }


def test_resident_decode_reuses_its_graph(depths):
    """Everything resident: one graph per decoded token, computed again unchanged (no allocation, the same uid),
    its operations counted, the host's time and the computation's adding up to the pass."""
    prof, graphs, _ = decode_profile(depths[24])
    assert graphs == 1
    assert prof["passes"] == N_DECODE
    assert prof["graphs_per_pass"] == 1 and prof["reused_per_pass"] == 1
    assert prof["ops_per_pass"] > 24 * 10  # every block's operations, views left out
    assert prof["compute_ms"] > 0 and prof["host_ms"] > 0
    assert prof["host_ms"] + prof["compute_ms"] == pytest.approx(prof["wall_ms"], rel=1e-3, abs=1e-3)
    assert prof["device_ms"] == 0  # the CPU has no events


def test_a_load_finished_before_the_first_pass_gives_it_the_whole_graph(depths):
    """The weights load in the background; a pass that starts after the load has ended runs the pass's one graph,
    and the next reuses it (as llama.cpp's warm-up builds the graph its timed runs reuse), rather than computing
    block by block as if the weights were still arriving and building the whole graph a pass later."""
    with Model(depths[24], ctx_size=256, n_threads=1) as m:
        for _ in range(2000):
            if not m.stats()["weights_loading"]:
                break
            time.sleep(0.005)
        prof = []
        for _ in range(2):
            m.reset()
            m.runtime.profile.reset()
            m.eval(list(range(1, 17)))
            st = m.stats()
            prof.append((st["graphs_per_pass"], st["pass_profile"]["prefill"]["reused_per_pass"]))
    assert prof == [(1, 0.0), (1, 1.0)], prof


def test_host_time_per_decoded_token_does_not_grow_with_depth(depths):
    """The host's own time per decoded token, 24 blocks against 2, within HOST_GROWTH_MS (the median pass, so
    that a busy machine's pauses do not count)."""
    host = {n: float(np.median(decode_profile(p)[2])) for n, p in depths.items()}
    assert host[24] - host[2] < HOST_GROWTH_MS, host


def test_a_graph_computed_again_after_its_storage_moved_is_prepared_again(smollm2_path):
    """Streamed blocks rebind their slots between passes: a graph whose weights moved is never computed again
    as it was, and the logits stay the resident ones."""
    with Model(smollm2_path, ctx_size=128, n_threads=2, repack=False) as m:
        ref = [m.eval([1, 2, 3])[-1].copy()] + [m.eval([t])[-1].copy() for t in (4, 5, 6)]
    with Model(smollm2_path, ctx_size=128, n_threads=2, repack=False, device_budget=24 << 20) as m:
        out = [m.eval([1, 2, 3])[-1].copy()] + [m.eval([t])[-1].copy() for t in (4, 5, 6)]
        prof = m.stats()["pass_profile"]["decode"]
        assert prof["graphs_per_pass"] > 1
        assert prof["reused_per_pass"] < prof["graphs_per_pass"]
    for a, b in zip(ref, out):
        assert np.array_equal(a, b)


def test_backend_stats_count_reuse_and_storage_moves():
    """native.Backend.stats: the same graph again is reused; after a tensor it reads is bound elsewhere it is
    prepared again (and reads the new storage)."""
    b = native.Backend("", 1)
    ctx = native.Context(max_tensors=8)
    x = ctx.new_tensor(native.GGMLType.F32, [4])
    y = ctx.new_tensor(native.GGMLType.F32, [4])
    keep = b.alloc_tensors(ctx)
    native.tensor_set(x, np.arange(4, dtype=np.float32))
    native.tensor_set(y, np.full(4, 10, dtype=np.float32))
    gctx = native.Context(max_tensors=8, graph_size=8)
    v = gctx.new_tensor(native.GGMLType.F32, [4])
    native.tensor_alias(v, x)
    g = gctx.new_graph()
    out = gctx.scale(v, 2.0)
    out.set_output()
    g.expand(out)
    s0 = b.stats()
    b.compute(g)
    b.compute(g)
    assert native.tensor_get(out).tolist() == [0, 2, 4, 6]
    native.tensor_alias(v, y)  # the storage moved: prepared again, reading y
    b.compute(g)
    assert native.tensor_get(out).tolist() == [20, 20, 20, 20]
    s1 = b.stats()
    assert s1["graphs"] - s0["graphs"] == 3 and s1["reused"] - s0["reused"] == 1
    assert s1["nodes"] - s0["nodes"] == 3
    del keep


@pytest.mark.parametrize("flash_attn", [False, True])
def test_masks_are_llama_cpps(flash_attn):
    """lane_rows' masks (a window per row for long passes, a compare for short ones) are the causal and sliding
    ones, element for element, in the mask's type."""
    from superggml.runtime.exec.graph import lane_rows

    mtype = np.float16 if flash_attn else np.float32
    for p0, n, n_kv, n_swa in ((0, 512, 512, 0), (37, 20, 256, 0), (300, 1, 512, 0), (5, 64, 256, 16), (0, 15, 256, 4)):
        r = lane_rows(p0, n, n_kv, n_swa=n_swa, flash_attn=flash_attn, v_channels=3, ctx_size=1024)
        pos, kv = np.arange(p0, p0 + n)[:, None], np.arange(n_kv)[None, :]
        assert r.mask.dtype == mtype and r.mask.flags.c_contiguous
        assert np.array_equal(r.mask, np.where(kv <= pos, 0, -np.inf).astype(mtype))
        if n_swa:
            assert np.array_equal(r.mask_swa, np.where((kv <= pos) & (pos - kv < n_swa), 0, -np.inf).astype(mtype))


def test_a_graph_moving_between_backends_is_prepared_again_on_each():
    """One graph computed on one backend, then another, then the first: never reused with the other backend's
    addresses (each releases what the other kept), and right each time."""
    b1, b2 = native.Backend("", 1), native.Backend("", 1)
    ctx = native.Context(max_tensors=4)
    x = ctx.new_tensor(native.GGMLType.F32, [4])
    keep = b1.alloc_tensors(ctx)
    native.tensor_set(x, np.arange(4, dtype=np.float32))
    gctx = native.Context(max_tensors=8, graph_size=8)
    g = gctx.new_graph()
    out = gctx.scale(gctx.scale(x, 2.0), 3.0)
    out.set_output()
    g.expand(out)
    r1, r2 = b1.stats()["reused"], b2.stats()["reused"]
    for b in (b1, b2, b1, b1):
        b.compute(g)
        assert native.tensor_get(out).tolist() == [0, 6, 12, 18]
    assert b1.stats()["reused"] - r1 == 1 and b2.stats()["reused"] - r2 == 0  # only b1's last, after its own
    del keep


def test_two_backends_graphs_each_reused():
    """A pass as on a GPU: the embedding's graph on one backend, the blocks' graph on another, reading the
    first's output. Each computed again unchanged is reused, pass after pass: an allocation that places a graph's
    nodes where they were moves nothing (it used to count as a move, so the two unsettled each other at every
    pass, and ggml-cuda never replayed its CUDA graph)."""
    b1, b2 = native.Backend("", 1), native.Backend("", 1)
    ctx = native.Context(max_tensors=4)
    x = ctx.new_tensor(native.GGMLType.F32, [4])
    keep = b1.alloc_tensors(ctx)
    native.tensor_set(x, np.arange(4, dtype=np.float32))
    g1ctx, g2ctx = native.Context(max_tensors=8, graph_size=8), native.Context(max_tensors=8, graph_size=8)
    g1, g2 = g1ctx.new_graph(), g2ctx.new_graph()
    mid = g1ctx.scale(g1ctx.scale(x, 2.0), 1.0)
    mid.set_output()
    g1.expand(mid)
    out = g2ctx.scale(g2ctx.scale(mid, 3.0), 1.0)
    out.set_output()
    g2.expand(out)
    r1, r2 = b1.stats()["reused"], b2.stats()["reused"]
    for _ in range(5):
        b1.compute(g1)
        b2.compute(g2)
        assert native.tensor_get(out).tolist() == [0, 6, 12, 18]
    assert b1.stats()["reused"] - r1 >= 3 and b2.stats()["reused"] - r2 >= 3
    del keep
