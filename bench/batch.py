"""Many sequences per forward pass: aggregate generated tokens/s of 1 to 32 sequences, Qwen2.5-1.5B or SmolLM2.

    python bench/batch.py [--model qwen|smollm2|PATH] [--tokens 32] [--counts 1,2,4,8,16,32] [--flash-attn]
                          [--json PATH]

While weights stream, a pass costs about one read of the streamed bytes whatever the number of tokens in it,
so S sequences decoding together should come close to S times the tokens of one. Four tables, in one run,
each in a child process of its own:
- resident: every weight in memory;
- llama.cpp, resident: its batched decoding of the same prompts (one llama_decode per step over a batch of S
  sequence ids, as its examples/batched does), and then superggml's speedup over one sequence against llama.cpp's;
- streamed: device_budget 128 MiB (async prefetch), no memory limit;
- streamed in a memory cgroup of 256 MiB (page cache dropped first; O_DIRECT reads), budget 64 MiB.
For each count S: S different prompts (12-20 tokens) prefilled together, then `tokens` greedy tokens each,
every step one eval_batch of S tokens. Timed: the decode steps after the first. Reports aggregate tokens/s, the ratio to one
sequence, sequences and tokens per pass, bytes streamed per generated token, and whether every sequence's text
equals its text decoded alone (the S = 1 runs of the same prompts).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "support"))

PROMPTS = [
    "def quicksort(xs):\n    ",
    "The three laws of thermodynamics are",
    "import numpy as np\n\ndef moving_average(x, w):",
    "Write a haiku about the sea:",
    "class LinkedList:\n    def __init__(self):",
    "The capital of Australia is",
    "SELECT name, COUNT(*) FROM orders",
    "// A function that reverses a string in C\n",
    "Photosynthesis is the process by which",
    "fn main() {\n    let v = vec![1, 2, 3];",
    "The best way to learn a new language is",
    "#include <stdio.h>\nint main(void) {",
    "Once upon a time there was a robot who",
    "def is_prime(n: int) -> bool:",
    "In 1969, the Apollo 11 mission",
    "const express = require('express');\nconst app =",
]

CHILD = r"""
import json, sys, time
from superggml import Model, native
req = json.loads(sys.argv[1])
kw = dict(ctx_size=req["ctx"], n_threads=2, n_batch=256)
if req["budget"]:
    kw.update(device_budget=req["budget"], async_prefetch=True)
if req.get("invariant"):
    kw["batch_invariant"] = True
if req.get("flash_attn"):
    kw["flash_attn"] = True
if req.get("direct") is not None:
    kw["direct_io"] = req["direct"]
rows = []
with Model(req["model"], **kw) as m:
    toks = [m.tokenize(p) for p in req["prompts"]]
    for s in req["counts"]:
        ids = [100 + i for i in range(s)]
        st0 = m.stats()
        outs = m.eval_batch(list(zip(ids, toks[:s])))
        nxt = [int(o[-1].argmax()) for o in outs]
        texts = [[t] for t in nxt]
        for k in range(req["tokens"] - 1):
            if k == 1:                    # the first step of each count is a warm-up (its graph is built)
                st1 = m.stats()
                t = time.perf_counter()
            outs = m.eval_batch([(i, [x]) for i, x in zip(ids, nxt)])
            nxt = [int(o[-1].argmax()) for o in outs]
            for tx, x in zip(texts, nxt):
                tx.append(x)
        dt = time.perf_counter() - t
        st2 = m.stats()
        passes = st2["passes"] - st1["passes"]
        gen = s * (req["tokens"] - 2)
        rows.append(dict(sequences=s, decode_s=dt, tok_s=gen / dt, passes=passes,
                         sequences_per_pass=(st2["passes"] * st2["sequences_per_pass"]
                                             - st1["passes"] * st1["sequences_per_pass"]) / max(passes, 1),
                         bytes_per_token=(st2.get("bytes_loaded", 0) - st1.get("bytes_loaded", 0)) / gen,
                         rss=native.host_memory()["process_rss"], peak_rss=native.host_memory()["process_peak"],
                         tokens=texts))
        print(json.dumps(dict(row=rows[-1])), flush=True)          # a row survives an OOM kill of a later one
        for i in ids:
            m.drop_sequence(i)
    alone = []
    for tk in (toks if req.get("alone") else []):       # every prompt on its own, with eval
        m.reset()
        x = int(m.eval(tk)[-1].argmax())
        tx = [x]
        for _ in range(req["tokens"] - 1):
            x = int(m.eval([x])[-1].argmax())
            tx.append(x)
        alone.append(tx)
