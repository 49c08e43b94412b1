"""Speculative decoding: greedy output equals plain decoding (draft model, prompt lookup; resident, streamed,
paged KV), every self-drafted token is accepted, speculative sampling keeps the model's distribution, a draft
of another vocabulary is refused."""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest
import synth_gguf

from superggml import Model, models
from superggml.generation.sampling import Sampler, SamplingParams
from superggml.generation.speculative import DraftLength, LookupDrafter, accept

from prompts import greedy

PROMPT = "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"
REWRITE = (
    "Rewrite this function with type hints:\n\ndef add(a, b):\n    total = a + b\n    return total\n\n"
    "def add(a: int, b: int) -> int:\n"
)

CONFIGS = {
    "resident": {},
    "paged256": dict(paged_kv=True, kv_page_size=256),
    "streamed": dict(device_budget="24MiB", async_prefetch=True),
    "streamed-paged16": dict(device_budget="24MiB", async_prefetch=True, paged_kv=True, kv_page_size=16),
}


@functools.cache
def plain_greedy(path: str, prompt: str) -> str:
    """40 greedy tokens after `prompt`, decoded plainly with batch_invariant: the text every configuration's
    plain decoding gives (resident, paged and streamed runs are bit-identical), computed once."""
    with Model(path, ctx_size=256, n_threads=2, batch_invariant=True) as m:
        return greedy(m, prompt, 40)


def chi2_critical(df: int, z: float = 3.09) -> float:
    """Wilson-Hilferty: the chi-square quantile at the normal quantile z (3.09: p = 0.001)."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


@pytest.mark.parametrize("config", list(CONFIGS))
def test_eval_rows_equal_feeding_one_by_one(smollm2_path, config):
    with Model(smollm2_path, ctx_size=256, n_threads=2, **CONFIGS[config]) as m:
        p = m.tokenize(PROMPT)
        m.eval(p)
        toks = [int(m.scores[-1].argmax())]
        for _ in range(8):
            toks.append(int(m.eval([toks[-1]])[-1].argmax()))
        m.truncate(len(p))
        solo = np.stack([m.eval([t])[-1].copy() for t in toks])
        m.truncate(len(p))
        rows = m.runtime.eval_rows(toks)
        assert np.array_equal(rows, solo)
        assert m.n_tokens == len(p) + len(toks)


def test_a_check_pass_computes_what_llama_cpp_computes_for_a_batch(smollm2_path, qwen_path):
    """Without batch_invariant a draft is checked with the kernels of any batch, as llama.cpp checks one: its rows
    are llama.cpp's logits of the same tokens fed after the same prefix in one batch (so they differ from
    feeding the tokens one by one exactly as much as llama.cpp's do)."""
    import llama_ref

    for path in (smollm2_path, qwen_path):
        with Model(path, ctx_size=256, n_threads=2) as m:
            toks = m.tokenize(PROMPT + "    if n < 2:\n        return n\n")
            m.eval(toks[:-6])
            ours = m.runtime.eval_check(toks[-6:]).copy()
            m.truncate(len(toks) - 6)
            solo = np.stack([m.eval([t])[-1].copy() for t in toks[-6:]])
        ref = llama_ref.run(dict(kind="logits", model=str(path), prompts=[toks], split=len(toks) - 6))["logits0"]
        assert np.array_equal(ours, ref[-6:])
        ref1 = llama_ref.run(
            dict(kind="logits", model=str(path), prompts=[toks], split=len(toks) - 6, one_by_one=True)
        )["logits0"]
        assert np.array_equal(solo, ref1[-6:])


@pytest.mark.parametrize("config", list(CONFIGS))
def test_self_draft_is_plain_greedy_and_always_accepted(smollm2_path, config):
    kw = dict(ctx_size=256, n_threads=2, batch_invariant=True, **CONFIGS[config])
    plain = plain_greedy(str(smollm2_path), PROMPT)
    with Model(smollm2_path, draft_model=smollm2_path, draft_k=4, **kw) as m:
        assert greedy(m, PROMPT, 40) == plain
        st = m.stats()
        assert st["draft_tokens"] > 0 and st["draft_accepted"] == st["draft_tokens"]
        assert st["draft_tokens_per_pass"] > 4
        if "paged_kv" in kw:  # the rejected rows' pages are gone
            assert st["kv_tokens"] == m.n_tokens * 30  # 30 layers


