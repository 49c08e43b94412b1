"""superggml's paging primitives, for Python inference stacks that stream their own weights.

- `BufferPool`: a fixed set of equal-size slots on one device (LRU eviction, pins, a hard byte budget).
  `acquire(key)` gives a `Slot`: a hold on the slot whose bytes are seen without a copy
  (`numpy.asarray(slot)`, `memoryview(slot)`, `torch.from_dlpack(slot)`, `slot.array(dtype, shape)`)
  and bound to ggml tensors (`slot.tensor(type, shape)`).
- `Prefetcher`: worker threads reading byte ranges of a file into slots (pread, or O_DIRECT into the slot).
- `LayerPager`: groups of a GGUF file's tensors ("layers") streamed through a pool with prefetch.
- `KVCache`: a paged K/V cache (device frames, a host budget, a spill file).
- `memory()`: memory telemetry (cgroup-aware host memory, ggml devices, NVML GPUs).

A hold's views are counted: `release()` raises BufferError while a view of it is alive, and no view can be made
after it (`SlotReleased`), so a view never reads memory that was freed or given to other bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Generic, Optional, Protocol, TypeVar, Union, cast

import numpy as np

from . import native
from .errors import LoadCancelled, PoolExhausted, SlotReleased
from .telemetry import MemorySnapshot, snapshot

__all__ = [
    "BufferPool",
    "KVCache",
    "KVFrame",
    "Layer",
    "LayerPager",
    "LoadCancelled",
    "LoadFuture",
    "PoolExhausted",
    "Prefetcher",
    "Slot",
    "SlotReleased",
    "DIRECT_ALIGN",
    "memory",
    "ggml_type",
]

Slot = native.Slot
Layer = native.Layer
KVFrame = native.KVFrame
LoadFuture = native.LoadFuture
DIRECT_ALIGN: int = native.DIRECT_ALIGN

_NUMPY = {"F32": np.float32, "F16": np.float16, "I32": np.int32, "I64": np.int64}


def ggml_type(t: Union[str, int, "native.GGMLType"]) -> "native.GGMLType":
    """A ggml type from its name ("Q4_K", "f16") or number."""
    if isinstance(t, native.GGMLType):
        return t
    if isinstance(t, str):
        try:
            return cast("native.GGMLType", getattr(native.GGMLType, t.upper()))
        except AttributeError:
            raise ValueError(f"unknown ggml type {t!r}") from None
    return native.GGMLType(int(t))


def _backend(device: str) -> Optional["native.Backend"]:
    """None for the CPU (host memory), else a backend of the ggml device: a name ggml lists ("CUDA0"), or an
    RPC server's device as superggml names them ("RPC[host:port]", the server added on first use)."""
    if device.upper() == "CPU":
        return None
    if "[" in device:
        from .devices import rpc_device

        device = rpc_device(device)
    return native.Backend(device)


def view(lease: Any, dtype: Any, shape: Sequence[int], offset: int = 0) -> np.ndarray:
    """A zero-copy numpy view of `lease`'s bytes (a Slot, Layer or KVFrame) at byte `offset`, as `dtype`
    and `shape` (row-major). The view counts as one: release() raises BufferError until it is gone."""
    dt = np.dtype(dtype)
    count = int(np.prod(shape, dtype=np.int64)) if len(shape) else 1
    return np.frombuffer(lease, dtype=dt, count=count, offset=offset).reshape(tuple(shape))


H = TypeVar("H", bound="Handle[Any]")
C = TypeVar("C")


class Handle(Generic[C]):
    """A handle on a native object (`core`, until close): its counters (stats), and a context that closes it."""

    kind = "handle"  # what the error of a closed one calls it

    def __init__(self, core: C) -> None:
        self._core: C | None = core

    @property
    def core(self) -> C:
        if self._core is None:
            raise ValueError(f"the {self.kind} is closed")
        return self._core

    def stats(self) -> dict[str, Any]:
        return dict(cast(Any, self.core).stats())

    def close(self) -> None:
        self._core = None

    def __enter__(self: H) -> H:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Slots(Protocol):
    @property
    def n_slots(self) -> int: ...
    @property
    def slot_size(self) -> int: ...


S = TypeVar("S", bound=Slots)


class SlotHandle(Handle[S]):
    """A handle on slots of one size."""

    @property
    def n_slots(self) -> int:
        return self.core.n_slots

    @property
    def slot_size(self) -> int:
        """Bytes of each slot: the most it holds in memory is n_slots * slot_size."""
        return self.core.slot_size


