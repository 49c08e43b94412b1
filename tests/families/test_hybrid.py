"""Hybrid gated delta-net models (qwen35, qwen35moe: Qwen3.5) beyond the parity test_arch checks for every variant:
prompts longer and shorter than a prefill chunk against llama.cpp, the recurrent state per sequence, checkpoints
for truncation and prompt reuse, batches and speculative decoding."""

from __future__ import annotations

import numpy as np
import pytest

import llama_ref
from batching import batch_gap, batch_prompts
from superggml import GGUFError, Model
from superggml.runtime.plan.devices import layer_split
from synth_gguf import VARIANTS, synth
from prompts import TOKENS_40 as PROMPT, greedy, run_prompt
from rollback import assert_going_back_replays

HYBRID = [
    "qwen35-interval2",
    "qwen35moe-8x2-q8_0",
    "qwen3next-8x2",
    "lfm2-ccaccaca",
    "granitehybrid-mmamma",
    "nemotron_h-M-M*-M-",
    "nemotron_h_moe-8x2",
]


@pytest.mark.parametrize("variant", HYBRID)
def test_chunks_and_single_tokens_match_llama_cpp(tmp_path, vocab_fields, variant):
    """A 90-token prompt in chunks of 16 (its state carried from chunk to chunk), and 40 tokens then one by one
    (the delta rule over one token), each as llama.cpp computes it, bit for bit."""
    path = synth(tmp_path / f"{variant}.gguf", vocab_fields, **VARIANTS[variant])
    prompt = [int(x) for x in np.random.default_rng(1).integers(0, 49152, 90)]
    chunked = llama_ref.run({"kind": "logits", "model": path, "prompts": [prompt], "n_batch": 16})["logits0"]
    stepped = llama_ref.run({"kind": "logits", "model": path, "prompts": [prompt], "split": 40, "one_by_one": True})[
        "logits0"
    ]
    with Model(path, ctx_size=256, n_threads=2, n_batch=16) as m:
        assert np.array_equal(m.eval(prompt, logits_all=True), chunked)
        st, kv = m.stats(), m.kv_bytes
    with Model(path, ctx_size=256, n_threads=2) as m:
        rows = [m.eval(prompt[:40], logits_all=True).copy()] + [m.eval([t]).copy() for t in prompt[40:]]
    assert np.array_equal(np.concatenate(rows), stepped)
    hp = VARIANTS[variant]
    if hp["arch"] == "lfm2":  # 5 conv layers of 8, each a window of 2 x 64; K/V of 3 attention layers
        assert st["state_bytes_per_sequence"] == 4 * 5 * 2 * 64
        assert kv == 256 * 2 * 2 * 2 * 16 * 3
    elif hp["arch"].startswith("nemotron_h"):  # Mamba-2 layers (a window of 3 x 192, a state of 16 x 128), attention
        layers = hp.get("layers", "M-M*-M-")
        assert st["state_bytes_per_sequence"] == 4 * layers.count("M") * (3 * 192 + 16 * 128)
        assert kv == 256 * 2 * 2 * 2 * 16 * layers.count("*")
    elif hp["arch"] == "granitehybrid":  # 4 Mamba-2 layers: a window of 3 x 192, a state of 16 x 128; 2 attention
        assert st["state_bytes_per_sequence"] == 4 * 4 * (3 * 192 + 16 * 128)
        assert kv == 256 * 2 * 2 * 2 * 16 * 2
    else:
        d_state, n_v, n_k = hp.get("d_state", 16), 4, 2
        conv = 3 * d_state * (n_v + 2 * n_k)
        assert st["state_bytes_per_sequence"] == 4 * 2 * (conv + d_state * d_state * n_v)  # 2 recurrent layers of 4
        assert kv == 256 * 2 * 2 * 2 * hp.get("head_dim", 32) * 2  # K/V of 2 attention layers
    assert st["state_tier"] == "CPU" and st["state_sequences"] == 1
    assert st["budget"]["kv"] == kv + 4 * st["state_bytes_per_sequence"]  # the plan: states and 3 checkpoints


