"""Sequences fed alone and in shared passes, for the tests that compare the two."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np


def alone(m: Any, prompts: Sequence[Sequence[int]], steps: int) -> list[Any]:
    """Each prompt fed alone from an empty memory, then `steps` greedy tokens: per prompt, the last logits of the
    prompt and of each step, F32 [steps + 1, n_vocab]. The model is reset after."""
    out = []
    for p in prompts:
        m.reset()
        rows = [m.eval(p)[-1].copy()]
        for _ in range(steps):
            rows.append(m.eval([int(rows[-1].argmax())])[-1].copy())
        out.append(np.stack(rows))
    m.reset()
    return out


def alone_and_batched(m: Any, prompts: Sequence[Sequence[int]], steps: int) -> tuple[list[Any], list[Any]]:
    """`alone`, and all the prompts in shared passes (eval_batch, sequences 10, 11, ...) with their own greedy
    tokens, as two lists of F32 [steps + 1, n_vocab] (alone, batched)."""
    solo = alone(m, prompts, steps)
    got = [[r[-1].copy()] for r in m.eval_batch([(10 + i, p) for i, p in enumerate(prompts)])]
    for _ in range(steps):
        step = [(10 + i, [int(g[-1].argmax())]) for i, g in enumerate(got)]
        for g, r in zip(got, m.eval_batch(step)):
            g.append(r[-1].copy())
    return solo, [np.stack(g) for g in got]
