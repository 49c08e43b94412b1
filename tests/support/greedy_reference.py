"""A prompt in passes of n_batch, then greedy steps, flash attention off and on: llama.cpp's logits, row for row."""

from __future__ import annotations

import numpy as np

import llama_ref
from prompts import greedy_rows
from superggml import Model


def assert_greedy_equals_llama_cpp(
    path: str, prompt: list[int], n_decode: int, n_batch: int, n_ctx: int = 256, equal_nan: bool = False
) -> None:
    """Every row of the prompt's logits and of n_decode greedy steps' (the argmax fed back) equal llama.cpp's
    (llama_ref's kv_types), with flash attention off and on in both."""
    configs = [(1, 1, False), (1, 1, True)]
    req = {"kind": "kv_types", "model": path, "prompt": prompt, "configs": configs, "n_decode": n_decode}
    ref = llama_ref.start({**req, "n_ctx": n_ctx, "n_batch": n_batch})
    ours = []
    for fa in (False, True):
        with Model(path, ctx_size=n_ctx, n_batch=n_batch, n_threads=2, flash_attn=fa) as m:
            ours.append(greedy_rows(m, prompt, n_decode))
    refs = ref.result()
    for i in range(2):
        assert np.array_equal(ours[i], refs[f"logits{i}"], equal_nan=equal_nan), f"flash_attn={bool(i)}"
