"""Fuzz superggml's GGUF loading path: N structure-aware mutations of a seed GGUF (tests/support/fuzz_gguf.py).

    python bench/fuzz.py [--inputs 100000] [--seed 0] [--jobs 2]

Runs the inputs in child processes (`--jobs` of them, different seeds), each
with a watchdog: a crash (non-zero exit) or a hang (no progress for 60 s)
stops the run and keeps the input that caused it. Prints the outcomes
(ok, or the Python exception raised) and inputs per second.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
FUZZER = os.path.join(HERE, "..", "tests", "support", "fuzz_gguf.py")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--inputs", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=2)
    a = ap.parse_args()
    per = -(-a.inputs // a.jobs)
    t0 = time.perf_counter()
    procs = []
    for j in range(a.jobs):
        d = tempfile.mkdtemp(prefix=f"sgfuzz{j}-")
        p = subprocess.Popen(
            [sys.executable, FUZZER, str(per), str(a.seed + j), d],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            errors="replace",
        )
        procs.append((p, d))
    totals: dict[str, int] = {}
    bad = []
    for p, d in procs:
        last = ""
        for line in p.stdout:
            if line.startswith("progress"):
                last = line
        rc = p.wait()
        if rc != 0 or not last:
            bad.append((rc, d))
        for kv in last.split()[2:]:
            k, v = kv.split("=")
            totals[k] = totals.get(k, 0) + int(v)
    dt = time.perf_counter() - t0
    n = sum(totals.values())
    print(f"{n} inputs in {dt:.0f} s ({n / dt:.0f}/s): " + ", ".join(f"{k} {v}" for k, v in sorted(totals.items())))
    for rc, d in bad:
        print(f"FAILED: a child exited with {rc}; its last input is in {d}/current.gguf")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
