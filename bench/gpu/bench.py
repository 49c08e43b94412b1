"""Prefill and decode speed of superggml and llama.cpp on one model, into OUT.json.

    python3 bench/gpu/bench.py MODEL.gguf resident|streamed OUT.json [RATE.json (streamed)]

resident: every weight on the device (device_budget "off"; llama.cpp -ngl 99): prefill 512 tokens and decode 64, each
from an empty context, the mean of 3 runs after a warm-up, as llama-bench measures (the prefill runs, then the decode
runs; llama-bench itself where it was built, else llama_cpp's API). streamed: device_budget a quarter of the weights: decode ms/token and prefill-512 time,
beside the bound (bytes streamed per token / the host-to-device rate of RATE.json) and llama.cpp with -ngl N, N the
blocks that fit in the same bytes; superggml streamed twice, with its default placement (auto: per pass, host or
device) and with every streamed block copied to the device (placement "device"), the auto placement's table kept.
A MoE model streamed also runs with its experts 4x the budget: superggml's expert cache on the device (the experts
it lacks placed by the cost model), against llama.cpp with every expert on the CPU (-ot exps=CPU) and with the
experts of the layers that do not fit there (--n-cpu-moe N).
"""

import json
import os
import subprocess
import sys
import time

import numpy as np

from common import THREADS, device_kw, device_name, error, reference, run_ref, sizes
from superggml import Model, native

N_PROMPT, N_GEN, REPS = 512, 64, 3
N_GEN_STREAMED, REPS_STREAMED = 16, 1
COUNTERS = ("bytes_loaded", "file_bytes", "host_bytes", "wait_seconds")  # the layer pager's


def prompt_tokens(n):
    return np.random.default_rng(1).integers(100, 40000, n).tolist()


def counters(m):
    st = m.stats()
    return np.array([float(st.get(k, 0)) for k in COUNTERS])


def superggml_speed(path, n_gen, reps, **kw):
    """pp and tg tok/s (means over reps, after a warm-up), and the pager's counters per pass and per token. As
    llama-bench runs them: the prefill reps one after another, then the decode reps, each from an empty context,
    after the load (superggml's runs in the background: it is waited for, as llama-bench's load ends before its
    warm-up; else the warm-up computes block by block as the weights arrive and the first rep builds the pass's
    graph)."""
    prompt = prompt_tokens(N_PROMPT)
    t0 = time.perf_counter()
    with Model(path, ctx_size=1024, n_batch=512, n_threads=THREADS, flash_attn=False, **device_kw(), **kw) as m:
        while m.stats()["weights_loading"] and time.perf_counter() - t0 < 120:
            time.sleep(0.005)
        load = time.perf_counter() - t0
        pp, tg, per_pass, per_token = [], [], [], []
        for rep in range(reps + 1):
            m.reset()
            c0, t0 = counters(m), time.perf_counter()
            m.eval(prompt)
            if rep:
                pp.append(N_PROMPT / (time.perf_counter() - t0))
                per_pass.append(counters(m) - c0)
        for rep in range(reps + 1):
            m.reset()
            c1, t1 = counters(m), time.perf_counter()
            for t in prompt[:n_gen]:
                m.eval([t])
            if rep:
                tg.append(n_gen / (time.perf_counter() - t1))
                per_token.append((counters(m) - c1) / n_gen)
        st = m.stats()
        info = {
            k: st[k]
            for k in ("n_slots", "slot_size", "layers_pinned", "host_slots", "direct_io", "placement", "budget")
            if k in st
        }
        info["pass_profile"] = st.get("pass_profile")
    per_pass, per_token = np.mean(per_pass, axis=0), np.mean(per_token, axis=0)
    return {
        "pp_tok_s": float(np.mean(pp)),
        "tg_tok_s": float(np.mean(tg)),
        "load_s": round(load, 2),
        "per_prefill": dict(zip(COUNTERS, per_pass.tolist())),
        "per_token": dict(zip(COUNTERS, per_token.tolist())),
        **info,
    }


def expert_bytes(path):
    """(bytes of the expert tensors, MoE layers): 0 for a dense model."""
    f = native.GGUFFile(path)
    try:
        t = [(name, int(nb)) for name, _, _, _, nb in f.tensors() if "_exps" in name]
    finally:
        f.close()
    return sum(nb for _, nb in t), len({name.split(".")[1] for name, _ in t})


