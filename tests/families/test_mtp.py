"""MTP drafting (draft_mtp): the next-token-prediction block of deepseek2, glm4moe, qwen35 and qwen3next GGUFs drafts
for the model, checked against llama.cpp's MTP context (load_mtp, LLAMA_CONTEXT_TYPE_MTP) and against plain decoding."""

from __future__ import annotations

import numpy as np
import pytest

import llama_ref
from superggml import Model, UnsupportedModelError
from synth_gguf import VARIANTS, expert_bytes, synth
from prompts import greedy

MTP = [
    "deepseek2-v3-groups-yarn",
    "glm4moe-bias-mtp",
    "qwen35-mtp",
    "qwen3next-mtp",
    "deepseek4-csa-hca",
    "hy_v3-mtp",
    "bailingmoe3-mtp",
    "mimo2-mtp",
]
PROMPT = "The quick brown fox jumps over the lazy dog, and then"


@pytest.mark.parametrize("flash_attn", [False, True])
@pytest.mark.parametrize("variant", MTP)
def test_the_mtp_block_matches_llama_cpps_mtp_context(tmp_path, vocab_fields, variant, flash_attn):
    """The model's output-normed hidden rows (llama.cpp's unmasked nextn embeddings), then the MTP block fed each
    prompt token with the row before it (zeros first): its logits and its own hidden rows, bit for bit."""
    path = synth(tmp_path / f"{variant}.gguf", vocab_fields, **VARIANTS[variant])
    rng = np.random.default_rng(5)
    prompts = [[int(x) for x in rng.integers(0, 49152, n)] for n in (7, 40)]
    ref = llama_ref.run(
        {"kind": "mtp", "model": path, "prompts": prompts, "flash_attn": flash_attn, "n_ctx": 256, "n_batch": 256}
    )
    with Model(path, ctx_size=256, n_threads=2, flash_attn=flash_attn, draft_mtp=True) as m:
        d = m.speculator.drafter
        for i, toks in enumerate(prompts):
            m.reset()
            m.eval(toks)
            h = np.stack([d.rows[0][q] for q in range(len(toks))])
            assert np.array_equal(h, ref[f"h{i}"])
            d.runtime.sequences.truncate(0)
            shifted = np.concatenate([np.zeros((1, h.shape[1]), np.float32), h[:-1]])
            logits = d.runtime.eval(toks, hidden=shifted, logits_all=True)
            assert np.array_equal(logits, ref[f"logits{i}"])
            assert np.array_equal(d.own, ref[f"mtp_h{i}"][-1])


def streamed_options(path):
    experts = expert_bytes(path)
    return dict(n_gpu_layers=0, prefetch_depth=1, **({"expert_cache": experts // 4} if experts else {}))


@pytest.mark.parametrize("streamed", [False, True], ids=["resident", "streamed"])
@pytest.mark.parametrize("variant", MTP)
def test_mtp_drafting_keeps_the_greedy_text(tmp_path, vocab_fields, variant, streamed):
    """batch_invariant: 3 tokens drafted every step (random weights: nearly all rejected, each rejection rolled
    back from the model's memory and the block's), 48 tokens equal to plain decoding; the counts in stats()."""
    path = synth(tmp_path / f"{variant}.gguf", vocab_fields, **VARIANTS[variant])
    kw = dict(
        ctx_size=256, n_threads=2, n_batch=16, batch_invariant=True, **(streamed_options(path) if streamed else {})
    )

    with Model(path, **kw) as m:
        plain = greedy(m, PROMPT, 48)
    with Model(path, draft_mtp=True, draft_k=3, **kw) as m:
        assert greedy(m, PROMPT, 48) == plain
        st = m.stats()
    print(
        f"{variant}: drafted {st['draft_tokens']}, accepted {st['draft_accepted']}, "
        f"{st['draft_tokens_per_pass']:.2f} tokens per pass, {st['bytes_streamed_per_token']:.0f} B/token"
    )
    assert st["draft"] == "mtp" and st["draft_tokens"] > 0 and st["draft_acceptance"] is not None
    assert st["draft_tokens_per_pass"] >= 1.0 and st["draft_resident_bytes"] > 0
    assert (st["bytes_streamed_per_token"] > 0) == streamed


def test_an_mtp_block_that_drafts_right_saves_passes_and_streamed_bytes(tmp_path, vocab_fields):
    """A model whose next token depends on its last one and whose MTP block predicts it (synth_gguf.echo_writers):
    nearly every draft is accepted, four tokens per pass, and the streamed bytes fall with the passes."""
    path = synth(tmp_path / "echo.gguf", vocab_fields, **{**VARIANTS["glm4moe-bias-mtp"], "echo": True})
    kw = dict(ctx_size=256, n_threads=2, n_batch=16, batch_invariant=True, **streamed_options(path))

    def run(**o):
        with Model(path, **kw, **o) as m:
            text = m.create_completion(PROMPT, max_tokens=48, temperature=0.0)["choices"][0]["text"]
            st = m.stats()
            return text, st, int(st["bytes_loaded"]) + int(st["expert_bytes_loaded"])

    plain, _, plain_bytes = run()
    text, st, mtp_bytes = run(draft_mtp=True, draft_k=3)
    print(
        f"echo: acceptance {st['draft_acceptance']:.2f}, {st['draft_tokens_per_pass']:.2f} tokens per pass, "
        f"{mtp_bytes / plain_bytes:.2f} of plain decoding's streamed bytes"
    )
    assert text == plain
    assert st["draft_acceptance"] >= 0.9 and st["draft_tokens_per_pass"] >= 3.0
    assert mtp_bytes < 0.6 * plain_bytes


def test_the_block_catches_up_in_batches_as_at_once(tmp_path, vocab_fields):
    """A prompt longer than n_batch: the block takes the model's rows batch by batch as they come (a long prompt's
    rows are not all held); its memory then gives the logits it gives fed the whole prompt at once."""
    path = synth(tmp_path / "mtp.gguf", vocab_fields, **VARIANTS["deepseek2-v3-groups-yarn"])
    prompt = [int(x) for x in np.random.default_rng(6).integers(0, 49152, 70)]

    def after(n_batch):
        with Model(path, ctx_size=256, n_threads=2, n_batch=n_batch, batch_invariant=True, draft_mtp=True) as m:
            m.eval(prompt)
            d = m.speculator.drafter
            held = len(d.rows[0])
            return d.feed(0, prompt + [11]), held

    whole, held_whole = after(128)
    batched, held_batched = after(16)
    assert held_whole == len(prompt) and held_batched <= 32
    assert np.array_equal(batched, whole)


def test_draft_mtp_needs_an_mtp_block(tmp_path, vocab_fields, smollm2_path):
    with pytest.raises(UnsupportedModelError, match="no next-token-prediction"):
        Model(smollm2_path, ctx_size=64, draft_mtp=True)
    path = synth(tmp_path / "lite.gguf", vocab_fields, **VARIANTS["deepseek2-lite"])
    with pytest.raises(UnsupportedModelError, match="no next-token-prediction"):
        Model(path, ctx_size=64, draft_mtp=True)
    with pytest.raises(ValueError, match="one of draft_model, lookup_ngram and draft_mtp"):
        Model(path, ctx_size=64, draft_mtp=True, lookup_ngram=2)
