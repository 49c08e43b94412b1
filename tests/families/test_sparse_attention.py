"""DeepSeek sparse attention (deepseek32, glm-dsa) on synthetic GGUFs, against llama.cpp: the indexer's keys kept in the
latent K/V's rows under a quantized cache, blocks that reuse an earlier block's choice over a split, and saved
sequences. The prompts are longer than the indexer's top k, so each query attends to a subset of its keys."""

from __future__ import annotations

import numpy as np
import pytest

import llama_ref
from superggml import Model, native
from saving import assert_restored_continues
from synth_gguf import VARIANTS, synth

from prompts import RANDOM_60 as PROMPT  # noqa: E402


def steps(m: Model, n: int = 2) -> np.ndarray:
    rows = [m.eval(PROMPT, logits_all=True).copy()]
    for _ in range(n):
        rows.append(m.eval([int(np.argmax(rows[-1][-1]))]).copy())
    return np.concatenate(rows)


@pytest.mark.parametrize("variant", ["deepseek32-dsa", "glm-dsa-shared"])
def test_a_quantized_cache_holds_the_indexers_keys_as_llama_cpp(tmp_path, vocab_fields, variant):
    """Q8_0 latent K/V with flash attention (one type for the latent cache, as llama.cpp requires): the indexer's
    keys are stored Q8_0 too, as in llama.cpp's indexer cache. Latent rows of 64 + 32 values: whole blocks."""
    path = synth(tmp_path / "dsa.gguf", vocab_fields, **{**VARIANTS[variant], "kv_lora_rank": 64, "qk_rope": 32})
    q8 = int(native.GGMLType.Q8_0)
    req = {"kind": "kv_types", "model": path, "prompt": PROMPT, "n_decode": 2, "n_ctx": 256, "n_batch": 512}
    ref = llama_ref.run({**req, "configs": [[q8, q8, True]]})["logits0"]
    with Model(path, ctx_size=256, n_threads=2, flash_attn=True, kv_type="q8_0") as m:
        assert np.array_equal(steps(m), ref)


def test_reused_choices_over_two_devices(tmp_path, vocab_fields):
    """glm-dsa's block 1 reuses block 0's choice: split between them, the mask moves with the activations."""
    path = synth(tmp_path / "dsa.gguf", vocab_fields, **VARIANTS["glm-dsa-shared"])
    kw = dict(ctx_size=128, n_batch=16, n_threads=2, repack=False)
    with Model(path, **kw) as m:
        ref = steps(m, 3)
    with Model(path, devices=["CPU", "CPU"], tensor_split=[1, 2], **kw) as m:
        assert m.stats()["blocks_per_device"] == [1, 2]
        assert np.array_equal(steps(m, 3), ref)


@pytest.mark.parametrize("kw", [{}, dict(paged_kv=True, kv_page_size=16, kv_device_layers=1)])
def test_a_restored_sequence_continues_bit_identically(tmp_path, vocab_fields, kw):
    """The indexer's keys are saved with the latent rows they share."""
    path = synth(tmp_path / "m.gguf", vocab_fields, **VARIANTS["deepseek32-dsa"])
    assert_restored_continues(path, tmp_path, PROMPT, **kw)


def test_a_missing_indexer_key_and_a_first_reusing_block_are_refused(tmp_path, vocab_fields):
    from superggml import GGUFError

    path = synth(tmp_path / "dsa.gguf", vocab_fields, **{**VARIANTS["glm-dsa-shared"], "indexer_types": [0, 1, 1]})
    with pytest.raises(GGUFError, match="block 0's indexer reuses"):
        Model(path)
