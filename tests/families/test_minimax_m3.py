"""minimax-m3 (MiniMax-M3) on synthetic GGUFs (tests/support/synth_minimax_m3.py) against llama.cpp without flash
attention, where llama.cpp attends densely in every block (its MSA runs only with flash attention, which superggml
refuses for those blocks)."""

from __future__ import annotations

import numpy as np
import pytest

import llama_ref
from saving import assert_restored_continues
from superggml import Model, UnsupportedModelError
from synth_gguf import expert_bytes
from synth_minimax_m3 import synth_minimax_m3


@pytest.fixture(scope="module")
def m3(tmp_path_factory, small_vocab):
    return synth_minimax_m3(str(tmp_path_factory.mktemp("m3") / "m3.gguf"), small_vocab)


def prompt_of(n: int, seed: int = 1) -> list[int]:
    return [int(x) for x in np.random.default_rng(seed).integers(3, 1000, n)]


def test_logits_and_48_greedy_tokens_equal_llama_cpp(m3):
    """A 100-token prompt in passes of 16, then 48 greedy tokens, every row bit for bit."""
    prompt = prompt_of(100)
    req = {"kind": "kv_types", "model": m3, "prompt": prompt, "configs": [(1, 1, False)], "n_decode": 48}
    ref = llama_ref.start({**req, "n_ctx": 256, "n_batch": 16})
    with Model(m3, ctx_size=256, n_batch=16, n_threads=2) as m:
        rows = [m.eval(prompt, logits_all=True).copy()]
        for _ in range(48):
            rows.append(m.eval([int(np.argmax(rows[-1][-1]))]).copy())
    assert np.array_equal(np.concatenate(rows), ref.result()["logits0"])


def test_flash_attention_is_refused_where_llama_cpp_would_run_msa(m3):
    with Model(m3, ctx_size=256, n_threads=2, flash_attn=True) as m:
        with pytest.raises(UnsupportedModelError, match="MSA"):
            m.eval(prompt_of(8))


@pytest.mark.slow
def test_streamed_cached_paged_and_split_equal_resident(m3, tmp_path):
    prompt = prompt_of(40, 2)
    experts = expert_bytes(m3)

    def run(**kw):
        with Model(m3, ctx_size=256, n_threads=2, n_batch=8, repack=False, **kw) as m:
            out = [m.eval(prompt, logits_all=True).copy()] + [m.eval([t]).copy() for t in (5, 6, 7)]
            return np.concatenate(out)

    ref = run()
    for kw in (
        dict(n_gpu_layers=0, async_prefetch=True, prefetch_depth=1),
        dict(expert_cache=experts // 4),
        dict(paged_kv=True, kv_page_size=16, kv_device_layers=1),
        dict(devices=["CPU", "CPU"], tensor_split=[1, 1]),
    ):
        assert np.array_equal(run(**kw), ref), kw
    assert_restored_continues(m3, tmp_path, prompt_of(30, 3))
