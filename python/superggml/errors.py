"""Exceptions raised by superggml."""


class SuperggmlError(Exception):
    """Base class of superggml's errors."""


class UnsupportedModelError(SuperggmlError):
    """The GGUF holds a model architecture or tokenizer superggml does not support."""


class GGUFError(SuperggmlError, ValueError):
    """The GGUF file is malformed, truncated or inconsistent."""


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
