"""Token sampling from logits, in llama.cpp's order: penalties, top-k, top-p, min-p, temperature."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Mapping, Sequence

import numpy as np


def log_softmax(x: np.ndarray) -> np.ndarray:
    """log(softmax(x)) in F64, stably."""
    x = np.asarray(x, dtype=np.float64)
    m = float(x.max())
    return x - m - np.log(np.exp(x - m).sum())


@dataclass(frozen=True)
class SamplingParams:
    """How a completion samples, the one place its options are defined: each field is named as OpenAI's request
    field (and the server's, the Python API's); `seed` None: the model's."""

    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    seed: int | None = None

    @classmethod
    def named_in(cls, values: Mapping[str, Any]) -> dict[str, Any]:
        """The sampling fields among `values` (a request's fields, a call's keywords, the CLI's flags)."""
        return {f.name: values[f.name] for f in fields(cls) if f.name in values}

    @classmethod
    def pick(cls, values: Mapping[str, Any]) -> SamplingParams:
        """The sampling fields among `values`; the rest by default."""
        return cls(**cls.named_in(values))

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError("temperature must be >= 0")
        if self.top_k < 0:
            raise ValueError("top_k must be >= 0 (0 = off)")
        if not 0.0 <= self.top_p <= 1.0:
            raise ValueError("top_p must be in [0, 1]")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError("min_p must be in [0, 1]")
        if self.repeat_penalty <= 0:
            raise ValueError("repeat_penalty must be > 0")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1


class Sampler:
    """Picks the next token; `seed` makes the draw reproducible."""

    def __init__(self, params: SamplingParams, seed: int | None = None):
        self.params = params
        self.rng = np.random.default_rng(seed)

    def apply_penalties(self, logits: np.ndarray, history: Sequence[int]) -> np.ndarray:
        p = self.params
        if (
            not history
            or p.repeat_last_n == 0
            or (p.repeat_penalty == 1.0 and p.frequency_penalty == 0.0 and p.presence_penalty == 0.0)
        ):
            return logits
        last = history[-p.repeat_last_n :] if p.repeat_last_n > 0 else history
        ids, counts = np.unique(np.asarray(last, dtype=np.int64), return_counts=True)
        out = logits.copy()
        sel = out[ids]
        sel = np.where(sel <= 0, sel * p.repeat_penalty, sel / p.repeat_penalty)
        sel -= counts * p.frequency_penalty + (counts > 0) * p.presence_penalty
        out[ids] = sel
        return out

    def distribution(self, logits: np.ndarray, history: Sequence[int] = ()) -> tuple[np.ndarray, np.ndarray]:
        """The distribution `sample` draws from: (token ids, their probabilities F64), the rest of the vocabulary
        having none. Greedy: the argmax with probability 1."""
        p = self.params
        logits = self.apply_penalties(np.asarray(logits, dtype=np.float32), history)
        if p.greedy:
            return np.array([int(np.argmax(logits))]), np.ones(1)
        ids = np.argsort(-logits, kind="stable")
        if p.top_k > 0:
            ids = ids[: p.top_k]
        x = logits[ids].astype(np.float64)
        probs = np.exp(x - x[0])
        probs /= probs.sum()
        if p.top_p < 1.0:
            keep = int(np.searchsorted(np.cumsum(probs), p.top_p) + 1)
            ids, x, probs = ids[:keep], x[:keep], probs[:keep]
        if p.min_p > 0.0:
            keep = probs >= p.min_p * probs[0]
            ids, x = ids[keep], x[keep]
        x = x / p.temperature
        probs = np.exp(x - x.max())
        probs /= probs.sum()
        return ids, probs

    def logprobs(self, logits: np.ndarray, history: Sequence[int] = ()) -> np.ndarray:
        """Log-probabilities (F64, every token) as OpenAI reports them: of the logits after the penalties and
        the temperature (1 when greedy), before top-k, top-p and min-p cut the distribution."""
        x = self.apply_penalties(np.asarray(logits, dtype=np.float32), history).astype(np.float64)
        return log_softmax(x / self.params.temperature if self.params.temperature > 0 else x)

    def draw(self, ids: np.ndarray, probs: np.ndarray) -> int:
        """One token from a distribution (ids, probs)."""
        return int(ids[0]) if self.params.greedy else int(ids[self.rng.choice(len(ids), p=probs)])

    def sample(self, logits: np.ndarray, history: Sequence[int] = ()) -> int:
        return self.draw(*self.distribution(logits, history))
