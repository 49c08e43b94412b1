"""Saved sequences (Model.save_sequence and load_sequence, the server's /slots): a sequence's tokens, the logits of
its last token and its memory in one file. The memory is each attention layer's K and V rows, token by token
(whatever the cache's layout: contiguous, paged, spilled, V transposed or not), and each recurrent layer's states.

    b"SUPERSEQ"  u32 version  u64 header length  header (JSON)  blobs  sha256 of everything before it

The header names the model (model_identity: a hash of the GGUF's header and of samples of its data), the cache
types and each blob. Loading checks the checksum, the model, the cache types and every blob's size before it
writes anything.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from ... import native
from ...arch import Architecture
from ...arch.base import CompressedLayer
from ...arch.common import HParams
from ...arch.mtp import MtpArch
from ...errors import SavedSequenceError
from ...settings import ContextSettings
from ..weights.placement import WeightPlacement
from .base import SequenceMemory
from .sequences import Sequences

MAGIC = b"SUPERSEQ"
VERSION = 1
SAMPLES, SAMPLE_BYTES = 16, 1 << 16  # of the tensor data, in the model's identity
HEAD = struct.Struct("<8sIQ")


@dataclass(frozen=True)
class SavedSource:
    """What saving and loading a sequence reads: the architecture (which layers keep what), the context
    settings, the sequence memory, the sequences and the weights' placement (the K/V a loaded sequence writes is
    owed back first)."""

    arch: Architecture | MtpArch
    context: ContextSettings
    memory: SequenceMemory
    sequences: Sequences
    placement: WeightPlacement

    @property
    def hp(self) -> HParams:
        return self.arch.hp


def model_identity(path: str) -> str:
    """A hash of the GGUF's header (metadata and tensor table) and of SAMPLES pieces of its tensor data."""
    f = native.GGUFFile(path)
    try:
        start, size = int(f.data_offset), int(f.file_size)
    finally:
        f.close()
    h = hashlib.sha256(str(size).encode())
    with open(path, "rb") as fh:
        h.update(fh.read(start))
        for i in range(SAMPLES):
            fh.seek(start + (size - start) * i // SAMPLES)
            h.update(fh.read(SAMPLE_BYTES))
    return h.hexdigest()


def tensor_bytes(t: Any) -> np.ndarray:
    raw = native.tensor_get(t)
    return np.frombuffer(raw if isinstance(raw, bytes) else raw.tobytes(), dtype=np.uint8)


def rows_of(t: Any, n: int, trans: bool) -> bytes:
    """Rows [0, n) of a K or V tensor [width, ctx], token by token (a transposed V holds channel by channel)."""
    b, row = tensor_bytes(t), int(t.nb[1])
    if not trans:
        return b[: n * row].tobytes()
    width = int(t.ne[0])
    return b.reshape(width, -1, row // width)[:, :n].transpose(1, 0, 2).tobytes()


def put_rows(t: Any, data: bytes, n: int, trans: bool) -> None:
    if not trans:
        native.tensor_set(t, np.frombuffer(data, dtype=np.uint8))
        return
    width, row = int(t.ne[0]), int(t.nb[1])
    whole = tensor_bytes(t).reshape(width, -1, row // width).copy()
    whole[:, :n] = np.frombuffer(data, dtype=np.uint8).reshape(n, width, row // width).transpose(1, 0, 2)
    native.tensor_set(t, whole)


def layer_blobs(src: SavedSource, il: int, n: int) -> list[tuple[str, Any, int, bool]]:
    """Layer il's pieces of the current sequence's memory: (kind, tensor, bytes, transposed); its tensors are
    bound to the sequence while the caller is inside memory.use."""
    k, v = src.memory.layer_tensors(il, 0)
    if k is None or src.arch.kv_source(il) != il:  # a block that keeps nothing, or reads another's K/V
        return []
    if src.arch.is_recurrent(il):
        return [("conv", k, int(k.ne[0]) * 4, False), ("state", v, int(v.ne[0]) * 4, False)]
    trans = not src.context.flash_attn
    out = [("k", k, n * int(k.nb[1]), False)]
    layout = src.arch.compressed_layout() if isinstance(src.arch, Architecture) else None
    if isinstance(v, CompressedLayer) and layout is not None:  # the rows of blocks completed, the rings whole
        done = n // max(layout[0][il], 1)
        for kind, t in vars(v).items():
            if t is not None:
                whole = kind.startswith(("ring", "lid_"))
                out.append((kind, t, int(t.nb[1]) * (int(t.ne[1]) if whole else done), False))
    elif v is not None:
        out.append(("v", v, n * int(v.nb[1]), trans))
    return out


def is_rows(kind: str) -> bool:
    """Whether a blob holds a tensor's first rows (K, V, compressed rows), not the whole tensor."""
    return kind in ("k", "v", "comp", "lid")


def save(src: SavedSource, path: str, identity: str) -> None:
    """Writes the current sequence to `path`."""
    seq, c = src.sequences.current, src.context
    n = seq.n_past
    if not n:
        raise ValueError("save_sequence: the current sequence is empty")
    blobs, meta = [], []
    src.memory.bind([seq.id])
    for il in range(src.hp.n_layer):
        with src.memory.use(il, [(seq.id, n, n)]):
            for kind, t, size, trans in layer_blobs(src, il, n):
                data = rows_of(t, size // int(t.nb[1]), trans) if is_rows(kind) else tensor_bytes(t).tobytes()
                blobs.append(data)
                meta.append({"layer": il, "kind": kind, "bytes": size})
    if seq.scores is not None:
        blobs.append(np.ascontiguousarray(seq.scores[-1], dtype=np.float32).tobytes())
        meta.append({"layer": -1, "kind": "logits", "bytes": 4 * src.hp.n_vocab})
    header = json.dumps(
        {
            "model": identity,
            "arch": src.hp.arch,
            "n_layer": src.hp.n_layer,
            "cache_type_k": c.cache_type_k,
            "cache_type_v": c.cache_type_v,
            "tokens": list(seq.tokens),
            "blobs": meta,
        }
    ).encode()
    h = hashlib.sha256()
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        for part in [HEAD.pack(MAGIC, VERSION, len(header)), header, *blobs]:
            h.update(part)
            f.write(part)
        f.write(h.digest())
    os.replace(tmp, path)  # a reader never sees half a file


def read(path: str) -> tuple[dict[str, Any], bytes]:
    """The header and the blobs of a saved sequence, checked whole (SavedSequenceError otherwise)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise SavedSequenceError(f"cannot read the saved sequence {path!r}: {e.strerror or e}") from None
    if len(data) < HEAD.size + 32 or data[:8] != MAGIC:
        raise SavedSequenceError(f"{path!r} is not a saved sequence of superggml")
    _, version, n_head = HEAD.unpack_from(data)
    if version != VERSION:
        raise SavedSequenceError(f"{path!r} is a saved sequence of version {version}; this superggml reads {VERSION}")
    if hashlib.sha256(data[:-32]).digest() != data[-32:]:
        raise SavedSequenceError(f"{path!r} is damaged or truncated: its checksum does not match")
    try:
        header = json.loads(data[HEAD.size : HEAD.size + n_head])
    except ValueError:
        raise SavedSequenceError(f"{path!r} has an unreadable header") from None
    return header, data[HEAD.size + n_head : -32]


def check(src: SavedSource, header: dict[str, Any], blobs: bytes, identity: str, path: str) -> list[int]:
    """The saved tokens, once the file is this model's, with this cache's types and sizes."""
    c = src.context
    if header.get("model") != identity:
        raise SavedSequenceError(
            f"{path!r} was saved from another model ({header.get('arch')}, "
            f"{header.get('n_layer')} layers); this is {src.hp.arch} with {src.hp.n_layer}"
        )
    for key in ("cache_type_k", "cache_type_v"):
        if header.get(key) != getattr(c, key):
            raise SavedSequenceError(f"{path!r} holds a {key} of {header.get(key)}; this model runs {getattr(c, key)}")
    tokens = [int(t) for t in header.get("tokens", [])]
    if not tokens or len(tokens) > c.ctx_size:
        raise SavedSequenceError(f"{path!r} holds {len(tokens)} tokens; this model's ctx_size is {c.ctx_size}")
    want = [(il, kind, size) for il in range(src.hp.n_layer) for kind, _, size, _ in layer_blobs(src, il, len(tokens))]
    got = [(int(b["layer"]), str(b["kind"]), int(b["bytes"])) for b in header.get("blobs", [])]
    has_logits = got[-1:] == [(-1, "logits", 4 * src.hp.n_vocab)]
    if got[: len(got) - has_logits] != want or sum(b for _, _, b in got) != len(blobs):
        raise SavedSequenceError(f"{path!r} holds other tensors than this model's memory of {len(tokens)} tokens")
    return tokens


def load(src: SavedSource, path: str, identity: str) -> int:
    """Makes the current sequence the one saved at `path`; returns its tokens."""
    header, blobs = read(path)
    tokens = check(src, header, blobs, identity, path)
    n, seq, memory = len(tokens), src.sequences.current, src.memory
    src.sequences.truncate(0)
    memory.bind([seq.id])
    memory.restored(seq.id, n)
    src.placement.lend({seq.id: n}, 1)  # the K/V about to be written is owed back first
    at = 0
    try:
        for il in range(src.hp.n_layer):
            with memory.use(il, [(seq.id, 0, n)]):
                for kind, t, size, trans in layer_blobs(src, il, n):
                    data, at = blobs[at : at + size], at + size
                    if is_rows(kind):
                        put_rows(t, data, size // int(t.nb[1]), trans)
                    else:
                        native.tensor_set(t, np.frombuffer(data, dtype=np.uint8))
    except BaseException:
        src.sequences.truncate(0)
        raise
    seq.tokens[:] = tokens
    seq.scores = np.frombuffer(blobs[at:], dtype=np.float32).reshape(1, -1).copy() if at < len(blobs) else None
    memory.checkpoint(seq.id)
    return n
