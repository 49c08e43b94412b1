"""superggml: run GGUF language models bigger than memory, layer by layer over ggml."""

from __future__ import annotations

from .errors import DeviceError, GGUFError, SuperggmlError, UnsupportedModelError
from .model import Model
from .sampling import SamplingParams

__version__ = "0.1.0"

__all__ = ["DeviceError", "GGUFError", "Model", "SamplingParams", "SuperggmlError", "UnsupportedModelError", "__version__"]
