"""Streaming cost on Qwen2.5-1.5B: budgets x prefetch, against the performance model.

    python bench/paging.py [--model qwen|smollm2] [--tokens 16] [--threads 2]

For each budget (100%, 50%, 25% of the blocks + lm head, and 1 slot) and
prefetch off/on: decode tokens/s, bytes streamed per token, the sustained
read bandwidth W measured in the same run (pread of the same file, same page
cache state), and overlap efficiency = max(T_compute, B / W) / T_measured,
where T_compute is the resident time per token and W the faster of a plain
pread loop and the loads' own bytes / read time. The file is in the page
cache here (24 GiB machine): W is memory-copy bandwidth, not disk.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

from superggml import Model, models


def read_bandwidth(path: str, nbytes: int = 1 << 30, chunk: int = 32 << 20) -> float:
    """Bytes/s of pread over the file into one reused buffer, like a prefetch worker."""
    buf = bytearray(chunk)
    size = os.path.getsize(path)
    done = 0
    t0 = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        off = 0
        while done < nbytes:
            f.seek(off)
            n = f.readinto(memoryview(buf))
            done += n
            off = (off + chunk) % max(size - chunk, 1)
    return done / (time.perf_counter() - t0)


def decode(m: Model, n: int) -> tuple[float, int, float]:
    """(seconds per token, bytes streamed per token, the loads' own read bandwidth in bytes/s)"""
    m.reset()
    m.eval(m.tokenize("def quicksort(xs):\n    "))
    pager = m._exec.pager
    s0 = pager.stats() if pager else {"bytes_loaded": 0, "read_seconds": 0.0}
    tok = int(np.argmax(m.logits))
    t0 = time.perf_counter()
    for _ in range(n):
        tok = int(np.argmax(m.eval([tok])[-1]))
    dt = (time.perf_counter() - t0) / n
    s1 = pager.stats() if pager else s0
    moved = s1["bytes_loaded"] - s0["bytes_loaded"]
    secs = s1["read_seconds"] - s0["read_seconds"]
    return dt, moved // n, (moved / secs if secs > 0 else float("nan"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen")
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    path = str(models.qwen_path() if a.model == "qwen" else models.smollm2_path())
    kw = dict(ctx_size=256, n_threads=a.threads, repack=False)
    with Model(path, **kw) as m:
        t_compute, _, _ = decode(m, a.tokens)
        slot = m._store.slot_bytes(m.arch.block_tensors(0))
        n_keys = m.hparams.n_layer + 1
    W = read_bandwidth(path)
    print(f"{os.path.basename(path)}: resident {1 / t_compute:.1f} tok/s (T_compute {t_compute * 1e3:.1f} ms), "
          f"read bandwidth W {W / 1e9:.2f} GB/s, slot {slot / 2**20:.1f} MiB")
    print(f"{'budget':>16} {'prefetch':>8} {'slots':>5} {'tok/s':>7} {'MB/token':>9} {'W_load GB/s':>11} "
          f"{'bound ms':>9} {'eff':>5}")
    n_chunks = None
    for label, n_slots in (("100%", None), ("50%", 0.5), ("25%", 0.25), ("1 slot", 1)):
        for prefetch in (False, True):
            with Model(path, ctx_size=256, n_threads=a.threads, device_budget=10**12, async_prefetch=prefetch) as m0:
                n_chunks = n_chunks or len(m0._exec.head_chunks)
            total = m0.hparams.n_layer + n_chunks
            slots = total if n_slots is None else (n_slots if isinstance(n_slots, int) else max(1, int(total * n_slots)))
            with Model(path, ctx_size=256, n_threads=a.threads, device_budget=int(slots * slot * 1.02),
                       async_prefetch=prefetch) as m:
                dt, bpt, w_load = decode(m, a.tokens)
                w = max(W, w_load) if w_load == w_load else W   # the faster of the two is achievable
                bound = max(t_compute, bpt / w)
                print(f"{label + ' (' + str(int(slots * slot * 1.02) >> 20) + ' MiB)':>16} {str(prefetch):>8} "
                      f"{m._exec.pager.n_slots:>5} {1 / dt:7.2f} {bpt / 1e6:9.1f} {w_load / 1e9:11.2f} "
                      f"{bound * 1e3:9.1f} {bound / dt:5.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
