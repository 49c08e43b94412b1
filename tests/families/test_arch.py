"""Model families and their features on small synthetic GGUFs (synth_gguf.py), against llama.cpp.

Random weights (F32, F16, Q8_0 or Q4_K matmul weights) with SmolLM2's vocabulary, laid out as llama.cpp's
converter writes each family: llama.cpp must load every file, and its logits must equal superggml's bit
for bit (the same ggml, the same op order). They cover what the real models do not: llama, qwen2, qwen3,
phi3, gemma2 and gemma3 blocks; separate output weights; Llama 3.1 rope_freqs; linear, YaRN and LongRoPE
scaling; head_dim != n_embd / n_head; sliding windows shorter than the prompt; soft caps; flash attention.
"""

from __future__ import annotations

import re

import gguf
import numpy as np
import pytest

import llama_ref
from batching import batch_gap, batch_prompts
from superggml import Model, UnsupportedModelError
from synth_gguf import N_LAYER, VARIANTS, synth
from cli_runner import run_cli


FLASH_REFUSED: set[str] = set()  # families whose flash-attention path llama.cpp computes otherwise


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_synthetic_model_matches_llama_cpp(tmp_path, small_vocab, variant):
    """Flash attention off and on: one llama.cpp child for both. A vocabulary of 1024 tokens: the greedy test
    below runs each family over the whole of SmolLM2's."""
    path = synth(tmp_path / f"{variant}.gguf", small_vocab, **VARIANTS[variant])
    prompt = [int(x) for x in np.random.default_rng(1).integers(0, 1024, 80)]
    flashes = (False,) if VARIANTS[variant]["arch"] in FLASH_REFUSED else (False, True)
    configs = [(1, 1, fa) for fa in flashes]  # F16 K and V, as llama.cpp's default
    ref = llama_ref.start({"kind": "kv_types", "model": path, "prompt": prompt, "configs": configs, "n_decode": 0})
    ours = []
    for flash_attn in flashes:
        with Model(path, ctx_size=256, n_threads=2, flash_attn=flash_attn) as m:
            ours.append(m.eval(prompt, logits_all=True).copy())
    if len(flashes) == 1:  # llama.cpp runs another attention with flash attention: refused, not approximated
        with pytest.raises(UnsupportedModelError, match="flash attention"):
            with Model(path, ctx_size=256, n_threads=2, flash_attn=True) as m:
                m.eval(prompt)
    refs = ref.result()
    for i, flash_attn in enumerate(flashes):
        diff = float(np.abs(ours[i] - refs[f"logits{i}"]).max())
        print(f"\n{variant} flash_attn={flash_attn}: max|dlogit| = {diff:.5f}")
        assert np.array_equal(ours[i], refs[f"logits{i}"]), flash_attn  # the same ggml, the same graph: the same bits


