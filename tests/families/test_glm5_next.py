"""glm5-next (GLM-5.3-Flash) on synthetic GGUFs (tests/support/synth_glm5_next.py) against llama.cpp: KDA blocks
beside nope-only MLA blocks made sparse by a k-pool indexer (top_k 16 over pools of 4: from position 19 on a query
sees fewer pools than it could), 4 hyper-connection streams, clamped experts."""

from __future__ import annotations

import os

import numpy as np
import pytest

import llama_ref
from greedy_reference import assert_greedy_equals_llama_cpp
from prompts import greedy_ids, greedy_rows as greedy, random_tokens as prompt_of
from rollback import assert_going_back_replays
from saving import assert_restored_continues
from superggml import Model, SuperggmlError, UnsupportedModelError
from synth_gguf import expert_bytes
from synth_glm5_next import synth_glm5_next


@pytest.fixture(scope="module")
def g5(tmp_path_factory, small_vocab):
    return synth_glm5_next(str(tmp_path_factory.mktemp("g5") / "g5.gguf"), small_vocab)


@pytest.mark.parametrize("n_batch", [16, 512])
def test_logits_and_48_greedy_tokens_equal_llama_cpp(g5, n_batch):
    """A 100-token prompt in passes of n_batch (16: the indexer's gather path, 512: its mask), then 48 greedy
    tokens (gathered), flash attention off and on: every row."""
    prompt = prompt_of(100)
    assert_greedy_equals_llama_cpp(g5, prompt, 48, n_batch=n_batch)


