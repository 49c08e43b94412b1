"""The OpenAI request fields that shape a request's choices: sampling parameters, stop strings, logprobs."""

from __future__ import annotations

from typing import Sequence

MAX_LOGPROBS = 20  # alternatives per token a request may ask for (OpenAI's top_logprobs limit)


def check_logprobs(k: int | None, name: str) -> None:
    """ValueError unless k is None or in 0..MAX_LOGPROBS."""
    if k is not None and not (isinstance(k, int) and 0 <= k <= MAX_LOGPROBS):
        raise ValueError(f"{name} must be in 0..{MAX_LOGPROBS}, not {k!r}")


def stop_list(stop: str | Sequence[str] | None) -> list[str]:
    """OpenAI's `stop` (a string, a list of them, or none) as a list."""
    return [stop] if isinstance(stop, str) else list(stop or [])
