"""The expert cache against Belady's optimum, on a routing trace (Model.record_routing, runtime/weights/routing.py).

    python bench/expert_optimum.py [--shape qwen3-30b-a3b|deepseek-v2-lite] [--layers 8] [--cache 0.25] [--tokens 48]

A synthetic qwen3moe GGUF with the shape's expert count and experts per token (its other sizes small: the
routing is what is measured), zero-mean random weights. Two texts are decoded token by token, teacher-forced:
a repetitive one (a 12-token phrase over and over) and a varied one (random tokens). For each, with the expert
cache at `--cache` of the experts' bytes, lookahead on and off, it prints the cache's loads (misses and
prefetches that loaded) beside Belady's for the same slots, in total and per layer, and what the best fixed set
of experts (chosen in hindsight) loads: without locality, no policy blind to the future does much better.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "support"))

import gguf  # noqa: E402
import synth_gguf  # noqa: E402

from superggml import Model, models  # noqa: E402

SHAPES = {"qwen3-30b-a3b": (128, 8), "deepseek-v2-lite": (64, 6)}  # experts, experts per token


def texts(n: int) -> dict[str, list[int]]:
    rng = np.random.default_rng(0)
    phrase = [int(x) for x in rng.integers(0, 49152, 12)]
    return {"repetitive": (phrase * (n // 12 + 1))[:n], "varied": [int(x) for x in rng.integers(0, 49152, n)]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="qwen3-30b-a3b", choices=sorted(SHAPES))
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--cache", type=float, default=0.25, help="the expert cache, a share of the experts' bytes")
    ap.add_argument("--tokens", type=int, default=48)
    a = ap.parse_args()
    n_expert, k = SHAPES[a.shape]
    with tempfile.TemporaryDirectory() as tmp:
        path = synth_gguf.synth(
            os.path.join(tmp, "moe.gguf"),
            synth_gguf.vocab_fields(str(models.smollm2_path())),
            arch="qwen3moe",
            n_layer=a.layers,
            n_expert=n_expert,
            n_expert_used=k,
            n_ff_exp=64,
            wtype="q8_0",
        )
        experts = sum(int(t.n_bytes) for t in gguf.GGUFReader(path).tensors if "_exps" in t.name)
        print(f"{a.shape}: {a.layers} layers x {n_expert} experts, {k} per token; cache {a.cache:.0%} of the experts")
        print(
            f"{'text':<11} {'lookahead':<9} {'slots':>5} {'requests':>8} {'loads':>6} {'optimal':>7} {'fixed':>6} {'ratio':>6}  per layer (loads/optimal)"
        )
        for name, toks in texts(a.tokens).items():
            for ahead in (False, True):
                with Model(
                    path, ctx_size=256, n_threads=2, expert_cache=int(experts * a.cache), expert_lookahead=ahead
                ) as m:
                    m.eval(toks[:1])
                    m.record_routing()
                    for t in toks[1:]:
                        m.eval([t])
                    trace = m.record_routing(False)
                assert trace is not None
                t = trace.table()
                per = " ".join(f"{r['loads']}/{r['optimal']}" for r in t["layers"].values())
                tot = t["total"]
                print(
                    f"{name:<11} {str(ahead):<9} {t['n_slots']:>5} {tot['requests']:>8} {tot['loads']:>6} "
                    f"{tot['optimal']:>7} {tot['fixed']:>6} {t['ratio']:>6.2f}  {per}"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
