"""llama-cpp-python's own high-level tests (tests/test_llama.py of the pinned 0.3.36 sdist), ported to the bundled
models. Each body takes the module under test (`llama_cpp`, or `superggml` as a drop-in) and a model path, asserts
what the original asserts (where it holds for these models), and returns what both engines must give alike: the
greedy texts and tokens. test_llama_drop_in.py runs each once on superggml here and once on llama_cpp in the
reference's child process (llama_ref.py, kind "bodies").

Changed from the originals: the models (SmolLM2-135M for Qwen3.5-0.8B, stories15M, bge-small); the token ids that
only hold for llama-spm's vocabulary are compared between the engines instead; private attributes
(`_is_recurrent`, `_ctx`) are not read; a sampled (not greedy) text is checked for its form, since the two engines
draw with different generators."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

THREADS = 2


def tokenization(llama_cpp: Any, path: str) -> dict[str, Any]:
    """test_llama_cpp_tokenization, on a vocab_only model."""
    llama = llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)
    text = b"Hello World"
    out: dict[str, Any] = {"bos": llama.token_bos(), "eos": llama.token_eos()}
    tokens = llama.tokenize(text)
    assert llama.detokenize(tokens) == text
    out["plain"] = tokens
    tokens = llama.tokenize(text, add_bos=False)
    assert llama.detokenize(tokens) == text
    out["no_bos"] = tokens
    eos_text = llama.detokenize([llama.token_eos()], special=True)
    text = b"Hello World" + eos_text
    tokens = llama.tokenize(text)
    assert tokens[-1] != llama.token_eos()
    out["eos_as_text"] = tokens
    tokens = llama.tokenize(text, special=True)
    assert tokens[-1] == llama.token_eos()
    out["eos_special"] = tokens
    tokens = llama.tokenize(b"", add_bos=True, special=True)
    assert llama.detokenize(tokens) == b""
    out["empty"] = tokens
    return out


def real_llama(llama_cpp: Any, path: str) -> dict[str, Any]:
    """test_real_llama: a greedy completion, a grammar, a logits processor, and save_state/load_state."""
    model = llama_cpp.Llama(
        path,
        n_ctx=32,
        n_batch=32,
        n_ubatch=32,
        n_threads=THREADS,
        n_threads_batch=THREADS,
        logits_all=False,
        flash_attn=True,
        verbose=False,
    )
    out: dict[str, Any] = {}
    output = model.create_completion(
        "The quick brown fox jumps over the lazy dog. The quick brown fox",
        max_tokens=6,
        top_k=50,
        top_p=0.9,
        temperature=0.0,
        seed=1337,
    )
    out["greedy"] = output["choices"][0]["text"]
    output = model.create_completion(
        "The capital of france is paris, 'true' or 'false'?:\n",
        max_tokens=4,
        top_k=50,
        top_p=0.9,
        temperature=0.8,
        seed=1337,
        grammar=llama_cpp.LlamaGrammar.from_string('root ::= "true" | "false"'),
    )
    assert output["choices"][0]["text"] in ("true", "false")
    tokens = model.tokenize(b"rot", add_bos=True, special=True)

    def logit_processor_func(input_ids, logits):
        for token in tokens:
            logits[token] *= 1000
        return logits

    output = model.create_completion(
        "The capital of france is par",
        max_tokens=4,
        top_k=50,
        top_p=0.9,
        temperature=0.8,
        seed=1337,
        logits_processor=llama_cpp.LogitsProcessorList([logit_processor_func]),
    )
    assert output["choices"][0]["text"].lower().startswith("rot")
    out["processed"] = output["choices"][0]["text"]
    model.set_seed(1337)
    state = model.save_state()
    numbers = 'root ::= "1" | "2" | "3" | "4" | "5" | "6" | "7" | "8" | "9" | "10"'

    def pick() -> str:
        output = model.create_completion(
            "Pick a number from 1 to 10?:\n",
            max_tokens=4,
            top_k=50,
            top_p=0.9,
            temperature=1.0,
            grammar=llama_cpp.LlamaGrammar.from_string(numbers),
        )
        return output["choices"][0]["text"]

    number_1, number_2 = pick(), pick()
    model.load_state(state)
    number_3 = pick()
    assert number_1 == number_3  # the seed comes back with the state
    assert {number_1, number_2} <= {str(i) for i in range(1, 11)}
    return out


def repeated_prompt_cache(llama_cpp: Any, path: str) -> dict[str, Any]:
    """test_real_llama_repeated_prompt_cache."""
    model = llama_cpp.Llama(
        path,
        n_ctx=32,
        n_batch=32,
        n_ubatch=32,
        n_threads=THREADS,
        n_threads_batch=THREADS,
        flash_attn=True,
        verbose=False,
    )
    prompt = "The quick brown fox jumps over the lazy dog. The quick brown fox"
    output_1 = model.create_completion(prompt, max_tokens=6, temperature=0.0, seed=1337)
    output_2 = model.create_completion(prompt, max_tokens=6, temperature=0.0, seed=1337)
    assert output_2["choices"][0]["text"] == output_1["choices"][0]["text"]
    return {"text": output_1["choices"][0]["text"]}


def prompt_cache_reset(llama_cpp: Any, path: str) -> dict[str, Any]:
    """_assert_prompt_cache_reset_handles_history_edit: a prompt, then one that edits its history."""
    model = llama_cpp.Llama(path, n_ctx=32, n_batch=32, n_ubatch=32, n_threads=THREADS, verbose=False)
    first, second = "The quick brown fox", "The slow brown fox"
    first_tokens = model.tokenize(first.encode(), add_bos=True, special=True)
    second_tokens = model.tokenize(second.encode(), add_bos=True, special=True)
    assert first_tokens != second_tokens and first_tokens[0] == second_tokens[0]
    a = model.create_completion(first, max_tokens=1, temperature=0.0)["choices"][0]["text"]
    b = model.create_completion(second, max_tokens=1, temperature=0.0)["choices"][0]["text"]
    return {"first": a, "second": b}


def create_test_model(llama_cpp: Any, path: str) -> Any:
    return llama_cpp.Llama(path, n_ctx=64, n_batch=64, n_ubatch=64, n_threads=THREADS, verbose=False)


def generate_test_tokens(model: Any, tokens: list[int], max_tokens: int = 3) -> list[int]:
    return list(itertools.islice(model.generate(tokens, temp=0.0), max_tokens))


def cached_prompt_reuse(llama_cpp: Any, path: str) -> dict[str, Any]:
    """_assert_exact_cached_prompt_reuse_matches_fresh and _assert_shorter_prompt_prefix_reuse_matches_fresh."""
    fresh = create_test_model(llama_cpp, path)
    tokens = fresh.tokenize(b"The quick brown fox", add_bos=True, special=True)
    expected = generate_test_tokens(fresh, tokens)
    cached = create_test_model(llama_cpp, path)
    cached.eval(tokens)
    assert cached.n_tokens == len(tokens)
    assert cached.input_ids[: cached.n_tokens].tolist() == tokens
    assert cached.sample(temp=0.0, idx=len(tokens) - 1) == expected[0]
    assert generate_test_tokens(cached, tokens) == expected
    assert cached.n_tokens == len(tokens) + len(expected) - 1
    history = fresh.tokenize(b" jumps over the lazy dog", add_bos=False, special=True)
    longer = create_test_model(llama_cpp, path)
    longer.eval(tokens + history)
    assert longer.n_tokens > len(tokens)
    assert longer.input_ids[: len(tokens)].tolist() == tokens
    assert generate_test_tokens(longer, tokens) == expected
    return {"tokens": expected}


def loaded_prompt_reuse(llama_cpp: Any, path: str) -> dict[str, Any]:
    """_assert_loaded_exact_cached_prompt_reuse_matches_fresh: a state saved after the prompt, loaded into a
    model that evaluated another prompt of the same length, continues as the fresh one."""
    fresh = create_test_model(llama_cpp, path)
    tokens = fresh.tokenize(b"The quick brown fox", add_bos=True, special=True)
    expected = generate_test_tokens(fresh, tokens)
    source = create_test_model(llama_cpp, path)
    source.eval(tokens)
    state = source.save_state()
    loaded = create_test_model(llama_cpp, path)
    loaded.eval(tokens[:-1] + [loaded.token_nl()])
    loaded.load_state(state)
    assert loaded.n_tokens == len(tokens)
    assert loaded.input_ids[: loaded.n_tokens].tolist() == tokens
    assert generate_test_tokens(loaded, tokens) == expected
    assert loaded.n_tokens == len(tokens) + len(expected) - 1
    return {"tokens": expected}


def ram_cache_hit(llama_cpp: Any, path: str) -> dict[str, Any]:
    """_assert_ram_cache_exact_prompt_hit_matches_fresh: a LlamaRAMCache filled by one model serves another."""
    fresh = create_test_model(llama_cpp, path)
    tokens = fresh.tokenize(b"The quick brown fox", add_bos=True, special=True)
    expected = fresh.create_completion(tokens, max_tokens=1, temperature=0.0, seed=1337)
    cache = llama_cpp.LlamaRAMCache()
    writer = create_test_model(llama_cpp, path)
    writer.set_cache(cache)
    writer.create_completion(tokens, max_tokens=1, temperature=0.0, seed=1337)
    cached = create_test_model(llama_cpp, path)
    cached.set_cache(cache)
    calls = []
    original = cached.load_state
    cached.load_state = lambda state: (calls.append(1), original(state))[1]
    actual = cached.create_completion(tokens, max_tokens=1, temperature=0.0, seed=1337)
    assert len(calls) == 1
    assert actual["choices"][0]["text"] == expected["choices"][0]["text"]
    assert actual["usage"]["completion_tokens"] == expected["usage"]["completion_tokens"]
    return {"text": actual["choices"][0]["text"]}


def embeddings(llama_cpp: Any, path: str) -> dict[str, Any]:
    """test_real_llama_embeddings: one text, then a batch, equal to each alone. Mean pooling asked for (bge's
    GGUF names its pooling; SmolLM2's does not, and llama_cpp's batch of unpooled rows is not each alone)."""
    model = llama_cpp.Llama(
        path,
        n_ctx=32,
        n_batch=32,
        n_ubatch=32,
        n_threads=THREADS,
        flash_attn=True,
        embedding=True,
        pooling_type=1,
        verbose=False,
    )
    embedding = model.embed("Hello World")
    assert len(embedding) > 0
    prompts = ["Hello World", "A different prompt"]
    individual = [model.embed(p) for p in prompts]
    batched = model.embed(prompts)
    assert len(batched) == len(prompts)
    for one, many in zip(individual, batched):
        np.testing.assert_allclose(many, one, rtol=1e-4, atol=1e-4)
    repeated = model.embed(list(reversed(prompts)))
    assert len(repeated) == len(prompts) and all(len(r) == len(embedding) for r in repeated)
    return {"embedding": [float(x) for x in embedding]}


BODIES = {
    f.__name__: f
    for f in (
        tokenization,
        real_llama,
        repeated_prompt_cache,
        prompt_cache_reset,
        cached_prompt_reuse,
        loaded_prompt_reuse,
        ram_cache_hit,
        embeddings,
    )
}
