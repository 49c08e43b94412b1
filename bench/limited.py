"""superggml and llama.cpp under the same real RAM limit (a child memory cgroup), Qwen2.5-1.5B.

    python bench/limited.py [--limit 768MiB] [--budget 512MiB] [--tokens 8]

superggml runs twice: with buffered reads (through the page cache, which
the limit squeezes) and with O_DIRECT reads (direct_io; the default when the
file is larger than the memory available, as here).

Before each run the model's pages are dropped from the page cache, so the
limit covers file-backed memory too (docs/design.md). Prints decode tokens/s, or
how the run ended (OOM-killed: -9).
"""

from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "support"))

import llama_ref  # noqa: E402
import memcg  # noqa: E402

from superggml import models  # noqa: E402
from superggml.settings import parse_size  # noqa: E402

OURS = r"""
import sys, time
from superggml import Model
m = Model(sys.argv[1], ctx_size=256, n_batch=32, n_threads=2, device_budget=sys.argv[2], async_prefetch=True,
          direct_io=sys.argv[4] == "direct")
m.eval(m.tokenize("def quicksort(xs):\n    "))
tok = int(m.logits.argmax()); n = int(sys.argv[3])
t = time.perf_counter()
for _ in range(n):
    tok = int(m.eval([tok])[-1].argmax())
print(n / (time.perf_counter() - t))
"""

PROMPT = "def quicksort(xs):\n    "  # OURS's


def run(code: str, path: str, budget: str, n: int, limit: int, io: str = "") -> str:
    memcg.drop_page_cache(path)
    r = memcg.run_limited([sys.executable, "-c", code, path, budget, str(n), io], limit, timeout=3600)
    if r.returncode != 0:
        return f"exit {r.returncode}" + (" (OOM-killed)" if r.returncode == -9 else "")
    return f"{float(r.stdout.split()[-1]):.2f} tok/s"


def run_llama(path: str, n: int, limit: int) -> str:
    """llama.cpp's default (mmap, CPU repack) in tests/support/llama_ref.py's child (its "bench" request): the prompt,
    then n greedy tokens timed."""
    req = {"kind": "bench", "model": path, "prompt": PROMPT, "n_decode": n, "n_ctx": 256, "n_threads": 2}
    try:
        r = llama_ref.run(req, timeout=3600, which="pip", limit=limit)
    except llama_ref.ChildFailed as e:
        return e.exit
    return f"{n / float(r['decode_s'][0]):.2f} tok/s"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--limit", default="768MiB")
    ap.add_argument("--budget", default="512MiB")
    ap.add_argument("--tokens", type=int, default=8)
    a = ap.parse_args()
    path = str(models.qwen_path())
    limit = parse_size(a.limit)
    print(f"Qwen2.5-1.5B Q4_K_M, cgroup limit {a.limit}, 2 threads, {a.tokens} decoded tokens")
    for io in ("buffered", "direct"):
        print(
            f"  superggml (device_budget {a.budget}, async prefetch, {io:>8} reads): "
            f"{run(OURS, path, a.budget, a.tokens, limit, io)}",
            flush=True,
        )
    print(f"  llama.cpp (default: mmap + CPU repack): {run_llama(path, a.tokens, limit)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
