"""Sequences fed alone and in shared passes, for the tests that compare the two."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

import llama_ref


def batch_prompts() -> list[list[int]]:
    """The batch tests' three prompts: 9, 17 and 5 random tokens (the 17 cut across passes of 16)."""
    rng = np.random.default_rng(3)
    return [[int(x) for x in rng.integers(0, 49152, n)] for n in (9, 17, 5)]


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


@dataclass
class BatchGap:
    """A batch against each sequence alone, in superggml and in llama.cpp (one unified K/V, the same passes of
    n_batch), all measured on the machine that runs the test: max |dlogit| of superggml's batch from its alone
    (`worst`), of llama.cpp's (`ref_gap`), of superggml's alone from llama.cpp's (`to_ref`), and the largest
    logit (`scale`)."""

    worst: float
    ref_gap: float
    to_ref: float
    scale: float

    def check(self, label: str) -> None:
        """The batch as close to each alone as llama.cpp's own batch is (twice its gap, or 1e-4 of the logits,
        whichever is more: the gap is rounding the kernels do by the shape of a pass), and each alone at
        llama.cpp's alone within 1e-4 of the logits."""
        print(
            f"{label}: max |dlogit| batch vs alone {self.worst:.2e} (llama.cpp {self.ref_gap:.2e}) of "
            f"{self.scale:.2f}; alone vs llama.cpp {self.to_ref:.2e}"
        )
        assert self.worst <= max(2 * self.ref_gap, 1e-4 * self.scale)
        assert self.to_ref <= 1e-4 * self.scale


def batch_gap(
    m: Any, path: str, prompts: Sequence[Sequence[int]], steps: int, *, n_ctx: int = 128, n_batch: int = 16
) -> BatchGap:
    """alone_and_batched on `m` (a Model of the file at `path`, batch_invariant), beside llama.cpp's batch of the
    same prompts; the greedy tokens of the batch are each alone's."""
    solo, got = alone_and_batched(m, prompts, steps)
    assert all((g.argmax(-1) == a.argmax(-1)).all() for g, a in zip(got, solo))
    req = {"kind": "batch", "model": path, "prompts": [list(p) for p in prompts], "steps": steps}
    ref = llama_ref.run({**req, "n_ctx": n_ctx, "n_batch": n_batch, "repack": False})
    ref_alone = [ref[f"alone{i}"] for i in range(len(prompts))]
    return BatchGap(
        worst=max(float(np.abs(g - a).max()) for g, a in zip(got, solo)),
        ref_gap=max(float(np.abs(ref[f"batched{i}"] - a).max()) for i, a in enumerate(ref_alone)),
        to_ref=max(float(np.abs(s - a).max()) for s, a in zip(solo, ref_alone)),
        scale=max(float(np.abs(a).max()) for a in solo),
    )
