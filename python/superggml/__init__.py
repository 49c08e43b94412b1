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
from . import compat
from .compat import *  # noqa: F403  (llama_cpp's high-level names: `import superggml as llama_cpp`)

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
__all__ += compat.__all__


def __getattr__(name: str) -> object:
    """llama_cpp's low-level bindings (llama_*) are not in superggml: NotImplementedError (an AttributeError too)
    saying so, rather than a bare AttributeError."""
    if name.startswith(("llama_", "LLAMA_")):
        raise compat.NotInSuperggml(
            f"{name}: superggml has llama-cpp-python's high-level API (Llama), not its low-level llama_* bindings"
        )
    raise AttributeError(f"module 'superggml' has no attribute {name!r}")