def test_truncate_and_prompt_reuse_go_back_to_a_checkpoint(tmp_path, vocab_fields):
    """A state cannot forget tokens: truncating to a prompt's end restores the checkpoint taken there; truncating
    elsewhere goes back to the latest checkpoint before, and the rest is fed again; either way the logits are
    those of a fresh sequence."""
    path = synth(tmp_path / "h.gguf", vocab_fields, **VARIANTS["qwen35-interval2"])
    prompt = [int(x) for x in np.random.default_rng(4).integers(0, 49152, 30)]
    kw = dict(ctx_size=256, n_threads=2, n_batch=16)
    with Model(path, **kw) as m:
        fresh = m.eval(prompt + [7, 8]).copy()
    with Model(path, **kw) as m:
        m.eval(prompt)
        for t in (5, 6, 9):
            m.eval([t])
        assert m.runtime.sequences.truncate(30) == 30  # the prompt's end: a checkpoint
        assert np.array_equal(m.eval([7, 8]), fresh)
        assert m.runtime.sequences.truncate(20) == 16  # no checkpoint at 20: the chunk before
        assert np.array_equal(m.eval(prompt[16:] + [7, 8])[-1], fresh[-1])
        assert m.stats()["state_checkpoints"] >= 1


@pytest.mark.parametrize("variant", HYBRID)
def test_a_batch_equals_each_sequence_alone(tmp_path, vocab_fields, variant):
    """batch_invariant: sequences of 9, 17 and 5 tokens in shared passes, then decode steps, each with its own
    state: the same greedy tokens as each alone, and the logits as close to each alone as llama.cpp's batch is to
    its own (BatchGap.check). ggml-cpu's kernels round by the shape of a pass: qwen3next's decode steps of three
    sequences in one pass are 1.7e-4 from each alone with AVX2 kernels."""
    path = synth(tmp_path / f"{variant}.gguf", vocab_fields, **VARIANTS[variant])
    prompts = batch_prompts()
    with Model(path, ctx_size=128, n_threads=2, n_batch=16, batch_invariant=True) as m:
        gap = batch_gap(m, path, prompts, 3)
        assert m.stats()["state_sequences"] >= 3
    gap.check(variant)


@pytest.mark.parametrize("variant", HYBRID)
def test_speculative_decoding_keeps_the_greedy_text(tmp_path, vocab_fields, variant):
    """batch_invariant: a draft model that agrees (the model itself: every draft kept) and one that does not
    (another seed: rolled back to the check's checkpoint every step), 40 tokens each, the text of plain decoding."""
    path = synth(tmp_path / f"{variant}.gguf", vocab_fields, **VARIANTS[variant])
    other = synth(tmp_path / "other.gguf", vocab_fields, **{**VARIANTS[variant], "seed": 1})
    kw = dict(ctx_size=256, n_threads=2, batch_invariant=True)

    with Model(path, **kw) as m:
        plain = greedy(m, "The quick brown fox", 40)
    for draft, kept in ((path, True), (other, False)):
        with Model(path, draft_model=draft, draft_k=3, **kw) as m:
            assert greedy(m, "The quick brown fox", 40) == plain
            st = m.stats()
        assert st["draft_tokens"] > 0 and (st["draft_accepted"] == st["draft_tokens"]) == kept


@pytest.mark.parametrize("variant", HYBRID)
def test_going_back_into_a_pass_replays_its_record(tmp_path, vocab_fields, variant):
    """A pass of 6 rows of one sequence (a speculative check, a short prompt) leaves its delta-rule inputs:
    going back 1, 3 or 5 rows into it replays them with no weights, bit for bit with a fresh sequence."""
    path = synth(tmp_path / f"{variant}.gguf", vocab_fields, **VARIANTS[variant])
    rng = np.random.default_rng(6)
    prompt = [int(x) for x in rng.integers(0, 49152, 20)]
    check = [int(x) for x in rng.integers(0, 49152, 6)]
    assert_going_back_replays(path, prompt, check, (1, 3, 5))


def test_a_rejected_draft_is_replayed_not_fed_again(tmp_path, vocab_fields):
    """Speculative decoding with a draft model that never agrees, checks in one causal pass (llama.cpp's
    kernels): every step goes back by replay, so a step is one pass of the model; the text is plain decoding's."""
    path = synth(tmp_path / "h.gguf", vocab_fields, **VARIANTS["qwen35moe-8x2-q8_0"])
    other = synth(tmp_path / "other.gguf", vocab_fields, **{**VARIANTS["qwen35moe-8x2-q8_0"], "seed": 1})
    kw = dict(ctx_size=256, n_threads=2)

    with Model(path, **kw) as m:
        plain = greedy(m, "The quick brown fox", 24)
        plain_passes = m.stats()["passes"]
    with Model(path, draft_model=other, draft_k=3, **kw) as m:
        assert greedy(m, "The quick brown fox", 24) == plain
        st = m.stats()
    assert st["draft_tokens"] > 0 and st["draft_accepted"] < st["draft_tokens"]
    assert st["state_replays"] > 0 and st["passes"] <= plain_passes


