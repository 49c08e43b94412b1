"""The layer loop: the one place that talks to both the graphs and the paging primitives.

A forward pass of n tokens runs as: an embedding graph, one graph per
transformer block, an output graph. Activations persist between graphs in
a device buffer; each block's K/V rows are written into that layer's cache.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from . import _core
from .arch import Architecture
from .arch.common import StepInputs

F32 = _core.GGMLType.F32
F16 = _core.GGMLType.F16
I32 = _core.GGMLType.I32
I64 = _core.GGMLType.I64

KV_PAD = 256          # n_kv is padded to this so graph shapes change rarely
GRAPH_NODES = 1024    # room for one block graph


@dataclass(frozen=True)
class ExecutorParams:
    n_ctx: int = 4096
    n_batch: int = 512
    n_threads: int = 4
    flash_attn: bool = False
    device: str = ""
    kv_type: str = "f16"   # "f16" (as llama.cpp) or "f32"


class _WeightView:
    """name -> paged tensor, as the architecture sees it."""

    def __init__(self, store: Any):
        self._store = store
        self._cache: dict[str, Any] = {}

    def __call__(self, name: str) -> Any:
        t = self._cache.get(name)
        if t is None:
            t = self._cache[name] = self._store.get(name)
        return t

    def has(self, name: str) -> bool:
        return self._store.has(name)


class Executor:
    """Runs an architecture layer by layer over one backend with a contiguous F16 KV cache."""

    def __init__(self, arch: Architecture, store: Any, params: ExecutorParams):
        self.arch = arch
        self.hp = hp = arch.hp
        self.params = params
        self.backend = _core.Backend(params.device, params.n_threads)
        self.weights = _WeightView(store)
        self.n_past = 0

        # persistent tensors: activations F32 [n_embd, n_batch]; per layer K, V F16 [n_embd_gqa, n_ctx]
        self._pctx = _core.Context(max_tensors=2 * hp.n_layer + 4)
        self.act = self._pctx.new_tensor(F32, [hp.n_embd, params.n_batch])
        self.act.name = "act"
        kv_type = {"f16": F16, "f32": F32}.get(params.kv_type)
        if kv_type is None:
            raise ValueError(f"kv_type must be 'f16' or 'f32', not {params.kv_type!r}")
        self.k_cache, self.v_cache = [], []
        for il in range(hp.n_layer):
            k = self._pctx.new_tensor(kv_type, [hp.n_embd_gqa, params.n_ctx])
            v = self._pctx.new_tensor(kv_type, [hp.n_embd_gqa, params.n_ctx])
            k.name, v.name = f"cache_k_l{il}", f"cache_v_l{il}"
            self.k_cache.append(k)
            self.v_cache.append(v)
        self._pbuf = self.backend.alloc_tensors(self._pctx)
        self._pbuf.clear(0)

    @property
    def kv_bytes(self) -> int:
        return 2 * self.hp.n_layer * self.hp.n_embd_gqa * self.params.n_ctx * self.k_cache[0].element_size

    def reset(self, n_past: int = 0) -> None:
        """Forget cached positions >= n_past (the cache rows are overwritten later)."""
        if not 0 <= n_past <= self.n_past:
            raise ValueError(f"n_past must be in [0, {self.n_past}]")
        self.n_past = n_past

    # -- one micro-batch ---------------------------------------------------
    def _inputs(self, tokens: Sequence[int], out_rows: Sequence[int]) -> tuple[StepInputs, Any, Any]:
        hp, p = self.hp, self.params
        n = len(tokens)
        p0 = self.n_past
        n_kv = min(p.n_ctx, -(-(p0 + n) // KV_PAD) * KV_PAD)
        ctx = _core.Context(max_tensors=8)
        t = {
            "tokens": ctx.new_tensor(I32, [n]),
            "positions": ctx.new_tensor(I32, [n]),
            "mask": ctx.new_tensor(F16 if p.flash_attn else F32, [n_kv, n]),
            "k_idxs": ctx.new_tensor(I64, [n]),
            "v_idxs": ctx.new_tensor(I64, [n] if p.flash_attn else [n * hp.n_embd_gqa]),
            "out_ids": ctx.new_tensor(I32, [max(len(out_rows), 1)]),
        }
        for name, x in t.items():
            x.name = "inp_" + name
        buf = self.backend.alloc_tensors(ctx)
        pos = np.arange(p0, p0 + n, dtype=np.int32)
        _core.tensor_set(t["tokens"], np.asarray(tokens, dtype=np.int32))
        _core.tensor_set(t["positions"], pos)
        kv_pos = np.arange(n_kv, dtype=np.int32)
        mask = np.where(kv_pos[None, :] <= pos[:, None], 0.0, -np.inf)
        mask = mask.astype(np.float16 if p.flash_attn else np.float32)
        _core.tensor_set(t["mask"], mask)
        _core.tensor_set(t["k_idxs"], pos.astype(np.int64))
        if p.flash_attn:
            _core.tensor_set(t["v_idxs"], pos.astype(np.int64))
        else:
            chan = np.arange(hp.n_embd_gqa, dtype=np.int64)
            _core.tensor_set(t["v_idxs"], (chan[None, :] * p.n_ctx + pos[:, None]).reshape(-1))
        _core.tensor_set(t["out_ids"], np.asarray(out_rows or [0], dtype=np.int32))
        inp = StepInputs(n_tokens=n, n_kv=n_kv, n_outputs=len(out_rows), flash_attn=p.flash_attn, **t)
        return inp, ctx, buf

    def _act_view(self, ctx: Any, n: int) -> Any:
        return ctx.view(self.act, [self.hp.n_embd, n], [self.act.nb[1]], 0)

    def _run(self, build: Any) -> Any:
        ctx = _core.Context(max_tensors=GRAPH_NODES, graph_size=GRAPH_NODES)
        gf = ctx.new_graph()
        out = build(ctx, gf)
        gf.expand(out)
        self.backend.compute(gf)
        return out

    def _ubatch(self, tokens: Sequence[int], out_rows: Sequence[int]) -> np.ndarray | None:
        arch, w, n = self.arch, self.weights, len(tokens)
        inp, _ictx, _ibuf = self._inputs(tokens, out_rows)

        self._run(lambda ctx, gf: ctx.cpy(arch.build_embed(ctx, w, inp), self._act_view(ctx, n)))
        for il in range(self.hp.n_layer):
            self._run(lambda ctx, gf, il=il: ctx.cpy(
                arch.build_block(ctx, gf, w, inp, il, self._act_view(ctx, n),
                                 self.k_cache[il], self.v_cache[il]),
                self._act_view(ctx, n)))
        logits = None
        if out_rows:
            def head(ctx: Any, gf: Any) -> Any:
                out = arch.build_output(ctx, w, inp, self._act_view(ctx, n))
                out.set_output()
                return out
            logits = _core.tensor_get(self._run(head)).reshape(len(out_rows), self.hp.n_vocab)
        self.n_past += n
        return logits

    # -- public --------------------------------------------------------------
    def eval(self, tokens: Sequence[int], *, logits_all: bool = False) -> np.ndarray:
        """Feeds tokens at positions n_past..; returns F32 logits [n_out, n_vocab]
        (every position if logits_all, else the last one)."""
        n = len(tokens)
        if n == 0:
            raise ValueError("eval needs at least one token")
        if self.n_past + n > self.params.n_ctx:
            raise ValueError(
                f"context overflow: {self.n_past} cached + {n} new tokens > ctx_size {self.params.n_ctx}")
        bad = [t for t in tokens if not 0 <= int(t) < self.hp.n_vocab]
        if bad:
            raise ValueError(f"token id {bad[0]} out of range [0, {self.hp.n_vocab})")
        outs = []
        b = self.params.n_batch
        for i in range(0, n, b):
            chunk = tokens[i:i + b]
            last = i + len(chunk) == n
            rows = list(range(len(chunk))) if logits_all else ([len(chunk) - 1] if last else [])
            r = self._ubatch(chunk, rows)
            if r is not None:
                outs.append(r)
        return np.concatenate(outs, axis=0)
