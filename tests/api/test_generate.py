"""Greedy generation against llama.cpp, the CLI, sampling and chat."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import numpy as np
import pytest

import llama_ref
from superggml import ContextLengthError, Model, SamplingParams
from superggml.generation.sampling import Sampler

GEN_PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n",
    "Once upon a time, in a small village by the sea,",
]
N_GEN = 48


@pytest.fixture(scope="module")
def smol(smollm2_path):
    with Model(smollm2_path, ctx_size=512, n_threads=2) as m:
        yield m


def test_greedy_generate_matches_llama_cpp(smollm2_path):
    ref = llama_ref.run({"kind": "generate", "model": smollm2_path, "prompts": GEN_PROMPTS, "max_tokens": N_GEN})
    for i, prompt in enumerate(GEN_PROMPTS):
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "superggml.commands.cli",
                "generate",
                "-m",
                smollm2_path,
                "-p",
                prompt,
                "-n",
                str(N_GEN),
                "--temp",
                "0",
                "-t",
                "2",
            ],
            capture_output=True,
            text=True,
            timeout=300,
            check=True,
        ).stdout
        assert out == str(ref[f"text{i}"]) + "\n", (prompt, out, str(ref[f"text{i}"]))


def test_cli_default_model_and_errors(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "superggml.commands.cli", "generate", "-p", "Hello", "-n", "4", "--temp", "0"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0 and r.stdout.strip()
    # it ends with the prompt's and the generation's tokens/s, as llama-cli does (stderr: stdout is the text)
    speed = re.search(r"prompt (\d+) tokens, ([\d.]+) tok/s; generation (\d+) tokens, ([\d.]+) tok/s", r.stderr)
    assert speed, r.stderr
    assert int(speed[1]) >= 1 and float(speed[2]) > 0 and int(speed[3]) == 3 and float(speed[4]) > 0
    r = subprocess.run(
        [sys.executable, "-m", "superggml.commands.cli", "generate", "-m", str(tmp_path / "none.gguf"), "-p", "x"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 1 and "cannot open" in r.stderr and "Traceback" not in r.stderr


def test_generate_stream_equals_completion(smol):
    full = smol.create_completion("Water boils at", max_tokens=24, temperature=0)["choices"][0]["text"]
    chunks = list(smol.create_completion("Water boils at", max_tokens=24, temperature=0, stream=True))
    assert "".join(c["choices"][0]["text"] for c in chunks) == full
    assert chunks[-1]["choices"][0]["finish_reason"] in ("length", "stop")


def test_generate_iterator_is_greedy_argmax(smol):
    toks = smol.tokenize("1, 2, 3, 4,")
    gen = smol.generate(toks, temp=0)
    got = [next(gen) for _ in range(5)]
    smol.reset()
    logits = smol.eval(toks)[-1]
    expect = []
    for _ in range(5):
        t = int(np.argmax(logits))
        expect.append(t)
        logits = smol.eval([t])[-1]
    assert got == expect


def test_seeded_sampling_is_reproducible(smol):
    kw = dict(max_tokens=20, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
    a = smol.create_completion("My favourite colour is", seed=42, **kw)["choices"][0]["text"]
    b = smol.create_completion("My favourite colour is", seed=42, **kw)["choices"][0]["text"]
    c = smol.create_completion("My favourite colour is", seed=7, **kw)["choices"][0]["text"]
    assert a == b
    assert a != c


def test_stop_strings_and_usage(smol):
    r = smol.create_completion("Count: 1, 2, 3,", max_tokens=40, temperature=0, stop=[" 6"])
    assert " 6" not in r["choices"][0]["text"] and r["choices"][0]["finish_reason"] == "stop"
    assert r["usage"]["prompt_tokens"] == len(smol.tokenize("Count: 1, 2, 3,"))


def test_chat_completion_uses_gguf_template(smol):
    prompt = smol.apply_chat_template([{"role": "user", "content": "Hi"}])
    assert prompt.startswith("<|im_start|>system\n") and prompt.endswith("<|im_start|>assistant\n")
    r = smol.create_chat_completion([{"role": "user", "content": "What is 2+2?"}], max_tokens=24, temperature=0)
    msg = r["choices"][0]["message"]
    assert msg["role"] == "assistant" and "4" in msg["content"]
    json.dumps(r)
    # OpenAI's content parts: the text ones, joined, are the message
    parts = [
        {"type": "text", "text": "What is "},
        {"type": "image_url", "image_url": {"url": "x"}},
        {"type": "text", "text": "2+2?"},
    ]
    assert smol.chat_tokens([{"role": "user", "content": parts}]) == smol.chat_tokens(
        [{"role": "user", "content": "What is 2+2?"}]
    )


def test_prompt_checks(smol):
    """One set of checks for prompts and inputs: the range of token ids, empty ones, and the context."""
    with pytest.raises(ValueError, match=f"prompt token id {smol.n_vocab} out of range"):
        smol.create_completion([1, smol.n_vocab], max_tokens=1)
    with pytest.raises(ValueError, match="prompt 1: token id -1 out of range"):
        smol.create_completion([[1, 2], [-1]], max_tokens=1)
    with pytest.raises(ValueError, match="input 0: token id"):
        smol.create_embedding([[smol.n_vocab + 5]])
    with pytest.raises(ValueError, match="the prompt is empty"):
        smol.create_completion([], max_tokens=1)
    with pytest.raises(ContextLengthError, match="ctx_size is 512"):
        smol.create_completion([1] * 600, max_tokens=1)
    with pytest.raises(ContextLengthError):
        smol.create_embedding([[1] * 600])


def test_sampler_filters():
    logits = np.array([5.0, 4.0, 1.0, -2.0, 0.0], dtype=np.float32)
    assert Sampler(SamplingParams(temperature=0)).sample(logits) == 0
    s = Sampler(SamplingParams(temperature=1.0, top_k=2, top_p=1.0, min_p=0.0), seed=1)
    assert {s.sample(logits) for _ in range(200)} == {0, 1}
    s = Sampler(SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.5), seed=1)
    assert {s.sample(logits) for _ in range(200)} <= {0, 1}
    s = Sampler(SamplingParams(temperature=1.0, top_k=0, top_p=0.5, min_p=0.0), seed=1)
    assert {s.sample(logits) for _ in range(200)} == {0}
    pen = Sampler(SamplingParams(temperature=0, repeat_penalty=2.0))
    assert pen.sample(np.array([3.0, 2.0], np.float32), history=[0]) == 1
    with pytest.raises(ValueError):
        SamplingParams(temperature=-1)
