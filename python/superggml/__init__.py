"""superggml: run GGUF language models bigger than memory, layer by layer over ggml."""

from __future__ import annotations

from .errors import (
    ContextLengthError,
    DeviceError,
    GGUFError,
    MissingExtra,
    SavedSequenceError,
    SuperggmlError,
    UnsupportedModelError,
)
from .generation.grammar import Grammar, GrammarError
from .model import Model
from .generation.sampling import SamplingParams
from .api.tools import ToolError
from .compat import (
    LLAMA_DEFAULT_SEED,
    Llama,
    LlamaCache,
    LlamaGrammar,
    LlamaRAMCache,
    LlamaState,
    LogitsProcessorList,
    MinTokensLogitsProcessor,
    NotInSuperggml,
    StoppingCriteriaList,
)

__version__ = "0.1.0"

__all__ = [
    "LLAMA_DEFAULT_SEED",
    "ContextLengthError",
    "DeviceError",
    "GGUFError",
    "Grammar",
    "GrammarError",
    "Llama",
    "LlamaCache",
    "LlamaGrammar",
    "LlamaRAMCache",
    "LlamaState",
    "LogitsProcessorList",
    "MinTokensLogitsProcessor",
    "MissingExtra",
    "Model",
    "SamplingParams",
    "NotInSuperggml",
    "SavedSequenceError",
    "StoppingCriteriaList",
    "SuperggmlError",
    "ToolError",
    "UnsupportedModelError",
    "__version__",
]


def __getattr__(name: str) -> object:
    """llama_cpp's low-level bindings (llama_*) are not in superggml: NotImplementedError (an AttributeError too)
    saying so, rather than a bare AttributeError."""
    if name.startswith(("llama_", "LLAMA_")):
        raise NotInSuperggml(
            f"{name}: superggml has llama-cpp-python's high-level API (Llama), not its low-level llama_* bindings"
        )
    raise AttributeError(f"module 'superggml' has no attribute {name!r}")
