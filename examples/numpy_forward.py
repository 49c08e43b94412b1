"""A NumPy forward pass of a llama-architecture GGUF (SmolLM2) whose weights stream through superggml.paging.

Each block's tensors are one pager layer: at most `n_slots` layers' weights are in memory at once (2 by
default), the next one loading on a worker thread (prefetch depth 1) while NumPy computes this one. The lm
head (the tied token embedding) streams through a pool in row chunks. NumPy does all the arithmetic on
float32 weights dequantized by ggml's type traits.

    python examples/numpy_forward.py [model.gguf] [--prompt "The capital of France is"]
"""

from __future__ import annotations

import argparse
import resource
from typing import Any

import numpy as np
import numpy.typing as npt

from superggml import gguf, paging

F32 = npt.NDArray[np.float32]
BLOCK = ["attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down"]


def rms_norm(x: F32, w: F32, eps: float) -> F32:
    return (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w).astype(np.float32)


def f16(x: F32) -> F32:
    return x.astype(np.float16).astype(np.float32)


def rope(x: F32, pos: npt.NDArray[np.int64], base: float) -> F32:
    """ggml's rope mode 0 (llama): rotates the adjacent pairs (x[2i], x[2i+1]) of each head; x [n, heads, d]."""
    d = x.shape[-1]
    theta = pos[:, None].astype(np.float64) * base ** (-np.arange(0, d, 2, dtype=np.float64) / d)
    cos, sin = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
    x0, x1 = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = x0 * cos - x1 * sin
    out[..., 1::2] = x0 * sin + x1 * cos
    return out


