"""Cold time to first token: superggml vs llama.cpp, side by side, page cache of the model dropped first.

    python bench/cold_start.py [--model qwen|qwen05|smollm2|PATH] [--runs 3] [--prompt TEXT]

Each run drops the GGUF's pages from the page cache (posix_fadvise DONTNEED; the
fraction still cached is checked with mincore), then times a fresh Python process
from its start through the first generated token (greedy), default options of
each engine: superggml.Model(path) and llama_cpp.Llama(model_path=path). The
engines alternate; the table gives the median of --runs. The floor is one
sequential read of the file (pread, 8 MiB at a time, one thread) after the same
drop; "2 readers" is the same read split over two threads.
"""

from __future__ import annotations

import argparse
import ctypes
import mmap
import os
import statistics
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))

CHILD = {
    "superggml": r"""
import sys, time
t0 = time.time()
import superggml
t1 = time.time()
m = superggml.Model(sys.argv[1])
t2 = time.time()
tok = next(m.generate(m.tokenize(sys.argv[2]), temp=0.0))
t3 = time.time()
print("FIRST", tok, f"import={t1 - t0:.3f} load={t2 - t1:.3f} first_token={t3 - t2:.3f}", flush=True)
""",
    "llama.cpp": r"""
import sys, time
t0 = time.time()
import llama_cpp
t1 = time.time()
m = llama_cpp.Llama(model_path=sys.argv[1], verbose=False)
t2 = time.time()
tok = next(m.generate(m.tokenize(sys.argv[2].encode()), temp=0.0))
t3 = time.time()
print("FIRST", tok, f"import={t1 - t0:.3f} load={t2 - t1:.3f} first_token={t3 - t2:.3f}", flush=True)
""",
}


def drop_cache(path: str) -> float:
    """Drops the file's clean pages from the page cache; returns the fraction still cached."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        return cached_fraction(fd, os.fstat(fd).st_size)
    finally:
        os.close(fd)


def cached_fraction(fd: int, size: int) -> float:
    import numpy as np

    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    m = mmap.mmap(fd, size, prot=mmap.PROT_READ)
    try:
        n = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
        vec = np.zeros(n, dtype=np.uint8)
        a = np.frombuffer(m, dtype=np.uint8)
        rc = libc.mincore(ctypes.c_void_p(a.ctypes.data), ctypes.c_size_t(size), ctypes.c_void_p(vec.ctypes.data))
        del a
        return float((vec & 1).mean()) if rc == 0 else float("nan")
    finally:
        m.close()


def read_file(path: str, n_threads: int) -> float:
    size = os.path.getsize(path)
    fd = os.open(path, os.O_RDONLY)
    per = -(-size // n_threads)

    def part(a: int, b: int) -> None:
        buf = bytearray(8 << 20)
        mv = memoryview(buf)
        while a < b:
            a += os.preadv(fd, [mv[: min(len(buf), b - a)]], a) or b

    ts = [threading.Thread(target=part, args=(i * per, min(size, (i + 1) * per))) for i in range(n_threads)]
    t0 = time.perf_counter()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    dt = time.perf_counter() - t0
    os.close(fd)
    return dt


def first_token(engine: str, path: str, prompt: str) -> tuple[float, str]:
    t0 = time.perf_counter()
    p = subprocess.Popen(
        [sys.executable, "-c", CHILD[engine], path, prompt], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    line = ""
    assert p.stdout is not None
    for line in p.stdout:
        if line.startswith("FIRST"):
            break
    dt = time.perf_counter() - t0
    p.communicate(timeout=120)
    if not line.startswith("FIRST"):
        raise RuntimeError(f"{engine} printed no token: {p.stderr}")
    return dt, line.split(maxsplit=2)[2].strip()


def model_path(name: str) -> str:
    from superggml import models

    return (
        str({"qwen": models.qwen_path, "qwen05": models.qwen05_path, "smollm2": models.smollm2_path}[name]())
        if name in ("qwen", "qwen05", "smollm2")
        else name
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--prompt", default="def fibonacci(n):")
    ap.add_argument("--engines", default="superggml,llama.cpp")
    a = ap.parse_args()
    path = model_path(a.model)
    size = os.path.getsize(path)
    engines = a.engines.split(",")
    times: dict[str, list[float]] = {e: [] for e in engines + ["read", "read2"]}
    for r in range(a.runs):
        for e in engines:
            left = drop_cache(path)
            if left > 0.01:
                raise SystemExit(
                    f"{left:.0%} of {path} stays in the page cache after the drop: another process "
                    "maps it (grep -l {path} /proc/*/maps)"
                )
            dt, detail = first_token(e, path, a.prompt)
            times[e].append(dt)
            print(f"run {r + 1} {e:10} {dt:6.3f} s  ({detail}; {left:.1%} cached before)", flush=True)
        drop_cache(path)
        times["read"].append(read_file(path, 1))
        drop_cache(path)
        times["read2"].append(read_file(path, 2))
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"\n{os.path.basename(path)} ({size / 2**30:.2f} GiB), median of {a.runs}, page cache dropped before each:")
    print(
        f"  floor: one sequential read {med['read']:.3f} s ({size / med['read'] / 1e9:.2f} GB/s); "
        f"2 readers {med['read2']:.3f} s"
    )
    for e in engines:
        print(f"  {e:10} cold time to first token {med[e]:.3f} s")
    if "superggml" in med and "llama.cpp" in med:
        print(
            f"  ratio superggml / llama.cpp = {med['superggml'] / med['llama.cpp']:.2f}; "
            f"superggml / one sequential read = {med['superggml'] / med['read']:.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
