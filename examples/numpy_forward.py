"""A NumPy forward pass of a llama-architecture GGUF (SmolLM2) whose weights stream through superggml.paging.

Each block's tensors are one pager layer: at most `n_slots` layers' weights are in memory at once (2 by
default), the next one loading on a worker thread (prefetch depth 1) while NumPy computes this one. The lm
head (the tied token embedding) streams through a BufferPool in row chunks, read by a Prefetcher. NumPy does
all the arithmetic, on float32 weights dequantized from the slots' bytes (zero-copy views) by ggml's own type
traits.

It computes what ggml-cpu computes: activations rounded as ggml-cpu rounds them for a quantized matmul
(`gguf.quantize_activations`, with the Q4_1 block minimums apart: `gguf.block_mins`), and Q, K, V and the
attention probabilities rounded to F16 as an F16 K/V cache makes ggml round them (kv_type="f32": not).
On a file with F32 weights (tests/support/synth_gguf.py's dequantized_copy writes one) and an F32 K/V cache it
agrees with `superggml.Model` to float rounding (6e-5 on SmolLM2). On quantized weights it cannot: ggml's
Q8_1 activation blocks store their sums in F16, which turns float rounding differences into steps of up to
~0.1 now and then, so the logits agree to about 1, and the next token wherever the top two logits are
further apart than that.

    python examples/numpy_forward.py [model.gguf] [--prompt "The capital of France is"] [--check]
"""

from __future__ import annotations

import argparse
import resource

import numpy as np
import numpy.typing as npt

from superggml import gguf, paging

F32 = npt.NDArray[np.float32]
BLOCK = ["attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down"]


def rms_norm(x: F32, w: F32, eps: float) -> F32:
    return np.asarray(x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w, dtype=np.float32)


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