def test_unsupported_rope_scaling(tmp_path):
    """A scaling type llama.cpp does not know (it asserts on one) is an error naming the key."""
    w = gguf.GGUFWriter(str(tmp_path / "dynamic.gguf"), "llama")
    w.add_block_count(1)
    w.add_embedding_length(8)
    w.add_head_count(2)
    w.add_feed_forward_length(8)
    w.add_context_length(64)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_string("llama.rope.scaling.type", "dynamic")
    w.add_tensor("x", np.zeros(4, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(UnsupportedModelError, match="'dynamic' .'llama.rope.scaling.type'"):
        Model(tmp_path / "dynamic.gguf")


@pytest.mark.parametrize(
    "variant",
    [
        "llama-tied",
        "qwen2-bias",
        "qwen3-qknorm-headdim32",
        "phi3-fused",
        "qwen3-q8_0",
        "phi3-f16",
        "gemma2-swa16-softcaps",
        "gemma3-q4_k-output-softcap",
        "gemma3-swa16-linear8",
        "qwen3-yarn4",
        "phi3-longrope-long",
        "qwen3moe-8x2-q8_0",
        "qwen2moe-shared",
        "olmoe-8x2-f16",
        "mixtral-8x1",
        "gpt-oss-8x2-q8_0",
        "glm4moe-bias-mtp",
        "deepseek2-lite-legacy",
        "qwen35-interval2",
        "qwen35moe-8x2-q8_0",
        "qwen3next-8x2",
        "smollm3-tied",
        "seed_oss-bias-headdim32",
        "mistral3-yarn-temp-headdim32",
        "mistral3-moe-8x2",
        "ernie4_5-moe-lead-shared",
        "minimax-m2-8x2",
        "llama4-8x1-step2",
        "mistral4-fused-yarn-temp",
        "lfm2-swa16-q8_0",
        "granitehybrid-rope-tied-q8_0",
        "granitehybrid-8x2-shared",
        "nemotron_h-biases-tied-q8_0",
        "nemotron_h_moe-8x2",
        "step35-4",
        "step35-kv-per-layer",
        "mimo2-swa-sinks",
        "hy_v3-mtp",
        "hy_v4-hc4",
        "hy_v4-dsa-shared",
        "dots3note-sparse-swa",
        "qwen4exp-qsa-ple",
        "glm5-next-kpool-shared",
        "gemma4-e-shared",
        "gemma4-8x2-kv",
        "deepseek32-dsa",
        "glm-dsa-shared",
    ],
)
def test_streamed_and_paged_kv_are_bit_identical_for_every_family(tmp_path, vocab_fields, variant):
    """F32 weights included: the streamed lm head's row chunks hold a multiple of 16 rows, so ggml-cpu's F32
    sgemm (multiple-of-4 row counts only) serves every chunk of a prompt as it serves the whole head."""
    path = synth(tmp_path / f"{variant}.gguf", vocab_fields, **VARIANTS[variant])
    prompt = [int(x) for x in np.random.default_rng(2).integers(0, 49152, 40)]

    def run(**kw):
        with Model(path, ctx_size=128, n_threads=2, repack=False, **kw) as m:
            out = [m.eval(prompt, logits_all=True).copy()] + [m.eval([t]).copy() for t in (5, 6, 7)]
            return np.concatenate(out), m.stats()

    ref, _ = run()
    streamed, st = run(n_gpu_layers=0, async_prefetch=True, prefetch_depth=1)  # a pool of 2 slots
    assert st["n_slots"] == 2 and st["layers_pinned"] == 0 and st["loads"] > 0
    paged, st = run(paged_kv=True, kv_page_size=16, kv_device_layers=1, async_prefetch=True)
    assert st["kv_pages_loaded"] > 0
    assert np.array_equal(paged, ref)
    assert np.array_equal(streamed, ref)


@pytest.mark.parametrize(
    "variant",
    [
        "qwen3-q8_0",
        "phi3-fused",
        "gemma2-swa16-softcaps",
        "gemma3-swa16-linear8",
        "gemma3-q4_k-output-softcap",
        "llama-yarn2-q8_0",
        "phi3-longrope-long",
        "qwen3moe-8x2-q8_0",
        "qwen2moe-shared",
        "olmoe-8x2-f16",
        "mixtral-8x1",
        "gpt-oss-8x2-swa16-yarn",
        "deepseek2-lite",
        "deepseek2-kimi-q8_0",
        "deepseek2-glm47flash",
        "deepseek2-lite-legacy",
        "glm4moe-bias-mtp",
        "glm4moe-qknorm-q8_0",
        "qwen35-interval2",
        "qwen35moe-8x2-q8_0",
        "qwen3next-8x2",
        "smollm3-tied",
        "seed_oss-bias-headdim32",
        "mistral3-yarn-temp-headdim32",
        "mistral3-biases-q8_0",
        "ernie4_5-moe-lead-shared",
        "ernie4_5-moe-q8_0",
        "minimax-m2-8x2",
        "minimax-m2-8x2-q8_0-headdim32",
        "llama4-8x1-step2",
        "llama4-128x1-q8_0",
        "mistral4-fused-yarn-temp",
        "mistral4-lite-q8_0",
        "deepseek2-temp",
        "lfm2-ccaccaca",
        "lfm2-swa16-q8_0",
        "granitehybrid-mmamma",
        "granitehybrid-rope-tied-q8_0",
        "granitehybrid-8x2-shared",
        "nemotron_h-M-M*-M-",
        "nemotron_h-biases-tied-q8_0",
        "step35-4",
        "nemotron_h_moe-8x2",
        "step35-plain-q8_0",
        "gemma4-e-shared",
        "gemma4-plain-q8_0",
        "gemma4-8x2-fused-pl",
        "deepseek32-dsa",
        "deepseek32-yarn-q8_0",
        "glm-dsa-shared",
        "granitehybrid-1group-flat-norm",
    ],
)
def test_greedy_text_matches_llama_cpp_over_48_tokens(tmp_path, vocab_fields, variant):
    path = synth(tmp_path / f"{variant}.gguf", vocab_fields, **VARIANTS[variant])
    prompts = ["Once upon a time", "def fibonacci(n):"]
    ref = llama_ref.run({"kind": "generate", "model": path, "prompts": prompts, "max_tokens": 48})
    with Model(path, ctx_size=256, n_threads=2) as m:
        runs = []
        for prompt in prompts:
            n_prompt = len(m.tokenize(prompt))
            out = m.create_completion(prompt, max_tokens=48, temperature=0.0, repeat_penalty=1.0)
            runs.append((out, m.tokens[n_prompt:]))  # the last one sampled is not evaluated
        for i, (out, ids) in enumerate(runs):
            assert out["usage"]["completion_tokens"] == 48 and len(out["choices"][0]["text"]) > 48
            ref_ids = [int(x) for x in ref[f"ids{i}"]]
            assert len(ref_ids) == 48 and len(ids) >= 47 and ids == ref_ids[: len(ids)]
            # their text as llama.cpp's llama_detokenize gives it; llama-cpp-python's own text drops any piece
            # longer than its 32-byte buffer, and equals it where there is none
            assert out["choices"][0]["text"] == str(ref[f"piece_text{i}"])
            if f"text{i}" in ref and all(len(m.tokenizer.token_to_piece(t)) <= 32 for t in ref_ids):
                assert out["choices"][0]["text"] == str(ref[f"text{i}"])


@pytest.mark.parametrize(
    "variant",
    [
        "smollm3-tied",
        "seed_oss-bias-headdim32",
        "mistral3-yarn-temp-headdim32",
        "mistral3-moe-8x2",
        "ernie4_5-moe-lead-shared",
        "minimax-m2-8x2",
        "llama4-8x1-step2",
        "mistral4-fused-yarn-temp",
        "step35-4",
        "gemma4-e-shared",
        "gemma4-8x2-kv",
        "deepseek32-dsa",
        "glm-dsa-shared",
        "qwen4exp-qsa-ple",
        "glm5-next-kpool-shared",
    ],
)
def test_a_batch_equals_each_sequence_alone(tmp_path, vocab_fields, variant):
    """batch_invariant: sequences of 9, 17 and 5 tokens in shared passes, then greedy steps, each at its own
    positions (mistral3's temperature is per position): the same tokens as each alone, and the logits as close to
    each alone as llama.cpp's batch (one unified K/V, the same passes) is to its own sequences alone, measured on
    this machine. The gap is rounding that the model amplifies: gemma4-e-shared's is 4e-2 of 27 on an AVX2
    machine, in llama.cpp as in superggml, whose alone equals llama.cpp's alone."""
    path = synth(tmp_path / f"{variant}.gguf", vocab_fields, **VARIANTS[variant])
    prompts = batch_prompts()
    with Model(path, ctx_size=128, n_threads=2, n_batch=16, batch_invariant=True) as m:
        gap = batch_gap(m, path, prompts, 3)
    gap.check(variant)


@pytest.mark.parametrize(
    "variant",
    ["llama-tied", "gemma2-swa16-softcaps", "phi3-f16", "deepseek2-lite", "qwen35-interval2", "seed_oss-nobias"],
)
def test_a_prompts_last_logits_alone_match_llama_cpp(tmp_path, vocab_fields, variant):
    """Only the last row's logits wanted: the last block keeps that row after its attention output's matmul, as
    llama.cpp does (F32 and F16 matmuls round by their row count), so those logits and the greedy steps after them
    are llama.cpp's bit for bit."""
    path = synth(tmp_path / f"{variant}.gguf", vocab_fields, **VARIANTS[variant])
    prompt = [int(x) for x in np.random.default_rng(6).integers(0, 49152, 200)]
    ref = llama_ref.run({"kind": "tail", "model": path, "prompt": prompt, "n_decode": 2})["logits"]
    with Model(path, ctx_size=512, n_threads=2) as m:
        rows = [m.eval(prompt)[-1].copy()]
        for _ in range(2):
            rows.append(m.eval([int(rows[-1].argmax())])[-1].copy())
    assert np.array_equal(np.stack(rows), ref)


@pytest.mark.slow
@pytest.mark.parametrize("flash_attn", [False, True])
def test_llama4_attends_within_chunks_past_the_first(tmp_path, vocab_fields, flash_attn):
    """8300 tokens: queries of the chunked layers past position 8191 see only their own chunk of 8192, and the
    layers without RoPE scale Q by a temperature above 1 from there. The prompt's last logits and 3 greedy steps
    are llama.cpp's, bit for bit."""
    path = synth(tmp_path / "llama4.gguf", vocab_fields, **VARIANTS["llama4-8x1-step2"])
    prompt = [int(x) for x in np.random.default_rng(5).integers(0, 49152, 8300)]
    req = {"kind": "tail", "model": path, "prompt": prompt, "n_decode": 3, "n_ctx": 8448, "flash_attn": flash_attn}
    ref = llama_ref.run(req)["logits"]
    with Model(path, ctx_size=8448, n_threads=2, flash_attn=flash_attn) as m:
        rows = [m.eval(prompt)[-1].copy()]
        for _ in range(3):
            rows.append(m.eval([int(rows[-1].argmax())])[-1].copy())
    assert np.array_equal(np.stack(rows), ref)


def test_gemma3_vision_tower_is_refused(tmp_path, vocab_fields):
    path = synth(
        tmp_path / "gemma3-vision.gguf",
        vocab_fields,
        arch="gemma3",
        extra={"v.patch_embd.weight": np.zeros((4, 4), np.float32)},
    )
    with pytest.raises(UnsupportedModelError, match="vision tower .'v.patch_embd.weight'"):
        Model(path)


@pytest.mark.parametrize(
    "variant",
    [
        "llama-tied",
        "qwen2-bias",
        "qwen3-q8_0",
        "phi3-longrope-long",
        "gemma2-swa16-softcaps",
        "gemma3-q4_k-output-softcap",
        "qwen3moe-8x2-q8_0",
        "qwen2moe-shared",
        "olmoe-8x2-f16",
        "mixtral-8x1",
        "gpt-oss-8x2-q8_0",
        "smollm3-tied",
        "seed_oss-nobias",
        "mistral3-yarn-temp-headdim32",
        "mistral3-moe-8x2",
        "ernie4_5-moe-q8_0",
        "minimax-m2-8x2",
        "llama4-8x1-step2",
        "mistral4-lite-q8_0",
        "lfm2-ccaccaca",
        "granitehybrid-8x2-shared",
        "nemotron_h-M-M*-M-",
        "nemotron_h_moe-8x2",
        "step35-4",
        "gemma4-e-shared",
        "gemma4-8x2-kv",
        "deepseek32-dsa",
        "glm-dsa-shared",
    ],
)
def test_analyze_works_on_every_family(tmp_path, vocab_fields, variant, capsys):
    import json

    path = synth(tmp_path / f"{variant}.gguf", vocab_fields, **VARIANTS[variant])
    d = json.loads(run_cli(capsys, "analyze", "-m", path, "--json", "--no-measure", "--device-budget", "1MiB").out)
    arch = VARIANTS[variant]["arch"]
    lay = d["layout"]
    n_layer = VARIANTS[variant].get(
        "n_layer", 3 if arch in ("deepseek2", "mistral4", "deepseek32", "glm-dsa") else N_LAYER
    )
    if arch in ("lfm2", "granitehybrid", "nemotron_h", "nemotron_h_moe", "step35", "gemma4"):
        key = "swa" if arch == "step35" else "layers"
        default = {"lfm2": "ccaccaca", "granitehybrid": "mmamma", "step35": "0101", "gemma4": "11101110"}
        n_layer = len(VARIANTS[variant].get(key, default.get(arch, "M-M*-M-")))
    assert lay["arch"] == arch and lay["n_layer"] == n_layer
    assert all(b > 0 for b in lay["block_bytes"]) and d["plans"][0]["n_slots"] >= 1
    assert lay["n_swa"] == (
        16
        if "swa16" in variant or arch in ("gemma3", "gpt-oss", "step35", "gemma4")
        else 8192
        if arch == "llama4"
        else 0
    )
    out = run_cli(capsys, "analyze", "-m", path, "--no-measure", "--device-budget", "1MiB").out
    swa = re.search(r"sliding window: (\d+) of (\d+) layers over 16 tokens", out)
    assert f": {arch}, " in out and bool(swa) == (lay["n_swa"] == 16)
    assert swa is None or int(swa[2]) == 2 * int(swa[1]) or arch == "gemma4"
    assert ("chunked attention: 3 of 4 layers over 8192 tokens" in out) == (arch == "llama4")
    moe = VARIANTS[variant].get("n_expert", 0)
    assert lay["n_expert"] == moe and ("mixture of experts: 8 experts per block" in out) == bool(moe)
    if moe:
        assert 0 < lay["dense_bytes"] < sum(lay["block_bytes"]) and lay["expert_bytes"] > 0


def test_sliding_window_pages_are_freed_and_logits_stay_identical(tmp_path, vocab_fields):
    """With paged_kv, the pages of gemma2's sliding-window layers that left the window are freed (llama.cpp's
    SWA cache drops those cells too): fewer pages held, the same logits; going back before the window needs a
    re-evaluation (truncate keeps nothing) unless swa_full keeps them."""
    path = synth(tmp_path / "gemma2.gguf", vocab_fields, **VARIANTS["gemma2-swa16-softcaps"])
    prompt = [int(x) for x in np.random.default_rng(3).integers(0, 49152, 80)]

    def run(**kw):
        with Model(path, ctx_size=256, n_threads=2, **kw) as m:
            out = [m.eval(prompt, logits_all=True).copy()] + [m.eval([t]).copy() for t in range(5, 25)]
            st = m.stats()
            return np.concatenate(out), st, m.truncate(95), m.truncate(10)

    ref, *_ = run()
    paged = dict(paged_kv=True, kv_page_size=16, kv_device_layers=1)
    freed, st, kept95, kept10 = run(**paged)
    full, st_full, kept95_full, kept10_full = run(**paged, swa_full=True)
    assert np.array_equal(freed, ref) and np.array_equal(full, ref)
    # layer 0 slides: after 100 tokens it holds only the pages its window still reaches
    assert st_full["kv_pages_forgotten"] == 0 and st["kv_pages_forgotten"] == (100 - 15) // 16
    assert st["kv_token_slots"] < st_full["kv_token_slots"]
    assert st["kv_host_bytes"] < st_full["kv_host_bytes"]
    # the last pass (position 99) freed the pages below 80: 95 needs keys from 80 on, 10 needs freed ones
    assert (kept95, kept10) == (95, 0)
    assert (kept95_full, kept10_full) == (95, 10)


def test_prompt_reuse_past_a_freed_window_re_evaluates(tmp_path, vocab_fields):
    path = synth(tmp_path / "gemma2.gguf", vocab_fields, **VARIANTS["gemma2-swa16-softcaps"])
    long = " ".join(["alpha beta gamma delta"] * 12)
    prompts = (long, " ".join(["alpha beta gamma delta"] * 6) + " omega")  # a shared prefix ending long ago
    with Model(path, ctx_size=256, n_threads=2) as m:
        ref = [m.create_completion(p, max_tokens=8, temperature=0.0)["choices"][0]["text"] for p in prompts]
    with Model(path, ctx_size=256, n_threads=2, paged_kv=True, kv_page_size=16) as m:
        kept, truncate = [], m.runtime.sequences.truncate
        m.runtime.sequences.truncate = lambda n: kept.append((n, truncate(n))) or kept[-1][1]
        out = [m.create_completion(p, max_tokens=8, temperature=0.0)["choices"][0]["text"] for p in prompts]
    assert out == ref
    assert kept[-1][0] > 20 and kept[-1][1] == 0  # the shared prefix was there, but not its window's keys


@pytest.mark.parametrize("variant", ["gemma3-swa16-linear8", "phi3-longrope-long"])
def test_streamed_family_serves_with_metrics(tmp_path, vocab_fields, variant):
    """A family with its own block, streamed through 2 slots with paged KV and metrics, behind the server:
    the completion is llama.cpp's greedy text and the metrics are written."""
    import json

    import httpx
    from http_server import Server

    path = synth(tmp_path / f"{variant}.gguf", vocab_fields, **VARIANTS[variant])
    prompt = "Once upon a time there was a sliding window that"
    ref = llama_ref.run({"kind": "generate", "model": path, "prompts": [prompt], "max_tokens": 24})["text0"]
    metrics = tmp_path / "metrics.jsonl"
    with Model(
        path,
        ctx_size=256,
        n_threads=2,
        n_gpu_layers=0,
        async_prefetch=True,
        prefetch_depth=1,
        paged_kv=True,
        kv_page_size=16,
        kv_device_layers=1,
        metrics_file=str(metrics),
    ) as m:
        server = Server(m)
        try:
            r = httpx.post(
                server.url + "/v1/completions",
                timeout=120,
                json={"prompt": prompt, "max_tokens": 24, "temperature": 0, "repeat_penalty": 1.0},
            )
        finally:
            server.close()
        st = m.stats()
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == str(ref)
    assert st["loads"] > 0 and st["kv_pages_loaded"] > 0
    lines = [json.loads(x) for x in metrics.read_text().splitlines()]
    snapshots = [x for x in lines if "tokens_per_sec" in x]
    layers = [x for x in lines if x.get("event") == "layer"]
    assert len(snapshots) >= 20 and {x["layer"] for x in layers} >= set(range(N_LAYER + 1))


def test_value_length_unlike_key_length_is_refused(tmp_path, vocab_fields):
    path = synth(
        tmp_path / "v.gguf", vocab_fields, arch="qwen3", keys={"attention.value_length": (8, gguf.GGUFValueType.UINT32)}
    )
    with pytest.raises(UnsupportedModelError, match="value_length"):
        Model(path)
