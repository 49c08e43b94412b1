"""Decode speed on a busy machine: a CPU hog on one core, each engine with its default threads.

    python bench/busy.py [--model qwen] [--tokens 32] [--rounds 3] [--no-hog]

The hog is a process spinning on the last CPU this process may use. Each round runs, in turn (the order rotates):
- superggml with no thread option (`superggml bench`, a child process): the physical cores, poll 0;
- the same with `--poll 50` (llama.cpp's default poll level);
- superggml `-t 1`;
- llama.cpp (llama-cpp-python, a child process) with its default threads (cpu_count // 2), and with llama-cli's
  (the physical cores).
A 16-token prompt, then --tokens decoded tokens; the table gives each setting's median tok/s and its ratio to the
better llama.cpp default.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "support"))

import llama_ref  # noqa: E402

from superggml import models  # noqa: E402
from superggml.settings import default_threads  # noqa: E402

PROMPT = [(i * 37) % 1000 + 100 for i in range(16)]


def hog(cpu: int) -> subprocess.Popen[bytes]:
    code = f"import os; os.sched_setaffinity(0, {{{cpu}}})\nwhile True: pass"
    return subprocess.Popen([sys.executable, "-c", code])


def superggml_tok_s(path: str, tokens: int, args: list[str]) -> float:
    cmd = [sys.executable, "-m", "superggml", "bench", "-m", path, "-p", "16", "-n", str(tokens), "-r", "1", "--json"]
    out = subprocess.run(cmd + args, capture_output=True, text=True, check=True).stdout
    return float(json.loads(out)["decode_tok_s"])


def llama_tok_s(path: str, tokens: int, threads: int) -> float:
    req = {"kind": "bench", "model": path, "prompt_tokens": PROMPT, "n_decode": tokens, "n_threads": threads}
    return tokens / float(llama_ref.run(req)["decode_s"][0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen", choices=["smollm2", "qwen", "qwen05"])
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-hog", action="store_true")
    a = ap.parse_args()
    path = str({"smollm2": models.smollm2_path, "qwen": models.qwen_path, "qwen05": models.qwen05_path}[a.model]())
    cores = default_threads()
    runs = {
        "superggml, defaults": lambda: superggml_tok_s(path, a.tokens, []),
        "superggml, --poll 50": lambda: superggml_tok_s(path, a.tokens, ["--poll", "50"]),
        "superggml, -t 1": lambda: superggml_tok_s(path, a.tokens, ["-t", "1"]),
        f"llama.cpp, llama-cpp-python's default ({max(1, (os.cpu_count() or 2) // 2)} threads)": lambda: llama_tok_s(
            path, a.tokens, max(1, (os.cpu_count() or 2) // 2)
        ),
        f"llama.cpp, llama-cli's default ({cores} threads)": lambda: llama_tok_s(path, a.tokens, cores),
    }
    cpus = sorted(os.sched_getaffinity(0))
    h = None if a.no_hog else hog(cpus[-1])
    got: dict[str, list[float]] = {k: [] for k in runs}
    try:
        time.sleep(0.5)
        names = list(runs)
        for r in range(a.rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                got[name].append(runs[name]())
                print(f"round {r}: {name}: {got[name][-1]:.2f} tok/s", file=sys.stderr, flush=True)
    finally:
        if h is not None:
            h.kill()
    med = {k: statistics.median(v) for k, v in got.items()}
    best_llama = max(v for k, v in med.items() if k.startswith("llama.cpp"))
    hogged = "no hog" if a.no_hog else f"a CPU hog on CPU {cpus[-1]}"
    print(f"{os.path.basename(path)}, {len(cpus)} CPUs, {hogged}, {a.tokens} decoded tokens, median of {a.rounds}")
    print("| setting | decode tok/s (each round) | vs the better llama.cpp default |")
    print("|---|---|---|")
    for k, v in med.items():
        each = ", ".join(f"{x:.2f}" for x in got[k])
        print(f"| {k} | {v:.2f} ({each}) | {v / best_llama:.2f}x |")


if __name__ == "__main__":
    main()
