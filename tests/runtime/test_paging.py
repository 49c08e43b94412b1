"""Paging: blocks streamed from the GGUF through a bounded pool give the resident logits."""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import threading

import numpy as np
import pytest

from prompts import feed_logits
from superggml import Model, native
from superggml.errors import LoadCancelled, PoolExhausted
from superggml.settings import parse_size


@pytest.fixture(scope="module")
def resident(model_path):
    with Model(model_path, ctx_size=128, n_threads=2, repack=False) as m:
        return feed_logits(m), m.store.slot_bytes(m.arch.block_tensors(0)), m.hparams.n_layer


@pytest.mark.parametrize("slots", [1, 2, 4, "half"])
@pytest.mark.parametrize("async_prefetch", [False, True])
def test_streamed_is_bit_identical_to_resident(model_path, resident, slots, async_prefetch):
    ref, slot_bytes, n_layer = resident
    n = n_layer // 2 if slots == "half" else slots
    budget = n * slot_bytes * 1.05  # blocks differ a little in size
    with Model(model_path, ctx_size=128, n_threads=2, device_budget=int(budget), async_prefetch=async_prefetch) as m:
        out = feed_logits(m)
        st = m.stats()
        assert st["n_slots"] == n
    assert np.array_equal(out, ref)
    assert st["failed"] == 0
    if n < n_layer:
        assert st["evictions"] > 0  # bytes really moved through the slots


def test_budget_smaller_than_a_layer(smollm2_path):
    with pytest.raises(ValueError, match=r"smaller than one layer: block \d+ needs \d+ bytes"):
        Model(smollm2_path, device_budget="1MiB")


def test_parse_size():
    assert parse_size("128MiB") == 128 * 2**20
    assert parse_size("2GB") == 2 * 10**9
    assert parse_size("1.5 GiB") == int(1.5 * 2**30)
    assert parse_size(4096) == 4096
    with pytest.raises(ValueError):
        parse_size("lots")


