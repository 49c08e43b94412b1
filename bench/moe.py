"""Mixture of experts with the expert cache: hit rates, bytes read per token and the router lookahead.

    python bench/moe.py [--layers 8] [--experts 32] [--used 4] [--cache 0.25] [--tokens 64] [--json PATH]

A synthetic qwen3moe (tests/support/synth_gguf.py: random Q8_0 experts, SmolLM2's vocabulary) decodes `tokens`
teacher-forced tokens one at a time after a 16-token prompt, with an expert cache of `cache` of the expert
bytes. The token stream has a set temporal locality: each token repeats the previous one with probability
0, 0.5 or 0.9 (a repeated token routes to the same experts, as real text's runs of related tokens route to
similar ones; random routers route uniformly otherwise). For each locality, with the lookahead off and on:
the cache's hit rate, the expert bytes read per token against the routed-experts floor (every routed expert
read: what streaming experts without a cache costs; streaming whole blocks costs n_expert / used times that),
the lookahead's precision and recall, and decode tok/s. Every run's logits equal the all-resident run's.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "support"))

import synth_gguf  # noqa: E402
from superggml import Model, models  # noqa: E402


def stream(n: int, locality: float, seed: int) -> list[int]:
    rng = np.random.default_rng(seed)
    out = [int(rng.integers(100, 40000))]
    for _ in range(n - 1):
        out.append(out[-1] if rng.random() < locality else int(rng.integers(100, 40000)))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--experts", type=int, default=32)
    ap.add_argument("--used", type=int, default=4)
    ap.add_argument("--cache", type=float, default=0.25, help="share of the expert bytes the cache holds")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json")
    a = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        path = synth_gguf.synth(
            os.path.join(tmp, "moe.gguf"),
            synth_gguf.vocab_fields(str(models.smollm2_path())),
            arch="qwen3moe",
            tied=False,
            n_layer=a.layers,
            n_embd=256,
            n_ff=256,
            n_ff_exp=256,
            n_expert=a.experts,
            n_expert_used=a.used,
            wtype="q8_0",
        )
        import gguf

        expert_total = sum(int(t.n_bytes) for t in gguf.GGUFReader(path).tensors if "_exps" in t.name)
        per_expert = expert_total // (a.layers * a.experts)
        floor = a.layers * a.used * per_expert
        for locality in (0.0, 0.5, 0.9):
            toks = stream(16 + a.tokens, locality, seed=int(locality * 10))
            with Model(path, ctx_size=256, n_threads=a.threads) as m:
                m.eval(toks[:16])
                ref = np.stack([m.eval([t])[-1].copy() for t in toks[16:]])
            for lookahead in (False, True):
                with Model(
                    path,
                    ctx_size=256,
                    n_threads=a.threads,
                    n_batch=16,
                    expert_cache=int(expert_total * a.cache),
                    expert_lookahead=lookahead,
                ) as m:
                    m.eval(toks[:16])
                    s0 = m.stats()
                    t0 = time.perf_counter()
                    out = np.stack([m.eval([t])[-1].copy() for t in toks[16:]])
                    dt = time.perf_counter() - t0
                    s1 = m.stats()
                hits = s1["expert_hits"] - s0["expert_hits"]
                misses = s1["expert_misses"] - s0["expert_misses"]
                read = (s1["expert_bytes_loaded"] - s0["expert_bytes_loaded"]) / a.tokens
                row = dict(
                    locality=locality,
                    lookahead=lookahead,
                    hit_rate=hits / max(hits + misses, 1),
                    bytes_per_token=read,
                    floor_bytes_per_token=floor,
                    read_vs_floor=read / floor,
                    precision=s1["expert_lookahead_precision"],
                    recall=s1["expert_lookahead_recall"],
                    tok_s=a.tokens / dt,
                    identical=bool(np.array_equal(out, ref)),
                )
                rows.append(row)
    print(
        f"qwen3moe synthetic: {a.layers} layers x {a.experts} experts, {a.used} per token, "
        f"{per_expert / 1024:.0f} KiB per expert; cache {a.cache:.0%} of {expert_total / 2**20:.1f} MiB; "
        f"{a.tokens} decoded tokens, {a.threads} threads"
    )
    print(
        f"{'locality':>8} {'lookahead':>9} {'hit rate':>8} {'KiB/token':>9} {'vs floor':>8} {'precision':>9} "
        f"{'recall':>6} {'tok/s':>7} {'identical':>9}"
    )
    for r in rows:
        print(
            f"{r['locality']:8.1f} {str(r['lookahead']):>9} {r['hit_rate']:8.1%} {r['bytes_per_token'] / 1024:9.0f} "
            f"{r['read_vs_floor']:8.2f} {r['precision']:9.2f} {r['recall']:6.2f} {r['tok_s']:7.1f} "
            f"{str(r['identical']):>9}"
        )
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0 if all(r["identical"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
