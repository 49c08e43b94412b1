"""Content addresses of a GGUF: a hash of every tensor's bytes, of every block and of every expert, so that a peer
holding the same bytes can be named them by hash instead of being sent them.

A tensor's hash is ggml RPC's own (FNV-1a, 64-bit, over the tensor's data: what RPC_CMD_SET_TENSOR_HASH carries
for it). An expert's is the hash of its slice of a 3-D expert tensor. A block's is the hash of its tensors'
hashes (8 bytes each, little-endian, by tensor name), and the model's the hash of every tensor's in file order.
They are computed once (native.content_hash_ranges, every core reading) and kept in a sidecar index: next to the
file if its directory is writable, else in the cache directory; the index is used while the file's size,
modification time and header are the ones it was made from.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import struct
from dataclasses import dataclass, field
from typing import Optional, Union

from . import native

__all__ = ["ContentHashes", "content_hashes", "content_ranges", "sidecar_path"]

VERSION = 1
BLOCK = re.compile(r"^blk\.(\d+)\.")
EXPERTS = re.compile(r"^blk\.\d+\.ffn_(gate|up|down|gate_up)_exps\.weight$")


def hex64(h: int) -> str:
    return f"{h:016x}"


def combine(hashes: list[str]) -> str:
    """The hash of hashes: FNV-1a over their 8-byte little-endian values."""
    return hex64(native.content_hash(b"".join(struct.pack("<Q", int(h, 16)) for h in hashes)))


@dataclass(frozen=True)
class ContentHashes:
    model: str  # the hash of every tensor's hash, in file order
    tensors: dict[str, str]  # name -> hash (16 hex digits)
    blocks: dict[int, str] = field(default_factory=dict)  # block -> hash of its tensors' hashes
    experts: dict[str, list[str]] = field(default_factory=dict)  # 3-D expert tensor -> each expert's slice hash
    computed: bool = False  # computed now (False: read from the sidecar index)


def sidecar_path(path: str, cache_dir: Optional[str] = None) -> str:
    """Where the index of `path` is kept: `<path>.hashes.json` beside it, or under cache_dir (default
    $XDG_CACHE_HOME/superggml/hashes) when its directory is not writable."""
    beside = path + ".hashes.json"
    if cache_dir is None and os.access(os.path.dirname(os.path.abspath(path)), os.W_OK):
        return beside
    base = cache_dir or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "superggml", "hashes"
    )
    key = hashlib.sha256(os.path.abspath(path).encode()).hexdigest()[:24]
    return os.path.join(base, f"{os.path.basename(path)}.{key}.json")


def file_key(path: str, data_offset: int) -> dict[str, Union[int, str]]:
    st = os.stat(path)
    with open(path, "rb") as f:
        header = hashlib.sha256(f.read(data_offset)).hexdigest()
    return {"version": VERSION, "size": st.st_size, "mtime_ns": st.st_mtime_ns, "header": header}


def content_hashes(
    path: Union[str, "os.PathLike[str]"], *, n_threads: Optional[int] = None, cache_dir: Optional[str] = None
) -> ContentHashes:
    """The content hashes of the GGUF at `path`, from its sidecar index when that is current, else computed
    (and the index written)."""
    return hashes_and_table(os.fspath(path), n_threads, cache_dir)[0]


def content_ranges(
    path: Union[str, "os.PathLike[str]"], *, n_threads: Optional[int] = None, cache_dir: Optional[str] = None
) -> list[tuple[int, int, int]]:
    """(offset, size, hash) of every tensor's bytes and every expert's slice in the GGUF at `path`: what a
    peer holding the file can be named by hash (native.content_index_set, native.rpc_server_start)."""
    h, tensors = hashes_and_table(os.fspath(path), n_threads, cache_dir)
    out: list[tuple[int, int, int]] = []
    for name, _, off, nbytes in tensors:
        out.append((off, nbytes, int(h.tensors[name], 16)))
        slices = h.experts.get(name, [])
        step = nbytes // len(slices) if slices else 0
        out += [(off + e * step, step, int(x, 16)) for e, x in enumerate(slices)]
    return out


Table = list[tuple[str, list[int], int, int]]  # name, shape, offset, nbytes


def hashes_and_table(path: str, n_threads: Optional[int], cache_dir: Optional[str]) -> tuple[ContentHashes, Table]:
    """The hashes (from the sidecar index when current) and the tensor table they were read beside."""
    f = native.GGUFFile(path)
    try:
        tensors: Table = [(str(n), [int(x) for x in s], int(o), int(b)) for n, _, s, o, b in f.tensors()]
        key = file_key(path, int(f.data_offset))
    finally:
        f.close()
    index = sidecar_path(path, cache_dir)
    try:
        with open(index, encoding="utf-8") as fh:
            saved = json.load(fh)
        if saved.get("key") == key:
            return ContentHashes(
                saved["model"], saved["tensors"], {int(k): v for k, v in saved["blocks"].items()}, saved["experts"]
            ), tensors
    except (OSError, ValueError, KeyError, TypeError):
        pass
    out = compute(path, tensors, n_threads or os.cpu_count() or 1)
    write_index(index, key, out)
    return out, tensors


def compute(path: str, tensors: Table, n_threads: int) -> ContentHashes:
    ranges: list[tuple[int, int]] = [(o, b) for _, _, o, b in tensors]
    slices: list[tuple[str, int]] = []  # (expert tensor, experts) in the order of their ranges
    for name, shape, off, nbytes in tensors:
        if EXPERTS.match(name) and len(shape) == 3 and shape[2] > 0 and nbytes % shape[2] == 0:
            step = nbytes // shape[2]
            ranges += [(off + e * step, step) for e in range(shape[2])]
            slices.append((name, shape[2]))
    got = [hex64(h) for h in native.content_hash_ranges(path, ranges, n_threads)]
    by_name = {t[0]: h for t, h in zip(tensors, got)}
    experts, at = {}, len(tensors)
    for name, n in slices:
        experts[name] = got[at : at + n]
        at += n
    members: dict[int, list[str]] = {}
    for name in sorted(by_name):
        m = BLOCK.match(name)
        if m:
            members.setdefault(int(m.group(1)), []).append(by_name[name])
    blocks = {b: combine(hs) for b, hs in sorted(members.items())}
    return ContentHashes(combine(got[: len(tensors)]), by_name, blocks, experts, computed=True)


def write_index(index: str, key: dict[str, Union[int, str]], h: ContentHashes) -> None:
    """Writes the index (atomically); an index that cannot be written only costs a recomputation later."""
    try:
        os.makedirs(os.path.dirname(index), exist_ok=True)
        tmp = f"{index}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(
                {
                    "key": key,
                    "model": h.model,
                    "tensors": h.tensors,
                    "blocks": {str(b): v for b, v in h.blocks.items()},
                    "experts": h.experts,
                },
                fh,
            )
        os.replace(tmp, index)
    except OSError:
        pass