print(json.dumps(dict(alone=alone)))
"""

# llama.cpp's batched decoding (examples/batched): one llama_decode per step over a batch holding the next token of
# every sequence, each with its own sequence id (n_seq_max = S, per-sequence K/V streams, its default), through
# llama-cpp-python's low-level API; the same prompts, tokenized by llama.cpp, and greedy tokens.
LLAMA = r"""
import json, sys, time
import numpy as np
import llama_cpp as L
req = json.loads(sys.argv[1])
L.llama_backend_init()
model = L.llama_model_load_from_file(req["model"].encode(), L.llama_model_default_params())
vocab = L.llama_model_get_vocab(model)
n_vocab = L.llama_vocab_n_tokens(vocab)

def tokenize(text):
    buf = (L.llama_token * 512)()
    n = L.llama_tokenize(vocab, text.encode(), len(text.encode()), buf, 512, True, False)
    return list(buf[:n])

rows = []
for s in req["counts"]:
    cp = L.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch = s * req["ctx"], 256, 256
    cp.n_seq_max, cp.n_threads, cp.n_threads_batch = s, 2, 2
    cp.flash_attn_type = 1 if req.get("flash_attn") else 0    # as ours, not its default (auto: on, on the CPU)
    ctx = L.llama_init_from_model(model, cp)
    batch = L.llama_batch_init(max(256, s), 0, 1)
    toks = [tokenize(p) for p in req["prompts"][:s]]

    def decode(items):
        # items: (seq, pos, token, wants logits); returns the greedy token of each wanted row
        batch.n_tokens = len(items)
        for i, (q, pos, t, want) in enumerate(items):
            batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = t, pos, 1, want
            batch.seq_id[i][0] = q
        if L.llama_decode(ctx, batch) != 0:
            raise RuntimeError("llama_decode failed")
        return [int(np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, i), shape=(n_vocab,)).argmax())
                for i, it in enumerate(items) if it[3]]

    nxt = []
    for q, tk in enumerate(toks):            # prompts one sequence at a time, as the batched example does
        nxt += decode([(q, p, t, p == len(tk) - 1) for p, t in enumerate(tk)])
    pos = [len(tk) for tk in toks]
    for k in range(req["tokens"] - 1):
        if k == 1:                        # the first step is a warm-up, as superggml's
            t0 = time.perf_counter()
        nxt = decode([(q, pos[q], nxt[q], True) for q in range(s)])
        pos = [p + 1 for p in pos]
    dt = time.perf_counter() - t0
    rows.append(dict(sequences=s, decode_s=dt, tok_s=s * (req["tokens"] - 2) / dt))
    print(json.dumps(dict(row=rows[-1])), flush=True)
    L.llama_batch_free(batch)
    L.llama_free(ctx)
