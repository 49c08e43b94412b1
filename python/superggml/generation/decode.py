"""Decoding one sequence: generate_step, a generator of tokens (MLX-LM's), plain or speculative."""

from __future__ import annotations

from typing import Iterator, Sequence

import numpy as np

from .engine import Engine
from .grammar import Matcher
from .sampling import Sampler


def pick(
    sampler: Sampler, matcher: Matcher | None, logits: np.ndarray, history: Sequence[int], logprobs: bool
) -> tuple[int, np.ndarray | None]:
    """Draws a token from `logits` within the constraint (which then moves past it); with `logprobs` also gives
    the log-probabilities it reports (the model's own: before the constraint's mask)."""
    logp = sampler.logprobs(logits, history) if logprobs else None
    tok = sampler.sample(logits if matcher is None else matcher.mask(logits), history)
    if matcher is not None:
        matcher.consume(tok)
    return tok, logp


def prefill(model: Engine, tokens: Sequence[int]) -> np.ndarray:
    """Brings the model's current sequence to `tokens`, reusing the longest cached prefix; returns last logits."""
    tokens = list(tokens)
    if not tokens:
        raise ValueError("the prompt is empty")
    keep = model.runtime.sequences.keep_prefix(tokens)
    return model.eval(tokens[keep:], logits_all=False)[-1]


def generate_step(
    model: Engine,
    tokens: Sequence[int],
    sampler: Sampler,
    *,
    reset: bool = True,
    logprobs: bool = False,
    matcher: Matcher | None = None,
) -> Iterator[tuple[int, np.ndarray | None]]:
    """Yields (token, the log-probabilities it was drawn with if `logprobs`, else None) after `tokens` on the
    model's current sequence (reset: from its longest cached prefix; else appended), until the context is full.
    With a speculator and neither logprobs nor a constraint, each step drafts (each token's own distribution
    is not reported or masked then)."""
    seq = model.runtime.seq
    logits = prefill(model, tokens) if reset or not seq.tokens else model.eval(tokens)[-1]
    spec = model.speculator
    if spec is not None and not logprobs and matcher is None:
        tok = sampler.sample(logits, seq.tokens)
        yield tok, None
        while model.n_tokens + 1 < model.n_ctx:
            toks = spec.step(model, tok, sampler)
            for t in toks:
                if model.metrics is not None:
                    model.metrics.on_token()
                yield t, None
            tok = toks[-1]
        return
    while True:
        tok, logp = pick(sampler, matcher, logits, seq.tokens, logprobs)
        yield tok, logp
        if model.n_tokens >= model.n_ctx:
            return
        logits = model.eval([tok])[-1]
