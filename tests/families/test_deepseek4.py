"""deepseek4 (DeepSeek V4) on synthetic GGUFs (tests/support/synth_deepseek4.py) against llama.cpp: hyper-connections,
the raw sliding window, CSA (ratio 4, the lightning indexer's top k) and HCA (ratio 128) compressed K/V, hash-routed
and sqrt-softplus experts. Prompts run past 128 tokens, so every compressor completes blocks, in chunks whose
boundaries fall inside compressor windows, and decoding crosses a window's end."""

from __future__ import annotations

import os

import numpy as np
import pytest

import llama_ref
from greedy_reference import assert_greedy_equals_llama_cpp
from prompts import greedy_ids, greedy_rows as greedy, random_tokens as prompt_of
from superggml import Model, UnsupportedModelError
from synth_deepseek4 import synth_deepseek4


@pytest.fixture(scope="module")
def ds4(tmp_path_factory, small_vocab):
    return synth_deepseek4(str(tmp_path_factory.mktemp("ds4") / "ds4.gguf"), small_vocab)


@pytest.mark.parametrize(
    "n_batch", [64, pytest.param(512, marks=pytest.mark.slow), pytest.param(5, marks=pytest.mark.slow)]
)
def test_logits_and_48_greedy_tokens_equal_llama_cpp(ds4, n_batch):
    """Flash attention off and on, F16 K/V: a 260-token prompt in chunks of n_batch (n_batch 5 splits CSA windows
    across passes), then 48 greedy tokens, every row bit for bit."""
    prompt = prompt_of(260)
    assert_greedy_equals_llama_cpp(ds4, prompt, 48, n_batch=n_batch, n_ctx=512)