@pytest.mark.parametrize("io", ["pread", "direct", "staged"])
def test_file_truncated_mid_run_raises(tmp_path, smollm2_path, io):
    p = tmp_path / "m.gguf"
    shutil.copy(smollm2_path, p)
    with Model(
        p,
        ctx_size=64,
        n_threads=2,
        device_budget="2.5MiB",
        async_prefetch=True,
        direct_io=io == "direct",
        staged_io=io == "staged",
    ) as m:
        m.eval([1, 2, 3])
        os.truncate(p, os.path.getsize(p) // 3)
        with pytest.raises(OSError, match="short read"):
            for _ in range(3):
                m.eval([4])


# -- the primitives on their own: any file's byte ranges through a pool ------------------


def test_pool_and_prefetcher_stream_any_file(tmp_path):
    data = np.random.default_rng(0).integers(0, 256, 1 << 20, dtype=np.uint8)
    path = tmp_path / "blob.bin"
    data.tofile(path)
    pool = native.BufferPool(slot_size=64 << 10, n_slots=3)
    io = native.Prefetcher(str(path), n_workers=2)
    slot, hit, evicted = pool.acquire(5)
    assert (hit, evicted) == (False, -1)
    io.submit(5, pool, slot, [(1000, 4000, 0), (200_000, 5000, 4096)]).result(timeout=10)
    got = pool.read(slot, 0, 9096)
    assert np.array_equal(got[:4000], data[1000:5000])
    assert np.array_equal(got[4096:9096], data[200_000:205_000])
    assert pool.acquire(5)[1] is True
    pool.release(slot)
    pool.release(slot)
    with pytest.raises(OSError, match="short read"):
        io.submit(6, pool, slot, [(len(data) - 10, 100, 0)]).result(timeout=10)
    for k in range(3):
        pool.acquire(100 + k)
    with pytest.raises(PoolExhausted):
        pool.acquire(200)


def test_prefetcher_stress(tmp_path):
    """Threads acquire, load, verify, cancel and release at random; no deadlock, no wrong bytes."""
    size = 4 << 20
    data = np.random.default_rng(1).integers(0, 256, size, dtype=np.uint8)
    path = tmp_path / "blob.bin"
    data.tofile(path)
    chunk = 16 << 10
    n_keys = size // chunk
    digests = [hashlib.sha256(data[k * chunk : (k + 1) * chunk].tobytes()).hexdigest() for k in range(n_keys)]
    pool = native.BufferPool(slot_size=chunk, n_slots=6)
    io = native.Prefetcher(str(path), n_workers=3)
    errors: list[BaseException] = []
    counts = {"ok": 0, "cancelled": 0, "exhausted": 0}
    lock = threading.Lock()

    def worker(seed: int) -> None:
        rnd = random.Random(seed)
        try:
            for _ in range(600):
                key = rnd.randrange(n_keys)
                try:
                    slot, hit, _ = pool.acquire(key)
                except PoolExhausted:
                    with lock:
                        counts["exhausted"] += 1
                    continue
                try:
                    fut = io.submit(key, pool, slot, [(key * chunk, chunk, 0)], priority=rnd.randrange(3))
                    if rnd.random() < 0.2 and fut.cancel():
                        with pytest.raises(LoadCancelled):
                            fut.result(timeout=30)
                        with lock:
                            counts["cancelled"] += 1
                        continue
                    fut.result(timeout=30)
                    got = pool.read(slot, 0, chunk)
                    assert hashlib.sha256(got.tobytes()).hexdigest() == digests[key]
                    with lock:
                        counts["ok"] += 1
                finally:
                    pool.release(slot)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "deadlock"
    assert not errors, errors[:3]
    assert counts["ok"] > 1000
    st = io.stats()
    assert st["pending"] == 0 and st["failed"] == 0


LIMITED_RUN = r"""
import sys
from superggml import Model
m = Model(sys.argv[1], ctx_size=256, n_batch=32, n_threads=2, device_budget="128MiB", async_prefetch=True)
out = m.create_completion("def fibonacci(n):\n   ", max_tokens=6, temperature=0)["choices"][0]["text"]
hwm = next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmHWM"))
print(repr(out))
print(hwm)
"""


@pytest.mark.slow
def test_qwen_runs_in_256mib_with_a_128mib_budget(qwen_path):
    """llama.cpp is OOM-killed below ~720 MB here; superggml streams within the budget."""
    import sys

    import memcg

    memcg.drop_page_cache(qwen_path)
    try:
        r = memcg.run_limited([sys.executable, "-c", LIMITED_RUN, qwen_path], 256 << 20, timeout=900)
    except (OSError, PermissionError) as e:
        pytest.skip(f"cannot make a child memory cgroup here: {e}")
    assert r.returncode == 0, r.stderr[-2000:]
    text, hwm = r.stdout.splitlines()[-2:]
    print(f"\nQwen2.5-1.5B in a 256 MiB cgroup, budget 128 MiB: VmHWM {int(hwm) / 2**20:.0f} MiB, text {text}")
    assert int(hwm) <= 232 << 20  # the budget, and at most 104 MiB besides (docs/design.md: where it goes)
    with Model(qwen_path, ctx_size=256, n_threads=2, repack=False) as m:
        ref = m.create_completion("def fibonacci(n):\n   ", max_tokens=6, temperature=0)["choices"][0]["text"]
    assert text == repr(ref)


@pytest.mark.parametrize("ngl", [0, 10])
def test_n_gpu_layers_keeps_that_many_resident(smollm2_path, ngl):
    with Model(smollm2_path, ctx_size=128, n_threads=2, repack=False) as m:
        ref = feed_logits(m)
    with Model(smollm2_path, ctx_size=128, n_threads=2, n_gpu_layers=ngl, async_prefetch=True) as m:
        out = feed_logits(m)
        assert m.stats()["layers_pinned"] == ngl
        assert m.stats()["n_slots"] == ngl + 3  # plus prefetch_depth + 1 streaming slots
    assert np.array_equal(out, ref)


# -- direct I/O (O_DIRECT into the slot, in the file's layout) ------------------------------


@pytest.mark.parametrize("slots", [1, "half"])
@pytest.mark.parametrize("async_prefetch", [False, True])
@pytest.mark.parametrize("io", ["direct", "staged"])
def test_direct_and_staged_io_are_bit_identical_to_resident(model_path, resident, slots, async_prefetch, io):
    """direct: O_DIRECT into the slot; staged: staging buffers + async copies + events, the device path."""
    ref, slot_bytes, n_layer = resident
    n = n_layer // 2 if slots == "half" else slots
    with Model(
        model_path,
        ctx_size=128,
        n_threads=2,
        device_budget=int(n * slot_bytes * 1.05),
        async_prefetch=async_prefetch,
        direct_io=io == "direct",
        staged_io=io == "staged",
    ) as m:
        out = feed_logits(m)
        st = m.stats()
    assert st["direct_io"] is (io == "direct") and st["staged_io"] is (io == "staged")
    assert st["failed"] == 0 and st["evictions"] > 0
    assert np.array_equal(out, ref)


def test_direct_io_on_tmpfs(smollm2_path):
    """tmpfs refuses O_DIRECT before Linux 6.6 (reads then go buffered) and takes it after: same logits."""
    shm = "/dev/shm"
    if not os.path.isdir(shm):
        pytest.skip("no /dev/shm")
    p = os.path.join(shm, f"superggml-test-{os.getpid()}.gguf")
    shutil.copy(smollm2_path, p)
    try:
        with Model(smollm2_path, ctx_size=128, n_threads=2, repack=False) as m:
            ref = feed_logits(m)
        with Model(p, ctx_size=128, n_threads=2, device_budget="8MiB", direct_io=True) as m:
            out = feed_logits(m)
    finally:
        os.unlink(p)
    assert np.array_equal(out, ref)


def test_prefetcher_direct_reads_aligned_ranges(tmp_path):
    data = np.random.default_rng(1).integers(0, 256, 1 << 20, dtype=np.uint8)
    path = tmp_path / "blob.bin"
    data.tofile(path)
    pool = native.BufferPool(slot_size=256 << 10, n_slots=1)
    io = native.Prefetcher(str(path), direct=True)
    slot, _, _ = pool.acquire(0)
    # the slot's base is only 64-byte aligned in general; reads that are not 4096-aligned go buffered
    io.submit(0, pool, slot, [(8192, 65536, 0), (4096 * 7 + 5, 1000, 70000)], direct=True).result(timeout=10)
    got = pool.read(slot, 0, 71000)
    assert np.array_equal(got[:65536], data[8192 : 8192 + 65536])
    assert np.array_equal(got[70000:71000], data[4096 * 7 + 5 : 4096 * 7 + 1005])


def test_prefetcher_staged_reads_in_chunks(tmp_path):
    """Ranges larger than a staging buffer (8 MiB) alternate between the two, copies overlapping reads."""
    data = np.random.default_rng(2).integers(0, 256, 20 << 20, dtype=np.uint8)
    path = tmp_path / "blob.bin"
    data.tofile(path)
    pool = native.BufferPool(slot_size=20 << 20, n_slots=1)
    io = native.Prefetcher(str(path), n_workers=2, staged=True)
    slot, _, _ = pool.acquire(0)
    io.submit(0, pool, slot, [(3, (17 << 20) + 5, 0), (1 << 20, 999, 18 << 20)]).result(timeout=30)
    assert np.array_equal(pool.read(slot, 0, (17 << 20) + 5), data[3 : (17 << 20) + 8])
    assert np.array_equal(pool.read(slot, 18 << 20, 999), data[1 << 20 : (1 << 20) + 999])
    with pytest.raises(OSError, match="short read"):
        io.submit(0, pool, slot, [(len(data) - 10, 100, 0)]).result(timeout=10)


def test_pool_shrinks_and_grows():
    pool = native.BufferPool(slot_size=1 << 20, n_slots=3)
    a = pool.acquire(1)[0]
    pool.set_pinned(a, True)
    pool.release(a)
    b = pool.acquire(2)[0]  # in use: cannot be freed
    assert pool.shrink() == (True, -1)  # the empty slot goes first
    assert pool.n_slots == 2 and pool.bytes == 2 << 20
    assert pool.shrink() == (False, -1)  # one pinned, one in use
    pool.release(b)
    assert pool.shrink() == (True, 2)  # now key 2's slot, evicted
    assert pool.slot_of(2) == -1 and pool.slot_of(1) == a
    with pytest.raises(PoolExhausted):
        pool.acquire(3)  # only the pinned slot is left
    with pytest.raises(native.SuperggmlError if hasattr(native, "SuperggmlError") else Exception, match="no memory"):
        pool.read(b, 0, 16)
    s = pool.grow()
    assert pool.n_slots == 2
    assert pool.acquire(3)[0] == s


def test_budget_beyond_available_memory_is_refused_before_loading(smollm2_path):
    from superggml import native

    avail = int(native.host_memory()["available"])
    with pytest.raises(
        ValueError, match=r"device_budget of \d+ bytes is more than the \d+ bytes available on the host"
    ):
        Model(smollm2_path, device_budget=avail + (1 << 30))
    with pytest.raises(ValueError, match=r"host_budget of \d+ bytes is more than the \d+ bytes of host memory"):
        Model(smollm2_path, paged_kv=True, host_budget=avail + (1 << 30))


BUDGET_IN_CGROUP = r"""
import sys
from superggml import Model
try:
    Model(sys.argv[1], device_budget="512MiB")
except ValueError as e:
    print("refused:", e)
"""


def test_budget_beyond_the_cgroup_limit_is_refused(smollm2_path):
    import sys

    import memcg

    try:
        r = memcg.run_limited([sys.executable, "-c", BUDGET_IN_CGROUP, smollm2_path], 300 << 20, timeout=120)
    except (OSError, PermissionError) as e:
        pytest.skip(f"cannot make a child memory cgroup here: {e}")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "refused: device_budget of 536870912 bytes is more than the" in r.stdout
    assert f"cgroup limit {300 << 20} bytes" in r.stdout


def test_streaming_decode_leaves_a_core_to_the_prefetcher(smollm2_path):
    """With threads left to superggml, single-token steps that stream use one compute thread fewer than
    prefill; an explicit n_threads is kept as given."""
    import os as _os

    n = len(_os.sched_getaffinity(0))
    with Model(smollm2_path, ctx_size=64, device_budget="8MiB", async_prefetch=True) as m:
        m.eval([1, 2, 3])
        assert m.n_threads == n
        m.eval([4])
        assert m.n_threads == max(1, n - 1)
    with Model(smollm2_path, ctx_size=64, n_threads=2, device_budget="8MiB", async_prefetch=True) as m:
        m.eval([1, 2, 3])
        m.eval([4])
        assert m.n_threads == 2