def test_streamed_cached_paged_and_split_equal_resident(g5):
    """Blocks streamed through 2 slots, and within a device budget of 40% of the file's bytes, a quarter of the
    experts cached, the MLA blocks' rows paged, the blocks over two devices: the same bits as resident."""
    prompt = prompt_of(40, 2)
    experts = expert_bytes(g5)

    def run(**kw):
        with Model(g5, ctx_size=256, n_threads=2, n_batch=8, repack=False, **kw) as m:
            out = [m.eval(prompt, logits_all=True).copy()] + [m.eval([t]).copy() for t in (5, 6, 7)]
            return np.concatenate(out)

    ref = run()
    for kw in (
        dict(n_gpu_layers=0, async_prefetch=True, prefetch_depth=1),
        dict(device_budget=int(0.4 * os.path.getsize(g5)), async_prefetch=True),
        dict(expert_cache=experts // 4),
        dict(paged_kv=True, kv_page_size=16, kv_device_layers=1),
        dict(devices=["CPU", "CPU"], tensor_split=[1, 1]),
    ):
        assert np.array_equal(run(**kw), ref), kw


def test_a_restored_sequence_continues_bit_identically(g5, tmp_path):
    """The MLA blocks' latent and indexer rows (with the pooled keys) and the KDA blocks' windows and states."""
    assert_restored_continues(g5, tmp_path, prompt_of(30, 3))


OPTIONS = {
    "mtp": dict(mtp=True),  # the NextN block loaded and never run, by llama.cpp as here
    "f16": dict(wtype="f16"),
    "q4_0": dict(wtype="q4_0"),
    "all-full-no-clamp": dict(shared_indexer=(), swiglu_limit=(None, None)),
    "top256": dict(indexer=(2, 16, 256)),  # every pool selected: the mask path even when decoding
    "tail-off": dict(select_tail=False),  # no tail: NaN rows in both without flash attention
}


@pytest.mark.parametrize("option", list(OPTIONS))
def test_generator_options_equal_llama_cpp(tmp_path, small_vocab, option):
    """A 100-token prompt in passes of 32 and 4 decoded tokens, flash attention off and on."""
    path = synth_glm5_next(str(tmp_path / "m.gguf"), small_vocab, **OPTIONS[option])
    prompt = prompt_of(100, 6)
    assert_greedy_equals_llama_cpp(path, prompt, 4, n_batch=32, equal_nan=True)


REFUSED = {  # files llama.cpp fails to load or aborts on (docs/dev/glm5-next.md section 5)
    "no rope.dimension_count": (dict(n_rot=None), "nope-only"),
    "rope.dimension_count 8": (dict(n_rot=8), "nope-only"),
    "kpool 1": (dict(kpool=1, indexer=(2, 16, 4)), "kpool"),
    "top_k 6 over pools of 4": (dict(indexer=(2, 16, 6)), "kpool"),
    "sinkhorn 0": (dict(hc_iters=0), "sinkhorn"),
    "a shared first MLA block": (dict(shared_indexer=(1, 3)), "first MLA block"),
    "KDA only": (dict(mla_layers=(), shared_indexer=()), "only KDA"),
    "no shared expert": (dict(n_shared=0), "shared"),
    "gating 9": (dict(gating=9), "gating"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_files_llama_cpp_cannot_run_are_refused(tmp_path, small_vocab, case):
    kw, reason = REFUSED[case]
    path = synth_glm5_next(str(tmp_path / "bad.gguf"), small_vocab, **kw)
    with pytest.raises((SuperggmlError, ValueError), match=reason):
        with Model(path, ctx_size=128, n_threads=2) as m:
            m.eval([1, 2, 3])


def test_going_back_into_a_pass_replays_its_record(g5):
    """A pass of 6 rows after 30 leaves the KDA blocks' inputs; going back 1 or 4 rows into it replays them, and
    the MLA rows and pools after are dropped. glm5-next's rows depend on how its passes split (30 + 1 + 2 tokens
    and one pass of 33 differ by ~1e-6 without any replay), and the replayed rows come from a pass of 6: the next
    logits are within 1e-4 of a sequence fed in passes of 30, keep and 2."""
    assert_going_back_replays(g5, prompt_of(30, 5), prompt_of(6, 6), (1, 4), atol=1e-4, batch_invariant=True)


@pytest.mark.slow
def test_speculative_decoding_keeps_the_greedy_text(g5, tmp_path, small_vocab):
    """A draft of other weights, nearly always rejected: the KDA states go back by replaying the check's record,
    the pools the rejected rows completed are dropped; the text is the plain greedy one."""
    draft = synth_glm5_next(str(tmp_path / "draft.gguf"), small_vocab, seed=1)
    prompt = prompt_of(30, 4)
    kw = dict(ctx_size=256, n_threads=2, batch_invariant=True)

    with Model(g5, **kw) as m:
        plain = greedy_ids(m, prompt, 32)
    with Model(g5, draft_model=draft, draft_k=4, **kw) as m:
        assert greedy_ids(m, prompt, 32) == plain
        st = m.stats()
        assert st["draft_tokens"] > 0 and st["state_replays"] > 0


def test_its_nextn_block_does_not_draft(tmp_path, small_vocab):
    """llama.cpp builds no graph for the NextN block (its MTP context fails): drafting with it is refused."""
    path = synth_glm5_next(str(tmp_path / "mtp.gguf"), small_vocab, mtp=True)
    with pytest.raises(UnsupportedModelError, match="glm5-next"):
        with Model(path, ctx_size=128, n_threads=2, draft_mtp=True) as m:
            m.eval([1, 2, 3])


@pytest.mark.parametrize("top_k", [16, 512])
def test_a_longer_prompt_in_short_passes_equals_llama_cpp(tmp_path, small_vocab, top_k):
    """300 tokens in passes of 16 (gathered) over a memory that grows past 256 rows, then 8 greedy tokens; top_k 512:
    128 pools per query, more than llama.cpp's padded pool count early on (every pool selected)."""
    path = synth_glm5_next(str(tmp_path / "m.gguf"), small_vocab, indexer=(2, 16, top_k))
    prompt = prompt_of(300, 7)
    assert_greedy_equals_llama_cpp(path, prompt, 8, n_batch=16, n_ctx=512)


def test_a_truncated_sequence_continues_as_if_fed_anew(g5):
    """Back to 50 tokens (in the middle of a pool; the KDA states from their checkpoint, the rows after it fed
    again), then other tokens: the pools they complete are pooled again, the logits those of a fresh run."""
    prompt, more = prompt_of(100, 8), prompt_of(20, 9)
    kw = dict(ctx_size=256, n_threads=2, n_batch=16, batch_invariant=True)
    with Model(g5, **kw) as m:
        m.eval(prompt)
        kept = m.truncate(50)
        if kept < 50:
            m.eval(prompt[kept:50])
        got = m.eval(more, logits_all=True).copy()
    with Model(g5, **kw) as m:
        m.eval(prompt[:50])
        assert np.array_equal(m.eval(more, logits_all=True), got)


def test_a_q8_0_cache_equals_llama_cpp(tmp_path, small_vocab):
    """Latent and indexer rows quantized (an indexer key of 32: rows of whole blocks; llama.cpp aborts on keys of
    16), flash attention on as a quantized V asks."""
    path = synth_glm5_next(str(tmp_path / "m.gguf"), small_vocab, indexer=(2, 32, 16))
    prompt = prompt_of(100, 10)
    req = {"kind": "kv_types", "model": path, "prompt": prompt, "n_decode": 3, "n_ctx": 256, "n_batch": 64}
    ref = llama_ref.start({**req, "configs": [[8, 8, True]]})
    with Model(path, ctx_size=256, n_batch=64, n_threads=2, flash_attn=True, kv_type="q8_0") as m:
        got = greedy(m, prompt, 3)
    assert np.array_equal(got, ref.result()["logits0"])


def test_a_quantized_cache_of_rows_it_cannot_divide_is_refused(tmp_path, small_vocab):
    """An indexer key of 16 leaves rows that q8_0's blocks of 32 do not divide (llama.cpp aborts): a clear error."""
    path = synth_glm5_next(str(tmp_path / "m.gguf"), small_vocab, indexer=(1, 16, 4), kpool=2)
    with pytest.raises(ValueError, match="blocks of 32 values, which this model's K/V rows"):
        with Model(path, ctx_size=64, n_threads=2, flash_attn=True, kv_type="q8_0") as m:
            m.eval([1, 2, 3])
