"""Architecture features on small synthetic GGUFs, against llama.cpp.

Random weights (F32, F16 or Q8_0 matmul weights) with SmolLM2's vocabulary, laid out as llama.cpp's
converter writes each family: llama.cpp must load every file, and its logits must equal superggml's bit
for bit. They cover what the real models do not: separate output weights, Llama 3.1 rope_freqs, linear
RoPE scaling, head_dim != n_embd / n_head, flash attention, qwen3's Q/K norms, phi3's fused tensors.
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest

import llama_ref
from superggml import Model, UnsupportedModelError, _core

N_EMBD, N_HEAD, N_HEAD_KV, N_FF, N_LAYER = 64, 4, 2, 96, 2


@pytest.fixture(scope="module")
def vocab_fields(smollm2_path):
    fields = []
    for key, f in gguf.GGUFReader(smollm2_path).fields.items():
        if key.startswith("tokenizer.") and key != "tokenizer.chat_template":
            vtype = f.types[0]
            sub = f.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
            fields.append((key, f.contents(), vtype, sub))
    return fields


def synth(path, fields, arch="llama", *, tied=True, rope_freqs=False, scaling=None, head_dim=None, seed=0,
          extra=None, wtype="f32", n_embd=N_EMBD, n_ff=N_FF, n_layer=N_LAYER, keys=None, rope=None):
    """A random-weight GGUF laid out as llama.cpp's converter writes `arch`; `wtype` (f32, f16, q8_0, q4_k) is
    the type of the matmul weights, as a quantized model has them (norms and the embedding stay F32).

    scaling: a linear RoPE factor; rope: ("yarn", factor, original context) or ("longrope", original
    context) (LongRoPE's long and short factor tensors and attn_factor, as phi3's converter writes them);
    keys: more "{arch}.<key>" values (sliding window, soft caps...) as (value, GGUFValueType)."""
    rng = np.random.default_rng(seed)
    hd = head_dim or n_embd // N_HEAD
    n_vocab = next(len(v) for k, v, *_ in fields if k == "tokenizer.ggml.tokens")
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(n_layer)
    w.add_context_length(512)
    w.add_embedding_length(n_embd)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD_KV)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    if head_dim or arch.startswith("gemma"):
        w.add_key_length(hd)
        w.add_value_length(hd)
    if scaling:
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(scaling)
    if rope and rope[0] == "yarn":
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(rope[1])
        w.add_rope_scaling_orig_ctx_len(rope[2])
    if rope and rope[0] == "longrope":
        w.add_rope_scaling_orig_ctx_len(rope[1])
        w.add_rope_scaling_attn_factors(float(np.sqrt(1 + np.log(512 / rope[1]) / np.log(rope[1]))))
    for key, (value, vtype) in (keys or {}).items():
        w.add_key_value(f"{arch}.{key}", value, vtype)
    for key, value, vtype, sub in fields:
        w.add_key_value(key, value, vtype, sub_type=sub)

    def put(name, a):
        quant = {"q8_0": gguf.GGMLQuantizationType.Q8_0, "q4_k": gguf.GGMLQuantizationType.Q4_K}.get(wtype)
        if a.ndim == 2 and name != "token_embd.weight" and wtype == "f16":
            w.add_tensor(name, a.astype(np.float16))
        elif a.ndim == 2 and name != "token_embd.weight" and quant is not None:   # ggml's own quantizer
            w.add_tensor(name, _core.quantize(getattr(_core.GGMLType, quant.name), a), raw_dtype=quant)
        else:
            w.add_tensor(name, a)

    def t(name, *shape, scale=0.08):  # numpy shape: rows first
        put(name, (rng.standard_normal(shape) * scale).astype(np.float32))

    def norm(name, n=n_embd, spread=0.1):
        w.add_tensor(name, (1 + spread * rng.standard_normal(n)).astype(np.float32))

    t("token_embd.weight", n_vocab, n_embd, scale=1.0 if not arch.startswith("gemma") else 0.125)
    norm("output_norm.weight")
    if not tied:
        t("output.weight", n_vocab, n_embd, scale=0.2)
    if rope_freqs:
        w.add_tensor("rope_freqs.weight", np.linspace(1, 8, hd // 2).astype(np.float32))
    if rope and rope[0] == "longrope":
        w.add_tensor("rope_factors_long.weight", np.linspace(1, 12, hd // 2).astype(np.float32))
        w.add_tensor("rope_factors_short.weight", np.linspace(1, 1.5, hd // 2).astype(np.float32))
    for name, value in (extra or {}).items():
        w.add_tensor(name, value)
    for il in range(n_layer):
        p = f"blk.{il}."
        for n in ("attn_norm", "ffn_norm"):
            norm(p + n + ".weight")
        if arch == "phi3":       # fused, as llama.cpp's converter writes Phi-3: Q|K|V rows, gate|up rows
            qkv = np.concatenate([rng.standard_normal((N_HEAD * hd, n_embd)) * 0.3,
                                  rng.standard_normal((N_HEAD_KV * hd, n_embd)) * 0.3,
                                  rng.standard_normal((N_HEAD_KV * hd, n_embd)) * 0.08])
            put(p + "attn_qkv.weight", qkv.astype(np.float32))
            t(p + "ffn_up.weight", 2 * n_ff, n_embd)
        else:
            t(p + "attn_q.weight", N_HEAD * hd, n_embd, scale=0.3)
            t(p + "attn_k.weight", N_HEAD_KV * hd, n_embd, scale=0.3)
            t(p + "attn_v.weight", N_HEAD_KV * hd, n_embd)
            t(p + "ffn_gate.weight", n_ff, n_embd)
            t(p + "ffn_up.weight", n_ff, n_embd)
        t(p + "attn_output.weight", n_embd, N_HEAD * hd)
        t(p + "ffn_down.weight", n_embd, n_ff)
        if arch in ("qwen3", "gemma3"):
            for n in ("attn_q_norm", "attn_k_norm"):
                norm(p + n + ".weight", hd, 0.2)
        if arch.startswith("gemma"):
            norm(p + "post_attention_norm.weight")
            norm(p + "post_ffw_norm.weight")
        if arch == "qwen2":
            for n, rows in (("q", N_HEAD * hd), ("k", N_HEAD_KV * hd), ("v", N_HEAD_KV * hd)):
                t(p + f"attn_{n}.bias", rows, scale=0.5)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


U32, F32V = gguf.GGUFValueType.UINT32, gguf.GGUFValueType.FLOAT32
SWA16 = {"attention.sliding_window": (16, U32)}
VARIANTS = {
    "llama-tied": dict(arch="llama"),
    "llama-output-ropefreqs-linear": dict(arch="llama", tied=False, rope_freqs=True, scaling=4.0),
    "llama-headdim32": dict(arch="llama", head_dim=32),
    "qwen2-bias": dict(arch="qwen2", tied=False),
    "qwen3-qknorm-headdim32": dict(arch="qwen3", head_dim=32),
    "qwen3-qknorm-output": dict(arch="qwen3", tied=False),
    "phi3-fused": dict(arch="phi3", tied=False),
    "qwen3-q8_0": dict(arch="qwen3", tied=False, wtype="q8_0"),
    "phi3-f16": dict(arch="phi3", wtype="f16"),
    "llama-q8_0": dict(arch="llama", tied=False, wtype="q8_0"),
    # a window of 16 tokens, shorter than the prompts; soft caps low enough to bite
    "gemma2-swa16-softcaps": dict(arch="gemma2", keys={**SWA16, "attn_logit_softcapping": (5.0, F32V),
                                                         "final_logit_softcapping": (8.0, F32V)}),
    "gemma2-default-caps-f16": dict(arch="gemma2", wtype="f16"),
    "gemma3-swa16-linear8": dict(arch="gemma3", n_layer=6, scaling=8.0, keys=SWA16),
    "gemma3-q4_k-output-softcap": dict(arch="gemma3", tied=False, wtype="q4_k", n_embd=256, n_ff=256,
                                       keys={**SWA16, "attention.sliding_window_pattern": (2, U32),
                                             "final_logit_softcapping": (10.0, F32V),
                                             "rope.freq_base_swa": (500.0, F32V)}),
    "gemma3-global-only": dict(arch="gemma3"),
    "qwen3-yarn4": dict(arch="qwen3", rope=("yarn", 4.0, 64)),
    "llama-yarn2-q8_0": dict(arch="llama", wtype="q8_0", rope=("yarn", 2.0, 128)),
    "phi3-longrope-long": dict(arch="phi3", rope=("longrope", 64)),
    "phi3-longrope-short": dict(arch="phi3", rope=("longrope", 4096)),
}


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("flash_attn", [False, True])
def test_synthetic_model_matches_llama_cpp(tmp_path, vocab_fields, variant, flash_attn):
    path = synth(tmp_path / f"{variant}.gguf", vocab_fields, **VARIANTS[variant])
    prompt = [int(x) for x in np.random.default_rng(1).integers(0, 49152, 80)]
    ref = llama_ref.run({"kind": "logits", "model": path, "prompts": [prompt], "flash_attn": flash_attn})["logits0"]
    with Model(path, ctx_size=256, n_threads=2, flash_attn=flash_attn) as m:
        ours = m.eval(prompt, logits_all=True)
    diff = float(np.abs(ours - ref).max())
    print(f"\n{variant} flash_attn={flash_attn}: max|dlogit| = {diff:.5f}")
    assert np.array_equal(ours, ref)     # the same ggml, the same graph: the same bits


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


@pytest.mark.parametrize("variant", ["llama-tied", "qwen2-bias", "qwen3-qknorm-headdim32", "phi3-fused", "qwen3-q8_0",
                                     "phi3-f16", "gemma2-swa16-softcaps", "gemma3-q4_k-output-softcap",
                                     "gemma3-swa16-linear8", "qwen3-yarn4", "phi3-longrope-long"])
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
    streamed, st = run(n_gpu_layers=0, async_prefetch=True, prefetch_depth=1)   # a pool of 2 slots
    assert st["n_slots"] == 2 and st["layers_pinned"] == 0 and st["loads"] > 0
    paged, st = run(paged_kv=True, kv_page_size=16, kv_device_layers=1, async_prefetch=True)
    assert st["kv_pages_loaded"] > 0
    assert np.array_equal(paged, ref)
    assert np.array_equal(streamed, ref)


@pytest.mark.parametrize("variant", ["qwen3-q8_0", "phi3-fused", "gemma2-swa16-softcaps", "gemma3-swa16-linear8",
                                     "gemma3-q4_k-output-softcap", "llama-yarn2-q8_0", "phi3-longrope-long"])
def test_greedy_text_matches_llama_cpp_over_48_tokens(tmp_path, vocab_fields, variant):
    path = synth(tmp_path / f"{variant}.gguf", vocab_fields, **VARIANTS[variant])
    prompts = ["Once upon a time", "def fibonacci(n):"]
    ref = llama_ref.run({"kind": "generate", "model": path, "prompts": prompts, "max_tokens": 48})
    with Model(path, ctx_size=256, n_threads=2) as m:
        for i, prompt in enumerate(prompts):
            out = m.create_completion(prompt, max_tokens=48, temperature=0.0, repeat_penalty=1.0)
            assert out["choices"][0]["text"] == str(ref[f"text{i}"])
            assert out["usage"]["completion_tokens"] == 48 and len(out["choices"][0]["text"]) > 48


def test_gemma3_vision_tower_is_refused(tmp_path, vocab_fields):
    path = synth(tmp_path / "gemma3-vision.gguf", vocab_fields, arch="gemma3",
                 extra={"v.patch_embd.weight": np.zeros((4, 4), np.float32)})
    with pytest.raises(UnsupportedModelError, match="vision tower .'v.patch_embd.weight'"):
        Model(path)


@pytest.mark.parametrize("variant", ["llama-tied", "qwen2-bias", "qwen3-q8_0", "phi3-longrope-long",
                                     "gemma2-swa16-softcaps", "gemma3-q4_k-output-softcap"])
def test_analyze_works_on_every_family(tmp_path, vocab_fields, variant, capsys):
    import json

    from superggml import cli

    path = synth(tmp_path / f"{variant}.gguf", vocab_fields, **VARIANTS[variant])
    assert cli.main(["analyze", "-m", path, "--json", "--no-measure", "--device-budget", "1MiB"]) == 0
    d = json.loads(capsys.readouterr().out)
    arch = VARIANTS[variant]["arch"]
    lay = d["layout"]
    assert lay["arch"] == arch and lay["n_layer"] == VARIANTS[variant].get("n_layer", N_LAYER)
    assert all(b > 0 for b in lay["block_bytes"]) and d["plans"][0]["n_slots"] >= 1


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
    prompts = (long, " ".join(["alpha beta gamma delta"] * 6) + " omega")     # a shared prefix ending long ago
    with Model(path, ctx_size=256, n_threads=2) as m:
        ref = [m.create_completion(p, max_tokens=8, temperature=0.0)["choices"][0]["text"] for p in prompts]
    with Model(path, ctx_size=256, n_threads=2, paged_kv=True, kv_page_size=16) as m:
        kept, truncate = [], m._exec.truncate
        m._exec.truncate = lambda n: kept.append((n, truncate(n))) or kept[-1][1]
        out = [m.create_completion(p, max_tokens=8, temperature=0.0)["choices"][0]["text"] for p in prompts]
    assert out == ref
    assert kept[-1][0] > 20 and kept[-1][1] == 0     # the shared prefix was there, but not its window's keys