class BufferPool(SlotHandle["native.BufferPool"]):
    """`n_slots` slots of `slot_size` bytes on `device` ("CPU", a ggml device name or "RPC[host:port]"), allocated
    at once, so the pool's bytes are its budget. Host slots start on a page (DIRECT_ALIGN) and their size is
    rounded up to one, so a Prefetcher's O_DIRECT reads land in them; device slots use the device's alignment
    and give tensors, not host views."""

    kind = "pool"

    def __init__(self, slot_size: int, n_slots: int, device: str = "CPU") -> None:
        self.device = device
        self._backend = _backend(device)
        # host slots page-aligned: a Prefetcher's O_DIRECT reads land in them without a bounce
        super().__init__(native.BufferPool(slot_size, n_slots, self._backend, DIRECT_ALIGN))

    def acquire(self, key: int, *, writable: bool = True) -> "native.Slot":
        """Holds the slot of `key` (slot.hit: it already holds key's bytes) or takes one, evicting the least
        recently used slot neither held nor pinned. PoolExhausted if every slot is held or pinned."""
        return self.core.acquire_slot(key, writable)

    def pin(self, slot: "native.Slot", pinned: bool = True) -> None:
        """A pinned slot is never evicted (it keeps its key's bytes after release)."""
        self.core.set_pinned(slot.index, pinned)

    def drop(self, key: int) -> bool:
        """Forgets `key`'s bytes if its slot is not held; returns whether it did."""
        return self.core.drop(key)

    def slot_of(self, key: int) -> int:
        return self.core.slot_of(key)

    @property
    def nbytes(self) -> int:
        return self.core.bytes

    @property
    def is_host(self) -> bool:
        return self.core.is_host

    def stats(self) -> dict[str, int]:
        return dict(self.core.stats())

    def close(self) -> None:
        """Drops the pool; slots still held keep its memory until they are released."""
        super().close()


class Prefetcher(Handle["native.Prefetcher"]):
    """`n_workers` threads reading byte ranges of the file at `path` into slots, highest priority first.
    direct_io: True or None (default) opens the file with O_DIRECT too, where the file system allows it
    (aligned ranges then go disk to slot without the page cache); False reads through the page cache."""

    kind = "prefetcher"

    def __init__(self, path: str, n_workers: int = 1, direct_io: Optional[bool] = None) -> None:
        self.path = str(path)
        super().__init__(native.Prefetcher(self.path, n_workers, direct_io is not False))

    @property
    def direct_io(self) -> bool:
        return self.core.direct

    def submit(
        self,
        slot: "native.Slot",
        ranges: Sequence[tuple[int, int, int]],
        *,
        priority: int = 0,
        direct: Optional[bool] = None,
    ) -> "native.LoadFuture":
        """Queues reads of (file_offset, size, slot_offset) ranges into a held slot; returns a LoadFuture
        (result(timeout), done(), cancel()). The slot's release() waits for the reads."""
        return self.core.submit_slot(slot, [tuple(r) for r in ranges], priority, direct)

    def cancel(self, key: int) -> bool:
        """Cancels every queued load into the slot of `key` (their futures raise LoadCancelled)."""
        return self.core.cancel(key)

    def close(self) -> None:
        """Cancels queued loads and stops the workers once loads in flight finish."""
        super().close()


class LayerPager(SlotHandle["native.LayerPager"]):
    """Groups of a GGUF file's tensors (`layers`: lists of tensor names) streamed through `n_slots` slots
    (each the size of the largest layer unless `slot_size` is given) by `n_workers` prefetch threads.
    prefetch(l) starts loading layer l; acquire(l) waits for it and returns a `Layer` whose tensors are
    bound to its slot (views: layer.array(name)); release it to let its slot go to another layer."""

    kind = "pager"

    def __init__(
        self,
        path: str,
        layers: Sequence[Sequence[str]],
        *,
        n_slots: int = 2,
        slot_size: int = 0,
        n_workers: int = 1,
        direct_io: bool = False,
        device: str = "CPU",
    ) -> None:
        self.path = str(path)
        self.store = native.WeightStore(native.GGUFFile(self.path))
        self._backend = _backend(device)
        super().__init__(
            native.LayerPager(
                self.store, [list(x) for x in layers], n_slots, slot_size, n_workers, self._backend, direct_io
            )
        )

    @property
    def n_layers(self) -> int:
        return self.core.n_layers

    def layer_bytes(self, layer: int) -> int:
        return self.core.layer_bytes(layer)

    def resident(self, layer: int) -> bool:
        """Whether a slot holds the layer's bytes now."""
        return self.core.resident(layer)

    def prefetch(self, layer: int, *, priority: int = 0) -> bool:
        """Starts loading `layer` in the background; False if no slot is free now."""
        return self.core.prefetch(layer, priority)

    def acquire(self, layer: int) -> "native.Layer":
        """Waits for the layer's bytes (GIL released) and binds its tensors to its slot."""
        return self.core.acquire_layer(layer)

    def pin(self, layer: int) -> None:
        self.core.pin(layer)

    def unpin(self, layer: int) -> None:
        self.core.unpin(layer)