class Matrix:
    """A weight matrix as ggml-cpu multiplies by it: float32 rows without their block minimums, the minimums
    (Q4_1, Q5_1; zeros otherwise) and the type that decides how activations are rounded."""

    def __init__(self, data: npt.ArrayLike | paging.Slot, type: str, shape: tuple[int, ...]) -> None:
        self.type = type
        self.w = gguf.dequantize(data, type, shape)  # [rows, row_length]
        self.mins = gguf.block_mins(data, type, shape)  # [rows, row_length / 32]
        if self.mins.any():
            self.w -= np.repeat(self.mins, 32, axis=1)

    def apply(self, x: F32) -> F32:
        """x @ W.T as ggml-cpu computes it."""
        a = gguf.quantize_activations(x, self.type)
        return np.asarray(a.values @ self.w.T + a.sums @ self.mins.T, dtype=np.float32)


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
        self.kv_f16 = kv_type == "f16"
        layers = [[f"blk.{i}.{t}.weight" for t in BLOCK] for i in range(self.n_layer)]
        self.pager = paging.LayerPager(path, layers, n_slots=n_slots, n_workers=1)
        self.head = self.file.info("output.weight" if "output.weight" in self.file.tensors else "token_embd.weight")
        self.head_rows = head_rows
        self.head_pool = paging.BufferPool(head_rows * self.head.row_bytes, 2)
        self.io = paging.Prefetcher(path, 1)

    def matrix(self, data: npt.ArrayLike | paging.Slot, type: str, shape: tuple[int, ...]) -> Matrix:
        return Matrix(data, type, shape)

    def weights(self, layer: paging.Layer) -> dict[str, F32 | Matrix]:
        """The layer's tensors, dequantized from its slot's bytes (zero-copy views of the slot)."""
        out: dict[str, F32 | Matrix] = {}
        for name in layer.names():
            info = self.file.info(name)
            view = paging.layer_array(layer, name)
            key = name.split(".")[2]
            out[key] = (
                self.matrix(view, info.type, info.shape)
                if len(info.shape) == 2
                else gguf.dequantize(view, info.type, info.shape)[0]
            )
            del view  # the layer cannot be released while views of it live
        return out

    def block(self, x: F32, w: dict[str, F32 | Matrix], pos: npt.NDArray[np.int64]) -> F32:
        n, d = x.shape
        hd = d // self.n_head

        def mm(a: F32, name: str) -> F32:
            m = w[name]
            assert isinstance(m, Matrix)
            return m.apply(a)

        def vec(name: str) -> F32:
            v = w[name]
            assert not isinstance(v, Matrix)
            return v

        h = rms_norm(x, vec("attn_norm"), self.eps)
        q = rope(mm(h, "attn_q").reshape(n, self.n_head, hd), pos, self.base)
        k = rope(mm(h, "attn_k").reshape(n, self.n_kv, hd), pos, self.base)
        v = mm(h, "attn_v").reshape(n, self.n_kv, hd)
        if self.kv_f16:  # an F16 K/V cache; ggml rounds Q to F16 for its product with K
            q, k, v = f16(q), f16(k), f16(v)
        rep = self.n_head // self.n_kv
        k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
        s = np.einsum("qhd,khd->hqk", q, k) * np.float32(1 / np.sqrt(np.float32(hd)))
        s = s + np.triu(np.full((n, n), -np.inf, dtype=np.float32), 1)
        p = np.exp(s - s.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        if self.kv_f16:  # and the probabilities for theirs with V
            p = f16(p)
        a = np.einsum("hqk,khd->qhd", p, v).reshape(n, d)
        x = x + mm(a, "attn_output")
        h = rms_norm(x, vec("ffn_norm"), self.eps)
        g = mm(h, "ffn_gate")
        return np.asarray(x + mm((g / (1 + np.exp(-g))) * mm(h, "ffn_up"), "ffn_down"), dtype=np.float32)

    def logits(self, tokens: list[int]) -> F32:
        """Logits F32 [len(tokens), n_vocab] of a prompt."""
        pos = np.arange(len(tokens), dtype=np.int64)
        emb = self.file.info("token_embd.weight")
        x = np.stack([self.file.dequantize(emb.name, rows=(t, t + 1))[0] for t in tokens]).astype(np.float32)
        self.pager.prefetch(0)
        for i in range(self.n_layer):
            if i + 1 < self.n_layer:
                self.pager.prefetch(i + 1)  # depth 1: the next block loads while this one computes
            with self.pager.acquire(i) as layer:
                w = self.weights(layer)
            x = self.block(x, w, pos)
            del w
        x = rms_norm(x, self.file.dequantize("output_norm.weight")[0], self.eps)
        return self.head_logits(x)

    def head_logits(self, x: F32) -> F32:
        """The lm head in chunks of head_rows rows: chunk c + 1 loads into the pool's other slot while NumPy
        multiplies by chunk c."""
        h, n_rows = self.head, self.head.n_rows
        out = np.empty((x.shape[0], n_rows), dtype=np.float32)
        chunks = [(r, min(n_rows, r + self.head_rows)) for r in range(0, n_rows, self.head_rows)]
        loads = [self._load_head(0)]
        for c, (r0, r1) in enumerate(chunks):
            if c + 1 < len(chunks):
                loads.append(self._load_head(c + 1))
            slot, fut = loads[c]
            fut.result()
            with slot:
                out[:, r0:r1] = self.matrix(slot, h.type, (h.shape[0], r1 - r0)).apply(x)
        return out

    def _load_head(self, c: int) -> tuple[paging.Slot, paging.LoadFuture]:
        r0 = c * self.head_rows
        slot = self.head_pool.acquire(c)
        return slot, self.file.read_into(
            self.head.name, slot, self.io, rows=(r0, min(self.head.n_rows, r0 + self.head_rows))
        )

    def close(self) -> None:
        self.pager.close()
        self.head_pool.close()
        self.io.close()
        self.file.close()


def rss(peak: bool = False) -> int:
    """The process's RSS (or peak RSS: Linux's VmHWM, which unlike ru_maxrss is not inherited from a forking
    parent) in bytes."""
    key = "VmHWM:" if peak else "VmRSS:"
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key))
    except (OSError, StopIteration):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def main(engine: type[NumpyLlama] = NumpyLlama) -> None:
    from superggml.models import smollm2_path

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", nargs="?", default=None, help="a llama-architecture GGUF (default: SmolLM2-135M)")
    ap.add_argument("--prompt", default="The capital of France is")
    ap.add_argument("--tokens", help="comma-separated token ids instead of --prompt")
    ap.add_argument("--slots", type=int, default=2, help="layers' weights in memory at once")
    ap.add_argument("--kv-type", choices=("f16", "f32"), default="f16", help="the K/V rounding to reproduce")
    ap.add_argument("--check", action="store_true", help="compare the logits with superggml.Model.eval's")
    ap.add_argument("--save", help="write the logits (F32 [tokens, n_vocab]) to this .npy file")
    args = ap.parse_args()
    path = args.model or str(smollm2_path())
    if args.tokens:
        tokens = [int(t) for t in args.tokens.split(",")]
    else:
        from superggml.tokenizer import Tokenizer

        with gguf.open(path) as f:
            tokens = Tokenizer.from_metadata(f.metadata()).encode(args.prompt)
    start = rss()  # Python, NumPy (and torch) imported
    m = engine(path, n_slots=args.slots, kv_type=args.kv_type)
    logits = m.logits(tokens)
    layer_bytes = m.pager.slot_size
    m.close()
    if args.save:
        np.save(args.save, logits)
    print("tokens:", ",".join(map(str, tokens)))
    print("next token:", int(np.argmax(logits[-1])))
    print(f"weights in memory: {args.slots} slots of {layer_bytes / 2**20:.1f} MiB")
    print(f"RSS at start: {start / 2**20:.0f} MiB")
    print(f"peak RSS: {rss(peak=True) / 2**20:.0f} MiB")
    if args.check:
        import superggml

        with superggml.Model(path, kv_type=args.kv_type) as model:
            ref = model.eval(tokens, logits_all=True).reshape(logits.shape)
        print(
            f"max |logit - Model.eval|: {np.abs(logits - ref).max():.3g} "
            f"(max |logit| {np.abs(ref).max():.3g}); same argmax: {bool((logits.argmax(1) == ref.argmax(1)).all())}"
        )


if __name__ == "__main__":
    main()
