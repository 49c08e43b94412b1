"""Paged KV cache at a long context: decode speed with K/V spilled to host memory and to disk.

    python bench/kv.py [--model smollm2|qwen] [--ctx 8192] [--tokens 16] [--page-size 256] [--json PATH]

One run per configuration, each in a fresh model: the prompt (ctx - tokens - 8
tokens) is prefilled, then `tokens` tokens are decoded greedily and timed.
"spilled" is the share of layers whose K/V pages live off the device and
come into one of 3 streaming frames while their layer runs (a worker fills
the next two layers' frames ahead, async_prefetch); the other layers keep a
frame of their own (kv_device_layers = those + 3). "host" keeps
those pages in RAM; "disk" gives a host budget of 0 and a spill directory, so
every page goes through the spill file (buffered I/O: on this 24 GiB machine
the page cache serves the reads). Also reports page waste (allocated but
unused token slots / allocated).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np

from superggml import Model, models


def decode(m: Model, prompt: list[int], n: int) -> tuple[float, list[int]]:
    logits = m.eval(prompt)[-1]
    toks = []
    t0 = time.perf_counter()
    for _ in range(n):
        toks.append(int(np.argmax(logits)))
        logits = m.eval([toks[-1]])[-1]
    return n / (time.perf_counter() - t0), toks


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--ctx", type=int, default=8192)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--page-size", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json")
    a = ap.parse_args()
    path = str(models.qwen_path() if a.model == "qwen" else models.smollm2_path())
    prompt = [(i * 97) % 20000 + 100 for i in range(a.ctx - a.tokens - 8)]
    kw = dict(ctx_size=a.ctx, n_batch=512, n_threads=a.threads, repack=False)
    rows = []
    with Model(path, **kw) as m:
        base, ref = decode(m, prompt, a.tokens)
        n_layer = m.hparams.n_layer
        kv_mib = m.kv_bytes / 2**20
    print(
        f"{os.path.basename(path)}: ctx {a.ctx}, KV {kv_mib:.0f} MiB, pages of {a.page_size}, "
        f"{a.threads} threads; unpaged decode {base:.2f} tok/s"
    )
    print(f"{'tier':>6} {'spilled':>8} {'frames':>6} {'tok/s':>7} {'vs unpaged':>10} {'waste':>6} {'same tokens':>11}")
    for tier in ("host", "disk"):
        for share in (0.0, 0.5, 1.0):
            if tier == "disk" and share == 0.0:
                continue  # nothing leaves the device: same as host 0%
            resident = n_layer - round(share * n_layer)
            frames = n_layer if resident == n_layer else resident + 3
            with tempfile.TemporaryDirectory() as spill:
                extra = dict(host_budget=0, kv_spill_dir=spill) if tier == "disk" else {}
                with Model(
                    path,
                    **kw,
                    paged_kv=True,
                    kv_page_size=a.page_size,
                    kv_device_layers=frames,
                    async_prefetch=True,
                    **extra,
                ) as m:
                    tps, toks = decode(m, prompt, a.tokens)
                    st = m.stats()
            row = dict(
                tier=tier,
                spilled=(n_layer - st["kv_resident_layers"]) / n_layer,
                frames=frames,
                tok_s=tps,
                ratio=tps / base,
                waste=st["kv_page_waste"],
                same=toks == ref,
            )
            rows.append(row)
            print(
                f"{tier:>6} {row['spilled']:8.0%} {frames:>6} {tps:7.2f} {row['ratio']:10.2f} "
                f"{row['waste']:6.1%} {str(row['same']):>11}",
                flush=True,
            )
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"unpaged_tok_s": base, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
