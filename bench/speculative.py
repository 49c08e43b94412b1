"""Speculative decoding against plain decoding, Qwen2.5-Coder-1.5B, streamed and resident, in one run.

    python bench/speculative.py [--tokens 96] [--budget 256MiB] [--limit ''] [--repeat 3] [--batch-invariant]
                                [--no-llama] [--json PATH]

Each (target, task) runs in a child process of its own, which alternates plain and speculative runs --repeat
times on the same model (a fresh speculator each time): the file in the page cache unless --limit, which runs it
in a memory cgroup of that size with the page cache dropped and O_DIRECT reads:
- code completion (a function to write), plain vs the Qwen2.5-Coder-0.5B draft model (resident);
- a rewrite-this-code prompt, plain vs prompt lookup (lookup_ngram 4);
each with the target streamed at device_budget --budget and resident. Greedy. By default drafts are checked with
llama.cpp's kernels, as llama.cpp checks them; --batch-invariant checks them bit-exactly, and then every
speculative text must equal the plain one (checked). Timed: generation after the prompt. Reports tokens/s,
the ratio to plain, acceptance, mean k, tokens per pass and bytes streamed per generated token; each the
median of --repeat runs. Beside the resident rewrite row, llama.cpp's own prompt lookup
(llama-cpp-python's LlamaPromptLookupDecoding, max_ngram_size --lookup-ngram, 2 and 10 tokens drafted)
against its plain decoding, in a child of its own.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "support"))

CODE = (
    "<|im_start|>user\nWrite a Python function that parses a CSV file of (name, age, city) rows and returns "
    "the average age per city, with a docstring and type hints.<|im_end|>\n<|im_start|>assistant\n"
)
REWRITE = (
    "<|im_start|>user\nRename the variable `data` to `records` in this code and change nothing else:\n\n"
    "```python\nimport json\n\n\ndef load(path):\n    with open(path) as f:\n        data = json.load(f)\n"
    "    out = []\n    for item in data:\n        if item.get(\"active\"):\n            out.append(item[\"name\"])\n"
    "    print(len(data), \"items\")\n    return sorted(out)\n\n\ndef save(path, data):\n    with open(path, \"w\") as f:\n"
    "        json.dump(data, f, indent=2)\n```<|im_end|>\n<|im_start|>assistant\n"
)

CHILD = r"""
import json, sys, time
from superggml import Model
from superggml.generation.speculative import DraftLength, Speculator
req = json.loads(sys.argv[1])
kw = dict(ctx_size=1024, n_threads=2, batch_invariant=req["batch_invariant"], **req["spec"])
if req["budget"]:
    kw.update(device_budget=req["budget"], async_prefetch=True)
if req.get("direct"):
    kw["direct_io"] = True
with Model(req["model"], **kw) as m:
    drafter, length = m.speculator.drafter, m.speculator.length
    toks = m.tokenize(req["prompt"], special=True)

    def one(speculate):
        # the same process for both: a fresh speculator (nothing learnt) or none
        m.speculator = Speculator(drafter, DraftLength(length.k_min, length.k_max, length.fixed)) if speculate else None
        m.reset()                          # the whole prompt in one pass each time, as in a fresh process
        gen = m.generate(toks, temp=0)
        out = [next(gen)]                  # the prompt's pass, not timed
        st0 = m.stats()
        t = time.perf_counter()
        for _ in range(req["tokens"] - 1):
            out.append(next(gen))
        dt = time.perf_counter() - t
        gen.close()
        st = m.stats()
        n = len(out) - 1
        return dict(tok_s=n / dt, tokens=out, bytes_per_token=(st.get("bytes_loaded", 0)
                    - st0.get("bytes_loaded", 0)) / n, acceptance=st.get("draft_acceptance"),
                    k=st.get("draft_k_mean"), per_pass=st.get("draft_tokens_per_pass"))

    runs = {"plain": [], "speculative": []}
    for _ in range(req["repeat"]):       # alternating
        runs["plain"].append(one(False))
        runs["speculative"].append(one(True))
    m.speculator = Speculator(drafter, length)
    print(json.dumps(runs))
"""

LLAMA_CHILD = r"""
import json, sys, time
import llama_cpp
from llama_cpp.llama_speculative import LlamaPromptLookupDecoding
req = json.loads(sys.argv[1])
runs = {}
for k in [0] + req["ks"]:
    llm = llama_cpp.Llama(req["model"], n_ctx=1024, n_threads=2, n_batch=512, verbose=False,
                          draft_model=LlamaPromptLookupDecoding(max_ngram_size=req["ngram"], num_pred_tokens=k)
                          if k else None)
    toks = llm.tokenize(req["prompt"].encode(), special=True)
    for _ in range(req["repeat"]):
        llm.reset()
        gen = llm.generate(toks, temp=0.0, top_k=1, repeat_penalty=1.0)
        out = [next(gen)]                  # the prompt's pass, not timed
        t = time.perf_counter()
        for _ in range(req["tokens"] - 1):
            out.append(next(gen))
        dt = time.perf_counter() - t
        gen.close()
        runs.setdefault(str(k), []).append(dict(tok_s=(len(out) - 1) / dt, tokens=out))
    llm.close()
