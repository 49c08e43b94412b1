"""Models far bigger than memory, run with no options: a ~39 GB dense model (Llama-70B's shape) in a 20 GiB memory
cgroup and a ~16 GB mixture of experts (Qwen3-30B-A3B's shape) in a 4 GiB one, against llama.cpp's mmap.

    python bench/at_scale.py [--model dense|moe|both] [--tokens 4] [--budgets 14GiB,16GiB,18GiB] [--repeat 1] [--keep]

Each model is a synthetic GGUF laid out as llama.cpp's converter writes the architecture (llama; qwen3moe with its
Q/K norms and 3-D expert tensors), SmolLM2's vocabulary, Q4_0 matrices (F32 norms and router). It is written tensor
by tensor, never whole in memory: every matrix row is drawn from a pool of rows quantized from N(0, 1/k) by ggml's
own quantizer (zero-mean weights: routing spreads over the experts), so a 39 GB file takes minutes, not hours. It
is written under --cache-dir and deleted after the runs unless --keep.

Every run is a child process in a child memory cgroup of --limit, with the file's pages dropped from the page
cache first. The same 16-token prompt, then --tokens tokens decoded one by one (teacher-forced, the same for all);
timed: the decode only.
- superggml auto: `Model(path)`, no options (device_budget "auto": the plan's line is reported);
- superggml at each --budgets size (device_budget=size, otherwise the defaults): the best hand-picked budget;
- llama.cpp (llama-cpp-python): mmap, no repack (what runs at that limit), the same context size, 2 threads.
The argmax of the logits of the prompt's last token and of the last decoded token are reported for each run (a
check that all ran the same model).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
SUPPORT = os.path.join(HERE, "..", "tests", "support")
MiB, GiB = 1 << 20, 1 << 30
PROMPT = 16

DENSE = dict(
    arch="llama",
    n_layer=80,
    n_embd=8192,
    n_head=64,
    n_head_kv=8,
    head_dim=128,
    n_ff=28672,
    n_ctx_train=4096,
    rope_base=500000.0,
    limit="20GiB",
    budgets="14GiB,16GiB,18GiB",
)
MOE = dict(
    arch="qwen3moe",
    n_layer=48,
    n_embd=2048,
    n_head=32,
    n_head_kv=4,
    head_dim=128,
    n_ff=6144,
    n_expert=128,
    n_expert_used=8,
    n_ff_exp=768,
    n_ctx_train=40960,
    rope_base=1000000.0,
    limit="4GiB",
    budgets="2GiB,2560MiB,3GiB",
)
POOL_ROWS = 2048  # quantized rows per row length, drawn from for every matrix


# ------------------------------------------------------------------------------------------------ the models


def tensor_specs(p: dict, n_vocab: int) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, numpy shape (rows first), kind) in the converter's order: "q4" a Q4_0 matrix, "f32" a random F32
    matrix (the router), "norm" an RMS norm's weights."""
    e, hd = p["n_embd"], p["head_dim"]
    q, kv = p["n_head"] * hd, p["n_head_kv"] * hd
    out = [
        ("token_embd.weight", (n_vocab, e), "q4"),
        ("output_norm.weight", (e,), "norm"),
        ("output.weight", (n_vocab, e), "q4"),
    ]
    for il in range(p["n_layer"]):
        b = f"blk.{il}."
        out += [
            (b + "attn_norm.weight", (e,), "norm"),
            (b + "ffn_norm.weight", (e,), "norm"),
            (b + "attn_q.weight", (q, e), "q4"),
            (b + "attn_k.weight", (kv, e), "q4"),
            (b + "attn_v.weight", (kv, e), "q4"),
            (b + "attn_output.weight", (e, q), "q4"),
        ]
        if p.get("n_expert"):
            ne, fe = p["n_expert"], p["n_ff_exp"]
            out += [
                (b + "ffn_gate_inp.weight", (ne, e), "f32"),
                (b + "ffn_gate_exps.weight", (ne, fe, e), "q4"),
                (b + "ffn_up_exps.weight", (ne, fe, e), "q4"),
                (b + "ffn_down_exps.weight", (ne, e, fe), "q4"),
                (b + "attn_q_norm.weight", (hd,), "norm"),
                (b + "attn_k_norm.weight", (hd,), "norm"),
            ]
        else:
            out += [
                (b + "ffn_gate.weight", (p["n_ff"], e), "q4"),
                (b + "ffn_up.weight", (p["n_ff"], e), "q4"),
                (b + "ffn_down.weight", (e, p["n_ff"]), "q4"),
            ]
    return out


