"""Every family's tensor shapes and per-layer keys read as llama.cpp reads them. For each family, its synthetic GGUF
with one change at a time: a tensor whose last dimension is 1 written without it (llama.cpp compares shapes with
trailing dimensions of 1 as equal), or a per-layer key written as an array of its value per block (llama.cpp reads
head counts and FFN sizes with get_key_or_arr). Where llama.cpp loads and runs the file, superggml does too, with
the same logits bit for bit; where llama.cpp refuses it or aborts on it, superggml raises a clear error."""

from __future__ import annotations

import os

import gguf
import numpy as np
import pytest

import llama_ref
from superggml import Model
from superggml.errors import SuperggmlError
from synth_gguf import ONE_PER_FAMILY, VARIANTS, layout_changes, metadata, synth
from prompts import TOKENS_10 as PROMPT

PER_LAYER = ("attention.head_count", "attention.head_count_kv", "feed_forward_length")


def ours(path):
    try:
        with Model(path, ctx_size=128, n_threads=2) as m:
            return m.eval(PROMPT, logits_all=True).copy()
    except (SuperggmlError, ValueError) as e:
        return e


def changes(path, arch):
    """The changes this file allows: (what, arrays, flatten) for each scalar per-layer key and each tensor whose
    last dimension is 1."""
    meta = metadata(path)
    out = []
    for k in PER_LAYER:
        key = f"{arch}.{k}"
        if key in meta and not isinstance(meta[key], (list, tuple)):
            out.append((f"{key} per layer", {key}, set()))
    for t in gguf.GGUFReader(str(path)).tensors:  # the dimensions as written (ggml_n_dims drops trailing 1s)
        shape = [int(x) for x in t.shape]
        if len(shape) > 1 and shape[-1] == 1:
            out.append((f"{t.name} {shape} as {shape[:-1]}", set(), {t.name}))
    return out


@pytest.mark.parametrize("variant", ONE_PER_FAMILY + ["granitehybrid-1group"])
def test_shapes_and_per_layer_keys_load_as_llama_cpp_loads_them(tmp_path, small_vocab, variant):
    full = synth(tmp_path / "full.gguf", small_vocab, **VARIANTS[variant])
    todo = changes(full, VARIANTS[variant]["arch"])
    paths = []
    for i, (_, arrays, flatten) in enumerate(todo):
        with layout_changes(arrays=arrays, flatten=flatten):
            paths.append(synth(tmp_path / f"changed-{i}.gguf", small_vocab, **VARIANTS[variant]))
    pending = llama_ref.start({"kind": "loads", "model": full, "models": paths, "prompt": PROMPT})
    got = [ours(path) for path in paths]
    ref = pending.result()
    wrong = []
    for i, ((what, _, _), path) in enumerate(zip(todo, paths)):
        status = int(ref["status"][i])
        os.unlink(path)
        if status == llama_ref.LOAD_OK:
            if isinstance(got[i], Exception):
                wrong.append(f"{what}: llama.cpp runs it, superggml refuses: {got[i]}")
            elif not np.array_equal(got[i], ref[f"logits{i}"]):
                d = np.abs(got[i] - ref[f"logits{i}"]).max()
                wrong.append(f"{what}: llama.cpp runs it, with other logits (max |d| {d})")
        elif not isinstance(got[i], Exception):
            what_ref = "refuses" if status == llama_ref.LOAD_ERROR else "aborts on"
            wrong.append(f"{what}: llama.cpp {what_ref} it, superggml runs it")
    print(f"\n{variant}: {[w for w, _, _ in todo]}, llama.cpp statuses {list(ref['status'])}")
    assert todo and not wrong, "\n".join(wrong)
