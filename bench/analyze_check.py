"""How close `superggml analyze`'s predicted time per token is to the measured one.

    python bench/analyze_check.py [--model qwen|smollm2] [--tokens 8] [--threads 2]

For budgets of 50% and 25% of the blocks + lm head, with async prefetch and
both read modes (buffered, O_DIRECT): analyze's prediction (its own measured
compute time and read bandwidth, in this run) against the measured decode
time per token. Goal: within 25%.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

from superggml import Model, models
from superggml.analyze import analyze, model_layout


def measure(path: str, budget: int, direct: bool, n: int, threads: int) -> float:
    with Model(path, ctx_size=256, n_threads=threads, repack=False, device_budget=budget, async_prefetch=True,
               direct_io=direct) as m:
        m.eval(m.tokenize("def quicksort(xs):\n    "))
        tok = int(np.argmax(m.logits))
        tok = int(np.argmax(m.eval([tok])[-1]))      # one warm-up token
        t0 = time.perf_counter()
        for _ in range(n):
            tok = int(np.argmax(m.eval([tok])[-1]))
        return (time.perf_counter() - t0) / n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen")
    ap.add_argument("--tokens", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    path = str(models.qwen_path() if a.model == "qwen" else models.smollm2_path())
    lay = model_layout(path)
    n_keys = lay.n_layer + len(lay.head_chunk_bytes)
    budgets = {"50%": int(n_keys * 0.5) * lay.slot_bytes, "25%": int(n_keys * 0.25) * lay.slot_bytes}
    print(f"{os.path.basename(path)}, {a.threads} threads, async prefetch, {a.tokens} tokens")
    print(f"{'read':>9} {'budget':>7} {'predicted ms':>12} {'measured ms':>11} {'error':>7}")
    worst = 0.0
    for direct in (False, True):
        res = analyze(path, list(budgets.values()), n_threads=a.threads, direct_io=direct)
        for (label, b), plan in zip(budgets.items(), res.plans):
            t = measure(path, b, direct, a.tokens, a.threads)
            err = plan.predicted_s / t - 1
            worst = max(worst, abs(err))
            print(f"{'O_DIRECT' if direct else 'buffered':>9} {label:>7} {plan.predicted_s * 1e3:12.1f} "
                  f"{t * 1e3:11.1f} {err:+7.0%}", flush=True)
    print(f"largest error {worst:.0%} (goal: within 25%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
