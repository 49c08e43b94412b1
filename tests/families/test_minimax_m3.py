"""minimax-m3 (MiniMax-M3) on synthetic GGUFs (tests/support/synth_minimax_m3.py) against llama.cpp, without flash
attention (dense attention in every block) and with it (MiniMax Sparse Attention in the blocks past the dense one:
rows at positions >= top_k * block_size = 64 attend to some of their blocks only)."""

from __future__ import annotations

import os

import logging

import numpy as np
import pytest

import llama_ref
from prompts import greedy_rows as greedy, random_tokens as prompt_of
from saving import assert_restored_continues
from superggml import Model, UnsupportedModelError
from superggml.arch.base import PassInputs
from superggml.arch.minimax_m3 import NO_FLASH, SEVERAL
from synth_gguf import expert_bytes
from synth_minimax_m3 import synth_minimax_m3

SPARSE_FROM = 64  # top_k 4 blocks of 16: rows before this keep every block


@pytest.fixture(scope="module")
def m3(tmp_path_factory, small_vocab):
    return synth_minimax_m3(str(tmp_path_factory.mktemp("m3") / "m3.gguf"), small_vocab)


@pytest.mark.parametrize("n_batch", [16, 512])
def test_logits_and_48_greedy_tokens_equal_llama_cpp(m3, n_batch):
    """A 200-token prompt in passes of n_batch (MSA's batch path), then 48 greedy tokens (its decode path), every row
    bit for bit, flash attention off and on; on, the rows past SPARSE_FROM attend to other keys than off."""
    prompt = prompt_of(200)
    req = {"kind": "kv_types", "model": m3, "prompt": prompt, "configs": [(1, 1, False), (1, 1, True)], "n_decode": 48}
    ref = llama_ref.start({**req, "n_ctx": 512, "n_batch": n_batch})
    ours, paths = [], []
    for fa in (False, True):
        with Model(m3, ctx_size=512, n_batch=n_batch, n_threads=2, flash_attn=fa) as m:
            ours.append(greedy(m, prompt, 48))
            paths.append(m.arch.attention_path)
    refs = ref.result()
    assert paths == [NO_FLASH, "MSA"] and isinstance(m.arch, PassInputs)
    for i in range(2):
        assert np.array_equal(ours[i], refs[f"logits{i}"]), i
    gap = np.abs(ours[1][: len(prompt)] - ours[0][: len(prompt)]).max(axis=1)
    assert gap[:SPARSE_FROM].max() < 0.01 and np.median(gap[SPARSE_FROM:]) > 0.1  # blocks were dropped


def test_last_rows_only_equal_llama_cpp(m3):
    """Passes that want only their last row's logits (the last block drops the others after attention)."""
    prompt = prompt_of(150, 4)
    req = {"kind": "tail", "model": m3, "prompt": prompt, "n_decode": 3, "flash_attn": True}
    ref = llama_ref.start({**req, "n_ctx": 256, "n_batch": 64})
    with Model(m3, ctx_size=256, n_batch=64, n_threads=2, flash_attn=True) as m:
        rows = [m.eval(prompt)[-1].copy()]
        for _ in range(3):
            rows.append(m.eval([int(np.argmax(rows[-1]))])[-1].copy())
    assert np.array_equal(np.stack(rows), ref.result()["logits"])


def test_token_by_token_equals_llama_cpp(m3):
    """40 tokens in one pass, then 110 one at a time (MSA's decode path over a growing memory)."""
    prompt = prompt_of(150, 5)
    req = {"kind": "logits", "model": m3, "prompts": [prompt], "split": 40, "one_by_one": True, "flash_attn": True}
    ref = llama_ref.start({**req, "n_ctx": 256})
    with Model(m3, ctx_size=256, n_threads=2, flash_attn=True) as m:
        rows = [m.eval(prompt[:40], logits_all=True).copy()] + [m.eval([t]).copy() for t in prompt[40:]]
    assert np.array_equal(np.concatenate(rows), ref.result()["logits0"])


@pytest.mark.parametrize(
    "synth_kw,kv", [({}, "f32"), ({}, "q8_0"), ({"head_dim": 64, "idx_dim": 64, "fused_qkv": True}, "q8_0")]
)
def test_cache_types_with_msa_equal_llama_cpp(tmp_path, small_vocab, synth_kw, kv):
    """F32 and Q8_0 K/V (the indexer's keys in the K type too; heads of 64 rotated by Walsh-Hadamard)."""
    path = synth_minimax_m3(str(tmp_path / "m3.gguf"), small_vocab, **synth_kw)
    prompt, t = prompt_of(120, 2), {"f32": 0, "q8_0": 8}[kv]
    req = {"kind": "kv_types", "model": path, "prompt": prompt, "configs": [(t, t, True)], "n_decode": 6}
    ref = llama_ref.start({**req, "n_ctx": 256, "n_batch": 64})
    with Model(path, ctx_size=256, n_batch=64, n_threads=2, flash_attn=True, kv_type=kv) as m:
        assert np.array_equal(greedy(m, prompt, 6), ref.result()["logits0"])