@pytest.mark.slow
def test_streamed_cached_and_split_equal_resident(ds4):
    """Blocks streamed through 2 slots (40% of them or less), a quarter of the experts cached, both, and the blocks
    split over two devices: the same bits as resident."""
    prompt = prompt_of(140, 2)
    experts = 4 * 8 * 3 * 32 * 64 * 4  # 4 trunk blocks of 8 F32 experts of gate, up and down

    def run(**kw):
        with Model(ds4, ctx_size=256, n_threads=2, n_batch=32, repack=False, **kw) as m:
            out = [m.eval(prompt, logits_all=True).copy()] + [m.eval([t]).copy() for t in (5, 6, 7)]
            return np.concatenate(out), m.stats()

    ref, _ = run()
    streamed, st = run(n_gpu_layers=0, async_prefetch=True, prefetch_depth=1)
    assert st["n_slots"] == 2 and st["loads"] > 0
    assert np.array_equal(streamed, ref)
    streamed, st = run(device_budget=int(0.4 * os.path.getsize(ds4)), async_prefetch=True, prefetch_depth=1)
    assert st["loads"] > 0
    assert np.array_equal(streamed, ref)
    cached, st = run(expert_cache=experts // 4)
    assert st["expert_misses"] > 0
    assert np.array_equal(cached, ref)
    both, st = run(n_gpu_layers=0, expert_cache=experts // 4, prefetch_depth=1)
    assert st["loads"] > 0 and st["expert_misses"] > 0
    assert np.array_equal(both, ref)
    split, st = run(devices=["CPU", "CPU"], tensor_split=[1, 1])
    assert st["blocks_per_device"] == [2, 2]
    assert np.array_equal(split, ref)


def test_paged_raw_keys_equal_contiguous(ds4):
    """paged_kv: the raw keys in pages of 16 tokens (on the device for every block, or one block's frame at a time
    with the rest paged to the host), the pages the sliding window left freed unless swa_full; the compressed rows
    and rings beside them. The same bits as the contiguous memory, going back 3 tokens included."""
    prompt = prompt_of(140, 2)

    def run(**kw):
        with Model(ds4, ctx_size=256, n_threads=2, n_batch=32, **kw) as m:
            out = [m.eval(prompt, logits_all=True).copy()] + [m.eval([t]).copy() for t in (5, 6, 7)]
            assert m.truncate(140) == 140
            out.append(m.eval([9, 10], logits_all=True).copy())
            return np.concatenate(out), m.stats()

    ref, _ = run()
    paged, st = run(paged_kv=True, kv_page_size=16)
    full, st_full = run(paged_kv=True, kv_page_size=16, swa_full=True)
    assert st["kv_tokens"] < st_full["kv_tokens"] == 4 * 142  # the window freed what no query sees again
    one, st = run(paged_kv=True, kv_page_size=16, kv_device_layers=1, async_prefetch=True)
    assert st["kv_frames"] == 1 and st["kv_pages_loaded"] > 0
    for got in (paged, full, one):
        assert np.array_equal(got, ref)


def test_going_back_a_few_tokens_recomputes_the_same(ds4):
    """A sequence taken back by 10 tokens (into a CSA window, past an HCA block's end) and fed other tokens gives
    the logits of a fresh run of the same tokens; taken back by 40 (more than its compressors' rings keep) it
    keeps nothing and is fed again from its start. Passes of 2 rows: both runs compute the same passes."""
    first, second = prompt_of(140, 3), prompt_of(10, 4)
    kw = dict(ctx_size=256, n_batch=2, n_threads=2)
    for keep, kept in ((130, 130), (100, 0)):
        with Model(ds4, **kw) as m:
            m.eval(first)
            assert m.truncate(keep) == kept
            if kept < keep:
                m.eval(first[kept:keep])
            got = m.eval(second, logits_all=True).copy()
        with Model(ds4, **kw) as fresh:
            fresh.eval(first[:keep])
            assert np.array_equal(got, fresh.eval(second, logits_all=True))


def test_files_llama_cpp_cannot_run_are_refused(tmp_path, small_vocab):
    """No ratio-4 block (llama.cpp dies of a division by zero creating its context); an MTP block that compresses
    (llama.cpp's graph_mtp asserts) drafts nothing."""
    with pytest.raises(UnsupportedModelError, match="ratio-4"):
        Model(synth_deepseek4(str(tmp_path / "a.gguf"), small_vocab, compress_ratios=(0, 128)))
    path = synth_deepseek4(str(tmp_path / "c.gguf"), small_vocab, mtp=False)
    with pytest.raises(UnsupportedModelError, match="no next-token-prediction"):
        Model(path, draft_mtp=True)


@pytest.mark.parametrize("paged", [False, True])
def test_a_restored_sequence_continues_bit_identically(ds4, tmp_path, paged):
    """The raw K, the compressed and indexer rows of the blocks completed, and the compressors' rings are saved; a
    sequence restored into a model that ran another continues as the saved one did (past the next HCA block)."""
    prompt, more = prompt_of(150, 5), prompt_of(120, 6)
    kw = dict(ctx_size=512, n_batch=32, n_threads=2, **(dict(paged_kv=True, kv_page_size=16) if paged else {}))
    with Model(ds4, **kw) as m:
        m.eval(prompt)
        m.save_sequence(tmp_path / "s.seq")
        ref = m.eval(more, logits_all=True).copy()
    with Model(ds4, **kw) as m:
        m.eval(prompt_of(40, 7))
        assert m.load_sequence(tmp_path / "s.seq") == len(prompt)
        assert np.array_equal(m.eval(more, logits_all=True), ref)


@pytest.mark.slow
@pytest.mark.parametrize("batch_invariant", [True, False])
def test_speculative_decoding_rolls_the_compressed_memory_back(ds4, tmp_path, small_vocab, batch_invariant):
    """A draft model of other weights: nearly every draft is rejected, so each check takes the sequence back by up to
    4 tokens (its rings and compressed rows included), and the greedy text is the plain one."""
    draft = synth_deepseek4(str(tmp_path / "draft.gguf"), small_vocab, seed=1)
    prompt = prompt_of(150, 8)
    kw = dict(ctx_size=512, n_threads=2, batch_invariant=batch_invariant)

    with Model(ds4, **kw) as m:
        plain = greedy_ids(m, prompt, 40)
    with Model(ds4, draft_model=draft, draft_k=4, **kw) as m:
        assert greedy_ids(m, prompt, 40) == plain
        st = m.stats()
        assert st["draft_tokens"] > 4 * st["draft_accepted"]


@pytest.mark.parametrize(
    "kv_type, flash_attn",
    [("q8_0", True), pytest.param("q4_0", True, marks=pytest.mark.slow), ("bf16", False), ("f32", False)],
)
def test_cache_types_equal_llama_cpp(ds4, kv_type, flash_attn):
    """A quantized cache rotates Q, the raw keys and the compressed rows by a Walsh-Hadamard matrix and the output
    back, as llama.cpp (quantized V: flash attention only, as llama.cpp); the indexer's keys are rotated always."""
    ggml = {"q8_0": 8, "q4_0": 2, "bf16": 30, "f32": 0}[kv_type]
    prompt = prompt_of(200)
    req = {"kind": "kv_types", "model": ds4, "prompt": prompt, "n_decode": 3, "n_ctx": 512, "n_batch": 64}
    ref = llama_ref.start({**req, "configs": [[ggml, ggml, flash_attn]]})
    with Model(ds4, ctx_size=512, n_batch=64, n_threads=2, flash_attn=flash_attn, kv_type=kv_type) as m:
        got = greedy(m, prompt, 3)
    assert np.array_equal(got, ref.result()["logits0"])
