"""The core primitives: paged tensors, graphs, and their failure modes."""

from __future__ import annotations

import numpy as np
import pytest

from superggml import SuperggmlError, native
from superggml.arch import get_architecture
from superggml.runtime.exec.executor import Executor
from superggml.settings import Settings

F32 = native.GGMLType.F32


def _logits(path, bind):
    f = native.GGUFFile(path)
    arch = get_architecture(f.metadata())
    store = native.WeightStore(f)
    bind(store, arch)
    ex = Executor.start(arch, store, Settings.from_options(dict(n_ctx=64, n_threads=2)), load=False)
    return ex.eval(list(range(300, 332)), logits_all=True), store


def test_weights_copied_to_a_resident_buffer_give_bit_identical_logits(smollm2_path):
    mapped, s1 = _logits(smollm2_path, lambda s, a: s.bind_mmap())
    names = [t[0] for t in native.GGUFFile(smollm2_path).tensors()]

    def resident(s, a):
        s.bind_mmap()
        s.load_resident(names[::2], native.Backend("", 1))  # half resident, half mapped

    copied, s2 = _logits(smollm2_path, resident)
    assert s2.home(names[0]) == native.WeightHome.RESIDENT and s2.home(names[1]) == native.WeightHome.MMAP
    assert s2.bytes(native.WeightHome.RESIDENT) > 0
    assert np.array_equal(mapped, copied)


def test_unbound_weight_is_an_error_not_a_crash(smollm2_path):
    f = native.GGUFFile(smollm2_path)
    arch = get_architecture(f.metadata())
    store = native.WeightStore(f)
    store.bind_mmap([n for n, *_ in f.tensors() if n != "blk.3.ffn_up.weight"])
    assert store.home("blk.3.ffn_up.weight") == native.WeightHome.UNBOUND
    ex = Executor.start(arch, store, Settings.from_options(dict(n_ctx=32, n_threads=1)), load=False)
    with pytest.raises(SuperggmlError, match="blk.3.ffn_up.weight' has no storage"):
        ex.eval([1, 2])
    with pytest.raises(SuperggmlError, match="no tensor 'nope'"):
        store.get("nope")


def test_graph_ops_compute_and_check_shapes():
    be = native.Backend("", 2)
    pctx = native.Context(8)
    a = pctx.new_tensor(F32, [4, 3])
    b = pctx.new_tensor(F32, [4, 2])
    buf = be.alloc_tensors(pctx)
    assert buf.size >= 4 * 5 * 4
    av = np.arange(12, dtype=np.float32).reshape(3, 4)
    bv = np.ones((2, 4), dtype=np.float32)
    native.tensor_set(a, av)
    native.tensor_set(b, bv)
    ctx = native.Context(16, 16)
    g = ctx.new_graph()
    out = ctx.mul_mat(a, b)  # [3, 2]
    out.set_output()  # only outputs keep their storage after compute
    g.expand(out)
    be.compute(g)
    assert np.array_equal(native.tensor_get(out), bv @ av.T)
    with pytest.raises(SuperggmlError, match="mul_mat"):
        ctx.mul_mat(a, ctx.new_tensor(F32, [5, 2]))
    with pytest.raises(SuperggmlError, match="reshape"):
        ctx.reshape(a, [5, 3])
    with pytest.raises(SuperggmlError, match="view"):
        ctx.view(a, [4, 4], [16], 0)
    with pytest.raises(SuperggmlError, match="larger than the tensor"):
        native.tensor_set(a, np.zeros(13, np.float32))


def test_full_context_raises():
    ctx = native.Context(2)
    ctx.new_tensor(F32, [1])
    ctx.new_tensor(F32, [1])
    with pytest.raises(SuperggmlError, match="full"):
        ctx.new_tensor(F32, [1])
    with pytest.raises(SuperggmlError, match="graph"):
        ctx.new_graph()


def test_devices_lists_the_cpu():
    devs = native.devices()
    assert any(d["type"] == "cpu" and d["memory_total"] > 0 for d in devs)


def test_cached_graphs_survive_compute_buffer_growth(smollm2_path):
    """Small graphs cached, then bigger ones grow (replace) the compute buffer, then the small
    ones run again: their nodes must not point into the freed buffer."""
    from superggml import Model

    with Model(smollm2_path, ctx_size=512, n_threads=2, n_batch=512) as m:
        first = m.eval([1, 2, 3]).copy()
        for n in (8, 64, 200, 9, 300, 7, 400):
            m.reset()
            m.eval(list(range(100, 100 + n)))
        m.reset()
        again = m.eval([1, 2, 3])
    assert np.array_equal(first, again)
