"""ggml RPC servers as devices, over loopback: decode tokens/s, bytes moved per token and the share of time in
transfer, for the blocks resident on a server, streamed onto it through a device budget, and split (CPU + a
server, two servers). From the bytes per token it projects 1 Gbit/s and 10 Gbit/s links.

    python bench/rpc.py                      # Qwen2.5-Coder-1.5B Q4_K_M, 32 decoded tokens
    python bench/rpc.py --model smollm2 --tokens 64

The servers are `superggml rpc-server` processes on this machine (each with --server-threads), so the client
and the servers share its cores: a CPU figure, not a GPU one. "waiting for weights" is measured: the share of the
decode time the pass spent waiting for a streamed block's copy to the device before computing it. Transfer
time is estimated from the bytes the guard relay counted and the loopback throughput measured first (16 writes of a 32 MiB tensor, the size of a
streamed block, through the same relay); the link projection replaces that time with bytes / link speed, the rest (compute and the
commands' latency) kept: time per token = rest + bytes / link, no overlap assumed (a lower bound on speed).
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Any

import numpy as np

from superggml import Model, native, models
from superggml.commands.analyze import model_layout

PROMPT = "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"
LINKS = {"1 Gbit/s": 125e6, "10 Gbit/s": 1250e6}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(threads: int) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    p = subprocess.Popen(
        [sys.executable, "-m", "superggml", "rpc-server", "-p", str(port), "-t", str(threads)],
        stdout=subprocess.DEVNULL,
    )
    ep = f"127.0.0.1:{port}"
    for _ in range(300):
        try:
            native.rpc_probe(ep, connect_timeout=1.0)
            return p, ep
        except Exception:
            time.sleep(0.1)
    raise RuntimeError(f"rpc-server on {ep} did not come up")


def moved() -> int:
    return sum(int(v["bytes_sent"]) + int(v["bytes_received"]) for v in native.rpc_stats().values())


def loopback_throughput(ep: str, chunk: int = 32 << 20, n: int = 16) -> float:
    """Bytes/s of n slot-sized tensor writes through the relay to the server (as streamed blocks go), one
    read back checked."""
    dev = [d for d in native.rpc_add_server(ep) if d["endpoint"] == ep][0]["name"]
    b = native.Backend(dev, 1)
    cx = native.Context(max_tensors=1)
    t = cx.new_tensor(native.GGMLType.I32, [chunk // 4])
    buf = b.alloc_tensors(cx)
    data = np.arange(chunk // 4, dtype=np.int32)
    native.tensor_set(t, data)  # warm
    t0 = time.time()
    for i in range(n):
        native.tensor_set(t, data)
    dt = time.time() - t0
    assert np.array_equal(native.tensor_get(t), data)
    del buf
    return n * chunk / dt


def run(path: str, tokens: int, threads: int, **kw: Any) -> dict[str, Any]:
    t_load = time.time()
    with Model(path, ctx_size=512, n_threads=threads, repack=False, **kw) as m:
        load = time.time() - t_load
        toks = m.tokenize(PROMPT)
        m.eval(toks)
        t = int(np.argmax(m.scores[-1]))
        m.eval([t])  # warm: the decode plan is built
        t = int(np.argmax(m.scores[-1]))
        m.record_timings = True  # per step: the wait for its weights, its compute
        b0, waited = moved(), 0.0
        t0 = time.time()
        for _ in range(tokens):
            m.eval([t])
            waited += sum(x["wait_ms"] for x in m.timings) / 1e3
            t = int(np.argmax(m.scores[-1]))
        dt = time.time() - t0
        b1 = moved()
        st = m.stats()
    return dict(
        tok_s=tokens / dt,
        s_per_tok=dt / tokens,
        bytes_tok=(b1 - b0) / tokens,
        wait_share=waited / dt,
        load_s=load,
        devices=st["devices"],
        blocks=st["blocks_per_device"],
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen", help="qwen (1.5B, default), smollm2, or a GGUF path")
    ap.add_argument("--tokens", type=int, default=32, help="decoded tokens timed per run (default 32)")
    ap.add_argument("--threads", type=int, default=2, help="client compute threads (default 2)")
    ap.add_argument("--server-threads", type=int, default=2, help="each server's compute threads (default 2)")
    ap.add_argument("--budget-blocks", type=int, default=4, help="streamed runs: blocks the budget holds (default 4)")
    a = ap.parse_args()
    path = {"qwen": models.qwen_path, "smollm2": models.smollm2_path}.get(a.model, lambda: a.model)()
    path = str(path)
    lay = model_layout(path)
    budget = a.budget_blocks * lay.slot_bytes
    procs = [start_server(a.server_threads), start_server(a.server_threads)]
    (_, e1), (_, e2) = procs
    r1, r2 = f"RPC[{e1}]", f"RPC[{e2}]"
    try:
        bw = loopback_throughput(e1)
        print(
            f"model {os.path.basename(path)}: {lay.n_layer} blocks, slot {lay.slot_bytes / 2**20:.1f} MiB; "
            f"loopback through the relay: {bw / 1e9:.2f} GB/s; {a.tokens} decoded tokens per run\n"
        )
        runs = [
            ("CPU, resident (no RPC)", {}),
            ("RPC, resident", dict(devices=[r1])),
            (f"RPC, streamed ({a.budget_blocks}-block budget)", dict(devices=[r1], device_budget=budget)),
            ("CPU + RPC split, resident", dict(devices=["CPU", r1])),
            (
                f"RPC + RPC split, streamed ({a.budget_blocks} blocks each)",
                dict(devices=[r1, r2], device_budget=f"{budget},{budget}"),
            ),
        ]
        head = (
            "| run | tok/s | MB moved/token | waiting for weights | transfer (bytes / loopback) | load s | "
            + " | ".join(f"tok/s at {k}" for k in LINKS)
            + " |"
        )
        print(head)
        print("|" + "---|" * (6 + len(LINKS)))
        for name, kw in runs:
            r = run(path, a.tokens, a.threads, **kw)
            xfer = r["bytes_tok"] / bw
            rest = max(0.0, r["s_per_tok"] - xfer)
            proj = [1.0 / (rest + r["bytes_tok"] / v) if r["bytes_tok"] else r["tok_s"] for v in LINKS.values()]
            print(
                f"| {name} | {r['tok_s']:.2f} | {r['bytes_tok'] / 1e6:.1f} | {r['wait_share']:.0%} | "
                f"{min(1.0, xfer / r['s_per_tok']):.0%} | "
                f"{r['load_s']:.1f} | " + " | ".join(f"{p:.2f}" for p in proj) + " |",
                flush=True,
            )
    finally:
        for p, _ in procs:
            p.send_signal(signal.SIGKILL)
            p.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