def write_model(path: str, p: dict, fields: list, seed: int = 0) -> None:
    """Streams the GGUF: the header, keys and tensor infos, then each tensor's data, made when it is written."""
    import gguf

    from superggml import native

    q4 = gguf.GGMLQuantizationType.Q4_0
    n_vocab = next(len(v) for k, v, *_ in fields if k == "tokenizer.ggml.tokens")
    w = gguf.GGUFWriter(path, p["arch"])
    w.add_block_count(p["n_layer"])
    w.add_context_length(p["n_ctx_train"])
    w.add_embedding_length(p["n_embd"])
    w.add_feed_forward_length(p["n_ff"])
    w.add_head_count(p["n_head"])
    w.add_head_count_kv(p["n_head_kv"])
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(p["rope_base"])
    w.add_rope_dimension_count(p["head_dim"])
    w.add_key_length(p["head_dim"])
    w.add_value_length(p["head_dim"])
    w.add_vocab_size(n_vocab)
    if p.get("n_expert"):
        w.add_expert_count(p["n_expert"])
        w.add_expert_used_count(p["n_expert_used"])
        w.add_expert_feed_forward_length(p["n_ff_exp"])
    for key, value, vtype, sub in fields:
        w.add_key_value(key, value, vtype, sub_type=sub)
    specs = tensor_specs(p, n_vocab)
    for name, shape, kind in specs:
        if kind == "q4":
            bshape = (*shape[:-1], shape[-1] // 32 * 18)
            w.add_tensor_info(name, bshape, np.dtype(np.uint8), int(np.prod(bshape)), raw_dtype=q4)
        else:
            w.add_tensor_info(name, shape, np.dtype(np.float32), int(np.prod(shape)) * 4)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    rng = np.random.default_rng(seed)
    pools: dict[int, np.ndarray] = {}
    for name, shape, kind in specs:
        k = shape[-1]
        if kind == "norm":
            a = (1 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
        elif kind == "f32":
            a = rng.standard_normal(shape, dtype=np.float32) * np.float32(2 / np.sqrt(k))
        else:
            if k not in pools:
                pools[k] = native.quantize(
                    native.GGMLType.Q4_0,
                    rng.standard_normal((POOL_ROWS, k), dtype=np.float32) * np.float32(1 / np.sqrt(k)),
                )
            rows = int(np.prod(shape[:-1]))
            a = pools[k][rng.integers(0, POOL_ROWS, rows)]
        w.write_tensor_data(a)
        del a
    w.close()


def model_path(p: dict, cache_dir: str) -> str:
    """The GGUF for these parameters under cache_dir, written first if it is not there."""
    sys.path.insert(0, SUPPORT)
    import synth_gguf

    from superggml import models

    path = os.path.join(cache_dir, f"at_scale-{p['arch']}-{p['n_layer']}x{p['n_embd']}.gguf")
    if not os.path.exists(path):
        os.makedirs(cache_dir, exist_ok=True)
        t = time.perf_counter()
        print(f"writing {path} ...", flush=True)
        write_model(path + ".part", p, synth_gguf.vocab_fields(str(models.smollm2_path())))
        os.replace(path + ".part", path)
        print(f"  {os.path.getsize(path) / GiB:.2f} GiB in {time.perf_counter() - t:.0f} s", flush=True)
    return path


def bench_model(name: str, p: dict, a: argparse.Namespace) -> list[dict]:
    import limited_run
    from limited_run import SUPERGGML

    from superggml.settings import parse_size

    path = model_path(p, a.cache_dir)
    size = os.path.getsize(path)
    limit = int(parse_size(a.limit or p["limit"]))
    budgets = [int(parse_size(b)) for b in (p["budgets"] if a.budgets is None else a.budgets).split(",") if b]
    rng = np.random.default_rng(1)
    toks = [int(x) for x in rng.integers(100, 40000, PROMPT + a.tokens)]
    print(
        f"{name}: {p['arch']} {os.path.basename(path)} {size / GiB:.2f} GiB; cgroup limit {limit / GiB:.2f} GiB; "
        f"prompt {PROMPT}, {a.tokens} decoded tokens",
        flush=True,
    )
    report = dict(
        diff=("bytes_loaded", "wait_seconds", "read_seconds"),
        report=("budget", "layers_pinned", "n_slots", "slot_size", "expert_hits", "expert_misses"),
    )
    runs = [("superggml auto", SUPERGGML, dict(report, options={}))]
    runs += [(f"superggml {b / GiB:g} GiB", SUPERGGML, dict(report, options=dict(device_budget=b))) for b in budgets]
    if not a.no_llama:
        runs.append(("llama.cpp mmap", limited_run.LLAMA, dict(n_ctx=a.ctx, n_threads=2)))
    # the superggml runs repeated in turn (--repeat), so that the disk's swings fall on every budget alike
    order = [r for _ in range(a.repeat) for r in runs if r[1] is SUPERGGML] + [r for r in runs if r[1] is not SUPERGGML]
    rows = []
    with tempfile.TemporaryDirectory() as work:
        for who, code, extra in order:
            req = dict(extra, who=who.replace(" ", "_"), tokens=toks, prompt=PROMPT)
            r = limited_run.run(code, req, path, limit, a.timeout, work, req["who"])
            row = dict(model=name, who=who, limit=limit, model_bytes=size, tokens=a.tokens)
            if "error" in r:
                row["error"] = r["error"]
            else:
                row.update(
                    s_per_token=r["decode_s"] / a.tokens,
                    load_s=r["load_s"],
                    wall_s=r["wall_s"],
                    maxrss=r["maxrss"],
                    argmax=[int(x) for x in r["logits"].argmax(-1)],
                    finite=bool(np.isfinite(r["logits"]).all()),
                    **{
                        k: r[k]
                        for k in (
                            "budget",
                            "layers_pinned",
                            "n_slots",
                            "slot_size",
                            "expert_hits",
                            "expert_misses",
                            "ctx_size",
                            "stderr",
                            "decode",
                        )
                        if k in r
                    },
                )
            rows.append(row)
            print(
                "  " + json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()})[:2000],
                flush=True,
            )
    if not a.keep:
        os.remove(path)
    return rows


