"""logprobs in OpenAI's shapes, from the Python API and from `superggml serve` through the official openai client:
each reported logprob is log_softmax of the logits Model.eval gives for that position (temperature 1, no
penalties), the top alternatives are the likeliest tokens, and echo reports the prompt's."""

from __future__ import annotations

from typing import Iterator

import httpx
import numpy as np
import openai
import pytest

from superggml import Model
from http_server import openai_client

from prompts import CAPITAL as PROMPT  # noqa: E402


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max()
    return x - m - np.log(np.exp(x - m).sum())


def greedy_with_logprobs(m: Model, prompt: list[int], n: int) -> tuple[list[int], np.ndarray]:
    """n greedy tokens with Model.eval, and log_softmax of the logits each was picked from (F64 [n, n_vocab])."""
    m.reset()
    logits = m.eval(prompt)[-1]
    ids, rows = [], []
    for _ in range(n):
        rows.append(log_softmax(logits))
        ids.append(int(np.argmax(logits)))
        logits = m.eval([ids[-1]])[-1]
    return ids, np.stack(rows)


@pytest.fixture(scope="module")
def model(model_path: str) -> Iterator[Model]:
    with Model(model_path, ctx_size=256, n_threads=2, paged_kv=True, kv_page_size=16) as m:
        yield m


@pytest.fixture(scope="module")
def client(model: Model) -> Iterator[openai.OpenAI]:
    yield from openai_client(model, parallel=2, max_queue=8)


def test_completion_logprobs_equal_eval(client, model):
    r = client.completions.create(model=model_id(client), prompt=PROMPT, max_tokens=5, temperature=0, logprobs=3)
    lp = r.choices[0].logprobs
    toks = model.tokenize(PROMPT, add_bos=True, special=True)
    ids, want = greedy_with_logprobs(model, toks, len(lp.tokens))
    assert lp.tokens == [model.token_bytes(t).decode("utf-8", "replace") for t in ids]
    for i, tok in enumerate(ids):
        assert abs(lp.token_logprobs[i] - want[i, tok]) < 1e-4
        top = sorted(lp.top_logprobs[i].values(), reverse=True)
        assert abs(top[0] - want[i].max()) < 1e-4
        assert np.allclose(top[:3], np.sort(want[i])[::-1][:3], atol=1e-4)
    assert "".join(lp.tokens) == r.choices[0].text


def model_id(c: openai.OpenAI) -> str:
    return c.models.list().data[0].id


def test_chat_logprobs_streaming_and_not(client, model):
    """The same request streamed and not: the same logprobs (cache_prompt off: both prefill the whole prompt)."""
    msgs = [{"role": "user", "content": "Name a color."}]
    fresh = {"cache_prompt": False}
    r = client.chat.completions.create(
        model=model_id(client),
        messages=msgs,
        max_tokens=6,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
        extra_body=fresh,
    )
    content = r.choices[0].logprobs.content
    assert "".join(c.token for c in content) == r.choices[0].message.content
    assert all(len(c.top_logprobs) == 2 and c.top_logprobs[0].logprob >= c.logprob - 1e-9 for c in content)
    assert all(bytes(c.bytes).decode("utf-8", "replace") == c.token for c in content)
    chunks = list(
        client.chat.completions.create(
            model=model_id(client),
            messages=msgs,
            max_tokens=6,
            temperature=0,
            logprobs=True,
            top_logprobs=2,
            stream=True,
            extra_body=fresh,
        )
    )
    streamed = [c for ch in chunks for c in ((ch.choices[0].logprobs.content or []) if ch.choices[0].logprobs else [])]
    assert [(c.token, round(c.logprob, 6)) for c in streamed] == [(c.token, round(c.logprob, 6)) for c in content]


def test_echo_prompt_logprobs(client, model):
    r = client.completions.create(
        model=model_id(client), prompt=PROMPT, max_tokens=2, temperature=0, logprobs=1, echo=True
    )
    lp = r.choices[0].logprobs
    toks = model.tokenize(PROMPT, add_bos=True, special=True)
    assert lp.token_logprobs[0] is None and len(lp.tokens) == len(toks) + 2
    model.reset()
    rows = model.eval(toks, logits_all=True)
    for i in range(1, len(toks)):
        assert abs(lp.token_logprobs[i] - log_softmax(rows[i - 1])[toks[i]]) < 1e-4
    assert r.choices[0].text.startswith(PROMPT)


def test_bad_logprobs_are_400(client):
    url = client.server.url  # type: ignore[attr-defined]
    r = httpx.post(url + "/v1/completions", json={"prompt": "x", "logprobs": 21})
    assert r.status_code == 400
    r = httpx.post(
        url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}
    )
    assert r.status_code == 400 and "logprobs" in r.json()["error"]["message"]


def test_python_api_shapes(model):
    """create_completion / create_chat_completion give llama-cpp-python's shapes; bad values are ValueErrors."""
    r = model.create_completion(PROMPT, max_tokens=3, temperature=0.8, seed=3, logprobs=2)
    lp = r["choices"][0]["logprobs"]
    assert set(lp) == {"tokens", "text_offset", "token_logprobs", "top_logprobs"}
    assert lp["text_offset"][0] == 0 and all(len(t) <= 3 for t in lp["top_logprobs"])
    r = model.create_chat_completion([{"role": "user", "content": "Hi"}], max_tokens=2, logprobs=True)
    assert r["choices"][0]["logprobs"]["content"][0]["top_logprobs"] == []
    with pytest.raises(ValueError, match="logprobs must be in 0..20"):
        model.create_completion(PROMPT, logprobs=21)
    with pytest.raises(ValueError, match="top_logprobs needs logprobs"):
        model.create_chat_completion([{"role": "user", "content": "Hi"}], top_logprobs=2)
