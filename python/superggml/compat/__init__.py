"""llama-cpp-python's high-level API over superggml (Llama and its helpers): `import superggml as llama_cpp`."""

from __future__ import annotations

from .helpers import (
    LLAMA_DEFAULT_SEED,
    LlamaCache,
    LlamaGrammar,
    LlamaRAMCache,
    LlamaState,
    LogitsProcessorList,
    MinTokensLogitsProcessor,
    StoppingCriteriaList,
)
from .llama import Llama
from .params import NotInSuperggml

__all__ = [
    "LLAMA_DEFAULT_SEED",
    "Llama",
    "LlamaCache",
    "LlamaGrammar",
    "LlamaRAMCache",
    "LlamaState",
    "LogitsProcessorList",
    "MinTokensLogitsProcessor",
    "NotInSuperggml",
    "StoppingCriteriaList",
]
