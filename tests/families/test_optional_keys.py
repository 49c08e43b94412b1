"""Every family's hyperparameter keys read as llama.cpp reads them: required where it requires them, with its
default where they are optional. For each family, its synthetic GGUF without one of its "{arch}." keys at a
time: where llama.cpp loads and runs the file, superggml does too, with the same logits bit for bit; where
llama.cpp refuses it, or aborts on it, superggml raises a clear error."""

from __future__ import annotations

import os

import numpy as np
import pytest

import llama_ref
from superggml import Model
from superggml.errors import SuperggmlError
from synth_gguf import ONE_PER_FAMILY, VARIANTS, keys_left_out, synth
from prompts import TOKENS_10 as PROMPT

CHUNK = 12


def ours(path):
    """superggml's logits for PROMPT, or the error it refused the file with."""
    try:
        with Model(path, ctx_size=128, n_threads=2) as m:
            return m.eval(PROMPT, logits_all=True).copy()
    except (SuperggmlError, ValueError) as e:
        return e


@pytest.mark.parametrize("variant", ONE_PER_FAMILY)
def test_each_key_dropped_loads_or_is_refused_as_llama_cpp_does(tmp_path, small_vocab, variant):
    written = []
    with keys_left_out(seen=written):
        full = synth(tmp_path / "full.gguf", small_vocab, **VARIANTS[variant])
    arch = VARIANTS[variant]["arch"]
    keys = [k for k in written if k.startswith(arch + ".")]
    wrong, statuses = [], []
    for at in range(0, len(keys), CHUNK):  # llama.cpp's children load a chunk while superggml loads it too
        chunk = keys[at : at + CHUNK]
        paths = []
        for i, key in enumerate(chunk, at):  # the same file but one key: the same seed, the same tensors
            with keys_left_out(drop={key}):
                paths.append(synth(tmp_path / f"no-{i}.gguf", small_vocab, **VARIANTS[variant]))
        pending = llama_ref.start({"kind": "loads", "model": full, "models": paths, "prompt": PROMPT})
        got = [ours(path) for path in paths]
        ref = pending.result()
        for i, (key, path) in enumerate(zip(chunk, paths)):
            status = int(ref["status"][i])
            statuses.append(status)
            os.unlink(path)  # 300 files in all: none is kept past its check
            if status == llama_ref.LOAD_OK:
                if isinstance(got[i], Exception):
                    wrong.append(f"{key}: llama.cpp runs it, superggml refuses: {got[i]}")
                elif not np.array_equal(got[i], ref[f"logits{i}"]):
                    d = np.abs(got[i] - ref[f"logits{i}"]).max()
                    wrong.append(f"{key}: llama.cpp runs it, with other logits (max |d| {d})")
            elif not isinstance(got[i], Exception):
                what = "refuses" if status == llama_ref.LOAD_ERROR else "aborts on"
                wrong.append(f"{key}: llama.cpp {what} it, superggml runs it")
    print(f"\n{variant}: {len(keys)} keys, llama.cpp statuses {statuses}")
    assert not wrong, "\n".join(wrong)
