"""superggml.paging and superggml.gguf: the public paging primitives, their zero-copy views and their guards."""

from __future__ import annotations

import subprocess
import sys
import tracemalloc

import gguf as hf_gguf
import numpy as np
import pytest

import superggml.gguf as G
from superggml import native
from superggml import paging as P
from superggml.errors import PoolExhausted, SlotReleased, SuperggmlError

SLOT = 1 << 20


def test_numpy_view_writes_reach_a_bound_tensor():
    with P.BufferPool(SLOT, 2) as pool:
        slot = pool.acquire(1)
        t = slot.tensor(native.GGMLType.F32, [16, 4], 64)
        a = P.view(slot, np.float32, [4, 16], 64)
        a[:] = np.arange(64, dtype=np.float32).reshape(4, 16)
        np.testing.assert_array_equal(native.tensor_get(t), a)
        del a
        slot.release()
        assert not t.bound  # a released slot's tensors are unbound: a graph on them fails


def test_views_allocate_no_slot_sized_memory():
    pool = P.BufferPool(64 << 20, 1)
    slot = pool.acquire(0)
    tracemalloc.start()
    views = [np.asarray(slot) for _ in range(8)] + [memoryview(slot), np.from_dlpack(slot)]
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 1 << 20  # eight 64 MiB views: no copy of the slot
    assert all(np.shares_memory(views[0], v) for v in views[1:8])
    assert slot.n_views == 10
    del views
    assert slot.n_views == 0
    slot.release()


def _rss() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


def test_views_leave_rss_alone():
    """Views of a 64 MiB slot whose pages are all resident: RSS does not grow by a slot (no copy is made)."""
    with P.BufferPool(64 << 20, 1) as pool:
        slot = pool.acquire(0)
        np.asarray(slot)[:] = 1  # every page of the slot resident
        before = _rss()
        views = [np.asarray(slot), memoryview(slot), np.from_dlpack(slot), P.view(slot, np.float32, [16 << 20])]
        views += [np.asarray(slot) for _ in range(8)]
        grew = _rss() - before
        assert int(views[3][-1].view(np.uint32)) == 0x01010101
        del views
        slot.release()
    assert grew < 4 << 20, f"RSS grew by {grew >> 20} MiB for views of a 64 MiB slot"


def test_host_slots_are_page_aligned():
    """O_DIRECT reads need the destination on a page: every host slot starts on one and spans whole pages."""
    with P.BufferPool(10_000, 3) as pool:
        assert pool.slot_size % P.DIRECT_ALIGN == 0
        for key in range(3):
            with pool.acquire(key) as slot:
                a = np.asarray(slot)
                assert a.ctypes.data % P.DIRECT_ALIGN == 0 and a.nbytes == pool.slot_size
                del a


def test_aligned_reads_go_direct(smollm2_path):
    """Page-aligned ranges into a (page-aligned) slot are read with O_DIRECT where the file system allows it:
    stats' direct_bytes counts them; an unaligned range, or direct=False, goes through the page cache."""
    with P.BufferPool(1 << 20, 2) as pool, P.Prefetcher(smollm2_path, 1) as io:
        if not io.direct_io:
            pytest.skip("O_DIRECT is not available on this file system")
        with open(smollm2_path, "rb") as f:
            raw = f.read(3 << 16)
        with pool.acquire(0) as slot:
            io.submit(slot, [(4096, 1 << 16, 0), (100, 1000, 1 << 17)]).result(timeout=30)
            io.submit(slot, [(8192, 4096, 1 << 18)], direct=False).result(timeout=30)
            got = np.asarray(slot)
            assert bytes(got[: 1 << 16]) == raw[4096 : 4096 + (1 << 16)]
            assert bytes(got[1 << 17 : (1 << 17) + 1000]) == raw[100:1100]
            assert bytes(got[1 << 18 : (1 << 18) + 4096]) == raw[8192:12288]
            del got
        st = io.stats()
        assert st["direct_bytes"] == 1 << 16 and st["bytes"] == (1 << 16) + 1000 + 4096


