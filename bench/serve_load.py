"""Load test of `superggml serve` on loopback: N concurrent streaming clients (server in its own process).

    python bench/serve_load.py [--clients 32] [--tokens 24] [--parallel 4] [--threads 2]

Every response must be complete ([DONE]) and equal to the first one (greedy); prints requests/s and
p50/p99 latency of whole responses.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np

from superggml import models


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--parallel", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    srv = subprocess.Popen([sys.executable, "-m", "superggml.cli", "serve", "-m", str(models.smollm2_path()),
                            "--port", str(port), "-c", "512", "-t", str(a.threads), "--parallel", str(a.parallel),
                            "--log-level", "warning"])
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)

        def one(_: int) -> tuple[str, float]:
            t0 = time.perf_counter()
            text, done = "", False
            with httpx.stream("POST", url + "/v1/completions", timeout=600,
                              json={"prompt": "The capital of France is", "max_tokens": a.tokens, "temperature": 0,
                                    "stream": True}) as r:
                for line in r.iter_lines():
                    if line == "data: [DONE]":
                        done = True
                    elif line.startswith("data: "):
                        text += json.loads(line[6:])["choices"][0]["text"]
            assert done and r.status_code == 200
            return text, time.perf_counter() - t0

        one(0)                                             # warm-up
        t0 = time.perf_counter()
        with ThreadPoolExecutor(a.clients) as ex:
            res = list(ex.map(one, range(a.clients)))
        wall = time.perf_counter() - t0
        lat = [x[1] for x in res]
        same = len({x[0] for x in res}) == 1
        print(f"{a.clients} streaming clients x {a.tokens} tokens, parallel {a.parallel}: "
              f"{a.clients / wall:.2f} requests/s ({a.clients * a.tokens / wall:.0f} tokens/s), "
              f"p50 {statistics.median(lat):.2f} s, p99 {np.percentile(lat, 99):.2f} s, all equal: {same}")
        return 0 if same else 1
    finally:
        srv.terminate()
        srv.wait(timeout=30)


if __name__ == "__main__":
    sys.exit(main())
