"""qwen4exp (Qwen4 experimental) on synthetic GGUFs (tests/support/synth_qwen4exp.py) against llama.cpp: gated
delta-net and gated attention blocks under hyper-connections, QSA block-sparse attention (a prompt of 100 tokens
runs past the indexer's budget of top_k + ratio - 1 cells, where QSA leaves dense attention), the PLE n-gram
embedding with its dilated conv."""

from __future__ import annotations

import os

import numpy as np
import pytest

from greedy_reference import assert_greedy_equals_llama_cpp
from prompts import greedy_ids, random_tokens as prompt_of
from rollback import assert_going_back_replays
from saving import assert_restored_continues
from cli_runner import run_cli
from superggml import GGUFError, Model
from synth_gguf import expert_bytes
from synth_qwen4exp import synth_qwen4exp

VARIANTS = {
    "qsa-ple": {},
    "qsa48-nople": {"compress_ratios": (0, 4, 0, 8), "ple_layer": None},
}


VARIANTS_OF: dict[str, str] = {}  # path -> variant


@pytest.fixture(scope="module", params=["qsa-ple", pytest.param("qsa48-nople", marks=pytest.mark.slow)])
def q4(request, tmp_path_factory, small_vocab):
    path = synth_qwen4exp(str(tmp_path_factory.mktemp("q4") / "m.gguf"), small_vocab, **VARIANTS[request.param])
    VARIANTS_OF[path] = request.param
    return path


@pytest.mark.parametrize("n_batch", [16, pytest.param(512, marks=pytest.mark.slow)])
def test_logits_and_48_greedy_tokens_equal_llama_cpp(q4, n_batch):
    """A 100-token prompt in passes of n_batch, then 48 greedy tokens, flash attention off and on: every row."""
    prompt = prompt_of(100)
    assert_greedy_equals_llama_cpp(q4, prompt, 48, n_batch=n_batch)


@pytest.mark.slow
def test_streamed_cached_paged_and_split_equal_resident(q4):
    """Blocks streamed through 2 slots, a quarter of the experts cached, the attention rows (K, V and the raw
    indexer keys after K) paged one frame at a time, and the blocks over two devices: the same bits as resident."""
    prompt = prompt_of(40, 2)
    experts = expert_bytes(q4)

    def run(**kw):
        with Model(q4, ctx_size=256, n_threads=2, n_batch=8, repack=False, **kw) as m:
            out = [m.eval(prompt, logits_all=True).copy()] + [m.eval([t]).copy() for t in (5, 6, 7)]
            return np.concatenate(out)

    ref = run()
    for kw in (
        dict(n_gpu_layers=0, async_prefetch=True, prefetch_depth=1),
        dict(device_budget=int(0.4 * os.path.getsize(q4)), async_prefetch=True),
        dict(expert_cache=experts // 4),
        dict(paged_kv=True, kv_page_size=16, kv_device_layers=1),
        dict(devices=["CPU", "CPU"], tensor_split=[1, 1]),
    ):
        assert np.array_equal(run(**kw), ref), kw


def test_a_restored_sequence_continues_bit_identically(q4, tmp_path):
    """The attention rows with their raw indexer keys, the delta-net windows and states, the PLE's conv history."""
    assert_restored_continues(q4, tmp_path, prompt_of(30, 3))


def test_a_batch_equals_each_sequence_alone(q4):
    """Prompts in one pass (each lane its own QSA blocks and PLE windows from its own tokens): the logits of each
    alone (the greedy steps after, against llama.cpp's batch gap: test_arch.py)."""
    prompts = [prompt_of(n, 7 + n) for n in (9, 30, 5)]
    kw = dict(ctx_size=128, n_threads=2, n_batch=64, batch_invariant=True)
    with Model(q4, **kw) as m:
        alone = []
        for p in prompts:
            m.reset()
            alone.append(m.eval(p, logits_all=True).copy())
    with Model(q4, **kw) as m:
        together = m.eval_batch(list(enumerate(prompts, 1)), logits_all=True)
    for a, b in zip(alone, together):
        assert np.array_equal(a, b)


def test_going_back_into_a_pass_replays_its_record(q4):
    """A pass of 6 rows leaves the delta-net's inputs and, in the PLE's block, its conv's input with the history
    before it; going back 1 or 4 rows into it replays both, bit for bit with a fresh sequence."""
    assert_going_back_replays(q4, prompt_of(20, 5), prompt_of(6, 6), (1, 4))


@pytest.mark.slow
def test_speculative_decoding_keeps_the_greedy_text(q4, tmp_path, small_vocab):
    """A draft of other weights, nearly always rejected: the delta-net states (and the PLE's history) are
    replayed and the text is the plain greedy one."""
    draft = synth_qwen4exp(str(tmp_path / "draft.gguf"), small_vocab, ple_layer=None, seed=1)
    prompt = prompt_of(30, 4)
    kw = dict(ctx_size=256, n_threads=2, batch_invariant=True)

    with Model(q4, **kw) as m:
        plain = greedy_ids(m, prompt, 32)
    with Model(q4, draft_model=draft, draft_k=4, **kw) as m:
        assert greedy_ids(m, prompt, 32) == plain
        st = m.stats()
        assert st["draft_tokens"] > 0 and st["state_replays"] > 0


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(ple_dim=8), "are not embedding_length"),  # llama.cpp aborts building the graph
        (dict(compress_ratios=(0, 96, 0, 0)), "above 64"),  # llama.cpp asserts at the first pass
        (dict(recurrent_layers=[False] * 4, ple_layer=None), "both delta-net and attention"),  # llama.cpp aborts
        (dict(hc=1), "hyper_connection.count"),  # llama.cpp: the same load error
    ],
)
def test_files_llama_cpp_refuses_or_aborts_on_are_refused(tmp_path, small_vocab, kw, match):
    path = synth_qwen4exp(str(tmp_path / "bad.gguf"), small_vocab, **kw)
    with pytest.raises(GGUFError, match=match):
        Model(path, ctx_size=64, n_threads=2)


def test_analyze_names_the_new_structure(q4, capsys):
    out = run_cli(capsys, "analyze", "-m", q4, "--no-measure", "--device-budget", "1MiB").out
    assert "hyper-connections: 4 residual streams of 64" in out and "gated delta-net layers" in out
    assert "block-sparse attention (QSA)" in out
    assert ("PLE n-gram embedding in block 0" in out) == (VARIANTS_OF[q4] == "qsa-ple")


def test_a_quantized_cache_of_rows_it_cannot_divide_is_refused(tmp_path, small_vocab):
    """QSA's raw indexer keys of 16 after each K row: q8_0's blocks of 32 do not divide the rows."""
    path = synth_qwen4exp(str(tmp_path / "m.gguf"), small_vocab, idx_dim=16, ple_layer=None)
    with pytest.raises(ValueError, match="blocks of 32 values, which this model's K/V rows"):
        with Model(path, ctx_size=64, n_threads=2, flash_attn=True, kv_type="q8_0") as m:
            m.eval([1, 2, 3])
