"""How close `superggml analyze`'s predicted time per token is to the measured one.

    python bench/analyze_check.py [--model qwen|smollm2|PATH] [--tokens 8] [--threads 2] [--budgets 50%,25%]

For budgets of shares of the blocks + lm head (or sizes: 16GiB), with async
prefetch and both read modes (buffered, O_DIRECT): analyze's prediction, by
default (sampled blocks and reads) and with full=True (the whole model
streamed), each with its own measured compute time and read bandwidth in
this run, against the measured decode time per token, and how long each
analysis took. Goal: within 25%.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

from superggml import Model, models
from superggml.commands.analyze import analyze, model_layout


def measure(path: str, budget: int, direct: bool, n: int, threads: int) -> float:
    with Model(
        path, ctx_size=256, n_threads=threads, repack=False, device_budget=budget, async_prefetch=True, direct_io=direct
    ) as m:
        m.eval(m.tokenize("def quicksort(xs):\n    "))
        tok = int(np.argmax(m.logits))
        tok = int(np.argmax(m.eval([tok])[-1]))  # one warm-up token
        t0 = time.perf_counter()
        for _ in range(n):
            tok = int(np.argmax(m.eval([tok])[-1]))
        return (time.perf_counter() - t0) / n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen")
    ap.add_argument("--tokens", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--budgets", default="50%,25%")
    ap.add_argument("--modes", default="buffered,O_DIRECT")
    ap.add_argument("--no-full", action="store_true", help="only the default (sampled) analysis")
    a = ap.parse_args()
    from superggml.settings import parse_size

    path = {"qwen": str(models.qwen_path()), "smollm2": str(models.smollm2_path())}.get(a.model, a.model)
    lay = model_layout(path)
    n_keys = lay.n_layer + len(lay.head_chunk_bytes)
    budgets = {
        b: int(n_keys * float(b[:-1]) / 100) * lay.slot_bytes if b.endswith("%") else int(parse_size(b))
        for b in a.budgets.split(",")
    }
    print(f"{os.path.basename(path)}, {a.threads} threads, async prefetch, {a.tokens} tokens")
    print(
        f"{'read':>9} {'budget':>7} {'analysis':>8} {'took s':>7} {'predicted ms':>12} {'measured ms':>11} {'error':>7}"
    )
    worst = 0.0
    for direct in [m == "O_DIRECT" for m in a.modes.split(",")]:
        runs = [
            (m, analyze(path, list(budgets.values()), n_threads=a.threads, direct_io=direct, full=m == "full"))
            for m in (["sampled"] if a.no_full else ["sampled", "full"])
        ]
        for i, (label, b) in enumerate(budgets.items()):
            t = measure(path, b, direct, a.tokens, a.threads)
            for method, res in runs:
                plan = res.plans[i]
                err = plan.predicted_s / t - 1
                worst = max(worst, abs(err))
                print(
                    f"{'O_DIRECT' if direct else 'buffered':>9} {label:>7} {method:>8} {res.seconds:7.1f} "
                    f"{plan.predicted_s * 1e3:12.1f} {t * 1e3:11.1f} {err:+7.0%}",
                    flush=True,
                )
    print(f"largest error {worst:.0%} (goal: within 25%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
