"""The OpenAI request fields that shape a request's choices: sampling parameters, stop strings, logprobs."""

from __future__ import annotations

from typing import Any, Sequence

MAX_LOGPROBS = 20  # alternatives per token a request may ask for (OpenAI's top_logprobs limit)


def sampling_options(
    *,
    temperature: float,
    top_p: float,
    top_k: int,
    min_p: float,
    repeat_penalty: float,
    frequency_penalty: float,
    presence_penalty: float,
    seed: int | None,
) -> dict[str, Any]:
    """OpenAI's sampling parameters as Model's samplers take them."""
    return dict(
        temp=temperature,
        top_p=top_p,
        top_k=top_k,
        min_p=min_p,
        repeat_penalty=repeat_penalty,
        frequency_penalty=frequency_penalty,
        presence_penalty=presence_penalty,
        seed=seed,
    )


def check_logprobs(k: int | None, name: str) -> None:
    """ValueError unless k is None or in 0..MAX_LOGPROBS."""
    if k is not None and not (isinstance(k, int) and 0 <= k <= MAX_LOGPROBS):
        raise ValueError(f"{name} must be in 0..{MAX_LOGPROBS}, not {k!r}")


def stop_list(stop: str | Sequence[str] | None) -> list[str]:
    """OpenAI's `stop` (a string, a list of them, or none) as a list."""
    return [stop] if isinstance(stop, str) else list(stop or [])