@pytest.mark.parametrize("config", list(CONFIGS))
def test_prompt_lookup_is_plain_greedy(smollm2_path, config):
    kw = dict(ctx_size=256, n_threads=2, batch_invariant=True, **CONFIGS[config])
    plain = plain_greedy(str(smollm2_path), REWRITE)
    with Model(smollm2_path, lookup_ngram=3, draft_k=4, **kw) as m:
        assert greedy(m, REWRITE, 40) == plain
        st = m.stats()
        assert st["draft"] == "lookup" and st["draft_tokens"] > 0 and st["draft_accepted"] > 0


@pytest.mark.slow
@pytest.mark.parametrize("budget", [None, "256MiB"])
def test_qwen_with_its_05b_draft_is_plain_greedy(qwen_path, budget):
    kw = dict(ctx_size=256, n_threads=2, batch_invariant=True)
    if budget:
        kw.update(device_budget=budget, async_prefetch=True, paged_kv=True, kv_page_size=16)
    with Model(qwen_path, **kw) as m:
        plain = greedy(m, PROMPT, 32)
    with Model(qwen_path, draft_model=str(models.qwen05_path()), draft_k=4, **kw) as m:  # always drafting
        assert greedy(m, PROMPT, 32) == plain
        st = m.stats()
        assert st["draft_accepted"] > 0


def test_lookup_drafter_continues_the_latest_longest_match():
    d = LookupDrafter(3)
    assert d.draft([1, 2, 3, 4, 5, 9, 2, 3], 2) == [4, 5]
    assert d.draft([7, 1, 2, 8, 1, 2, 6, 6, 1, 2], 3) == [6, 6, 1]  # latest of the matches with room
    assert d.draft([1, 2, 3], 4) == []


def test_draft_length_goes_long_when_a_pass_is_expensive_and_short_when_not():
    slow = DraftLength(1, 16)
    assert slow.choose(100) == 0  # plain passes first, then two rows
    for k in (0, 1, 4, 8):
        slow.on_pass(k + 1, 9.0)  # the first pass of a row count also built its graphs
        slow.on_pass(k + 1, 1.0 + 0.002 * k)
    slow.on_draft(4, 0.04)
    slow.on_check(8, 7)
    assert slow.choose(100) >= 8
    fast = DraftLength(1, 16)
    for k in (0, 1, 4, 8):
        for _ in range(2):
            fast.on_pass(k + 1, 0.04 + 0.03 * (k + 1))
    fast.on_draft(4, 0.2)
    fast.on_check(8, 2)
    assert fast.choose(100) == 0
    # what a step spends outside its pass counts: extra rows that cost 90% of a pass pay with a step's sampling
    # and output on top, and not without
    mid = DraftLength(1, 16)
    for k in (0, 1, 2):
        for _ in range(2):
            mid.on_pass(k + 1, 0.002 + 0.018 * (k + 1))
    mid.on_check(8, 5)
    assert mid.choose(100) == 0
    mid.on_between(0.05)
    assert mid.choose(100) > 0


@pytest.mark.parametrize("q_kind", ["point", "spread"])
def test_accept_keeps_the_target_distribution(q_kind):
    """The token a check yields (accepted draft or residual draw) is distributed as p, whatever q."""
    rng = np.random.default_rng(1)
    ids = np.arange(6)
    p = rng.dirichlet(np.ones(6))
    q = rng.dirichlet(np.ones(6) * 0.5)
    s = Sampler(SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0), seed=3)
    n = 20000
    counts = np.zeros(6)
    for _ in range(n):
        if q_kind == "point":
            d, qd = 2, None
        else:
            d = int(rng.choice(6, p=q))
            qd = (ids, q)
        got = accept(s, (ids, p), d, qd)
        counts[d if got is None else got] += 1
    chi2 = float((((counts - n * p) ** 2) / (n * p)).sum())
    assert chi2 < chi2_critical(5)