def table(rows: list[dict]) -> str:
    """One line per run name: the median s/token of its repeats (each repeat's in brackets when several)."""
    out = [f"{'model':<6} {'run':<22} {'s/token':>8} {'vs llama.cpp':>12} {'max RSS GiB':>11}  argmax  repeats"]
    for name in dict.fromkeys(r["model"] for r in rows):
        mine = [r for r in rows if r["model"] == name]
        ref = next((r.get("s_per_token") for r in mine if r["who"].startswith("llama") and "error" not in r), None)
        for who in dict.fromkeys(r["who"] for r in mine):
            same = [r for r in mine if r["who"] == who]
            ok = [r for r in same if "error" not in r]
            if not ok:
                out.append(f"{name:<6} {who:<22} {same[0]['error'][:80]}")
                continue
            s = float(np.median([r["s_per_token"] for r in ok]))
            x = f"{ref / s:.2f}x" if ref else "-"
            each = "  [" + ", ".join(f"{r['s_per_token']:.2f}" for r in ok) + "]" if len(same) > 1 else ""
            out.append(
                f"{name:<6} {who:<22} {s:>8.2f} {x:>12} {max(r['maxrss'] for r in ok) / GiB:>11.2f}  "
                f"{ok[0]['argmax']}{each}"
            )
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=("dense", "moe", "both"), default="both")
    ap.add_argument("--tokens", type=int, default=4, help="decoded tokens per run")
    ap.add_argument("--repeat", type=int, default=1, help="runs of each superggml setting, in turn (median reported)")
    ap.add_argument("--limit", help="the cgroup limit (default: 20 GiB dense, 4 GiB MoE)")
    ap.add_argument("--budgets", help="hand-picked device budgets, comma-separated (default per model; '' for none)")
    ap.add_argument("--ctx", type=int, default=4096, help="llama.cpp's n_ctx (superggml's default ctx_size)")
    ap.add_argument("--no-llama", action="store_true")
    ap.add_argument("--write-only", action="store_true", help="write the model(s) and stop")
    ap.add_argument("--cache-dir", default="/work/tmp")
    ap.add_argument("--keep", action="store_true", help="keep the written model(s)")
    ap.add_argument("--timeout", type=float, default=3600)
    ap.add_argument("--json")
    a = ap.parse_args()
    models = {"dense": DENSE, "moe": MOE}
    todo = list(models) if a.model == "both" else [a.model]
    if a.write_only:
        for name in todo:
            model_path(models[name], a.cache_dir)
        return 0
    rows = []
    for name in todo:
        rows += bench_model(name, models[name], a)
    print(table(rows))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
