"""GGUF tensor access for other stacks: list a file's tensors, read one (or a row range) into memory or a
pool slot, and dequantize it to float32/float16 with ggml's own type traits."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, NamedTuple, Optional, Union

import numpy as np

from . import native
from .hashes import ContentHashes, content_hashes
from .paging import LoadFuture, Prefetcher, Slot, ggml_type

__all__ = [
    "Activations",
    "GGUFReader",
    "TensorInfo",
    "block_mins",
    "dequantize",
    "open",
    "quantize_activations",
    "round_activations",
    "vec_dot_type",
]

_OUT = {np.dtype(np.float32): "F32", np.dtype(np.float16): "F16"}


@dataclass(frozen=True)
class TensorInfo:
    name: str
    type: str  # ggml type name: "q4_K", "f32", ...
    shape: tuple[int, ...]  # ggml order: shape[0] is the row length
    offset: int  # absolute byte offset in the file
    nbytes: int

    @property
    def n_rows(self) -> int:
        n = 1
        for d in self.shape[1:]:
            n *= d
        return n

    @property
    def row_bytes(self) -> int:
        return self.nbytes // max(1, self.n_rows)


def dequantize(
    data: Any,
    type: Union[str, int],
    shape: tuple[int, ...],
    *,
    dtype: Any = np.float32,
    out: Any = None,
    n_threads: int = 1,
) -> np.ndarray:
    """Rows of ggml `type` (bytes in any buffer: numpy, bytes, a Slot) as float32 or float16, converted by
    ggml's type traits: shape is (row_length, n_rows) in ggml order; the result is row-major [n_rows, row_length]
    (written into `out`, a writable buffer of that many elements, when given)."""
    dt = np.dtype(dtype)
    if dt not in _OUT:
        raise ValueError("dequantize: dtype must be float32 or float16")
    row_len = int(shape[0])
    n_rows = 1
    for d in shape[1:]:
        n_rows *= int(d)
    res = native.convert_rows(int(ggml_type(type)), data, n_rows, row_len, int(ggml_type(_OUT[dt])), out, n_threads)
    if out is None:
        return np.asarray(res)
    return np.frombuffer(out, dtype=dt, count=n_rows * row_len).reshape(n_rows, row_len)


def vec_dot_type(type: Union[str, int]) -> str:
    """The type ggml-cpu converts a matmul's activations to when the weights are of `type` (Q8_1 for Q4_1,
    Q8_K for the K-quants, F16 for F16): a stack that quantizes its activations the same way computes the
    numbers ggml computes."""
    return str(native.vec_dot_type(ggml_type(type)).name)


class Activations(NamedTuple):
    """Activation rows as ggml-cpu feeds them to a matmul with quantized weights (quantize_activations)."""

    values: np.ndarray  # F32 [n, k]: the rows converted to the weights' vec_dot_type and back
    sums: np.ndarray  # F32 [n, k // 32]: each 32-block's sum as the dot product uses it with a block minimum


def quantize_activations(x: Any, type: Union[str, int]) -> Activations:
    """float32 rows `x` [n, k] as ggml-cpu sees them in a matmul with weights of `type`: converted to its
    vec_dot_type and back (unchanged for F32), with the per-32-block sums its dot products pair with a block
    minimum. ggml-cpu's x . w is then `values . (w - mins) + sums . mins` (mins: block_mins of w, repeated
    over each block on the left): Q8_1, the activations of Q4_1/Q5_1, stores each block's sum rounded to F16."""
    vt = vec_dot_type(type)
    a = np.ascontiguousarray(x, dtype=np.float32)
    k = a.shape[-1]
    if vt == "F32":
        values = a
    else:
        _, q = native.to_vec_dot(ggml_type(type), a.reshape(-1, k))
        if vt == "Q8_1":  # ggml has no to_float for Q8_1: blocks of (F16 d, F16 s = d * sum(q), 32 x int8)
            blocks = q.reshape(-1, 36)
            d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32)
            s = blocks[:, 2:4].copy().view(np.float16).astype(np.float32)
            values = (d * blocks[:, 4:].view(np.int8).astype(np.float32)).reshape(a.shape)
            return Activations(values, s.reshape(*a.shape[:-1], k // 32))
        values = dequantize(q, vt, (k, q.shape[0])).reshape(a.shape)
    if k % 32:
        return Activations(values, np.zeros((*a.shape[:-1], 0), dtype=np.float32))
    sums = values.reshape(*a.shape[:-1], k // 32, 32).sum(-1, dtype=np.float64).astype(np.float32)
    return Activations(values, sums)


def round_activations(x: Any, type: Union[str, int]) -> np.ndarray:
    """float32 rows `x` [n, k] as ggml-cpu sees them in a matmul with weights of `type`: converted to its
    vec_dot_type and back (unchanged for F32)."""
    return quantize_activations(x, type).values


_MIN_AT = {"Q4_1": 20, "Q5_1": 24}  # block bytes of the types whose blocks hold (F16 d, F16 m, ...)


def block_mins(data: Any, type: Union[str, int], shape: tuple[int, ...]) -> np.ndarray:
    """The per-32-block minimums `m` of Q4_1/Q5_1 rows (each value is d * q + m) as F32 [n_rows, row_length // 32];
    zeros for the other types (theirs, if any, enter ggml's dot products exactly: no correction needed)."""
    name = ggml_type(type).name.upper()
    row_len = int(shape[0])
    n_rows = 1
    for dim in shape[1:]:
        n_rows *= int(dim)
    if name not in _MIN_AT:
        return np.zeros((n_rows, row_len // 32), dtype=np.float32)
    raw = np.frombuffer(data, dtype=np.uint8, count=n_rows * (row_len // 32) * _MIN_AT[name])
    blocks = raw.reshape(n_rows, row_len // 32, _MIN_AT[name])
    return blocks[:, :, 2:4].copy().view(np.float16)[:, :, 0].astype(np.float32)


class GGUFReader:
    """A GGUF file opened read-only: header parsed and every tensor's byte range checked against the file."""

    def __init__(self, path: Union[str, os.PathLike[str]]) -> None:
        self.path = os.fspath(path)
        self._file: Optional[native.GGUFFile] = native.GGUFFile(self.path)
        self.tensors: dict[str, TensorInfo] = {
            n: TensorInfo(n, t, tuple(int(x) for x in s), int(o), int(b)) for n, t, s, o, b in self._file.tensors()
        }
        self.data_offset = int(self._file.data_offset)

    def metadata(self) -> dict[str, Any]:
        return dict(self.native().metadata())

    def native(self) -> "native.GGUFFile":
        if self._file is None:
            raise ValueError("the GGUF file is closed")
        return self._file

    def info(self, name: str) -> TensorInfo:
        try:
            return self.tensors[name]
        except KeyError:
            raise KeyError(f"the GGUF file has no tensor {name!r}") from None

    def _range(self, name: str, rows: Optional[tuple[int, int]]) -> tuple[TensorInfo, int, int, int]:
        ti = self.info(name)
        r0, r1 = (0, ti.n_rows) if rows is None else rows
        if not 0 <= r0 <= r1 <= ti.n_rows:
            raise ValueError(f"rows {rows} outside {name!r}'s {ti.n_rows} rows")
        return ti, ti.offset + r0 * ti.row_bytes, (r1 - r0) * ti.row_bytes, r1 - r0

    def read(self, name: str, *, rows: Optional[tuple[int, int]] = None) -> np.ndarray:
        """The raw bytes of tensor `name` (rows [r0, r1) of it) as uint8 [n_rows, row_bytes]."""
        ti, off, size, n = self._range(name, rows)
        buf = np.empty(size, dtype=np.uint8)
        fd = os.open(self.path, os.O_RDONLY)
        try:
            got = os.preadv(fd, [buf.data], off)
        finally:
            os.close(fd)
        if got != size:
            raise OSError(f"short read of {name!r} at offset {off}: the file was truncated")
        return buf.reshape(n, ti.row_bytes)

    def read_into(
        self,
        name: str,
        slot: Slot,
        prefetcher: Prefetcher,
        *,
        rows: Optional[tuple[int, int]] = None,
        slot_offset: int = 0,
        priority: int = 0,
    ) -> LoadFuture:
        """Queues a read of tensor `name` (rows [r0, r1) of it) into a held pool slot at `slot_offset`."""
        _, off, size, _ = self._range(name, rows)
        return prefetcher.submit(slot, [(off, size, slot_offset)], priority=priority)

    def dequantize(self, name: str, *, rows: Optional[tuple[int, int]] = None, dtype: Any = np.float32) -> np.ndarray:
        """Tensor `name` (rows [r0, r1)) as float32/float16, row-major [n_rows, row_length]."""
        ti = self.info(name)
        raw = self.read(name, rows=rows)
        return dequantize(raw, ti.type, (ti.shape[0], raw.shape[0]), dtype=dtype)

    def hashes(self, *, n_threads: Optional[int] = None) -> ContentHashes:
        """The file's content hashes: each tensor's (ggml RPC's hash of its bytes), block's and expert's
        (superggml.hashes; computed once, then read from the sidecar index)."""
        return content_hashes(self.path, n_threads=n_threads)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> "GGUFReader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open(path: Union[str, os.PathLike[str]]) -> GGUFReader:  # noqa: A001 - gguf.open, as the issue names it
    """Opens a GGUF file (GGUFError if it is malformed, OSError if it cannot be read)."""
    return GGUFReader(path)
