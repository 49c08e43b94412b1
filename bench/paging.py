"""Streaming cost on Qwen2.5-1.5B: budgets x prefetch, against the performance model.

    python bench/paging.py [--model qwen|smollm2] [--tokens 16] [--threads 2] [--io buffered,direct]

For each read mode (buffered pread from the page cache; O_DIRECT from the
disk into the slot), budget (100%, 50%, 25% of the blocks + lm head, and 1
slot) and prefetch off/on: decode tokens/s, bytes streamed per token, the
sustained read bandwidth W of that mode measured in the same run (a plain
read loop over the same file), and overlap efficiency =
max(T_compute, B / W) / T_measured, where T_compute is the resident time per
token and W the faster of the read loop and the loads' own bytes / read time.
Buffered reads hit the page cache here (24 GiB machine): their W is memory
copy bandwidth, the same memory bus the computation needs.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import sys
import time

import numpy as np

from superggml import Model, models
from superggml.commands.analyze import model_layout


def read_bandwidth(path: str, direct: bool = False, nbytes: int = 1 << 30, chunk: int = 32 << 20) -> float:
    """Bytes/s of pread over the file into one reused buffer, like a prefetch worker
    (with O_DIRECT into a page-aligned buffer if `direct`)."""
    buf = mmap.mmap(-1, chunk)  # page aligned, as O_DIRECT needs
    size = os.path.getsize(path)
    done = 0
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECT if direct else 0))
    t0 = time.perf_counter()
    try:
        off = 0
        while done < nbytes:
            done += os.preadv(fd, [buf], off)
            off = (off + chunk) % max((size - chunk) // 4096 * 4096, 4096)
    finally:
        os.close(fd)
    return done / (time.perf_counter() - t0)


def decode(m: Model, n: int) -> tuple[float, int, float]:
    """(seconds per token, bytes streamed per token, the loads' own read bandwidth in bytes/s)"""
    m.reset()
    m.eval(m.tokenize("def quicksort(xs):\n    "))
    zero = {"bytes_loaded": 0, "read_seconds": 0.0}
    s0 = {**zero, **m.stats()}
    tok = int(np.argmax(m.logits))
    t0 = time.perf_counter()
    for _ in range(n):
        tok = int(np.argmax(m.eval([tok])[-1]))
    dt = (time.perf_counter() - t0) / n
    s1 = {**zero, **m.stats()}
    moved = s1["bytes_loaded"] - s0["bytes_loaded"]
    secs = s1["read_seconds"] - s0["read_seconds"]
    return dt, moved // n, (moved / secs if secs > 0 else float("nan"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen")
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--io", default="buffered,direct", help="read modes, comma separated")
    ap.add_argument("--json", help="also write the rows here")
    a = ap.parse_args()
    path = str(models.qwen_path() if a.model == "qwen" else models.smollm2_path())
    with Model(path, ctx_size=256, n_threads=a.threads, repack=False) as m:
        t_compute, _, _ = decode(m, a.tokens)
        n_keys = m.hparams.n_layer
    print(
        f"{os.path.basename(path)}: resident {1 / t_compute:.1f} tok/s (T_compute {t_compute * 1e3:.1f} ms), "
        f"{a.threads} threads, repack off (the streamed layout)"
    )
    print(
        f"{'io':>8} {'budget':>16} {'prefetch':>8} {'slots':>5} {'tok/s':>7} {'MB/token':>9} {'W GB/s':>7} "
        f"{'W_load':>7} {'bound ms':>9} {'eff':>5}"
    )
    rows = []
    for io in a.io.split(","):
        direct = io == "direct"
        W = read_bandwidth(path, direct)
        lay = model_layout(path)
        slot = lay.slot_bytes
        total = lay.n_layer + len(lay.head_chunk_bytes)  # blocks + lm head chunks
        for label, frac in (("100%", 1.0), ("50%", 0.5), ("25%", 0.25), ("1 slot", None)):
            for prefetch in (False, True):
                slots = 1 if frac is None else max(1, int(total * frac))
                budget = slots * slot
                with Model(
                    path,
                    ctx_size=256,
                    n_threads=a.threads,
                    device_budget=budget,
                    async_prefetch=prefetch,
                    direct_io=direct,
                ) as m:
                    dt, bpt, w_load = decode(m, a.tokens)
                    w = max(W, w_load) if w_load == w_load else W  # the faster of the two is achievable
                    bound = max(t_compute, bpt / w)
                    row = dict(
                        io=io,
                        budget=label,
                        budget_mib=budget >> 20,
                        prefetch=prefetch,
                        slots=m.stats()["n_slots"],
                        tok_s=1 / dt,
                        mb_per_token=bpt / 1e6,
                        w_gb_s=W / 1e9,
                        w_load_gb_s=w_load / 1e9,
                        bound_ms=bound * 1e3,
                        efficiency=bound / dt,
                    )
                rows.append(row)
                print(
                    f"{io:>8} {label + ' (' + str(budget >> 20) + ' MiB)':>16} {str(prefetch):>8} "
                    f"{row['slots']:>5} {row['tok_s']:7.2f} {row['mb_per_token']:9.1f} {row['w_gb_s']:7.2f} "
                    f"{row['w_load_gb_s']:7.2f} {row['bound_ms']:9.1f} {row['efficiency']:5.2f}",
                    flush=True,
                )
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"t_compute_ms": t_compute * 1e3, "n_blocks": n_keys, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