print(json.dumps(dict(alone=[])))
"""


def run(req: dict, limit: int | None, timeout: float) -> dict:
    import memcg

    script = LLAMA if req.get("llama") else CHILD
    r = memcg.run_maybe_limited([sys.executable, "-c", script, json.dumps(req)], req["model"], limit, timeout)
    lines = [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]
    rows = [x["row"] for x in lines if "row" in x]
    if r.returncode != 0:
        error = f"exit {r.returncode}" + (" (OOM-killed)" if r.returncode == -9 else "") + f": {r.stderr[-800:]}"
        return dict(rows=rows, alone=[], error=error)
    return dict(rows=rows, alone=lines[-1]["alone"])


def print_table(name: str, rows: list[dict], alone: list[list[int]]) -> None:
    print(f"\n{name}")
    one = rows[0]["tok_s"] if rows and rows[0]["sequences"] == 1 else None
    if rows and "tokens" not in rows[0]:  # llama.cpp's: tokens/s only
        print(f"{'sequences':>9} {'tok/s':>8} {'vs 1':>6}")
    else:
        print(
            f"{'sequences':>9} {'tok/s':>8} {'vs 1':>6} {'seq/pass':>8} {'MB/token':>9} {'peak RSS MiB':>12} "
            f"{'texts = alone':>13}"
        )
    for r in rows:
        r["vs_one"] = r["tok_s"] / one if one else float("nan")
        line = f"{r['sequences']:>9} {r['tok_s']:>8.2f} {r['vs_one']:>5.2f}x"
        if "tokens" in r:
            same = sum(t == alone[i] for i, t in enumerate(r["tokens"]) if i < len(alone))
            r["texts_equal_alone"] = same
            eq = f"{same}/{len(r['tokens'])}"
            line += (
                f" {r['sequences_per_pass']:>8.2f} {r['bytes_per_token'] / 1e6:>9.1f} "
                f"{r['peak_rss'] / 2**20:>12.0f} {eq:>13}"
            )
        print(line)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=32, help="tokens generated per sequence")
    ap.add_argument("--counts", default="1,2,4,8,16,32")
    ap.add_argument("--budget", default="128MiB", help="the streamed table's budget ('' skips it)")
    ap.add_argument("--limit", default="256MiB", help="the cgroup of the third table ('' skips it)")
    ap.add_argument(
        "--limit-budget",
        default="64MiB",
        help="device_budget in the cgroup (the tokenizer, K/V, logits and graphs need the rest)",
    )
    ap.add_argument("--limited-only", action="store_true", help="only the table in the cgroup")
    ap.add_argument(
        "--batch-invariant",
        action="store_true",
        help="batch_invariant=True: every sequence's logits as alone (ggml-cpu's reference kernels)",
    )
    ap.add_argument("--flash-attn", action="store_true", help="flash attention in both engines (default: off in both)")
    ap.add_argument("--model", default="qwen", help="qwen (Qwen2.5-Coder-1.5B Q4_K_M), smollm2, or a GGUF's path")
    ap.add_argument("--no-llama", action="store_true", help="skip llama.cpp's batched decoding (resident)")
    ap.add_argument("--timeout", type=float, default=3600)
    ap.add_argument("--json")
    a = ap.parse_args()

    from superggml import models
    from superggml.settings import parse_size

    named = {"qwen": models.qwen_path, "smollm2": models.smollm2_path}
    path = str(named[a.model]()) if a.model in named else a.model
    counts = [int(x) for x in a.counts.split(",")]
    prompts = [
        p if i < len(PROMPTS) else f"{p} (take {i // len(PROMPTS) + 1})"
        for i, p in ((i, PROMPTS[i % len(PROMPTS)]) for i in range(max(counts)))
    ]
    base = dict(
        model=path,
        prompts=prompts,
        counts=counts,
        tokens=a.tokens,
        ctx=64 + a.tokens,
        invariant=a.batch_invariant,
        flash_attn=a.flash_attn,
    )
    tables = [
        ("resident", dict(base, budget=None, alone=True), None),
        *([] if a.no_llama else [("llama.cpp, resident (batched llama_decode)", dict(base, llama=True), None)]),
        *([("streamed, device_budget " + a.budget, dict(base, budget=a.budget), None)] if a.budget else []),
    ]
    if a.limited_only:
        tables = []
    if a.limit:
        tables.append(
            (
                f"streamed, device_budget {a.limit_budget}, cgroup {a.limit}",
                dict(base, budget=a.limit_budget, direct=True),
                int(parse_size(a.limit)),
            )
        )
    print(
        f"{os.path.basename(path)}: {a.tokens} greedy tokens per sequence, 2 threads, flash attention "
        f"{'on' if a.flash_attn else 'off'}",
        flush=True,
    )
    results = {}
    ok = True
    alone: list[list[int]] = []
    if a.limited_only:  # the solo texts, resident (not timed)
        got = run(dict(base, budget=None, alone=True, counts=[1]), None, a.timeout)
        alone = got["alone"]
    for name, req, limit in tables:
        got = run(req, limit, a.timeout)
        results[name] = got
        alone = got["alone"] or alone
        print_table(name, got["rows"], alone)
        if "error" in got:
            print(f"  then {got['error']}")
            ok = False
    llama = results.get("llama.cpp, resident (batched llama_decode)")
    if llama is not None and results["resident"]["rows"] and llama["rows"]:
        print("\nspeedup over 1 sequence, resident: superggml's / llama.cpp's")
        for ours, theirs in zip(results["resident"]["rows"], llama["rows"]):
            print(
                f"{ours['sequences']:>9} {ours['vs_one']:>5.2f}x / {theirs['vs_one']:>5.2f}x = "
                f"{ours['vs_one'] / theirs['vs_one']:.2f}   (tok/s {ours['tok_s']:.2f} / {theirs['tok_s']:.2f})"
            )
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(model=path, tokens=a.tokens, results=results), f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
