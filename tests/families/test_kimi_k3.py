"""kimi-k3 (Kimi-K3) and kimi-linear on synthetic GGUFs (tests/support/synth_kimi_k3.py, synth_kimi_linear.py)
against llama.cpp: KDA blocks (three convs, a per-channel decay) beside nope-only MLA blocks; Kimi-K3's cross-layer
residual attention over banked inputs, situ activation and latent MoE."""

from __future__ import annotations

import os

import numpy as np
import pytest

from greedy_reference import assert_greedy_equals_llama_cpp
from prompts import greedy_ids, random_tokens as prompt_of
from rollback import assert_going_back_replays
from saving import assert_restored_continues
from superggml import Model
from synth_gguf import expert_bytes
from synth_kimi_k3 import synth_kimi_k3
from synth_bailingmoe3 import synth_bailingmoe3
from synth_kimi_linear import synth_kimi_linear

MAKERS = {"kimi-k3": synth_kimi_k3, "kimi-linear": synth_kimi_linear, "bailingmoe3": synth_bailingmoe3}


@pytest.fixture(scope="module", params=list(MAKERS))
def family(request):
    return request.param


@pytest.fixture(scope="module")
def k3(family, tmp_path_factory, small_vocab):
    return MAKERS[family](str(tmp_path_factory.mktemp(family) / "m.gguf"), small_vocab)


@pytest.mark.parametrize("n_batch", [16, pytest.param(512, marks=pytest.mark.slow)])
def test_logits_and_48_greedy_tokens_equal_llama_cpp(k3, n_batch):
    """A 100-token prompt in passes of n_batch, then 48 greedy tokens, flash attention off and on: every row."""
    prompt = prompt_of(100)
    assert_greedy_equals_llama_cpp(k3, prompt, 48, n_batch=n_batch)


@pytest.mark.slow
def test_streamed_cached_paged_and_split_equal_resident(k3):
    """Blocks streamed through 2 slots, a quarter of the experts cached (their latent inputs), both, the MLA
    blocks' latent rows paged one frame at a time, and the blocks over two devices: the same bits as resident."""
    prompt = prompt_of(40, 2)
    experts = expert_bytes(k3)

    def run(**kw):
        with Model(k3, ctx_size=256, n_threads=2, n_batch=8, repack=False, **kw) as m:
            out = [m.eval(prompt, logits_all=True).copy()] + [m.eval([t]).copy() for t in (5, 6, 7)]
            return np.concatenate(out), m.stats()

    ref, _ = run()
    for kw in (
        dict(n_gpu_layers=0, async_prefetch=True, prefetch_depth=1),
        dict(device_budget=int(0.4 * os.path.getsize(k3)), async_prefetch=True, prefetch_depth=1),
        dict(expert_cache=experts // 4),
        dict(n_gpu_layers=0, expert_cache=experts // 4, prefetch_depth=1),
        dict(paged_kv=True, kv_page_size=16, kv_device_layers=1),
        dict(devices=["CPU", "CPU"], tensor_split=[1, 1]),
    ):
        got, st = run(**kw)
        assert np.array_equal(got, ref), kw


def test_a_restored_sequence_continues_bit_identically(k3, tmp_path):
    """The MLA blocks' latent rows and the KDA blocks' windows and states are saved and restored."""
    assert_restored_continues(k3, tmp_path, prompt_of(30, 3))


def test_going_back_into_a_pass_replays_its_record(k3):
    """A pass of 6 rows leaves the KDA blocks' inputs (the three windows with their rows, the conv outputs, the
    decay and beta); going back 1 or 4 rows into it replays them, bit for bit with a fresh sequence."""
    assert_going_back_replays(k3, prompt_of(20, 5), prompt_of(6, 6), (1, 4))


@pytest.mark.slow
def test_speculative_decoding_keeps_the_greedy_text(k3, family, tmp_path, small_vocab):
    """A draft of other weights, nearly always rejected: the KDA states go back by replaying the check's
    record; the text is the plain greedy one."""
    draft = MAKERS[family](str(tmp_path / "draft.gguf"), small_vocab, seed=1)
    prompt = prompt_of(30, 4)
    kw = dict(ctx_size=256, n_threads=2, batch_invariant=True)

    with Model(k3, **kw) as m:
        plain = greedy_ids(m, prompt, 32)
    with Model(k3, draft_model=draft, draft_k=4, **kw) as m:
        assert greedy_ids(m, prompt, 32) == plain
        st = m.stats()
        assert st["draft_tokens"] > 0 and st["state_replays"] > 0
