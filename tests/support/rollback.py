"""Going back into a pass: a recurrent family's states k rows into a recorded pass, by replay."""

from __future__ import annotations

from typing import Any

import numpy as np

from superggml import Model


def assert_going_back_replays(
    path: str, prompt: list[int], check: list[int], keeps: tuple[int, ...], atol: float = 0.0, **kw: Any
) -> None:
    """The prompt, then a pass of `check` (2..16 rows of one sequence: it records its recurrent inputs); truncating
    to keep rows into it restores the checkpoint where it began and replays those rows with no weights: no token
    is fed again, and the next logits are those of a sequence fed prompt + check[:keep] anew: bit for bit, or
    within `atol` of one fed in the same passes for a family whose rows depend on how its passes split."""
    kw = dict(ctx_size=128, n_threads=2, n_batch=16) | kw
    n = len(prompt)
    for keep in keeps:
        with Model(path, **kw) as m:
            if atol:
                m.eval(prompt)
                m.eval(check[:keep])
                fresh = m.eval([7, 8]).copy()
            else:
                fresh = m.eval(prompt + check[:keep] + [7, 8]).copy()
        with Model(path, **kw) as m:
            m.eval(prompt)
            m.eval(check)
            passes = m.stats()["passes"]
            assert m.runtime.sequences.truncate(n + keep) == n + keep
            assert m.stats()["state_replays"] == 1
            got = m.eval([7, 8])
            assert m.stats()["passes"] == passes + 1
        assert np.allclose(got, fresh[-1:], rtol=0, atol=atol) if atol else np.array_equal(got, fresh[-1:])
