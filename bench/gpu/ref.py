"""llama.cpp through llama-cpp-python's llama_cpp, in a process of its own (two ggml copies in one process clash).

python3 ref.py REQUEST.json OUT.npz      kinds: "check" (prompt logits, greedy ids), "bench" (pp and tg tok/s),
                                         "profile" (each pass's call, wait and logits copy; llama_perf_context)
"""

import ctypes
import json
import sys
import time

import llama_cpp
import numpy as np


def fresh(llm):
    llm.reset()
    llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(llm.ctx), True)


def profile(llm, req):
    """Prefill and decode passes through the C API, as superggml's profile times them: the llama_decode call (the
    host's work and launches), llama_synchronize (the wait for the device), the logits' copy; the mean per pass of
    reps after a warm-up, with llama_perf_context's figures (n_reused: graphs llama.cpp reused) and how often ggml
    logged each message about CUDA graphs."""
    words = {}

    @llama_cpp.llama_log_callback
    def on_log(level, text, user_data):
        t = text.decode(errors="replace")
        if "CUDA graph" in t or "CUDA Graph" in t:
            key = "".join("#" if c.isdigit() else c for c in t.strip())
            words[key] = words.get(key, 0) + 1

    llama_cpp.llama_log_set(on_log, ctypes.c_void_p())
    ctx, n_vocab = llm.ctx, llm.n_vocab()
    prompt = np.random.default_rng(1).integers(100, 40000, req["n_prompt"]).tolist()
    batch = llama_cpp.llama_batch_init(max(req["n_prompt"], 1), 0, 1)

    def one_pass(tokens, p0):
        batch.n_tokens = len(tokens)
        for i, t in enumerate(tokens):
            batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = t, p0 + i, 1, i == len(tokens) - 1
            batch.seq_id[i][0] = 0
        t0 = time.perf_counter()
        if llama_cpp.llama_decode(ctx, batch):
            raise RuntimeError("llama_decode failed")
        t1 = time.perf_counter()
        llama_cpp.llama_synchronize(ctx)
        t2 = time.perf_counter()
        np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, -1), shape=(n_vocab,)).copy()
        t3 = time.perf_counter()
        return np.array([t3 - t0, t1 - t0, t2 - t1, t3 - t2])

    kinds = {"prefill": [], "decode": []}  # as llama-bench: the prefill runs, then the decode runs
    for rep in range(req["reps"] + 1):
        fresh(llm)
        p = one_pass(prompt, 0)
        if rep:
            kinds["prefill"].append(p)
    llama_cpp.llama_perf_context_reset(ctx)
    for rep in range(req["reps"] + 1):
        fresh(llm)
        d = [one_pass([t], i) for i, t in enumerate(prompt[: req["n_gen"]])]
        if rep:
            kinds["decode"] += d
    perf = llama_cpp.llama_perf_context(ctx)
    llama_cpp.llama_batch_free(batch)
    llama_cpp.llama_log_set(ctypes.cast(None, llama_cpp.llama_log_callback), ctypes.c_void_p())  # on_log goes
    out = {
        k: dict(
            zip(
                ("wall_ms", "decode_call_ms", "synchronize_ms", "logits_copy_ms"),
                (1e3 * np.mean(v, 0)).round(4).tolist(),
            )
        )
        for k, v in kinds.items()
    }
    out["perf_context"] = {
        f: getattr(perf, f)
        for f in ("t_start_ms", "t_load_ms", "t_p_eval_ms", "t_eval_ms", "n_p_eval", "n_eval", "n_reused")
    }
    out["cuda_graph_log"] = words
    return out


def load(req, logits_all):
    return llama_cpp.Llama(
        model_path=req["model"],
        n_gpu_layers=req["ngl"],
        n_ctx=req["n_ctx"],
        n_batch=512,
        n_ubatch=512,
        n_threads=req["threads"],
        n_threads_batch=req["threads"],
        flash_attn=False,
        logits_all=logits_all,
        verbose=False,
    )


def main():
    with open(sys.argv[1]) as f:
        req = json.load(f)
    llm = load(req, req["kind"] == "check")
    out = {}
    if req["kind"] == "profile":
        out["profile"] = np.array(json.dumps(profile(llm, req)))
    elif req["kind"] == "check":
        prompt = req["prompt"]
        llm.eval(prompt)
        out["logits"] = np.array(llm.scores[: len(prompt)], dtype=np.float32)
        # greedy as superggml's generate runs: the prompt's last row alone (a GPU's matmul of one row rounds
        # unlike one of all the prompt's rows, so logits_all would compare unlike with like)
        llm.close()
        llm = load(req, False)
        ids = []
        for t in llm.generate(prompt, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0):
            ids.append(t)
            if len(ids) == req["n_gen"]:
                break
        out["ids"] = np.array(ids, dtype=np.int64)
    else:  # as llama-bench: pp from an empty context, tg from an empty context, the mean of reps after a warm-up
        rng = np.random.default_rng(1)
        prompt = rng.integers(100, 40000, req["n_prompt"]).tolist()
        pp, tg = [], []
        for rep in range(req["reps"] + 1):
            fresh(llm)
            t0 = time.perf_counter()
            llm.eval(prompt)
            t1 = time.perf_counter()
            fresh(llm)
            for t in prompt[: req["n_gen"]]:
                llm.eval([t])
            t2 = time.perf_counter()
            if rep:
                pp.append(req["n_prompt"] / (t1 - t0))
                tg.append(req["n_gen"] / (t2 - t1))
        out = {"pp": np.array(pp), "tg": np.array(tg)}
    np.savez(sys.argv[2], **out)


if __name__ == "__main__":
    main()
