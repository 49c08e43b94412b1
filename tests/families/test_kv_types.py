"""Quantized and other K/V cache types (cache_type_k/-ctk, cache_type_v/-ctv): llama.cpp's logits, bit for bit, with
the same types, resident and with paged K/V (pages of 16 and 256 tokens, spilled to host and disk)."""

from __future__ import annotations

import numpy as np
import pytest

import llama_ref
from superggml import Model, native, models
from superggml.settings import KV_CACHE_TYPES, KV_QUANTIZED, Settings
from cli_runner import run_cli

N_DECODE = 3
KW = dict(ctx_size=256, n_batch=64, n_threads=2)  # CPU repack on, as llama.cpp's default
TEXT = "The quick brown fox jumps over the lazy dog, and then it runs into the forest where"


def gtype(name: str) -> int:
    return int(getattr(native.GGMLType, name.upper()))


def configs(model: str) -> list[tuple[str, str, bool]]:
    """Every type for K and V with flash attention; quantized K without it (V F16, transposed), on SmolLM2 all of
    them and on Qwen two block layouts."""
    fa = [(t, t, True) for t in KV_CACHE_TYPES]
    k_only = [(t, "f16", False) for t in (KV_QUANTIZED if model == "smollm2" else ("q8_0", "q4_1"))]
    return fa + k_only + [("f32", "bf16", False)]


PATHS = {"smollm2": models.smollm2_path, "qwen": models.qwen_path}


@pytest.fixture(scope="module", params=list(PATHS))
def reference(request):
    path = str(PATHS[request.param]())
    with Model(path, **KW) as m:
        prompt = m.tokenize(TEXT)
    cfgs = configs(request.param)
    ref = llama_ref.run(
        {
            "kind": "kv_types",
            "model": path,
            "prompt": prompt,
            "n_decode": N_DECODE,
            "configs": [[gtype(k), gtype(v), fa] for k, v, fa in cfgs],
            "n_ctx": KW["ctx_size"],
            "n_batch": KW["n_batch"],
        }
    )
    return path, prompt, {c: ref[f"logits{i}"] for i, c in enumerate(cfgs)}


def run(m: Model, prompt: list[int]) -> np.ndarray:
    rows = [m.eval(prompt, logits_all=True).copy()]
    for _ in range(N_DECODE):
        rows.append(m.eval([int(np.argmax(rows[-1][-1]))]).copy())
    return np.concatenate(rows)


@pytest.mark.parametrize("paging", ["resident", "paged16", "paged256"])
def test_kv_types_equal_llama_cpp(reference, paging, tmp_path):
    path, prompt, ref = reference
    kw: dict = {}
    if paging != "resident":  # pages leave the device: host pages (16) or the spill file (256)
        kw = dict(paged_kv=True, kv_page_size=int(paging[5:]), kv_device_layers=2)
        if paging == "paged256":
            kw.update(host_budget=0, kv_spill_dir=str(tmp_path))
    bad = []
    for (k, v, fa), want in ref.items():
        with Model(path, **KW, **kw, cache_type_k=k, cache_type_v=v, flash_attn=fa) as m:
            got = run(m, prompt)
            if paging != "resident":
                assert m.stats()["kv_pages_written_back"] > 0
        if not np.array_equal(got, want):
            bad.append((k, v, fa, float(np.abs(got - want).max())))
    assert not bad, f"logits differ from llama.cpp's: {bad}"


def test_kv_bytes_per_token(smollm2_path):
    """K/V bytes per token follow the types' block sizes (SmolLM2: 30 layers of 192 K and 192 V channels)."""
    want = {
        "f32": 46080,
        "f16": 23040,
        "bf16": 23040,
        "q8_0": 12240,
        "q4_0": 6480,
        "q4_1": 7200,
        "q5_0": 7920,
        "q5_1": 8640,
        "iq4_nl": 6480,
    }
    for t, n in want.items():
        with Model(smollm2_path, ctx_size=64, n_threads=1, kv_type=t, flash_attn=True) as m:
            assert m.kv_bytes == n * 64, t


def test_options():
    s = Settings.from_options(dict(kv_type="q8_0", flash_attn=True)).context
    assert (s.cache_type_k, s.cache_type_v) == ("q8_0", "q8_0")
    s = Settings.from_options(dict(cache_type_k="q4_0")).context  # a quantized K needs no flash attention
    assert (s.cache_type_k, s.cache_type_v) == ("q4_0", "f16")
    with pytest.raises(ValueError, match="quantized V cache .* requires flash_attn"):
        Settings.from_options(dict(cache_type_v="q4_0"))
    with pytest.raises(ValueError, match="cache_type_k must be one of"):
        Settings.from_options(dict(cache_type_k="q2_k"))
    with pytest.raises(ValueError, match="kv_type sets both"):
        Settings.from_options(dict(kv_type="q8_0", cache_type_k="q4_0", flash_attn=True))


def test_cli_flags(model_kwargs, smollm2_path, capsys):
    run_cli(
        capsys,
        "generate",
        "-m",
        smollm2_path,
        "-p",
        "Hi",
        "-n",
        "2",
        "--temp",
        "0",
        "-c",
        "64",
        "-ctk",
        "q8_0",
        "-ctv",
        "q5_0",
        "--flash-attn",
    )
    assert model_kwargs["cache_type_k"] == "q8_0" and model_kwargs["cache_type_v"] == "q5_0"
    err = run_cli(capsys, "generate", "-m", smollm2_path, "-p", "Hi", "-n", "2", "-ctv", "q8_0", rc=1).err
    assert "requires flash_attn" in err


def test_batch_and_speculative_with_quantized_kv(smollm2_path):
    """Several sequences in one pass, and speculative decoding, over a q8_0/q4_0 cache: the plain run's greedy
    tokens."""
    kw = dict(KW, cache_type_k="q8_0", cache_type_v="q4_0", flash_attn=True)
    prompts = ["Once upon a time", "The capital of France is", "def add(a, b):"]
    with Model(smollm2_path, **kw) as m:
        plain = [m.create_completion(p, max_tokens=8, temperature=0)["choices"][0]["text"] for p in prompts]
        batched = m.create_completion(prompts, max_tokens=8, temperature=0)
        assert [c["text"] for c in sorted(batched["choices"], key=lambda c: c["index"])] == plain
    with Model(smollm2_path, **kw, draft_model=smollm2_path, draft_k=3) as m:
        spec = [m.create_completion(p, max_tokens=8, temperature=0)["choices"][0]["text"] for p in prompts]
        assert m.stats()["draft_accepted"] > 0
    assert spec == plain
