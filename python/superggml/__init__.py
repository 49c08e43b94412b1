"""superggml: run GGUF language models bigger than memory, layer by layer over ggml."""

from __future__ import annotations

from .errors import GGUFError, SuperggmlError, UnsupportedModelError

__version__ = "0.1.0"

__all__ = ["GGUFError", "SuperggmlError", "UnsupportedModelError", "__version__"]
