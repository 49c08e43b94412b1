"""superggml vs llama.cpp: prefill and decode tokens/s side by side, in one run.

    python bench/compare.py [--models smollm2,qwen,qwen05] [--threads 2] [--prompt-tokens 128] [--decode 64]
                            [--repeats 5] [--rounds 1]

llama.cpp (llama-cpp-python) runs in a child process (its ggml libraries
clash with superggml's in one process); both see the same GGUF, the same
token ids and the same thread count, everything resident (each engine's default: CPU
repack on). Each figure is the median of --repeats (after one warm-up run), and the
engines alternate (which goes first, too) --rounds times so a slow spell of the machine
hits both.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "support"))
sys.path.insert(0, HERE)

import llama_ref  # noqa: E402

from superggml import Model, models  # noqa: E402

PROMPT = (
    "def quicksort(xs):\n    \"\"\"Sort a list.\"\"\"\n    if len(xs) <= 1:\n        return xs\n"
    "    pivot = xs[len(xs) // 2]\n"
) * 20


def model_paths(names: list[str]) -> dict[str, str]:
    out = {}
    for n in names:
        out[n] = str({"smollm2": models.smollm2_path, "qwen": models.qwen_path, "qwen05": models.qwen05_path}[n]())
    return out


def bench_superggml(path: str, toks: list[int], n_decode: int, threads: int, repeats: int) -> tuple[list, list]:
    with Model(path, ctx_size=1024, n_threads=threads) as m:
        pre, dec = [], []
        for _ in range(repeats + 1):  # the first is a warm-up
            m.reset()
            t0 = time.perf_counter()
            logits = m.eval(toks)[-1]
            t1 = time.perf_counter()
            tok = int(np.argmax(logits))
            for _ in range(n_decode):
                tok = int(np.argmax(m.eval([tok])[-1]))
            t2 = time.perf_counter()
            pre.append(len(toks) / (t1 - t0))
            dec.append(n_decode / (t2 - t1))
    return pre[1:], dec[1:]


def bench_llama(path: str, toks: list[int], n_decode: int, threads: int, repeats: int) -> tuple[list, list]:
    r = llama_ref.run(
        {
            "kind": "bench",
            "model": path,
            "prompt_tokens": toks,
            "n_decode": n_decode,
            "n_threads": threads,
            "n_ctx": 1024,
            "repeats": repeats + 1,
        }
    )
    return [len(toks) / float(x) for x in r["prefill_s"][1:]], [n_decode / float(x) for x in r["decode_s"][1:]]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="smollm2,qwen")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=1)
    a = ap.parse_args()
    rows = []
    for name, path in model_paths(a.models.split(",")).items():
        with Model(path, ctx_size=1024) as m:
            toks = m.tokenize(PROMPT)[: a.prompt_tokens]
        runs: dict[str, list[float]] = {"sp": [], "sd": [], "lp": [], "ld": []}
        for r in range(a.rounds):  # alternating which engine goes first
            if r % 2 == 0:
                sp, sd = bench_superggml(path, toks, a.decode, a.threads, a.repeats)
                lp, ld = bench_llama(path, toks, a.decode, a.threads, a.repeats)
            else:
                lp, ld = bench_llama(path, toks, a.decode, a.threads, a.repeats)
                sp, sd = bench_superggml(path, toks, a.decode, a.threads, a.repeats)
            for k, v in zip(("sp", "sd", "lp", "ld"), (sp, sd, lp, ld)):
                runs[k] += v
        print(f"{name}: " + "; ".join(f"{k} " + " ".join(f"{x:.1f}" for x in v) for k, v in runs.items()), flush=True)
        rows.append((name, *(float(np.median(runs[k])) for k in ("sp", "lp", "sd", "ld"))))
    print(f"{'model':10} {'prefill tok/s':>28} {'decode tok/s':>28}")
    print(f"{'':10} {'superggml':>9} {'llama.cpp':>9} {'ratio':>8} {'superggml':>9} {'llama.cpp':>9} {'ratio':>8}")
    for name, sp, lp, sd, ld in rows:
        print(f"{name:10} {sp:9.1f} {lp:9.1f} {sp / lp:8.2f} {sd:9.1f} {ld:9.1f} {sd / ld:8.2f}")
    print(
        f"({a.threads} threads, {a.prompt_tokens} prompt tokens, {a.decode} decoded, median of {a.repeats * a.rounds})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