@pytest.mark.slow
def test_speculative_sampling_keeps_the_model_distribution(tmp_path, smollm2_path):
    """A tiny random model drafted by another: the first two sampled tokens (the second checked against a draft)
    follow the plain model's joint distribution (chi-square over the pairs)."""
    fields = synth_gguf.vocab_fields(smollm2_path)
    target, draft = tmp_path / "t.gguf", tmp_path / "d.gguf"
    synth_gguf.synth(target, fields, seed=5)
    synth_gguf.synth(draft, fields, seed=6)
    sampling = dict(temp=1.0, top_k=4, top_p=1.0, min_p=0.0)
    kw = dict(ctx_size=64, n_threads=1)
    with Model(str(target), **kw) as m:
        prompt = m.tokenize("Once upon a time")
        first = m.eval(prompt)[-1]
        s = Sampler(SamplingParams(temperature=1.0, top_k=4, top_p=1.0, min_p=0.0))
        ids1, p1 = s.distribution(first, prompt)
        expected = {}
        for t1, pr1 in zip(ids1.tolist(), p1):
            m.truncate(len(prompt))
            ids2, p2 = s.distribution(m.eval([t1])[-1], prompt + [t1])
            for t2, pr2 in zip(ids2.tolist(), p2):
                expected[(t1, t2)] = pr1 * pr2
    n = 800
    counts = dict.fromkeys(expected, 0)
    with Model(str(target), draft_model=str(draft), draft_k=2, **kw) as m:
        for i in range(n):
            gen = m.generate(prompt, seed=1000 + i, **sampling)
            pair = (next(gen), next(gen))
            gen.close()
            counts[pair] += 1
        st = m.stats()
    assert 0 < st["draft_accepted"] < st["draft_tokens"]  # both outcomes of a check were exercised
    e = np.array([expected[k] * n for k in expected])
    c = np.array([counts[k] for k in expected])
    chi2 = float(((c - e) ** 2 / e).sum())
    assert chi2 < chi2_critical(len(e) - 1)


def test_a_draft_model_of_another_vocabulary_is_refused(tmp_path, smollm2_path, qwen_path):
    with pytest.raises(ValueError, match="draft model"):
        Model(smollm2_path, ctx_size=64, draft_model=str(models.qwen05_path()))
    with pytest.raises(ValueError, match="one of draft_model, lookup_ngram and draft_mtp"):
        Model(smollm2_path, ctx_size=64, draft_model=smollm2_path, lookup_ngram=2)


def test_metrics_report_drafted_accepted_and_tokens_per_pass(tmp_path, smollm2_path):
    from metrics_lines import valid_lines

    path = tmp_path / "m.jsonl"
    with Model(smollm2_path, ctx_size=256, n_threads=2, lookup_ngram=3, draft_k=4, metrics_file=str(path)) as m:
        m.create_completion(REWRITE, max_tokens=24, temperature=0)
        st = m.stats()
    lines = valid_lines(path)
    snaps = [x for x in lines if "event" not in x]
    assert len(snaps) == 23 and snaps[-1]["generated_tokens"] == 23  # as plain: the last token is never fed
    last = snaps[-1]
    assert last["draft_tokens"] == st["draft_tokens"] > 0 and last["draft_accepted"] == st["draft_accepted"]
    assert last["draft_tokens_per_pass"] == round(st["draft_tokens_per_pass"], 3) >= 1.0


def test_server_speculates_for_a_lone_request_and_answers_as_plain(smollm2_path):
    import httpx
    from http_server import Server

    kw = dict(ctx_size=256, n_threads=2, paged_kv=True, kv_page_size=16, kv_device_layers=4 * 30, batch_invariant=True)
    with Model(smollm2_path, **kw) as m:
        plain = greedy(m, REWRITE, 32)
    with Model(smollm2_path, lookup_ngram=3, draft_k=4, **kw) as m:
        s = Server(m, parallel=4)
        try:
            r = httpx.post(
                s.url + "/v1/completions", json={"prompt": REWRITE, "max_tokens": 32, "temperature": 0}, timeout=120
            )
            assert r.status_code == 200 and r.json()["choices"][0]["text"] == plain
            st = m.stats()
            assert st["draft_steps"] > 0 and st["draft_tokens"] > 0
        finally:
            s.close()