def test_use_after_release_raises():
    pool = P.BufferPool(4096, 1)
    slot = pool.acquire(5)
    a = np.asarray(slot)
    with pytest.raises(BufferError, match="view"):
        slot.release()
    del a
    slot.release()
    slot.release()  # a second release does nothing
    for make in (np.asarray, memoryview, np.from_dlpack, lambda s: s.tensor(native.GGMLType.F32, [4])):
        with pytest.raises(SlotReleased):
            make(slot)
    other = pool.acquire(6)  # the slot's memory now holds key 6
    assert other.index == slot.index and not slot.valid
    other.release()


def test_read_only_slots_and_dlpack():
    pool = P.BufferPool(4096, 1)
    with pool.acquire(1, writable=False) as slot:
        a = np.asarray(slot)
        assert not a.flags.writeable
        d = np.from_dlpack(slot)  # DLPack 1.0 carries the read-only flag
        assert not d.flags.writeable and np.shares_memory(a, d)
        with pytest.raises(ValueError):
            a[0] = 1
        del a, d
    with pool.acquire(2) as slot:
        w = np.from_dlpack(slot)
        w[:3] = 7
        assert bytes(memoryview(slot)[:3]) == b"\x07\x07\x07"
        del w


def test_exhausted_pool_and_pins():
    pool = P.BufferPool(4096, 2)
    a, b = pool.acquire(1), pool.acquire(2)
    with pytest.raises(PoolExhausted):
        pool.acquire(3)
    pool.pin(a)
    a.release()
    b.release()
    c = pool.acquire(3)
    assert c.index == b.index and c.evicted == 2
    c.release()


def test_prefetch_into_slot_and_dequantize(model_path):
    f = G.open(model_path)
    ti = f.info("blk.0.ffn_down.weight")
    ref = next(t for t in hf_gguf.GGUFReader(model_path).tensors if t.name == ti.name)
    want = hf_gguf.quants.dequantize(ref.data, ref.tensor_type)
    np.testing.assert_array_equal(f.dequantize(ti.name), want)
    np.testing.assert_array_equal(f.dequantize(ti.name, rows=(10, 20)), want[10:20])
    np.testing.assert_array_equal(f.dequantize(ti.name, dtype=np.float16), want.astype(np.float16))
    with P.BufferPool(ti.nbytes, 1) as pool, P.Prefetcher(model_path, 2) as io:
        slot = pool.acquire(0)
        f.read_into(ti.name, slot, io).result(timeout=30)
        np.testing.assert_array_equal(G.dequantize(slot, ti.type, ti.shape), want)
        out = np.empty(ti.shape[::-1], np.float32)
        G.dequantize(slot, ti.type, ti.shape, out=out, n_threads=2)
        np.testing.assert_array_equal(out, want)
        slot.release()
    with pytest.raises(SuperggmlError, match="block size"):
        G.dequantize(b"\0" * 64, "q4_K", (100, 1))
    with pytest.raises(SuperggmlError, match="holds"):
        G.dequantize(b"\0" * 10, "q4_1", (32, 1))
    with pytest.raises(KeyError):
        f.info("nope")


def test_layer_pager_views_match_the_file(model_path):
    f = G.open(model_path)
    layers = [[f"blk.{i}.attn_norm.weight", f"blk.{i}.attn_k.weight"] for i in range(4)]
    with P.LayerPager(model_path, layers, n_slots=2) as pager:
        for i in range(4):
            pager.prefetch((i + 1) % 4)
            layer = pager.acquire(i)
            assert layer.names() == layers[i]
            norm = P.layer_array(layer, layers[i][0])
            np.testing.assert_array_equal(norm, f.dequantize(layers[i][0])[0])
            k = P.layer_array(layer, layers[i][1])
            np.testing.assert_array_equal(k, f.read(layers[i][1]))
            assert not k.flags.writeable
            with pytest.raises(BufferError):
                layer.release()
            del norm, k
            layer.release()
            with pytest.raises(SlotReleased):
                layer.offset(layers[i][0])
        assert pager.stats()["loads"] >= 4


