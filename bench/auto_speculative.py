"""Default options in a memory cgroup: Qwen2.5-Coder-1.5B plain against speculative with the 0.5B draft.

    python bench/auto_speculative.py [--limit 1280MiB] [--tokens 64] [--repeat 2] [--budget 256MiB]

Each run is a child process in a new memory cgroup of --limit (tests/support/memcg.py), the model files' pages
dropped from the page cache first. The target gets no paging option: device_budget is "auto", which leaves the draft model's
memory to it (--budget: that device_budget instead). Prints the plan's line, the read mode it chose
(direct_io), generation tokens/s (after the prompt; greedy), the draft's acceptance and VmHWM.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "support"))

import memcg  # noqa: E402

from superggml import models  # noqa: E402
from superggml.settings import parse_size  # noqa: E402

PROMPT = (
    "<|im_start|>user\nWrite a Python function that parses a CSV file of (name, age, city) rows and returns "
    "the average age per city, with a docstring and type hints.<|im_end|>\n<|im_start|>assistant\n"
)

CHILD = r"""
import json, sys, time
from superggml import Model
req = json.loads(sys.argv[1])
m = Model(req["model"], **req["options"])
t0 = None
n = 0
for chunk in m.create_completion(req["prompt"], max_tokens=req["tokens"], temperature=0, stream=True):
    n += 1
    if t0 is None:
        t0 = time.perf_counter()      # the first token closes the prompt
dt = time.perf_counter() - t0
st = m.stats()
hwm = [l.split()[1] for l in open("/proc/self/status") if l.startswith("VmHWM")][0]
print(json.dumps({"tok_s": (n - 1) / dt, "n": n, "vmhwm_mib": int(hwm) / 1024,
                  "accepted": st.get("draft_accepted"), "drafted": st.get("draft_tokens"),
                  "steps": st.get("draft_steps"), "pass_s": st.get("draft_pass_s"),
                  "row_s": st.get("draft_pass_row_s"), "draft_token_s": st.get("draft_token_s"),
                  "streamed": st.get("n_slots", 0) > 0,
                  "draft_dropped": bool((st.get("budget") or {}).get("draft_dropped")),
                  "budget": st.get("budget"), "direct_io": m.settings.paging.direct_io}))
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--limit", default="1280MiB")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--draft-k", type=int, help="also a row drafting exactly this many tokens per step")
    ap.add_argument("--budget", help="the target's device_budget (default: auto)")
    a = ap.parse_args()
    target, draft = str(models.qwen_path()), str(models.qwen05_path())
    base = {"device_budget": a.budget} if a.budget else {}
    rows = {"plain": dict(base), "speculative (0.5B draft)": {**base, "draft_model": draft}}
    if a.draft_k:
        rows[f"speculative, draft_k={a.draft_k}"] = {**base, "draft_model": draft, "draft_k": a.draft_k}
    out: dict[str, list[dict]] = {k: [] for k in rows}
    for _ in range(a.repeat):
        for name, options in rows.items():
            for f in (target, draft):
                memcg.drop_page_cache(f)
            req = dict(model=target, options=options, prompt=PROMPT, tokens=a.tokens)
            r = memcg.run_limited([sys.executable, "-c", CHILD, json.dumps(req)], int(parse_size(a.limit)), 1800)
            if r.returncode != 0:
                print(f"{name}: exit {r.returncode}\n{r.stderr[-1500:]}")
                continue
            line = [x for x in r.stderr.splitlines() if "device budget" in x]
            res = json.loads(r.stdout.strip().splitlines()[-1])
            out[name].append(res)
            if res.get("draft_dropped"):
                name_note = " (the plan did not use the draft: it cannot pay for its memory)"
                print(f"{name}:{name_note}", flush=True)
            print(
                f"{name}: {res['tok_s']:.2f} tok/s, direct_io {res.get('direct_io')}, VmHWM {res['vmhwm_mib']:.0f} MiB, accepted "
                f"{res['accepted']}/{res['drafted']} in {res['steps']} steps (pass {res['pass_s'] or 0:.3f} s + "
                f"{res['row_s'] or 0:.3f} s/row, draft {res['draft_token_s'] or 0:.3f} s/token); "
                f"{line[0] if line else ('blocks stream' if res['streamed'] else 'all resident')}",
                flush=True,
            )
    what = f"device_budget {a.budget}" if a.budget else "default options"
    print(f"\n| {a.limit} cgroup, {what} | tokens/s (median of {a.repeat}) |\n|---|---|")
    for name, rs in out.items():
        if rs:
            print(f"| {name} | {statistics.median(r['tok_s'] for r in rs):.2f} |")


if __name__ == "__main__":
    main()