def test_states_paged_to_host_and_back_are_bit_identical(tmp_path, vocab_fields):
    """state_device_sequences=2 with three sequences taking turns (and a pass over two of them): the least recently
    run one's states wait in host memory and come back for its next pass, the logits those of keeping all. With 1,
    a batch of two runs a pass each."""
    path = synth(tmp_path / "h.gguf", vocab_fields, **VARIANTS["qwen35-interval2"])
    rng = np.random.default_rng(5)
    prompts = [[int(x) for x in rng.integers(0, 49152, n)] for n in (12, 7, 20)]

    def run(**kw):
        out = []
        with Model(path, ctx_size=128, n_threads=2, n_batch=16, **kw) as m:
            for i, p in enumerate(prompts):
                out.append(m.eval_batch([(i + 1, p)])[0][-1].copy())
            for step in range(3):
                for i in range(3):
                    out.append(m.eval_batch([(i + 1, [5 + step])])[0][-1].copy())
            out += [r[-1].copy() for r in m.eval_batch([(1, [9]), (3, [9])])]
            return np.stack(out), m.stats()

    ref, _ = run()
    paged, st = run(state_device_sequences=2)
    assert st["state_paged_out"] >= 9 and st["state_paged_in"] >= 9 and st["state_sequences_host"] == 1
    assert np.array_equal(paged, ref)
    with Model(path, ctx_size=128, n_threads=2, n_batch=16, state_device_sequences=1) as m:  # a pass each
        two = m.eval_batch([(1, prompts[0]), (3, prompts[2])])
        assert np.array_equal(np.stack([two[0][-1], two[1][-1]]), ref[[0, 2]])


def test_prompt_lookup_keeps_the_greedy_text(tmp_path, vocab_fields):
    """A qwen35 whose blocks add nothing and whose head is its embedding (synth_gguf.echo_writers, tied) repeats its
    last token: prompt lookup drafts 4 tokens a step and every one is kept; the text is plain decoding's."""
    path = synth(tmp_path / "echo.gguf", vocab_fields, **{**VARIANTS["qwen35-interval2"], "echo": True, "tied": True})
    kw = dict(ctx_size=256, n_threads=2, batch_invariant=True)

    with Model(path, **kw) as m:
        plain = greedy(m, "The quick brown fox", 40)
    with Model(path, lookup_ngram=2, draft_k=4, **kw) as m:
        assert greedy(m, "The quick brown fox", 40) == plain
        st = m.stats()
    assert st["draft_tokens"] >= 20 and st["draft_accepted"] == st["draft_tokens"]


@pytest.mark.parametrize("split", [[1, 1], [3, 1]])
def test_states_live_on_each_layers_device(tmp_path, vocab_fields, split):
    """Blocks split over two backends (two CPU instances standing in for two devices): each recurrent layer's
    states in a buffer on its block's device; a prompt, greedy steps and a batch of two give the logits of one."""
    path = synth(tmp_path / "h.gguf", vocab_fields, **VARIANTS["qwen35moe-8x2-q8_0"])
    prompts = [list(PROMPT), list(PROMPT[:7])]

    def run(**kw):
        with Model(path, ctx_size=128, n_threads=2, n_batch=16, batch_invariant=True, **kw) as m:
            rows = run_prompt(m)
            m.reset()
            batch = [r[-1].copy() for r in m.eval_batch([(i + 1, p) for i, p in enumerate(prompts)])]
            return rows, np.stack(batch), m.stats()

    ref, ref_batch, _ = run()
    rows, batch, st = run(devices=["CPU", "CPU"], tensor_split=split)
    assert st["blocks_per_device"] == list(layer_split(4, 2, tuple(split)))
    assert st["state_sequences"] >= 2
    assert np.array_equal(rows, ref) and np.array_equal(batch, ref_batch)


def test_a_mixer_without_its_conv_bias_is_refused_where_llama_cpp_aborts(tmp_path, vocab_fields):
    """llama.cpp loads a nemotron_h file whose Mamba-2 layers lack ssm_conv1d.bias (it is optional to its loader)
    and then aborts in the graph; superggml refuses the file, naming the tensor."""
    path = synth(tmp_path / "no-bias.gguf", vocab_fields, **{**VARIANTS["nemotron_h-M-M*-M-"], "conv_bias": False})
    ref = llama_ref.run({"kind": "loads", "model": path, "models": [path], "prompt": PROMPT[:8]})
    assert int(ref["status"][0]) == llama_ref.LOAD_CRASH
    with pytest.raises(GGUFError, match="ssm_conv1d.bias"):
        Model(path)