def test_kv_frames_round_trip_through_host_pages(tmp_path):
    kv = P.KVCache(4, 32, 64, page_size=16, n_frames=1, host_budget=2 * 4 * 16 * 32 * 2, spill_dir=str(tmp_path))
    rng = np.random.default_rng(0)
    want = {}
    for layer in range(4):
        with kv.acquire(0, layer, 0) as frame:
            k, v = kv.k_array(frame), kv.v_array(frame)
            want[layer] = rng.standard_normal((2, 40, 32)).astype(np.float16)
            k[:40], v[:40] = want[layer]
            del k, v
            frame.written(40)
    for layer in range(4):
        with kv.acquire(0, layer, 40) as frame:
            k, v = kv.k_array(frame), kv.v_array(frame)
            np.testing.assert_array_equal(k[:40], want[layer][0])
            np.testing.assert_array_equal(v[:40], want[layer][1])
            del k, v
    st = kv.stats()
    assert st["kv_pages_loaded"] > 0 and st["kv_pages_spilled"] > 0


def test_memory_telemetry():
    m = P.memory(nvml=False)
    assert m.process_rss > 0 and m.host_total > 0


DEVICE_SLOTS = """
import sys
import numpy as np
from superggml import native, paging as P
from superggml.errors import SuperggmlError

endpoint, path = sys.argv[1:]
with P.BufferPool(1 << 16, 2, device=f"RPC[{endpoint}]") as pool, P.Prefetcher(path, 1) as io:
    assert not pool.is_host
    slot = pool.acquire(0)
    assert not slot.is_host
    for make in (np.asarray, memoryview, np.from_dlpack):
        try:
            make(slot)
            raise AssertionError(f"{make} made a host view of a device slot")
        except (BufferError, SuperggmlError) as e:
            assert "device memory" in str(e), e
    io.submit(slot, [(4096, 1 << 16, 0)]).result(timeout=60)
    t = slot.tensor(native.GGMLType.F32, [1 << 14])
    with open(path, "rb") as f:
        f.seek(4096)
        want = np.frombuffer(f.read(1 << 16), np.float32)
    np.testing.assert_array_equal(native.tensor_get(t), want)
    slot.release()
    assert not t.bound
print("ok")
"""


def test_device_slots_give_tensors_not_views(smollm2_path):
    """A pool on a device that is not host memory (an RPC server on loopback): its slots have no host view,
    but tensors bound to them work in ggml, and a Prefetcher fills them (through its staging buffers). In a
    child process: a server added to this one would stay registered (and dead) for the tests after it."""
    from rpc_server import Server

    srv = Server()
    try:
        r = subprocess.run(
            [sys.executable, "-c", DEVICE_SLOTS, srv.endpoint, smollm2_path],
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        srv.close()
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr


@pytest.mark.parametrize("name", ["blk.0.attn_v.weight", "token_embd.weight"])  # Q4_1, Q8_0
def test_activation_rounding_gives_ggmls_matmul(smollm2_path, name):
    """values . (w - mins) + sums . mins, from quantize_activations and block_mins, is ggml-cpu's own
    mul_mat of the quantized weights to float rounding; the float product of the same weights is not."""
    with G.open(smollm2_path) as f:
        ti = f.info(name)
        rows = min(ti.n_rows, 512)
        raw = f.read(name, rows=(0, rows))
    x = (np.random.default_rng(0).standard_normal((6, ti.shape[0])) * 3).astype(np.float32)
    be = native.Backend("CPU", 2)
    ctx = native.Context(4, 4)
    w_t = ctx.new_tensor(P.ggml_type(ti.type), [ti.shape[0], rows])
    x_t = ctx.new_tensor(native.GGMLType.F32, [ti.shape[0], 6])
    keep = be.alloc_tensors(ctx)
    native.tensor_set(w_t, raw)
    native.tensor_set(x_t, x)
    g = native.Context(4, 4)
    gf = g.new_graph()
    y = g.mul_mat(w_t, x_t)
    y.set_output()
    gf.expand(y)
    be.compute(gf)
    want = native.tensor_get(y)
    w = G.dequantize(raw, ti.type, (ti.shape[0], rows))
    mins = G.block_mins(raw, ti.type, (ti.shape[0], rows))
    a = G.quantize_activations(x, ti.type)
    got = a.values @ (w - np.repeat(mins, 32, axis=1)).T + a.sums @ mins.T
    scale = np.abs(want).max()
    assert np.abs(got - want).max() < 1e-5 * scale
    if ti.type == "q4_1":
        assert np.abs(x @ w.T - want).max() > 1e-3 * scale  # what the rounding accounts for
    del keep