def layer_array(layer: "native.Layer", name: str) -> np.ndarray:
    """A zero-copy read-only numpy view of tensor `name` of an acquired layer: F32/F16/I32 as numbers in
    row-major shape, other (quantized) types as their raw bytes [rows, row_bytes]."""
    t = layer.get(name)
    off = layer.offset(name)
    shape = list(reversed(t.ne))
    while len(shape) > 1 and shape[0] == 1:
        shape.pop(0)
    if t.type_name.upper() in _NUMPY:
        return view(layer, _NUMPY[t.type_name.upper()], shape, off)
    row_bytes = native.row_size(t.type, t.ne[0])
    return view(layer, np.uint8, [t.nbytes // row_bytes, row_bytes], off)


class KVCache(Handle["native.KVCache"]):
    """A paged K/V cache for `n_layers` layers of `n_embd_kv` channels and up to `n_ctx` tokens per sequence:
    pages of `page_size` tokens live in device frames (`n_frames`, 0: one per layer), host memory
    (`host_budget` bytes, None: no limit) and a spill file in `spill_dir`. acquire(seq, layer, n_valid)
    returns a KVFrame holding rows [0, n_valid) of K ([n_ctx, n_embd_kv]) and V (the same, or transposed
    with v_trans); frame.written(n_end) then release() marks the new rows' pages dirty."""

    kind = "KV cache"

    def __init__(
        self,
        n_layers: int,
        n_embd_kv: int,
        n_ctx: int,
        *,
        type: str = "F16",
        page_size: int = 256,
        n_frames: int = 0,
        n_stream: int = 1,
        host_budget: Optional[int] = None,
        spill_dir: str = "",
        v_trans: bool = False,
        device: str = "CPU",
        n_workers: int = 1,
    ) -> None:
        if type.upper() not in ("F16", "F32"):
            raise ValueError("KVCache type must be F16 or F32")
        self.type = type.upper()
        self.n_ctx, self.n_embd_kv, self.v_trans = n_ctx, n_embd_kv, v_trans
        self._ctx = native.Context(2 * n_layers + 2)
        t = ggml_type(self.type)
        k = [self._ctx.new_tensor(t, [n_embd_kv, n_ctx]) for _ in range(n_layers)]
        v = [self._ctx.new_tensor(t, [n_ctx, n_embd_kv] if v_trans else [n_embd_kv, n_ctx]) for _ in range(n_layers)]
        self._backend = _backend(device)
        kv = native.KVCache(
            k,
            v,
            page_size,
            n_frames,
            host_budget,
            spill_dir,
            v_trans,
            self._backend,
            n_workers,
            1 if n_stream < 1 else n_stream,
        )
        super().__init__(kv)

    def acquire(self, seq: int, layer: int, n_valid: int) -> "native.KVFrame":
        return self.core.acquire_frame(seq, layer, n_valid)

    def prefetch(self, seq: int, layer: int, n_valid: int) -> bool:
        return self.core.prefetch(seq, layer, n_valid)

    def seq_truncate(self, seq: int, n: int) -> None:
        self.core.seq_truncate(seq, n)

    def k_array(self, frame: "native.KVFrame") -> np.ndarray:
        """Zero-copy view of the frame's K: [n_ctx, n_embd_kv]."""
        return view(frame, _NUMPY[self.type], [self.n_ctx, self.n_embd_kv], 0)

    def v_array(self, frame: "native.KVFrame") -> np.ndarray:
        """Zero-copy view of the frame's V: [n_ctx, n_embd_kv], or [n_embd_kv, n_ctx] with v_trans."""
        shape = [self.n_embd_kv, self.n_ctx] if self.v_trans else [self.n_ctx, self.n_embd_kv]
        return view(frame, _NUMPY[self.type], shape, frame.v_offset)

    @property
    def page_bytes(self) -> int:
        return self.core.page_bytes


def memory(*, nvml: bool = True) -> MemorySnapshot:
    """Host memory (clipped by the cgroup limit), the process's RSS and peak, and each device's free memory."""
    return snapshot(nvml=nvml)
