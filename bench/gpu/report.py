"""RESULTS_DIR/results.json and results.md from what run.sh's steps left in RESULTS_DIR/logs.

python3 bench/gpu/report.py RESULTS_DIR
"""

import json
import os
import sys

MB = 1e6


def load(path):
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        return json.load(f)


def last_line(path):
    if not os.path.exists(path):
        return "(no log)"
    with open(path, errors="replace") as f:
        rows = [x.strip() for x in f if x.strip()]
    return rows[-1][:300] if rows else "(empty log)"


def fmt(x, spec=".3g"):
    if x is None:
        return "-"
    return format(x, spec) if isinstance(x, (int, float)) and not isinstance(x, bool) else str(x)


def ms(d):
    return 1000 / d["tg_tok_s"] if d.get("tg_tok_s") else None


def pp(d):
    return 512 / d["pp_tok_s"] if d.get("pp_tok_s") else None


def problems(r, rc):
    """A row's errors, and its step's exit status where it failed (124: stopped at its time limit)."""
    out = [f"step rc {rc}"] if rc != "0" else []
    return "; ".join(out + [f"{k}: {v.splitlines()[-1][:200]}" for k, v in r.get("errors", {}).items()]) or "-"


def check_rows(runs):
    out = [
        "| model | max abs dlogit (max abs logit) | argmax agree | 64 greedy tokens equal | streamed = resident, "
        "bit for bit (logits, greedy) | streamed pinned/slots | GPU vs CPU: superggml, llama.cpp (CPUs apart) | "
        "problems |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, c, rc in runs:
        s = c.get("streamed", {})
        st = f"{fmt(s.get('logits_equal'))}, {fmt(s.get('greedy_equal'))}" if s else "-"
        eq = c.get("greedy_equal")
        greedy = "-" if eq is None else "yes" if eq else f"no (first {c['greedy_same_prefix']} equal)"
        x = c.get("cross_backend", {})
        gap = (
            f"{fmt(x['superggml_gpu_vs_cpu'])}, {fmt(x['llama.cpp_gpu_vs_cpu'])} "
            f"({fmt(x['cpu_superggml_vs_llama.cpp'])})"
            if x
            else "-"
        )
        out.append(
            f"| {name} | {fmt(c.get('max_abs_dlogit'))} ({fmt(c.get('max_abs_logit'))}) | "
            f"{fmt(c.get('argmax_agree'))} | {greedy} | {st} | "
            f"{fmt(s.get('layers_pinned'))}/{fmt(s.get('n_slots'))} | {gap} | {problems(c, rc)} |"
        )
    return out


def resident_rows(runs):
    out = [
        "| model | superggml pp512 | llama.cpp pp512 | ratio | superggml tg64 | llama.cpp tg64 | ratio | "
        "llama.cpp via | problems |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, b, rc in runs:
        s, r = b.get("superggml", {}), b.get("llama.cpp", {})
        size = f" ({b['weights'] / MB:.0f} MB)" if "weights" in b else ""
        out.append(
            f"| {name}{size} | {fmt(s.get('pp_tok_s'), '.1f')} | {fmt(r.get('pp_tok_s'), '.1f')} | "
            f"{fmt(b.get('ratio_pp'), '.2f')} | {fmt(s.get('tg_tok_s'), '.1f')} | "
            f"{fmt(r.get('tg_tok_s'), '.1f')} | {fmt(b.get('ratio_tg'), '.2f')} | {fmt(r.get('tool'))} | "
            f"{problems(b, rc)} |"
        )
    return out


def streamed_rows(runs):
    out = [
        "| model | budget MB | pinned/slots | MB streamed per token (from the file) | decode ms/token | "
        "bound ms/token | prefill-512 s | bound s | llama.cpp -ngl N: decode ms/token, prefill-512 s | problems |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, b, rc in runs:
        s, r = b.get("superggml", {}), b.get("llama.cpp", {})
        t = s.get("per_token")
        mb = f"{t['bytes_loaded'] / MB:.0f} ({t['file_bytes'] / MB:.0f})" if t else "-"
        llama = f"N={r['ngl']}: {fmt(ms(r), '.1f')}, {fmt(pp(r), '.2f')}" if r else "-"
        out.append(
            f"| {name} | {fmt(b['budget'] / MB if 'budget' in b else None, '.0f')} | "
            f"{fmt(s.get('layers_pinned'))}/{fmt(s.get('n_slots'))} | {mb} | {fmt(ms(s), '.1f')} | "
            f"{fmt(b.get('bound_ms_per_token'), '.1f')} | {fmt(pp(s), '.2f')} | "
            f"{fmt(b.get('bound_prefill_s'), '.3g')} | {llama} | {problems(b, rc)} |"
        )
    return out


def pass_rows(runs):
    """Per pass, ms: superggml's host and device parts beside llama.cpp's call, wait and copy (passes.py)."""
    out = [
        "| model | pass | superggml wall | host (python, build, prepare, launch) | compute wait | device span | "
        "graphs (reused) | ops | llama.cpp wall | decode call | synchronize | logits copy | problems |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r, rc in runs:
        s, ll = r.get("superggml", {}), r.get("llama.cpp", {})
        for kind in ("decode", "prefill"):
            p, q = s.get("pass_profile", {}).get(kind, {}), ll.get(kind, {})
            host = (
                f"{fmt(p.get('host_ms'), '.3f')} ({fmt(p.get('python_ms'), '.3f')}, {fmt(p.get('build_ms'), '.3f')}, "
                f"{fmt(p.get('prepare_ms'), '.3f')}, {fmt(p.get('launch_ms'), '.3f')})"
                if p
                else "-"
            )
            out.append(
                f"| {name} | {kind} | {fmt(p.get('wall_ms'), '.3f')} | {host} | {fmt(p.get('compute_ms'), '.3f')} | "
                f"{fmt(p.get('device_ms'), '.3f')} | {fmt(p.get('graphs_per_pass'))} ({fmt(p.get('reused_per_pass'))}) | "
                f"{fmt(p.get('ops_per_pass'))} | {fmt(q.get('wall_ms'), '.3f')} | {fmt(q.get('decode_call_ms'), '.3f')} | "
                f"{fmt(q.get('synchronize_ms'), '.3f')} | {fmt(q.get('logits_copy_ms'), '.3f')} | {problems(r, rc)} |"
            )
    for name, r, _ in runs:
        words = {e: r.get(e, {}).get("cuda_graph_log") for e in ("superggml", "llama.cpp")}
        if any(words.values()):
            out += ["", f"{name}, ggml-cuda's words on CUDA graphs (message: times): {json.dumps(words)}"]
        perf = r.get("llama.cpp", {}).get("perf_context")
        if perf:
            out += ["", f"{name}, llama_perf_context: {json.dumps(perf)}"]
    return out


def kernel_rows(d, steps):
    """The first rows of each kernels step's side-by-side table (kernels.py)."""
    out = []
    for s in steps:
        if s["step"].startswith("kernels_"):
            path = os.path.join(d, s["step"], "kernels.md")
            if os.path.exists(path):
                with open(path) as f:
                    rows = f.read().splitlines()
                out += [""] + rows[:30] + ([f"... ({len(rows) - 30} more rows in logs)"] if len(rows) > 30 else [])
            else:
                out += ["", f"{s['step']}: rc {s['rc']}, no table ({last_line(os.path.join(d, s['step'] + '.log'))})"]
    return out


def main():
    out = sys.argv[1]
    d = os.path.join(out, "logs")
    env, rate = load(os.path.join(d, "env.json")), load(os.path.join(d, "rate.json"))
    steps = []
    if os.path.exists(os.path.join(d, "steps.jsonl")):
        with open(os.path.join(d, "steps.jsonl")) as f:
            steps = [json.loads(x) for x in f if x.strip()]

    def runs(prefix):  # (model, its JSON, its step's rc) for each step named prefix + model
        return [
            (s["step"][len(prefix) :], load(os.path.join(d, s["step"] + ".json")), s["rc"])
            for s in steps
            if s["step"].startswith(prefix)
        ]

    checks, resident, streamed = runs("check_"), runs("bench_resident_"), runs("bench_streamed_")
    passes = runs("passes_")
    ref = next((c["reference"] for _, c, _ in checks if "reference" in c), {})
    res = {
        "env": env,
        "rate": rate,
        "reference": ref,
        "steps": steps,
        "checks": [c for _, c, _ in checks],
        "bench": [b for _, b, _ in resident + streamed],
        "passes": [p for _, p, _ in passes],
    }
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(res, f, indent=1)
    n_prompt = next((c["n_prompt"] for _, c, _ in checks if "n_prompt" in c), "?")
    dev = next((r["device"] for _, r, _ in checks + resident + streamed if "device" in r), "?")
    md = [
        f"# superggml on {dev}",
        "",
        f"Build: {env.get('build', '?')}; {env.get('gpu') or 'no GPU'}, {env.get('nproc', '?')} cores; "
        f"commit {env.get('git') or '?'}; timing models: SIZE={env.get('size', '?')}. llama.cpp: "
        f"{ref.get('lib', '?')} (python package: {ref.get('llama_cpp', '?')}). Host-to-device rate: "
        f"{fmt(rate.get('bytes_per_s', 0) / 1e9, '.1f')} GB/s ({rate.get('used', '?')}).",
        "",
        f"Against llama.cpp on the same device and ggml build (a {n_prompt}-token prompt's logits, 64 greedy tokens; "
        "flash attention off; llama.cpp with n_gpu_layers 99), and streamed against resident:",
        "",
    ]
    md += check_rows(checks)
    md += ["", "Resident, tokens/s (prefill 512, decode 64, each from an empty context; the mean of 3):", ""]
    md += resident_rows(resident)
    md += [
        "",
        "Streamed, device_budget a quarter of the weights; bound: the bytes streamed / the host-to-device rate "
        "(llama.cpp: -ngl N, the blocks that fit in as many bytes):",
        "",
    ]
    md += streamed_rows(streamed)
    md += ["", "Resident passes, ms per pass (the mean of 3 after a warm-up; passes.py):", ""]
    md += pass_rows(passes)
    md += kernel_rows(d, steps)
    md += ["", "Steps:", "", "| step | rc | seconds | limit |", "|---|---|---|---|"]
    md += [f"| {s['step']} | {s['rc']} | {s['seconds']} | {s['limit']} |" for s in steps]
    failed = [s["step"] for s in steps if s["rc"] not in ("0", "skipped")]
    md += ["", "Failed steps, the last line of each log:", ""] if failed else []
    md += [f"- {name}: {last_line(os.path.join(d, name + '.log'))}" for name in failed]
    with open(os.path.join(out, "results.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
