"""Load test of `superggml serve` on loopback: N concurrent streaming clients against one client alone.

    python bench/serve_load.py [--clients 16] [--tokens 16] [--device-budget 128MiB] [--limit 512MiB]
                               [--model qwen|smollm2|PATH] [--no-batch-invariant]

The server runs in its own process (default: Qwen2.5-Coder-1.5B with --device-budget 128MiB, async prefetch,
--parallel = clients, --batch-invariant), batching continuously: every engine step is one forward pass over the next token of
each running request. First each client's prompt (all different) runs alone, one request after another: its
solo text, and the tokens/s of one client. Then all the clients at once: every response must be complete
([DONE]) and equal its solo text; prints aggregate tokens/s, the ratio to one client, and p50/p99 latency of
whole responses, and of the time to the first token and between tokens, for one client and for all.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tests", "support"))

from batch import PROMPTS  # noqa: E402

from superggml import models  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--device-budget", default="128MiB", help="'' for all resident")
    ap.add_argument("--model", help="qwen (Qwen2.5-Coder-1.5B Q4_K_M, the default), smollm2 or a GGUF's path")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--no-batch-invariant",
        action="store_true",
        help="serve without --batch-invariant (faster kernels from 8 rows on, texts may differ from solo)",
    )
    ap.add_argument(
        "--limit",
        default="",
        help="run the server in a memory cgroup of this size, the model's pages "
        "dropped from the page cache first and read with O_DIRECT (a disk-bound pass)",
    )
    ap.add_argument("--json")
    a = ap.parse_args()
    a.model = {
        None: str(models.qwen_path()),
        "qwen": str(models.qwen_path()),
        "smollm2": str(models.smollm2_path()),
    }.get(a.model, a.model)
    with contextlib.ExitStack() as stack:
        enter = None
        if a.limit:
            import memcg
            from superggml.settings import parse_size

            memcg.drop_page_cache(a.model or str(models.qwen_path()))
            enter = stack.enter_context(memcg.limited(int(parse_size(a.limit))))
        return serve_load(a, enter)


def serve_load(a: argparse.Namespace, enter: Any) -> int:
    path = a.model or str(models.qwen_path())
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [
        sys.executable,
        "-m",
        "superggml.commands.cli",
        "serve",
        "-m",
        path,
        "--port",
        str(port),
        "-c",
        str(max(256, 64 + a.tokens)),
        "-t",
        str(a.threads),
        "--parallel",
        str(a.clients),
        "--log-level",
        "warning",
    ]
    if a.device_budget:
        cmd += ["--device-budget", a.device_budget, "--async-prefetch"]
    if not a.no_batch_invariant:
        cmd += ["--batch-invariant"]
    if a.limit:
        cmd += ["--direct-io", "on"]
    srv = subprocess.Popen(cmd, preexec_fn=enter)
    url = f"http://127.0.0.1:{port}"
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(a.clients)]
    try:
        for _ in range(600):
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)

        def one(i: int) -> tuple[str, float, int, list[float]]:
            """(text, seconds, tokens, when each token arrived after the request was sent)"""
            t0 = time.perf_counter()
            text, done, n, at = "", False, 0, []
            with httpx.stream(
                "POST",
                url + "/v1/completions",
                timeout=3600,
                json={"prompt": prompts[i], "max_tokens": a.tokens, "temperature": 0, "stream": True},
            ) as r:
                for line in r.iter_lines():
                    if line == "data: [DONE]":
                        done = True
                    elif line.startswith("data: "):
                        ch = json.loads(line[6:])["choices"][0]
                        text += ch["text"]
                        if ch["text"]:
                            n += 1
                            at.append(time.perf_counter() - t0)
            assert done and r.status_code == 200
            return text, time.perf_counter() - t0, n, at

        one(0)  # warm-up
        t0 = time.perf_counter()
        solo = [one(i) for i in range(a.clients)]
        solo_wall = time.perf_counter() - t0
        t0 = time.perf_counter()
        with ThreadPoolExecutor(a.clients) as ex:
            res = list(ex.map(one, range(a.clients)))
        wall = time.perf_counter() - t0
        metrics1 = httpx.get(url + "/v1/stats").json()
        lat = [x[1] for x in res]
        equal = sum(r[0] == s[0] for r, s in zip(res, solo))
        one_tok_s = sum(x[2] for x in solo) / solo_wall  # tokens: chunks with text, one per token
        all_tok_s = sum(x[2] for x in res) / wall
        print(
            f"{os.path.basename(path)}, device_budget {a.device_budget or 'none (resident)'}, {a.tokens} tokens "
            f"per request, {a.threads} threads" + (f", cgroup {a.limit} (O_DIRECT)" if a.limit else "")
        )
        print(
            f"1 client, requests one after another: {one_tok_s:.2f} tokens/s, p50 "
            f"{statistics.median(x[1] for x in solo):.2f} s per request"
        )
        print(
            f"{a.clients} concurrent streaming clients: {all_tok_s:.2f} tokens/s ({all_tok_s / one_tok_s:.2f}x), "
            f"p50 {statistics.median(lat):.2f} s, p99 {np.percentile(lat, 99):.2f} s; complete and equal to their "
            f"solo text: {equal}/{a.clients}; sequences per pass {metrics1.get('sequences_per_pass')}"
        )
        lat_ms = {}
        for label, runs in (("1 client", solo), (f"{a.clients} clients", res)):
            ttft = [x[3][0] * 1e3 for x in runs if x[3]]
            itl = [(b - c) * 1e3 for x in runs for b, c in zip(x[3][1:], x[3])]
            lat_ms[label] = dict(
                ttft_p50=float(np.percentile(ttft, 50)),
                ttft_p99=float(np.percentile(ttft, 99)),
                itl_p50=float(np.percentile(itl, 50)),
                itl_p99=float(np.percentile(itl, 99)),
            )
            print(
                f"{label:>11}: time to first token p50 {lat_ms[label]['ttft_p50']:.0f} ms, p99 "
                f"{lat_ms[label]['ttft_p99']:.0f} ms; per token p50 {lat_ms[label]['itl_p50']:.0f} ms, p99 "
                f"{lat_ms[label]['itl_p99']:.0f} ms"
            )
        if a.json:
            with open(a.json, "w") as f:
                json.dump(
                    dict(
                        model=path,
                        budget=a.device_budget,
                        limit=a.limit,
                        tokens=a.tokens,
                        clients=a.clients,
                        one_tok_s=one_tok_s,
                        all_tok_s=all_tok_s,
                        p50=statistics.median(lat),
                        p99=float(np.percentile(lat, 99)),
                        equal=equal,
                        latency_ms=lat_ms,
                    ),
                    f,
                    indent=1,
                )
        return 0 if equal == a.clients or a.no_batch_invariant else 1
    finally:
        srv.terminate()
        srv.wait(timeout=30)


if __name__ == "__main__":
    sys.exit(main())
