"""Embeddings: Model.embed and POST /v1/embeddings through the official openai client, on SmolLM2 and
Qwen2.5-Coder-1.5B: shapes, unit norms, a batch equal to one text at a time, base64, streamed weights, and
llama.cpp's own embeddings (embedding=True with mean and last pooling) as the reference."""

from __future__ import annotations

import base64
from typing import Iterator

import numpy as np
import openai
import pytest

import llama_ref
from superggml import Model
from http_server import openai_client

TEXTS = [
    "The cat sat on the mat.",
    "A dog is running in the park.",
    "Quantum physics is hard to learn.",
    "def add(a, b):\n    return a + b",
]


@pytest.fixture(scope="module")
def model(model_path: str) -> Iterator[Model]:
    with Model(model_path, ctx_size=512, n_threads=2, paged_kv=True, kv_page_size=16) as m:
        yield m


@pytest.fixture(scope="module")
def client(model: Model) -> Iterator[openai.OpenAI]:
    yield from openai_client(model, parallel=2, max_queue=8, model_id="m")


def test_shapes_norms_and_batch_equal_one_at_a_time(client, model):
    r = client.embeddings.create(model="m", input=TEXTS)
    assert [d.index for d in r.data] == list(range(len(TEXTS)))
    vecs = np.array([d.embedding for d in r.data])
    assert vecs.shape == (len(TEXTS), model.hparams.n_embd)
    assert np.allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-5)
    assert r.usage.prompt_tokens == sum(len(model.tokenize(t)) for t in TEXTS)
    one = np.array([client.embeddings.create(model="m", input=t).data[0].embedding for t in TEXTS])
    # the same passes but for how many rows each matrix product has: equal up to its rounding
    assert np.abs(vecs - one).max() < 1e-2 and (np.sum(vecs * one, axis=1) > 0.999).all()
    sims = vecs @ vecs.T
    assert sims[0, 1] > sims[0, 3]  # two sentences about animals are closer than one to code


def test_base64_and_token_input(client, model):
    f = client.embeddings.create(model="m", input="hello world").data[0].embedding
    r = client.embeddings.create(model="m", input="hello world", encoding_format="base64")
    vec = np.frombuffer(base64.b64decode(r.data[0].embedding), dtype="<f4")  # little-endian F32, as OpenAI's
    assert np.allclose(vec, f, atol=1e-7)
    ids = model.tokenize("hello world")
    t = client.embeddings.create(model="m", input=[ids]).data[0].embedding
    assert np.allclose(t, f, atol=1e-6)


def test_bad_requests(client, model):
    for kw, param in [
        (dict(input=[]), "input"),
        (dict(input=""), "input"),
        (dict(input="x", dimensions=model.hparams.n_embd + 1), "dimensions"),
        (dict(input=[[model.n_vocab + 5]]), "input"),
    ]:
        with pytest.raises(openai.BadRequestError) as e:
            client.embeddings.create(model="m", **kw)
        assert e.value.body["param"] == param
    assert client.embeddings.create(model="other", input="x").data  # any model name: the one served


@pytest.mark.parametrize("pooling", ["mean", "last"])
def test_equal_to_llama_cpp(model, pooling):
    ref = llama_ref.run({"kind": "embed", "model": model.path, "texts": TEXTS[:3], "pooling": pooling, "n_ctx": 512})
    ours = np.array(model.embed(TEXTS[:3], pooling=pooling))
    for i in range(3):
        r = ref[f"emb{i}"]
        assert r.shape == ours[i].shape
        # llama.cpp embeds them in its own batches: equal up to the rounding of products over other row counts
        assert float(ours[i] @ r) > 0.999 and np.abs(ours[i] - r).max() < 1e-2


def test_streamed_weights_embed_the_same(smollm2_path):
    with Model(smollm2_path, ctx_size=256) as a, Model(smollm2_path, ctx_size=256, device_budget="40MiB") as b:
        x = np.array(a.embed(TEXTS, normalize=False))
        y = np.array(b.embed(TEXTS, normalize=False))
        assert b.stats()["loads"] > 0 and np.array_equal(x, y)
        assert a.embed("solo", pooling="last") == a.embed(["solo"], pooling="last")[0]
        assert a.tokens == [] and b.tokens == []  # scratch sequences: the current one untouched
