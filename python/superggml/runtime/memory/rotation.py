"""Rotations and cache types: the Walsh-Hadamard rotation llama.cpp applies before a quantized K/V cache, and the
checks that a cache type can hold a model's heads."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ... import native
from ...settings import KV_QUANTIZED
from ..plan.memory_plan import kv_type


def attn_rot_size(head_dim: int, cache_type: str, *, largest: bool) -> int:
    """The Walsh-Hadamard rotation llama.cpp applies for a quantized cache type (0: none): heads of a multiple of
    64; for K the largest power of 2 dividing the head, for V 64."""
    if cache_type not in KV_QUANTIZED or head_dim % 64:
        return 0
    n = 64
    while largest and head_dim % (2 * n) == 0:
        n *= 2
    return n


def hadamard(n: int) -> np.ndarray:
    """The orthonormal Walsh-Hadamard matrix F32 [n, n] as llama.cpp builds it (Sylvester's, times 1/sqrtf(n))."""
    i = np.arange(n)
    parity = np.vectorize(lambda x: bin(x).count("1") & 1)(i[:, None] & i[None, :])
    val = np.float32(1.0 / float(np.sqrt(np.float32(n))))
    return np.where(parity == 1, -val, val).astype(np.float32)


def check_latent_types(hp: Any, type_k: str, type_v: str) -> None:
    """ValueError unless a latent K/V (V read from K) can be held in these cache types: the same one for K and V
    (llama.cpp's rule), whose blocks divide V's values as well as K's."""
    if type_k != type_v:
        raise ValueError(
            f"the latent K/V of {hp.arch} is one cache: cache_type_k ({type_k}) and cache_type_v "
            f"({type_v}) must be the same, as llama.cpp requires (kv_type sets both)"
        )
    if hp.head_dim_v % native.blck_size(kv_type(type_k)):
        raise ValueError(
            f"cache_type_k={type_k} stores blocks of {native.blck_size(kv_type(type_k))} values, which "
            f"this model's latent V of {hp.head_dim_v} does not divide into"
        )


def check_blocks(c: Any, name: str, dims: Sequence[int]) -> None:
    """ValueError unless the cache type `name` of context settings `c` ("cache_type_k" or "cache_type_v") stores
    blocks that divide every head size in dims."""
    block = native.blck_size(kv_type(getattr(c, name)))
    odd = [d for d in dims if d % block]
    if odd:
        raise ValueError(
            f"{name}={getattr(c, name)} stores blocks of {block} values, which this model's heads of {odd[0]} do "
            "not divide into"
        )


def check_rows(hp: Any, c: Any) -> None:
    """ValueError unless the cache types' blocks divide the memory's rows where a family keeps more than its heads
    in them (HParams.kv_width: an indexer's keys after K, a latent's pooled keys)."""
    for name, width in (("cache_type_k", hp.kv_width), ("cache_type_v", hp.kv_width_v or hp.kv_width)):
        block = native.blck_size(kv_type(getattr(c, name)))
        if width and (name == "cache_type_k" or not hp.latent_kv) and width % block:
            raise ValueError(
                f"{name}={getattr(c, name)} stores blocks of {block} values, which this model's K/V rows of "
                f"{width} values (its heads and what {hp.arch} keeps beside them) do not divide into"
            )


def cache_rotations(hp: Any, c: Any, head_dims: Sequence[int] = ()) -> dict[str, int]:
    """Every check of the cache types against the model's heads, and the rotations a quantized cache holds Q, K
    and V rotated by: "k" and "v" (0: none; none for a latent K/V, one type with V read from K, as llama.cpp's),
    and with layers of other head sizes (`head_dims`) K's rotation of each size, "k<size>"."""
    check_rows(hp, c)
    if hp.latent_kv:
        check_latent_types(hp, c.cache_type_k, c.cache_type_v)
        return {"k": attn_rot_size(hp.head_dim, c.cache_type_k, largest=True) if hp.k_only_rot else 0, "v": 0}
    for name in ("cache_type_k", "cache_type_v"):
        check_blocks(c, name, head_dims)
    n_rot = {
        "k": attn_rot_size(hp.head_dim, c.cache_type_k, largest=True),
        "v": attn_rot_size(hp.head_dim_v or hp.head_dim, c.cache_type_v, largest=False),
    }
    for d in sorted(set(head_dims) - {hp.head_dim}) if n_rot["k"] else ():
        n_rot[f"k{d}"] = attn_rot_size(d, c.cache_type_k, largest=True)
        if not n_rot[f"k{d}"]:
            raise ValueError(
                f"cache_type_k={c.cache_type_k} rotates heads by a multiple of 64 values: this model also has "
                f"heads of {d}"
            )
    return n_rot
