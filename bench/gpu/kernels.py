"""One decoded token's kernels, superggml beside llama.cpp, from Nsight Compute (ncu).

    python3 bench/gpu/kernels.py MODEL.gguf OUTDIR          both engines under ncu: OUTDIR/{superggml,llama.cpp}.csv,
                                                            OUTDIR/kernels.json and kernels.md (the table side by side)
    python3 bench/gpu/kernels.py --token ENGINE MODEL.gguf  (the profiled child) a 32-token prompt, 8 decoded
                                                            tokens, then one more between cudaProfilerStart and Stop

ncu profiles only the range (--profile-from-start off), each kernel's gpu__time_duration, clocks and caches as
they are (--clock-control none --cache-control none); CUDA graphs' kernels one by one (--graph-profiling node).
"""

import csv
import ctypes
import io
import json
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ENGINES = ("superggml", "llama.cpp")
N_PROMPT, N_WARM = 32, 8


def profiled_token(feed):
    """A prompt and N_WARM decoded tokens through `feed` (an engine's eval), then one more token between
    cudaProfilerStart and Stop: the range ncu profiles."""
    lib = ctypes.CDLL("libcudart.so.13")
    feed(list(range(100, 100 + N_PROMPT)))
    for t in range(N_WARM):
        feed([200 + t])
    lib.cudaProfilerStart()
    feed([300])
    lib.cudaProfilerStop()


def token_superggml(path):
    from common import device_kw
    from superggml import Model

    with Model(path, ctx_size=1024, n_batch=512, flash_attn=False, device_budget="off", **device_kw()) as m:
        profiled_token(m.eval)


def token_llama(path):
    import llama_cpp

    llm = llama_cpp.Llama(
        model_path=path, n_gpu_layers=99, n_ctx=1024, n_batch=512, n_ubatch=512, flash_attn=False, verbose=False
    )
    profiled_token(llm.eval)


def short(name):
    """A kernel's name without its template arguments and parameters."""
    name = re.sub(r"\(.*\)$", "", name.strip())
    depth, out = 0, []
    for c in name:
        depth += c == "<"
        if not depth:
            out.append(c)
        depth -= c == ">" and depth > 0
    return re.sub(r"^void ", "", "".join(out)).strip()


def parse(text):
    """ncu's CSV: [(kernel, ns)] in launch order."""
    start = text.find('"ID"')
    if start < 0:
        return []
    rows = []
    for r in csv.DictReader(io.StringIO(text[start:])):
        if r.get("Metric Name") == "gpu__time_duration.sum":
            v = float(r["Metric Value"].replace(",", ""))
            unit = r.get("Metric Unit", "ns")
            rows.append(
                (
                    short(r["Kernel Name"]),
                    v * {"ns": 1, "nsecond": 1, "us": 1e3, "usecond": 1e3, "ms": 1e6, "msecond": 1e6}.get(unit, 1),
                )
            )
    return rows


def table(per):
    """{kernel: {engine: (count, us)}} sorted by the larger time, with totals."""
    names = {}
    for eng, rows in per.items():
        for k, ns in rows:
            c, t = names.setdefault(k, {}).get(eng, (0, 0.0))
            names[k][eng] = (c + 1, t + ns / 1e3)
    order = sorted(names, key=lambda k: -max(t for _, t in names[k].values()))
    return [(k, names[k]) for k in order]


def main():
    if sys.argv[1] == "--token":
        eng, path = sys.argv[2], sys.argv[3]
        (token_superggml if eng == "superggml" else token_llama)(path)
        return
    from common import reference

    path, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    ref = reference()
    per, errors = {}, {}
    for eng in ENGINES:
        env = ref["env"] if eng == "llama.cpp" else dict(os.environ)
        cmd = [
            "ncu",
            "--profile-from-start",
            "off",
            "--csv",
            "--metrics",
            "gpu__time_duration.sum",
            "--clock-control",
            "none",
            "--cache-control",
            "none",
            "--graph-profiling",
            "node",
            sys.executable,
            os.path.abspath(__file__),
            "--token",
            eng,
            path,
        ]
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=150, cwd=HERE)
        with open(os.path.join(out, f"{eng}.csv"), "w") as f:
            f.write(p.stdout)
        per[eng] = parse(p.stdout)
        if p.returncode or not per[eng]:
            errors[eng] = f"ncu rc {p.returncode}: {p.stderr[-1200:]}"
    rows = table(per)
    tot = {e: (len(per[e]), sum(ns for _, ns in per[e]) / 1e3) for e in ENGINES}
    res = {
        "model": os.path.basename(path),
        "totals": tot,
        "errors": errors,
        "kernels": [{"kernel": k, **{e: v.get(e, (0, 0.0)) for e in ENGINES}} for k, v in rows],
    }
    with open(os.path.join(out, "kernels.json"), "w") as f:
        json.dump(res, f, indent=1)
    md = [
        f"# One decoded token's kernels: {os.path.basename(path)} (ncu, gpu__time_duration)",
        "",
        "| kernel | superggml n | superggml us | llama.cpp n | llama.cpp us |",
        "|---|---|---|---|---|",
    ]
    md.append(
        f"| **all** | {tot['superggml'][0]} | {tot['superggml'][1]:.1f} | {tot['llama.cpp'][0]} | "
        f"{tot['llama.cpp'][1]:.1f} |"
    )
    for k, v in rows:
        a, b = v.get("superggml", (0, 0.0)), v.get("llama.cpp", (0, 0.0))
        md.append(f"| `{k[:90]}` | {a[0]} | {a[1]:.1f} | {b[0]} | {b[1]:.1f} |")
    with open(os.path.join(out, "kernels.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md[:40]))
    print(json.dumps({"totals": tot, "errors": errors}))


if __name__ == "__main__":
    main()
