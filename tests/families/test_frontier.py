"""The 2026 families without a test file of their own (hy_v3, hy_v4, mimo2, dots3note) held to what every frontier
family owes: a prompt in passes, then 48 greedy tokens equal to llama.cpp's, flash attention off and on, streamed
within 40% of the file's bytes and restored from a saved sequence bit for bit. The family matrices (test_arch.py,
test_moe.py, ...) hold the rest: other generator options, paged K/V, a quarter of the experts cached."""

from __future__ import annotations

import os

import numpy as np
import pytest

from greedy_reference import assert_greedy_equals_llama_cpp
from prompts import random_tokens as prompt_of
from saving import assert_restored_continues
from superggml import Model
from synth_gguf import VARIANTS, synth

FAMILIES = ["hy_v4-dsa-shared"] + [
    pytest.param(v, marks=pytest.mark.slow) for v in ("hy_v3-mtp", "mimo2-swa-sinks", "dots3note-sparse-swa")
]


@pytest.fixture(scope="module", params=FAMILIES)
def model(request, tmp_path_factory, small_vocab):
    return synth(tmp_path_factory.mktemp("frontier") / f"{request.param}.gguf", small_vocab, **VARIANTS[request.param])


def test_logits_and_48_greedy_tokens_equal_llama_cpp(model):
    """A 100-token prompt in passes of 16, then 48 greedy tokens, flash attention off and on: every row."""
    prompt = prompt_of(100)
    assert_greedy_equals_llama_cpp(model, prompt, 48, n_batch=16)


def test_streamed_in_40_percent_equals_resident_and_a_restored_sequence_continues(model, tmp_path):
    prompt = prompt_of(40, 2)

    def run(**kw):
        with Model(model, ctx_size=256, n_threads=2, n_batch=8, repack=False, **kw) as m:
            out = [m.eval(prompt, logits_all=True).copy()] + [m.eval([t]).copy() for t in (5, 6, 7)]
            return np.concatenate(out), m.stats()

    ref, _ = run()
    got, st = run(device_budget=int(0.4 * os.path.getsize(model)))
    assert np.array_equal(got, ref) and st["loads"] > 0
    assert_restored_continues(model, tmp_path, prompt_of(30, 3))