@pytest.mark.parametrize(
    "kw",
    [
        dict(block_size=24, local_blocks=2),
        dict(top_k=2, block_size=32, n_dense=0),
        dict(local_blocks=0),
        dict(local_blocks=6),
        dict(top_k=64),
        dict(block_size=512, top_k=2),
    ],
)
def test_block_layouts_equal_llama_cpp(tmp_path, small_vocab, kw):
    """A block size that does not divide 256, two local blocks; no dense block and two blocks of 32 kept; no block
    forced; more forced than kept (llama.cpp keeps some of them); every block kept; one block over every position."""
    path = synth_minimax_m3(str(tmp_path / "m3.gguf"), small_vocab, **kw)
    prompt = prompt_of(160, 3)
    req = {"kind": "kv_types", "model": path, "prompt": prompt, "configs": [(1, 1, True)], "n_decode": 4}
    ref = llama_ref.start({**req, "n_ctx": 256, "n_batch": 100})
    with Model(path, ctx_size=256, n_batch=100, n_threads=2, flash_attn=True) as m:
        assert np.array_equal(greedy(m, prompt, 4), ref.result()["logits0"])


@pytest.mark.parametrize(
    "kw,why",
    [
        (dict(idx_head=1), "indexer heads"),
        (dict(idx_dim=8), "RoPE"),
        (dict(n_dense=4), "no sparse block"),
        (dict(top_k=0), "top_k 0"),
    ],
)
def test_files_msa_cannot_run_are_refused_with_flash_attention(tmp_path, small_vocab, kw, why):
    """llama.cpp aborts on the first three with flash attention (and zeroes every sparse row on the last); without
    it they run densely, here as there."""
    path = synth_minimax_m3(str(tmp_path / "m3.gguf"), small_vocab, **kw)
    with Model(path, ctx_size=256, n_threads=2, flash_attn=True) as m:
        with pytest.raises(UnsupportedModelError, match=why):
            m.eval(prompt_of(8))
    with Model(path, ctx_size=256, n_threads=2) as m:
        assert np.isfinite(m.eval(prompt_of(8))).all()


def test_several_sequences_in_a_pass_attend_densely(m3, caplog):
    """MSA needs a pass over one sequence (llama.cpp: one sequence, or per-sequence streams); a pass over several
    attends densely, as llama.cpp's unified cache, and says so; the sequence's own passes run MSA again."""
    with Model(m3, ctx_size=256, n_threads=2, flash_attn=True) as m:
        with caplog.at_level(logging.WARNING, logger="superggml.arch.minimax_m3"):
            m.eval_batch([(1, prompt_of(70, 1)), (2, prompt_of(70, 2))])
        assert m.arch.attention_path == SEVERAL and "running DENSE attention" in caplog.text
        m.eval(prompt_of(80, 3))
        assert m.arch.attention_path == "MSA"


@pytest.mark.slow
@pytest.mark.parametrize("flash_attn", [False, True])
def test_streamed_cached_paged_and_split_equal_resident(m3, tmp_path, flash_attn):
    """Blocks streamed through 2 slots, a quarter of the experts cached, both, the K/V paged, the blocks split over
    two devices, a saved sequence restored: the same bits as resident (the indexer's keys page and save with K)."""
    prompt = prompt_of(90, 2)
    experts = expert_bytes(m3)

    def run(**kw):
        with Model(m3, ctx_size=256, n_threads=2, n_batch=32, repack=False, flash_attn=flash_attn, **kw) as m:
            out = [m.eval(prompt, logits_all=True).copy()] + [m.eval([t]).copy() for t in (5, 6, 7)]
            assert m.arch.attention_path == ("MSA" if flash_attn else NO_FLASH), kw
            return np.concatenate(out)

    ref = run()
    for kw in (
        dict(n_gpu_layers=0, async_prefetch=True, prefetch_depth=1),
        dict(device_budget=int(0.4 * os.path.getsize(m3)), async_prefetch=True),
        dict(n_gpu_layers=0, expert_cache=experts // 4, prefetch_depth=1),
        dict(expert_cache=experts // 4),
        dict(paged_kv=True, kv_page_size=16, kv_device_layers=1),
        dict(devices=["CPU", "CPU"], tensor_split=[1, 1]),
    ):
        assert np.array_equal(run(**kw), ref), kw
    assert_restored_continues(m3, tmp_path, prompt_of(80, 3), flash_attn=flash_attn)
