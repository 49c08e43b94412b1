"""Deprecated: the server is the package superggml.serve; this module re-exports what it held."""

from __future__ import annotations

import warnings

warnings.warn("superggml.server is deprecated; import from superggml.serve", DeprecationWarning, stacklevel=2)

from .serve import create_app, serve  # noqa: E402
from .serve.bodies import (  # noqa: E402
    ChatBody,
    ChatMessage,
    CompletionBody,
    DetokenizeBody,
    EmbeddingBody,
    SlotBody,
    TokenizeBody,
)
from .serve.engine import END, Engine, Job  # noqa: E402
from .serve.errors import ApiError, add_error_handlers, model_not_found  # noqa: E402
from .serve.routes import WEB, Routes  # noqa: E402

__all__ = [
    "END",
    "WEB",
    "ApiError",
    "ChatBody",
    "ChatMessage",
    "CompletionBody",
    "DetokenizeBody",
    "EmbeddingBody",
    "Engine",
    "Job",
    "Routes",
    "SlotBody",
    "TokenizeBody",
    "add_error_handlers",
    "create_app",
    "model_not_found",
    "serve",
]
