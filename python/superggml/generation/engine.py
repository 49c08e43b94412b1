"""What generation/ reads of a model (superggml.Model is one): an Engine. generation/ never imports the facade;
the type checker holds Model to this shape wherever one is handed down."""

from __future__ import annotations

from typing import Any, Protocol, Sequence

import numpy as np

from .. import native
from ..arch import Architecture
from ..metrics import Metrics
from ..runtime.exec.executor import Executor
from ..settings import Settings
from ..tokenizer import Tokenizer
from .grammar import Grammar, Matcher
from .sampling import Sampler, SamplingParams


class Stepper(Protocol):
    """A speculator as decoding sees it: one speculative step of the engine's current sequence after `tok`
    (chosen, not yet fed), returning the accepted drafted tokens and the engine's next one; its counters."""

    generated: int

    def step(self, model: Engine, tok: int, sampler: Sampler) -> list[int]: ...

    def stats(self) -> dict[str, Any]: ...

    def close(self) -> None: ...


class Engine(Protocol):
    """A loaded model: its runtime (the executor: sequences, passes), settings, architecture and file, the
    tokenizer, its metrics and speculator if any, and the calls that evaluate, sample and bound a completion."""

    runtime: Executor
    settings: Settings
    arch: Architecture
    file: native.GGUFFile
    store: Any  # native.WeightStore while running
    tokenizer: Tokenizer
    metrics: Metrics | None
    speculator: Stepper | None
    seed: int | None

    @property
    def n_ctx(self) -> int: ...

    @property
    def n_tokens(self) -> int: ...

    def eval(self, tokens: Sequence[int], *, logits_all: bool | None = None) -> np.ndarray: ...

    def completion_limit(self, prompt_tokens: Sequence[int], max_tokens: int | None) -> int: ...

    def sampler(self, params: SamplingParams, seed: int | None = None) -> Sampler: ...

    def matcher(self, grammar: Grammar | None) -> Matcher | None: ...

    def close(self) -> None: ...
