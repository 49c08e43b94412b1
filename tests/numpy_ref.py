"""A float64 NumPy forward pass of llama/qwen2 GGUFs: ground truth for diagnostics only.

Weights are dequantized exactly; activations, attention and the KV stay in
float64. Neither engine computes like this (both quantize activations to Q8
and keep K/V in F16), so it tells which of two engines is nearer the exact
result of the quantized model. Tests only: superggml never computes with NumPy.
"""

from __future__ import annotations

import gguf
import numpy as np


class Float64Reference:
    def __init__(self, path: str):
        r = gguf.GGUFReader(path)
        self.arch = str(r.fields["general.architecture"].contents())
        f = lambda k, d=None: r.fields[f"{self.arch}.{k}"].contents() if f"{self.arch}.{k}" in r.fields else d  # noqa: E731
        self.n_layer = int(f("block_count"))
        self.n_embd = int(f("embedding_length"))
        self.n_head = int(f("attention.head_count"))
        self.n_head_kv = int(f("attention.head_count_kv", self.n_head))
        self.head_dim = self.n_embd // self.n_head
        self.eps = float(f("attention.layer_norm_rms_epsilon"))
        self.base = float(f("rope.freq_base", 10000.0))
        self.neox = self.arch == "qwen2"
        self.w = {}
        for t in r.tensors:
            a = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float64)
            self.w[t.name] = a.reshape([int(x) for x in reversed(t.shape)]) if a.size == np.prod(t.shape) else a
        if "output.weight" not in self.w:
            self.w["output.weight"] = self.w["token_embd.weight"]

    def _norm(self, x, w):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * w

    def _rope(self, x, pos):  # x [n, heads, d]
        d = self.head_dim
        inv = self.base ** (-np.arange(0, d, 2, dtype=np.float64) / d)
        ang = pos[:, None] * inv[None, :]                       # [n, d/2]
        cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        if self.neox:
            a, b = x[..., : d // 2], x[..., d // 2:]
            return np.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1)
        a, b = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = a * cos - b * sin
        out[..., 1::2] = a * sin + b * cos
        return out

    def logits(self, tokens: list[int]) -> np.ndarray:
        w, n, d = self.w, len(tokens), self.head_dim
        x = w["token_embd.weight"][tokens]
        pos = np.arange(n, dtype=np.float64)
        causal = np.triu(np.full((n, n), -np.inf), 1)
        for il in range(self.n_layer):
            p = f"blk.{il}."
            h = self._norm(x, w[p + "attn_norm.weight"])
            q, k, v = (h @ w[p + f"attn_{c}.weight"].T + w.get(p + f"attn_{c}.bias", 0.0) for c in "qkv")
            q = self._rope(q.reshape(n, self.n_head, d), pos)
            k = self._rope(k.reshape(n, self.n_head_kv, d), pos)
            v = v.reshape(n, self.n_head_kv, d)
            rep = self.n_head // self.n_head_kv
            k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
            s = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(d) + causal
            s = np.exp(s - s.max(-1, keepdims=True))
            s /= s.sum(-1, keepdims=True)
            o = np.einsum("hqk,khd->qhd", s, v).reshape(n, -1)
            x = x + o @ w[p + "attn_output.weight"].T
            h = self._norm(x, w[p + "ffn_norm.weight"])
            g, u = h @ w[p + "ffn_gate.weight"].T, h @ w[p + "ffn_up.weight"].T
            x = x + (g / (1 + np.exp(-g)) * u) @ w[p + "ffn_down.weight"].T
        return self._norm(x, w["output_norm.weight"]) @ w["output.weight"].T
