"""Gemma 4's own layout on synthetic GGUFs (synth_gguf.synth_gemma4), against llama.cpp: K/V memory as wide as the
widest layer under quantized cache types (K rotated per head size), blocks that read an earlier block's K/V over a
split, saved and restored, and the per-layer embeddings moving with the activations between devices."""

from __future__ import annotations

import numpy as np
import pytest

import llama_ref
from superggml import Model, native
from saving import assert_restored_continues
from synth_gguf import VARIANTS, synth

from prompts import RANDOM_60 as PROMPT  # noqa: E402

# heads of 64 (sliding) and 128 (full) values: the quantized caches' rotations are of 64 and 128
WIDE = {**VARIANTS["gemma4-e-shared"], "head_dim": 64, "head_dim_full": 128, "n_head": 2}


def steps(m: Model, n: int = 2) -> np.ndarray:
    rows = [m.eval(PROMPT, logits_all=True).copy()]
    for _ in range(n):
        rows.append(m.eval([int(np.argmax(rows[-1][-1]))]).copy())
    return np.concatenate(rows)


def test_quantized_caches_rotate_each_head_size_as_llama_cpp(tmp_path, vocab_fields):
    path = synth(tmp_path / "g4.gguf", vocab_fields, **WIDE)
    cfgs = [("q8_0", "f16", False), ("q8_0", "q8_0", True), ("q4_0", "f16", True)]

    def gtype(name: str) -> int:
        return int(getattr(native.GGMLType, name.upper()))

    req = {"kind": "kv_types", "model": path, "prompt": PROMPT, "n_decode": 2, "n_ctx": 256, "n_batch": 512}
    ref = llama_ref.run({**req, "configs": [[gtype(k), gtype(v), fa] for k, v, fa in cfgs]})
    for i, (tk, tv, fa) in enumerate(cfgs):
        with Model(path, ctx_size=256, n_threads=2, flash_attn=fa, cache_type_k=tk, cache_type_v=tv) as m:
            assert np.array_equal(steps(m), ref[f"logits{i}"]), (tk, tv, fa)


def test_a_cache_type_whose_blocks_do_not_fit_a_layers_heads_is_refused(tmp_path, vocab_fields):
    path = synth(tmp_path / "g4.gguf", vocab_fields, **VARIANTS["gemma4-e-shared"])  # heads of 16 and 32
    with pytest.raises(ValueError, match="heads of 16 do not divide"):
        Model(path, ctx_size=128, cache_type_k="q8_0")


def test_shared_kv_and_per_layer_inputs_over_two_devices(tmp_path, vocab_fields):
    """Blocks 4-7 read the K/V of blocks 2 and 3: a split that keeps them together gives the logits of one device
    (the per-layer embeddings move along with the activations); one that parts them is refused."""
    path = synth(tmp_path / "g4.gguf", vocab_fields, **VARIANTS["gemma4-e-shared"])
    kw = dict(ctx_size=128, n_batch=16, n_threads=2, repack=False)
    with Model(path, **kw) as m:
        ref = steps(m, 4)
    with Model(path, devices=["CPU", "CPU"], tensor_split=[1, 7], **kw) as m:
        assert m.stats()["blocks_per_device"] == [1, 7]
        assert np.array_equal(steps(m, 4), ref)
    with pytest.raises(ValueError, match="block 4 reads the K/V of block 2"):
        Model(path, devices=["CPU", "CPU"], tensor_split=[1, 1], **kw)


@pytest.mark.parametrize("kw", [{}, dict(paged_kv=True, kv_page_size=16, kv_device_layers=2)])
def test_a_restored_sequence_continues_bit_identically(tmp_path, vocab_fields, kw):
    """The blocks that read another's K/V save nothing of their own."""
    path = synth(tmp_path / "m.gguf", vocab_fields, **VARIANTS["gemma4-e-shared"])
    assert_restored_continues(path, tmp_path, PROMPT, **kw)