class NumpyLlama:
    def __init__(self, path: str, *, n_slots: int = 2, head_rows: int = 4096, kv_type: str = "f16") -> None:
        self.file = gguf.open(path)
        meta = self.file.metadata()
        arch = str(meta["general.architecture"])
        self.n_layer = int(meta[f"{arch}.block_count"])
        self.n_head = int(meta[f"{arch}.attention.head_count"])
        self.n_kv = int(meta[f"{arch}.attention.head_count_kv"])
        self.eps = float(meta[f"{arch}.attention.layer_norm_rms_epsilon"])
        self.base = float(meta.get(f"{arch}.rope.freq_base", 10000.0))
        self.layers = [[f"blk.{i}.{t}.weight" for t in BLOCK] for i in range(self.n_layer)]
        self.pager = paging.LayerPager(path, self.layers, n_slots=n_slots, n_workers=1)
        self.head = self.file.info("output.weight" if "output.weight" in self.file.tensors else "token_embd.weight")
        self.head_rows = head_rows
        self.head_pool = paging.BufferPool(head_rows * self.head.row_bytes, 2)
        self.io = paging.Prefetcher(path, 1)
        self.types: dict[str, str] = {}
        self.kv_f16 = kv_type == "f16"

    def weights(self, layer: Any) -> dict[str, F32]:
        """The layer's tensors as float32, dequantized from its slot's bytes (a zero-copy view); a matrix's
        per-block minimums (Q4_1) are kept apart, under "<name>.mins", for mm."""
        out = {}
        for name in layer.names():
            info = self.file.info(name)
            view = paging.layer_array(layer, name)      # the slot's bytes, no copy
            key = name.split(".")[2]
            w = gguf.dequantize(view, info.type, info.shape)
            if len(info.shape) == 2:
                mins = gguf.block_mins(view, info.type, info.shape)
                w -= np.repeat(mins, 32, axis=1)
                out[key + ".mins"] = mins
            out[key] = w
            self.types[key] = info.type
            del view
        return out

    def mm(self, x: F32, w: dict[str, F32], name: str) -> F32:
        """x @ W.T as ggml-cpu computes it: x rounded to the activation type of W's dot products, and the
        Q4_1 block minimums times the block sums that type stores."""
        a = gguf.quantize_activations(x, self.types[name])
        return (a.values @ w[name].T + a.sums @ w[name + ".mins"].T).astype(np.float32)

    def block(self, x: F32, w: dict[str, F32], pos: npt.NDArray[np.int64]) -> F32:
        n, d = x.shape
        hd = d // self.n_head
        h = rms_norm(x, w["attn_norm"][0], self.eps)
        q = rope((self.mm(h, w, "attn_q")).reshape(n, self.n_head, hd), pos, self.base)
        k = rope((self.mm(h, w, "attn_k")).reshape(n, self.n_kv, hd), pos, self.base)
        v = (self.mm(h, w, "attn_v")).reshape(n, self.n_kv, hd)
        if self.kv_f16:                               # an F16 K/V cache, as ggml's
            k, v = f16(k), f16(v)
            q = f16(q)                                # ggml rounds Q to F16 for its product with the F16 K
        rep = self.n_head // self.n_kv
        k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
        s = np.einsum("qhd,khd->hqk", q, k) * np.float32(1 / np.sqrt(np.float32(hd)))
        s = s + np.triu(np.full((n, n), -np.inf, dtype=np.float32), 1)
        p = np.exp(s - s.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        if self.kv_f16:
            p = f16(p)                                # and the probabilities for theirs with the F16 V
        a = np.einsum("hqk,khd->qhd", p, v).reshape(n, d)
        x = x + self.mm(a, w, "attn_output")
        h = rms_norm(x, w["ffn_norm"][0], self.eps)
        g = self.mm(h, w, "ffn_gate")
        x = x + self.mm((g / (1 + np.exp(-g))) * self.mm(h, w, "ffn_up"), w, "ffn_down")
        return x.astype(np.float32)

    def logits(self, tokens: list[int]) -> F32:
        pos = np.arange(len(tokens), dtype=np.int64)
        emb = self.file.info("token_embd.weight")
        x = np.stack([gguf.dequantize(self.file.read(emb.name, rows=(t, t + 1)), emb.type, (emb.shape[0], 1))[0]
                      for t in tokens]).astype(np.float32)
        self.pager.prefetch(0)
        for i in range(self.n_layer):
            if i + 1 < self.n_layer:
                self.pager.prefetch(i + 1)            # depth 1: the next block loads while this one computes
            with self.pager.acquire(i) as layer:
                w = self.weights(layer)
                x = self.block(x, w, pos)
                del w
        x = rms_norm(x, gguf.dequantize(self.file.read("output_norm.weight"), "F32", (x.shape[1], 1))[0], self.eps)
        return self.head_logits(x)

    def head_logits(self, x: F32) -> F32:
        h = self.head
        n_rows = h.n_rows
        out = np.empty((x.shape[0], n_rows), dtype=np.float32)
        chunks = [(r, min(n_rows, r + self.head_rows)) for r in range(0, n_rows, self.head_rows)]
        pending = None
        for c, (r0, r1) in enumerate(chunks):
            if pending is None:
                pending = self._load_head(c, r0, r1)
            slot, fut = pending
            pending = self._load_head(c + 1, *chunks[c + 1]) if c + 1 < len(chunks) else None
            fut.result()
            with slot:
                w = gguf.dequantize(slot, h.type, (h.shape[0], r1 - r0))
                out[:, r0:r1] = gguf.round_activations(x, h.type) @ w.T
        return out

    def _load_head(self, key: int, r0: int, r1: int) -> tuple[Any, Any]:
        slot = self.head_pool.acquire(key)
        return slot, self.file.read_into(self.head.name, slot, self.io, rows=(r0, r1))

    def close(self) -> None:
        self.pager.close()
        self.head_pool.close()
        self.io.close()
        self.file.close()


def main() -> None:
    from superggml.models import smollm2_path
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("model", nargs="?", default=None)
    ap.add_argument("--tokens", default="1,504,3458,282,4649,314")
    args = ap.parse_args()
    path = args.model or str(smollm2_path())
    m = NumpyLlama(path)
    tokens = [int(t) for t in args.tokens.split(",")]
    logits = m.logits(tokens)
    m.close()
    print("next token:", int(np.argmax(logits[-1])))
    print(f"peak RSS: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")


if __name__ == "__main__":
    main()