def llama_speed(path, ngl, n_gen, reps, extra=()):
    """llama.cpp's pp and tg tok/s: llama-bench -o json where it was built, else ref.py (llama_cpp's API); `extra`:
    more llama-bench flags (-ot, --n-cpu-moe), llama-bench only."""
    ref = reference()
    if extra and not ref["llama_bench"]:
        raise RuntimeError(f"{' '.join(extra)} needs llama-bench, which this build lacks")
    if ref["llama_bench"]:
        cmd = [
            ref["llama_bench"],
            "-m",
            path,
            "-p",
            str(N_PROMPT),
            "-n",
            str(n_gen),
            "-ngl",
            str(ngl),
            "-fa",
            "0",
            "-r",
            str(reps),
            "-t",
            str(THREADS),
            "-o",
            "json",
            *extra,
        ]
        p = subprocess.run(cmd, env=ref["env"], capture_output=True, text=True, timeout=300)
        if p.returncode:
            raise RuntimeError(f"llama-bench rc {p.returncode}: {p.stderr[-1500:]}")
        rows = json.loads(p.stdout)
        pp = next(r["avg_ts"] for r in rows if r["n_prompt"] and not r["n_gen"])
        tg = next(r["avg_ts"] for r in rows if r["n_gen"] and not r["n_prompt"])
        return {"pp_tok_s": pp, "tg_tok_s": tg, "tool": "llama-bench", "ngl": ngl, "extra": list(extra)}
    r = run_ref(
        ref,
        {"kind": "bench", "model": path, "ngl": ngl, "n_ctx": 1024, "n_prompt": N_PROMPT, "n_gen": n_gen, "reps": reps},
        timeout=300,
    )
    return {"pp_tok_s": float(r["pp"].mean()), "tg_tok_s": float(r["tg"].mean()), "tool": "llama_cpp API", "ngl": ngl}


def save(res, out, what):
    with open(out, "w") as f:
        json.dump(res, f, indent=1)
    print(what, json.dumps(res), flush=True)


def main():
    path, mode, out = sys.argv[1], sys.argv[2], sys.argv[3]
    weights, block = sizes(path)
    res = {
        "model": os.path.basename(path).removesuffix(".gguf"),
        "mode": mode,
        "device": device_name(),
        "weights": weights,
        "errors": {},
    }
    streamed = mode == "streamed"
    n_gen, reps = (N_GEN_STREAMED, REPS_STREAMED) if streamed else (N_GEN, REPS)
    try:
        res["superggml"] = s = superggml_speed(path, n_gen, reps, device_budget=weights // 4 if streamed else "off")
        if streamed:
            with open(sys.argv[4]) as f:
                rate = json.load(f)
            res.update(
                budget=weights // 4,
                rate={"bytes_per_s": rate["bytes_per_s"], "source": rate["used"]},
                bound_ms_per_token=1000 * s["per_token"]["bytes_loaded"] / rate["bytes_per_s"],
                bound_prefill_s=s["per_prefill"]["bytes_loaded"] / rate["bytes_per_s"],
            )
    except Exception as e:
        res["errors"]["superggml"] = error(e)
    save(res, out, "superggml")
    if streamed:  # the default placement (auto) against every streamed block copied to the device
        try:
            res["superggml_copy"] = superggml_speed(path, n_gen, reps, device_budget=weights // 4, placement="device")
        except Exception as e:
            res["errors"]["superggml_copy"] = error(e)
        save(res, out, "superggml_copy")
    try:
        res["llama.cpp"] = llama_speed(path, min(weights // 4 // block, 99) if streamed else 99, n_gen, reps)
    except Exception as e:
        res["errors"]["llama.cpp"] = error(e)
    experts, moe_layers = expert_bytes(path)
    if streamed and experts:  # the experts 4x the budget: superggml's expert cache on the device, llama.cpp's experts
        budget = weights // 4  # on the CPU, all of them (-ot exps=CPU) or those of the layers that do not fit
        dense = weights - experts
        fit = max(0, min(moe_layers, (budget - dense) * moe_layers // max(experts, 1)))
        runs = {
            "superggml_experts": lambda: superggml_speed(
                path, n_gen, reps, expert_cache=max(budget - dense, experts // 8)
            ),
            "llama.cpp_ot": lambda: llama_speed(path, 99, n_gen, reps, ("-ot", "exps=CPU")),
            "llama.cpp_ncmoe": lambda: llama_speed(path, 99, n_gen, reps, ("--n-cpu-moe", str(moe_layers - fit))),
        }
        for name, fn in runs.items():
            try:
                res[name] = fn()
            except Exception as e:
                res["errors"][name] = error(e)
            save(res, out, name)
    if "pp_tok_s" in res.get("superggml", {}) and "llama.cpp" in res:
        res["ratio_pp"] = res["superggml"]["pp_tok_s"] / res["llama.cpp"]["pp_tok_s"]
        res["ratio_tg"] = res["superggml"]["tg_tok_s"] / res["llama.cpp"]["tg_tok_s"]
    save(res, out, "llama.cpp")


if __name__ == "__main__":
    main()
