"""Exceptions raised by superggml."""


class SuperggmlError(Exception):
    """Base class of superggml's errors."""


class UnsupportedModelError(SuperggmlError):
    """The GGUF holds a model architecture or tokenizer superggml does not support."""


class GGUFError(SuperggmlError, ValueError):
    """The GGUF file is malformed, truncated or inconsistent."""


class ContextLengthError(SuperggmlError, ValueError):
    """A prompt or input does not fit in the model's context (ctx_size)."""


class SavedSequenceError(SuperggmlError, ValueError):
    """A saved sequence that this model cannot take: another model's or cache type's, or a damaged file."""


class PoolExhausted(SuperggmlError):
    """Every buffer-pool slot is in use or pinned."""


class SlotReleased(SuperggmlError):
    """A view of a pool slot, pager layer or KV frame was used after its hold ended (released, evicted, dropped
    or shrunk): its memory may hold other bytes now, so superggml refuses to hand it out."""


class LoadCancelled(SuperggmlError):
    """A queued load was cancelled before it ran."""


class DeviceError(SuperggmlError, ConnectionError):
    """A device cannot be reached or failed mid-run (an RPC server: unreachable, busy, of another protocol
    version, killed or silent past its timeout). The message names the endpoint; a model whose device failed
    cannot continue: close it."""


class MissingExtra(SuperggmlError, ImportError):
    """An optional dependency of a feature is not installed; the message names the extra that installs it."""


EXTRAS = {
    "server": ("fastapi", "uvicorn", "pydantic", "prometheus_client"),
    "plot": ("matplotlib",),
    "hub": ("huggingface_hub",),
}


def require_extra(extra: str, what: str) -> None:
    """Imports the optional modules of `extra` (pyproject's optional-dependencies), or raises MissingExtra
    saying which are missing and how to install them, for `what` (the feature that needs them)."""
    import importlib

    missing = []
    for name in EXTRAS[extra]:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    if missing:
        raise MissingExtra(
            f"{what} needs {', '.join(missing)}, which is not installed: pip install 'superggml[{extra}]'"
        )
