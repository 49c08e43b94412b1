"""superggml.Llama as a drop-in for llama_cpp.Llama: llama-cpp-python's own high-level test bodies
(llama_cpp_bodies.py, ported to the bundled models) pass on superggml and on llama_cpp, with the same greedy
texts and tokens."""

from __future__ import annotations

import json

import numpy as np
import pytest

import llama_cpp_bodies
import llama_ref
import superggml
from superggml import Llama


@pytest.mark.parametrize("body", list(llama_cpp_bodies.BODIES))
def test_llama_cpp_python_bodies_on_both_engines(smollm2_path, body):
    ours = llama_cpp_bodies.BODIES[body](superggml, smollm2_path)
    ref = json.loads(str(llama_ref.run({"kind": "bodies", "body": body, "model": smollm2_path})["json"]))
    if "embedding" in ours:  # a mean of rows, summed in another order
        np.testing.assert_allclose(ours.pop("embedding"), ref.pop("embedding"), rtol=1e-4, atol=1e-4)
    assert ours == ref


def test_a_script_for_llama_cpp_runs_with_its_import_changed(smollm2_path):
    """Positional arguments, __call__, streaming, chat, tokens and the state, as a llama_cpp script uses them."""
    import superggml as llama_cpp

    llm = llama_cpp.Llama(smollm2_path, n_ctx=256, n_gpu_layers=-1, seed=7, verbose=False, use_mlock=True)
    out = llm("Q: Name the planets in the solar system? A: ", max_tokens=8, stop=["Q:", "\n"], echo=True)
    assert out["choices"][0]["text"].startswith("Q: Name the planets") and out["object"] == "text_completion"
    pieces = [c["choices"][0]["text"] for c in llm.create_completion("Once upon a time", None, 12, 0.0, stream=True)]
    whole = llm.create_completion("Once upon a time", max_tokens=12, temperature=0.0)["choices"][0]["text"]
    assert "".join(pieces) == whole and llm.n_tokens > 0
    chat = llm.create_chat_completion([{"role": "user", "content": "Hi"}], max_tokens=4, temperature=0.0)
    assert chat["choices"][0]["message"]["role"] == "assistant"
    assert llm.detokenize(llm.tokenize(b"hello world", add_bos=False)) == b"hello world"
    assert llm.n_ctx() == 256 and llm.n_vocab() == 49152 and llm.n_embd() == 576
    llm.reset()
    assert llm.n_tokens == 0


def test_greedy_equals_models(smollm2_path):
    """The adapter's greedy text is Model's, token for token (its own generation loop included)."""
    prompt = "def fibonacci(n):"
    with superggml.Model(smollm2_path, ctx_size=128) as m:
        want = m.create_completion(prompt, max_tokens=16, temperature=0.0)["choices"][0]["text"]
    llm = Llama(smollm2_path, n_ctx=128, verbose=False)
    got = llm.create_completion(prompt, max_tokens=16, temperature=0.0)["choices"][0]["text"]
    keep = llama_cpp_bodies_identity()
    hooked = llm.create_completion(prompt, max_tokens=16, temperature=0.0, logits_processor=keep)
    assert got == want == hooked["choices"][0]["text"]


def llama_cpp_bodies_identity() -> superggml.LogitsProcessorList:
    return superggml.LogitsProcessorList([lambda ids, scores: scores])


def test_what_is_not_there_says_so(smollm2_path):
    llm = Llama(smollm2_path, n_ctx=64, verbose=False)
    for name in ("_ctx", "_model", "ctx"):
        with pytest.raises(NotImplementedError, match="superggml has no"):
            getattr(llm, name)
    assert not hasattr(llm, "_ctx")
    with pytest.raises(NotImplementedError, match="low-level"):
        superggml.llama_backend_init  # noqa: B018
    assert not hasattr(superggml, "llama_decode")
    with pytest.raises(NotImplementedError, match="LoRA"):
        Llama(smollm2_path, lora_path="adapter.gguf")
    with pytest.raises(NotImplementedError, match="mirostat"):
        llm.create_completion("Hi", mirostat_mode=2)
    with pytest.raises(NotImplementedError, match="pooling"):
        Llama(smollm2_path, pooling_type=0)
    with pytest.raises(NotImplementedError, match="chat_format"):
        Llama(smollm2_path, chat_format="llama-2")
    chatml = Llama(smollm2_path, n_ctx=64, chat_format="chatml", verbose=False)
    assert "<|im_start|>user" in chatml.loaded.apply_chat_template([{"role": "user", "content": "Hi"}])
    with pytest.raises(ValueError, match="vocab_only"):
        Llama(smollm2_path, vocab_only=True, verbose=False).create_completion("Hi")


def test_options_map_onto_models(smollm2_path):
    """n_ctx 0 is the model's own context; n_batch is the smaller of n_batch and n_ubatch; type_k/type_v are ggml
    types; n_gpu_layers is ignored without a GPU, as llama.cpp ignores it; superggml's own options pass through."""
    llm = Llama(smollm2_path, n_ctx=0, n_batch=64, n_ubatch=32, type_k=8, flash_attn=True, verbose=False)
    s = llm.loaded.settings
    assert llm.n_ctx() == 8192 and s.context.n_batch == 32 and s.context.cache_type_k == "q8_0"
    llm.close()
    llm = Llama(smollm2_path, n_ctx=64, n_gpu_layers=10, device_budget="64MiB", verbose=False)
    assert llm.loaded.settings.paging.n_gpu_layers is None
    assert llm.loaded.stats()["layers_pinned"] < 30
    out = np.asarray(llm.embed(["a", "b"]))
    assert out.shape == (2, 576)
