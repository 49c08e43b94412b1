"""pytest-benchmark suite for the paging primitives of superggml.paging:

- prefetcher throughput: the Qwen2.5-Coder-1.5B GGUF read whole through a Prefetcher (2 workers, O_DIRECT)
  into 16 MiB slots of a BufferPool, against `dd bs=8M iflag=direct` on the same file, page cache dropped
  before each; rounds alternate, medians compared (the bar: >= 0.9x dd);
- BufferPool acquire + release, hits and misses with eviction (ns/op);
- view creation on a held slot (np.asarray, memoryview, np.from_dlpack, paging.view), 64 MiB against 4 KiB.

    python -m pytest bench/test_primitives.py -p no:cacheprovider -s --benchmark-columns=min,median,mean,rounds
"""

from __future__ import annotations

import itertools
import os
import statistics
import subprocess
import timeit

import numpy as np
import pytest

from cold_start import cached_fraction, drop_cache
from superggml import models, paging

A = paging.DIRECT_ALIGN
CHUNK = 16 << 20  # bytes per load (16 MiB beat 8 MiB here: more bytes in flight on the virtio disk)
N_SLOTS = 4  # loads in flight: 2 reading, 2 queued
N_WORKERS = 2
DD_BS = "8M"
ROUNDS = 5  # one read's time varies by up to 2x on a shared disk: medians of 5


def qwen() -> str:
    try:
        return str(models.qwen_path())
    except (models.ModelNotInstalledError, ValueError) as e:
        pytest.skip(f"Qwen2.5-1.5B not available: {e}")


def dropped(path: str) -> None:
    left = drop_cache(path)
    assert left < 0.01, f"{left:.0%} of {path} stays in the page cache (another process maps it?)"


def read_through_prefetcher(path: str, pool: paging.BufferPool, pf: paging.Prefetcher, keys) -> None:
    """The whole file, CHUNK at a time, N_SLOTS loads in flight, into page-aligned slots (O_DIRECT needs the
    file offset, the size and the destination aligned). The file's last size % A bytes are read buffered
    (an unaligned range)."""
    size = os.path.getsize(path)
    off, inflight = 0, []
    while off < size or inflight:
        while off < size and len(inflight) < pool.n_slots:
            slot = pool.acquire(next(keys))
            n = min(CHUNK, size - off)
            head = n // A * A
            ranges = [(off, head, 0)] if head else []
            if n > head:
                ranges.append((off + head, n - head, head))
            inflight.append((slot, pf.submit(slot, ranges)))
            off += n
        slot, fut = inflight.pop(0)
        fut.result()
        slot.release()


@pytest.mark.slow
def test_prefetcher_vs_dd(benchmark):
    path = qwen()
    size = os.path.getsize(path)
    dd_s: list[float] = []

    def drop_then_dd():  # pedantic's setup: untimed, before each prefetcher round
        dropped(path)
        cmd = ["dd", f"if={path}", "of=/dev/null", f"bs={DD_BS}", "iflag=direct"]
        dd_s.append(timeit.timeit(lambda: subprocess.run(cmd, check=True, capture_output=True), number=1))
        dropped(path)

    pool = paging.BufferPool(CHUNK, N_SLOTS)
    with paging.Prefetcher(path, n_workers=N_WORKERS, direct_io=True) as pf:
        assert pf.direct_io, "O_DIRECT could not be opened on this file system"
        benchmark.pedantic(
            read_through_prefetcher, args=(path, pool, pf, itertools.count()), setup=drop_then_dd, rounds=ROUNDS
        )
        stats = pf.stats()
    fd = os.open(path, os.O_RDONLY)
    left = cached_fraction(fd, size)  # O_DIRECT bypasses the page cache: only the buffered tail is there
    os.close(fd)

    pf_gbs = size / benchmark.stats["median"] / 1e9
    dd_gbs = size / statistics.median(dd_s) / 1e9
    ratio = pf_gbs / dd_gbs
    benchmark.extra_info.update(prefetcher_gb_s=pf_gbs, dd_direct_gb_s=dd_gbs, ratio=ratio)
    print(
        f"\n{os.path.basename(path)} ({size / 1e9:.2f} GB), median of {ROUNDS}, page cache dropped before each:"
        f"\n  prefetcher ({N_WORKERS} workers, {N_SLOTS} x {CHUNK >> 20} MiB slots, O_DIRECT) {pf_gbs:.3f} GB/s"
        f"\n  dd bs={DD_BS} iflag=direct                            {dd_gbs:.3f} GB/s"
        f"\n  ratio {ratio:.2f}  (rounds: prefetcher {[round(t, 3) for t in benchmark.stats.stats.data]} s, "
        f"dd {[round(t, 3) for t in dd_s]} s; {left:.4%} of the file cached after the prefetcher)"
    )
    assert stats["failed"] == 0 and stats["bytes"] == ROUNDS * size
    assert stats["direct_bytes"] == ROUNDS * (size // A * A), "some aligned reads went through the page cache"
    assert left < 0.001, "the prefetcher's reads went through the page cache, not O_DIRECT"
    assert ratio >= 0.9


@pytest.mark.parametrize("case", ["hit", "miss"])
def test_pool_acquire_release(benchmark, case):
    pool = paging.BufferPool(4096, 4)
    keys = itertools.repeat(0) if case == "hit" else itertools.cycle(range(pool.n_slots + 1))  # LRU: all miss
    before = pool.stats()

    def cycle():
        pool.acquire(next(keys)).release()

    benchmark(cycle)
    after = pool.stats()
    ns = benchmark.stats["mean"] * 1e9
    benchmark.extra_info["ns_per_op"] = ns
    print(f"\n  acquire+release ({case}): {ns:.0f} ns/op (median {benchmark.stats['median'] * 1e9:.0f} ns)")
    if case == "hit":
        assert after["misses"] - before["misses"] <= 1
    else:
        assert after["hits"] == before["hits"] and after["evictions"] > 0


VIEWS = {  # each makes one view of the whole slot (nbytes) and returns it
    "asarray": lambda slot, nbytes: np.asarray(slot),
    "memoryview": lambda slot, nbytes: memoryview(slot),
    "from_dlpack": lambda slot, nbytes: np.from_dlpack(slot),
    "paging.view": lambda slot, nbytes: paging.view(slot, np.float32, (nbytes // 4096, 1024)),
}


@pytest.mark.parametrize("kind", list(VIEWS))
def test_view_creation(benchmark, kind):
    """Per-call time on a 64 MiB slot (benchmarked) and a 4 KiB slot (timeit, best of 5): zero-copy, so equal."""
    small, big = paging.BufferPool(4 << 10, 1), paging.BufferPool(64 << 20, 1)
    s_small, s_big = small.acquire(0), big.acquire(0)
    n = 20000
    make = VIEWS[kind]
    t_small = min(timeit.repeat(lambda: make(s_small, 4 << 10), number=n, repeat=5)) / n
    v = benchmark(make, s_big, 64 << 20)
    assert memoryview(v).nbytes == 64 << 20
    del v  # a live view would make release() raise BufferError
    s_small.release()
    s_big.release()
    t_big = benchmark.stats["min"]
    benchmark.extra_info.update(ns_per_call_64MiB=t_big * 1e9, ns_per_call_4KiB=t_small * 1e9)
    print(f"\n  {kind:12} 64 MiB slot {t_big * 1e9:6.0f} ns/call, 4 KiB slot {t_small * 1e9:6.0f} ns/call")
    assert t_big < 3 * t_small + 1e-6  # no copy: the 16384x larger slot costs the same
