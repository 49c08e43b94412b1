"""The NumPy example's streaming loop (examples/numpy_forward.py) with PyTorch doing the arithmetic.

superggml.paging still streams the weights: each block is a pager layer (2 slots, the next block prefetched
while this one computes), the lm head a Prefetcher reading row chunks into BufferPool slots. PyTorch sees a
slot's bytes with `torch.from_dlpack(slot)` (a uint8 tensor over the slot's memory: no copy), ggml's type
traits dequantize them (`superggml.gguf.dequantize`), and torch computes the block, rounding as ggml-cpu
rounds (see numpy_forward.py).

    pip install torch
    python examples/torch_forward.py [model.gguf] [--prompt "The capital of France is"] [--check]
"""

from __future__ import annotations

import math
import os
import sys

import numpy as np
import numpy.typing as npt
import torch
from torch.utils.dlpack import from_dlpack  # torch.from_dlpack

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from numpy_forward import F32, Matrix, NumpyLlama, main  # noqa: E402

from superggml import gguf, paging  # noqa: E402


def t16(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float16).to(torch.float32)


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope(x: torch.Tensor, pos: torch.Tensor, base: float) -> torch.Tensor:
    """ggml's rope mode 0 (llama): rotates the adjacent pairs (x[2i], x[2i+1]) of each head; x [n, heads, d]."""
    d = x.shape[-1]
    theta = pos[:, None].double() * base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    cos, sin = theta.cos()[:, None, :].float(), theta.sin()[:, None, :].float()
    x0, x1 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1).flatten(-2)


class TorchMatrix(Matrix):
    """Matrix with its float32 rows and minimums as torch tensors (sharing NumPy's memory)."""

    def __init__(self, data: npt.ArrayLike | paging.Slot, type: str, shape: tuple[int, ...]) -> None:
        if isinstance(data, paging.Slot):
            raw = from_dlpack(data)  # uint8 [slot bytes]: the slot itself
            super().__init__(raw.numpy(), type, shape)
            del raw  # the slot can be released once this view is gone
        else:
            super().__init__(data, type, shape)
        self.wt, self.mt = torch.from_numpy(self.w), torch.from_numpy(self.mins)

    def apply_t(self, x: torch.Tensor) -> torch.Tensor:
        a = gguf.quantize_activations(x.numpy(), self.type)
        return torch.from_numpy(a.values) @ self.wt.T + torch.from_numpy(a.sums) @ self.mt.T

    def apply(self, x: F32) -> F32:
        out: F32 = self.apply_t(torch.from_numpy(x)).numpy()  # torch is Any where it is not installed
        return out


class TorchLlama(NumpyLlama):
    def matrix(self, data: npt.ArrayLike | paging.Slot, type: str, shape: tuple[int, ...]) -> Matrix:
        return TorchMatrix(data, type, shape)

    def weights(self, layer: paging.Layer) -> dict[str, F32 | Matrix]:
        """The layer's tensors, dequantized from a torch view of its slot."""
        raw = from_dlpack(layer)  # uint8 [slot bytes], no copy
        out: dict[str, F32 | Matrix] = {}
        for name in layer.names():
            info = self.file.info(name)
            off = layer.offset(name)
            data = raw[off : off + info.nbytes].numpy().reshape(info.n_rows, info.row_bytes)
            key = name.split(".")[2]
            out[key] = (
                self.matrix(data, info.type, info.shape)
                if len(info.shape) == 2
                else gguf.dequantize(data, info.type, info.shape)[0]
            )
            del data
        del raw
        return out

    def block(self, x_np: F32, w: dict[str, F32 | Matrix], pos_np: npt.NDArray[np.int64]) -> F32:
        x, pos = torch.from_numpy(x_np), torch.from_numpy(pos_np)
        n, d = x.shape
        hd = d // self.n_head

        def mm(a: torch.Tensor, name: str) -> torch.Tensor:
            m = w[name]
            assert isinstance(m, TorchMatrix)
            return m.apply_t(a.contiguous())

        def vec(name: str) -> torch.Tensor:
            v = w[name]
            assert isinstance(v, np.ndarray)
            return torch.from_numpy(v)

        with torch.no_grad():
            h = rms_norm(x, vec("attn_norm"), self.eps)
            q = rope(mm(h, "attn_q").view(n, self.n_head, hd), pos, self.base)
            k = rope(mm(h, "attn_k").view(n, self.n_kv, hd), pos, self.base)
            v = mm(h, "attn_v").view(n, self.n_kv, hd)
            if self.kv_f16:  # an F16 K/V cache; ggml rounds Q to F16 for its product with K
                q, k, v = t16(q), t16(k), t16(v)
            rep = self.n_head // self.n_kv
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
            s = torch.einsum("qhd,khd->hqk", q, k) * (1 / math.sqrt(hd))
            s = s + torch.full((n, n), float("-inf")).triu(1)
            p = torch.softmax(s, dim=-1)
            if self.kv_f16:  # and the probabilities for theirs with V
                p = t16(p)
            a = torch.einsum("hqk,khd->qhd", p, v).reshape(n, d)
            x = x + mm(a, "attn_output")
            h = rms_norm(x, vec("ffn_norm"), self.eps)
            x = x + mm(torch.nn.functional.silu(mm(h, "ffn_gate")) * mm(h, "ffn_up"), "ffn_down")
        return np.asarray(x.numpy(), dtype=np.float32)


if __name__ == "__main__":
    main(TorchLlama)