print(json.dumps(runs))
"""


def run_llama(req: dict, timeout: float) -> dict:
    """llama.cpp's plain decoding and its prompt lookup (num_pred_tokens in req["ks"]): runs per k."""
    import subprocess

    r = subprocess.run(
        [sys.executable, "-c", LLAMA_CHILD, json.dumps(req)], capture_output=True, text=True, timeout=timeout
    )
    if r.returncode != 0:
        return dict(error=f"exit {r.returncode}: {r.stderr[-600:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def run(req: dict, limit: int | None, timeout: float) -> dict:
    import memcg

    r = memcg.run_maybe_limited([sys.executable, "-c", CHILD, json.dumps(req)], req["model"], limit, timeout)
    if r.returncode != 0:
        return dict(error=f"exit {r.returncode}: {r.stderr[-600:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def median_run(runs: list[dict]) -> dict:
    """The run of median tokens/s (an error if any run failed)."""
    bad = [r for r in runs if "error" in r]
    if bad:
        return bad[0]
    return sorted(runs, key=lambda r: r["tok_s"])[len(runs) // 2]


def llama_rows(req: dict, timeout: float) -> dict:
    """Prints llama.cpp's plain and prompt-lookup rows (the median run of each); returns them."""
    got = run_llama(req, timeout)
    label = "llama.cpp (llama-cpp-python)"
    if "error" in got:
        print(f"{label:<28} {got['error']}")
        return dict(llama=got)
    med = {k: median_run(v) for k, v in got.items()}
    plain = med["0"]
    for k, r in med.items():
        name = "plain" if k == "0" else f"lookup k={k}"
        same = "" if k == "0" else ("yes" if r["tokens"] == plain["tokens"] else "NO")
        print(
            f"{label:<28} {'rewrite':<16} {name:<11} {r['tok_s']:>7.2f} {r['tok_s'] / plain['tok_s']:>7.2f}x "
            f"{'':>7} {'':>5} {'':>8} {'':>9} {same:>7}",
            flush=True,
        )
    return dict(llama={k: dict(tok_s=r["tok_s"]) for k, r in med.items()})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--budget", default="256MiB")
    ap.add_argument("--limit", default="", help="memory cgroup for every row (O_DIRECT reads), e.g. 1GiB")
    ap.add_argument("--draft-max", type=int, default=16)
    ap.add_argument("--lookup-ngram", type=int, default=4)
    ap.add_argument("--resident", action=argparse.BooleanOptionalAction, default=True, help="the resident rows")
    ap.add_argument("--streamed", action=argparse.BooleanOptionalAction, default=True, help="the streamed rows")
    ap.add_argument("--timeout", type=float, default=3600)
    ap.add_argument("--repeat", type=int, default=3, help="runs of each row, plain and speculative alternating")
    ap.add_argument("--batch-invariant", action="store_true", help="check drafts bit-exactly (texts must equal plain)")
    ap.add_argument(
        "--llama",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="llama.cpp's own prompt lookup beside the resident rewrite row",
    )
    ap.add_argument("--json")
    a = ap.parse_args()

    from superggml import models
    from superggml.settings import parse_size

    path, draft = str(models.qwen_path()), str(models.qwen05_path())
    limit = int(parse_size(a.limit)) if a.limit else None
    tasks = [
        ("code completion", CODE, "0.5B draft", dict(draft_model=draft, draft_max=a.draft_max)),
        ("rewrite", REWRITE, f"lookup {a.lookup_ngram}", dict(lookup_ngram=a.lookup_ngram, draft_max=a.draft_max)),
    ]
    modes = [(f"streamed {a.budget}" + (f", cgroup {a.limit}" if a.limit else ""), a.budget)] if a.streamed else []
    if a.resident:
        modes.append(("resident", None))
    kernels = "batch_invariant" if a.batch_invariant else "llama.cpp's kernels"
    print(f"{os.path.basename(path)}: {a.tokens} greedy tokens, 2 threads, drafts checked with {kernels}", flush=True)
    print(
        f"{'mode':<28} {'task':<16} {'drafter':<11} {'tok/s':>7} {'vs plain':>8} {'accept':>7} {'k':>5} "
        f"{'tok/pass':>8} {'MB/token':>9} {'= plain':>7}"
    )
    results, ok = [], True
    for mode, budget in modes:
        for task, prompt, name, spec in tasks:
            base = dict(
                model=path,
                prompt=prompt,
                tokens=a.tokens,
                budget=budget,
                direct=bool(limit),
                batch_invariant=a.batch_invariant,
            )
            got = run(dict(base, spec=spec, repeat=a.repeat), limit, a.timeout)
            if "error" in got:
                plain = fast = got
            else:
                plain, fast = median_run(got["plain"]), median_run(got["speculative"])
            if "error" in plain or "error" in fast:
                print(f"{mode:<28} {task:<16} {name:<11} {plain.get('error') or fast.get('error')}")
                ok = False
                continue
            same = plain["tokens"] == fast["tokens"]
            ok &= same or not a.batch_invariant
            for label, r in (("plain", plain), (name, fast)):
                ratio = r["tok_s"] / plain["tok_s"]
                print(
                    f"{mode:<28} {task:<16} {label:<11} {r['tok_s']:>7.2f} {ratio:>7.2f}x "
                    f"{'' if r['acceptance'] is None else format(r['acceptance'], '.2f'):>7} "
                    f"{'' if r['k'] is None else format(r['k'], '.1f'):>5} "
                    f"{'' if r['per_pass'] is None else format(r['per_pass'], '.2f'):>8} "
                    f"{r['bytes_per_token'] / 1e6:>9.1f} {'yes' if same or label == 'plain' else 'NO':>7}",
                    flush=True,
                )
            results.append(dict(mode=mode, task=task, drafter=name, plain=plain, speculative=fast, equal=same))
            if a.llama and budget is None and task == "rewrite":
                results.append(
                    llama_rows(
                        dict(
                            model=path,
                            prompt=prompt,
                            tokens=a.tokens,
                            ngram=a.lookup_ngram,
                            ks=[2, 10],
                            repeat=a.repeat,
                        ),
                        a.timeout,
                    )
                )
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(model=path, draft=draft, tokens=a.tokens, results=results), f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
