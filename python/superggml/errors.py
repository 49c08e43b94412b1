"""Exceptions raised by superggml."""


class SuperggmlError(Exception):
    """Base class of superggml's errors."""


class UnsupportedModelError(SuperggmlError):
    """The GGUF holds a model architecture or tokenizer superggml does not support."""


class GGUFError(SuperggmlError, ValueError):
    """The GGUF file is malformed, truncated or inconsistent."""


class PoolExhausted(SuperggmlError):
    """Every buffer-pool slot is in use or pinned."""


class LoadCancelled(SuperggmlError):
    """A queued load was cancelled before it ran."""
