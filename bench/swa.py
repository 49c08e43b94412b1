"""Sliding-window layers with the paged KV cache: the K/V bytes freed at a long context.

    python bench/swa.py [--ctx 8192] [--window 512] [--tokens 16] [--page-size 256] [--json PATH]

A synthetic Gemma 3 with Gemma 3 1B's K/V shape (26 layers, one KV head of 256 dims, a 512-token window
on five layers of every six; small matmuls and SmolLM2's vocabulary, random Q8_0 weights, written by
tests/support/synth_gguf.py) prefills ctx - tokens tokens and decodes `tokens` more, with paged_kv: four device
frames, the other layers' pages in host memory. Once with swa_full (every page kept, as without sliding
windows), once as default (pages that left every window freed). Reports the K/V held in pages (host +
frames' share), the pages freed, the pages loaded into frames during the decode, decode tok/s, and whether
the logits of both runs are bit-identical.
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ctx", type=int, default=8192)
    ap.add_argument("--window", type=int, default=512)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--page-size", type=int, default=256)
    ap.add_argument("--frames", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json")
    a = ap.parse_args()
    U32 = synth_gguf.gguf.GGUFValueType.UINT32
    with tempfile.TemporaryDirectory() as tmp:
        path = synth_gguf.synth(
            os.path.join(tmp, "gemma3-1b-kv.gguf"),
            synth_gguf.vocab_fields(str(models.smollm2_path())),
            arch="gemma3",
            n_layer=26,
            n_embd=256,
            n_ff=512,
            n_head=1,
            n_head_kv=1,
            head_dim=256,
            wtype="q8_0",
            n_ctx_train=32768,
            keys={"attention.sliding_window": (a.window, U32)},
        )
        prompt = [(i * 97) % 20000 + 100 for i in range(a.ctx - a.tokens)]
        rows, logits = [], []
        for swa_full in (True, False):
            with Model(
                path,
                ctx_size=a.ctx,
                n_batch=512,
                n_threads=a.threads,
                paged_kv=True,
                kv_page_size=a.page_size,
                kv_device_layers=a.frames,
                async_prefetch=True,
                swa_full=swa_full,
            ) as m:
                t0 = time.perf_counter()
                out = [m.eval(prompt)[-1].copy()]
                t1 = time.perf_counter()
                loaded = m.stats()["kv_pages_loaded"]
                for _ in range(a.tokens):
                    out.append(m.eval([int(np.argmax(out[-1]))])[-1].copy())
                t2 = time.perf_counter()
                st = m.stats()
                page_bytes = m.runtime.memory.parts[0].core.page_bytes
                n_swa_layers = sum(m.arch.is_swa(il) for il in range(m.hparams.n_layer))
            held = st["kv_token_slots"] // a.page_size * page_bytes
            row = dict(
                swa_full=swa_full,
                kv_held_bytes=held,
                kv_host_bytes=st["kv_host_bytes"],
                kv_frame_bytes=st["kv_frame_bytes"],
                pages_forgotten=st["kv_pages_forgotten"],
                decode_pages_loaded=st["kv_pages_loaded"] - loaded,
                prefill_s=t1 - t0,
                decode_tok_s=a.tokens / (t2 - t1),
                n_swa_layers=n_swa_layers,
            )
            rows.append(row)
            logits.append(np.stack(out))
    same = bool(np.array_equal(logits[0], logits[1]))
    full, freed = rows
    saved = full["kv_held_bytes"] - freed["kv_held_bytes"]
    print(
        f"gemma3 (Gemma 3 1B's K/V: 26 layers, {rows[0]['n_swa_layers']} sliding over {a.window} tokens), "
        f"ctx {a.ctx}, pages of {a.page_size}, {a.frames} device frames, {a.threads} threads"
    )
    print(
        f"{'':>10} {'KV held':>10} {'host':>10} {'freed pages':>11} {'decode loads':>12} {'prefill s':>9} "
        f"{'decode tok/s':>12}"
    )
    for r in rows:
        print(
            f"{'swa_full' if r['swa_full'] else 'default':>10} {r['kv_held_bytes'] / 2**20:8.1f} MiB "
            f"{r['kv_host_bytes'] / 2**20:6.1f} MiB {r['pages_forgotten']:>11} {r['decode_pages_loaded']:>12} "
            f"{r['prefill_s']:9.1f} {r['decode_tok_s']:12.2f}"
        )
    print(
        f"KV bytes saved at {a.ctx}: {saved / 2**20:.1f} MiB of {full['kv_held_bytes'] / 2**20:.1f} MiB "
        f"({saved / full['kv_held_bytes']:.0%}); logits bit-identical: {same}"
    )
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"rows": rows, "saved_bytes": saved, "logits_identical": same}, f, indent=1)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
