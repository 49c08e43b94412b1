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

__version__ = "0.1.0"

__all__ = [
    "ContextLengthError",
    "DeviceError",
    "GGUFError",
    "Grammar",
    "GrammarError",
    "MissingExtra",
    "Model",
    "SamplingParams",
    "SavedSequenceError",
    "SuperggmlError",
    "ToolError",
    "UnsupportedModelError",
    "__version__",
]
