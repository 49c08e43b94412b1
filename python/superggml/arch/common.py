"""What every decoder-only family shares: hparams, the attention block, the head and tail."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Protocol

from .. import _core
from ..errors import GGUFError, UnsupportedModelError

F32 = _core.GGMLType.F32
F16 = _core.GGMLType.F16
ROPE_NORM = 0
ROPE_NEOX = 2


@dataclass(frozen=True)
class HParams:
    arch: str
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    n_vocab: int
    n_ctx_train: int
    rms_eps: float
    rope_base: float
    rope_scale: float
    n_rot: int

    @property
    def n_embd_gqa(self) -> int:
        return self.head_dim * self.n_head_kv

    @classmethod
    def from_metadata(cls, meta: Mapping[str, Any], arch: str) -> "HParams":
        def get(key: str, default: Any = None) -> Any:
            v = meta.get(f"{arch}.{key}", default)
            if v is None:
                raise GGUFError(f"GGUF metadata lacks '{arch}.{key}'")
            return v

        try:
            n_embd = int(get("embedding_length"))
            n_head = int(get("attention.head_count"))
            n_head_kv = int(get("attention.head_count_kv", n_head))
            head_dim = int(get("attention.key_length", n_embd // max(n_head, 1)))
            n_vocab = meta.get(f"{arch}.vocab_size") or len(meta.get("tokenizer.ggml.tokens") or [])
            scaling = meta.get(f"{arch}.rope.scaling.type", "none")
            if scaling not in ("none", "linear"):
                raise UnsupportedModelError(f"RoPE scaling type {scaling!r} is not supported (none, linear)")
            # as llama.cpp: rope.scaling.factor, else the older rope.scale_linear
            scale_linear = float(meta.get(f"{arch}.rope.scaling.factor")
                                 or meta.get(f"{arch}.rope.scale_linear") or 1.0)
            hp = cls(
                arch=arch,
                n_layer=int(get("block_count")),
                n_embd=n_embd,
                n_head=n_head,
                n_head_kv=n_head_kv,
                head_dim=head_dim,
                n_ff=int(get("feed_forward_length")),
                n_vocab=int(n_vocab),
                n_ctx_train=int(get("context_length")),
                rms_eps=float(get("attention.layer_norm_rms_epsilon")),
                rope_base=float(get("rope.freq_base", 10000.0)),
                rope_scale=1.0 / scale_linear,
                n_rot=int(get("rope.dimension_count", head_dim)),
            )
        except (TypeError, ValueError) as e:
            if isinstance(e, GGUFError):
                raise
            raise GGUFError(f"GGUF hyperparameters are malformed: {e}") from e
        if min(hp.n_layer, hp.n_embd, hp.n_head, hp.n_head_kv, hp.head_dim, hp.n_ff, hp.n_vocab) <= 0:
            raise GGUFError(f"GGUF hyperparameters are not positive: {hp}")
        if hp.n_head % hp.n_head_kv or hp.n_rot > hp.head_dim or hp.n_rot % 2:
            raise GGUFError(f"GGUF hyperparameters are inconsistent: {hp}")
        return hp


class Weights(Protocol):
    """name -> paged tensor (the executor decides where its bytes are)."""

    def __call__(self, name: str) -> Any: ...
    def has(self, name: str) -> bool: ...


@dataclass
class StepInputs:
    """Tensors shared by every layer graph of one micro-batch (all already filled).

    tokens  I32 [n_tokens]              positions I32 [n_tokens]
    mask    F32 [n_kv, n_tokens]        causal mask, 0 or -inf (F16 with flash_attn)
    k_idxs  I64 [n_tokens]              KV rows written this step
    v_idxs  I64 [n_tokens*n_embd_gqa]   (transposed V) or [n_tokens]
    out_ids I32 [n_outputs]             rows whose logits are wanted
    """

    n_tokens: int
    n_kv: int
    n_outputs: int
    tokens: Any
    positions: Any
    mask: Any
    k_idxs: Any
    v_idxs: Any
    out_ids: Any
    flash_attn: bool


class Architecture:
    """One model family: names its tensors and builds the block graph."""

    rope_mode = ROPE_NORM
    has_qkv_bias = False
    prescale_q = False       # multiply Q by 1/sqrt(head_dim) before attention instead of scaling KQ

    def __init__(self, hp: HParams):
        self.hp = hp

    # -- tensors ---------------------------------------------------------
    def block_tensor_shapes(self, il: int) -> dict[str, tuple[int, ...]]:
        hp = self.hp
        p = f"blk.{il}."
        shapes = {
            p + "attn_norm.weight": (hp.n_embd,),
            p + "attn_q.weight": (hp.n_embd, hp.n_head * hp.head_dim),
            p + "attn_k.weight": (hp.n_embd, hp.n_embd_gqa),
            p + "attn_v.weight": (hp.n_embd, hp.n_embd_gqa),
            p + "attn_output.weight": (hp.n_head * hp.head_dim, hp.n_embd),
            p + "ffn_norm.weight": (hp.n_embd,),
            p + "ffn_gate.weight": (hp.n_embd, hp.n_ff),
            p + "ffn_up.weight": (hp.n_embd, hp.n_ff),
            p + "ffn_down.weight": (hp.n_ff, hp.n_embd),
        }
        if self.has_qkv_bias:
            shapes[p + "attn_q.bias"] = (hp.n_head * hp.head_dim,)
            shapes[p + "attn_k.bias"] = (hp.n_embd_gqa,)
            shapes[p + "attn_v.bias"] = (hp.n_embd_gqa,)
        return shapes

    def block_tensors(self, il: int) -> list[str]:
        return list(self.block_tensor_shapes(il))

    def matmul_weights(self, has: Any) -> list[str]:
        """Weights used only as the left side of mul_mat (candidates for re-laid kernels)."""
        names = [n for il in range(self.hp.n_layer)
                 for n, shape in self.block_tensor_shapes(il).items() if len(shape) == 2]
        if has("output.weight"):
            names.append("output.weight")
        return names

    def output_tensor(self, has: Any) -> str:
        return "output.weight" if has("output.weight") else "token_embd.weight"

    def global_tensor_shapes(self, has: Any) -> dict[str, tuple[int, ...]]:
        hp = self.hp
        shapes = {
            "token_embd.weight": (hp.n_embd, hp.n_vocab),
            "output_norm.weight": (hp.n_embd,),
            self.output_tensor(has): (hp.n_embd, hp.n_vocab),
        }
        if has("rope_freqs.weight"):
            shapes["rope_freqs.weight"] = (hp.n_rot // 2,)
        return shapes

    def validate(self, table: Mapping[str, tuple[int, ...]]) -> None:
        """GGUFError naming the first missing or misshapen tensor."""
        expected = dict(self.global_tensor_shapes(lambda n: n in table))
        for il in range(self.hp.n_layer):
            expected.update(self.block_tensor_shapes(il))
        for name, shape in expected.items():
            got = table.get(name)
            if got is None:
                raise GGUFError(f"GGUF lacks tensor '{name}' required by {self.hp.arch}")
            if tuple(got) != tuple(shape):
                raise GGUFError(f"tensor '{name}' has shape {list(got)}, expected {list(shape)}")

    # -- graphs ------------------------------------------------------------
    def build_embed(self, ctx: Any, w: Weights, inp: StepInputs) -> Any:
        """F32 [n_embd, n_tokens]"""
        return ctx.get_rows(w("token_embd.weight"), inp.tokens)

    def build_output_norm(self, ctx: Any, w: Weights, x: Any) -> Any:
        """x F32 [n_embd, n_outputs] -> the normed input of the lm head, same shape"""
        return ctx.mul(ctx.rms_norm(x, self.hp.rms_eps), w("output_norm.weight"))

    def build_output(self, ctx: Any, w: Weights, inp: StepInputs, x: Any) -> Any:
        """x F32 [n_embd, n_outputs] (the last block kept only those rows) -> logits F32 [n_vocab, n_outputs]"""
        return ctx.mul_mat(w(self.output_tensor(w.has)), self.build_output_norm(ctx, w, x))

    def build_qk_norm(self, ctx: Any, w: Weights, p: str, q: Any, k: Any) -> tuple[Any, Any]:
        """Before RoPE: q F32 [head_dim, n_head, n_tokens], k F32 [head_dim, n_head_kv, n_tokens]. Most
        families leave them as they are."""
        return q, k

    def build_block(self, ctx: Any, gf: Any, w: Weights, inp: StepInputs, il: int,
                    x: Any, k_cache: Any, v_cache: Any) -> Any:
        """One transformer block: x F32 [n_embd, n_tokens] -> same shape, except that the last
        block keeps only the rows whose logits are wanted ([n_embd, n_outputs], as llama.cpp)."""
        hp = self.hp
        p = f"blk.{il}."
        n = inp.n_tokens
        cur = ctx.mul(ctx.rms_norm(x, hp.rms_eps), w(p + "attn_norm.weight"))
        q, k, v = self.build_qkv(ctx, w, p, cur, n)
        q, k = self.build_qk_norm(ctx, w, p, q, k)
        ff = w("rope_freqs.weight") if w.has("rope_freqs.weight") else None   # Llama 3.1 long-context factors
        q = ctx.rope_ext(q, inp.positions, ff, hp.n_rot, self.rope_mode, hp.n_ctx_train,
                         hp.rope_base, hp.rope_scale)
        k = ctx.rope_ext(k, inp.positions, ff, hp.n_rot, self.rope_mode, hp.n_ctx_train,
                         hp.rope_base, hp.rope_scale)
        kq_scale = 1.0 / math.sqrt(hp.head_dim)
        if self.prescale_q:                      # Q scaled before attention, as some families' graphs do
            q, kq_scale = ctx.scale(q, kq_scale), 1.0
        cur = build_attn(ctx, gf, hp, inp, q, k, v, k_cache, v_cache, kq_scale)
        if il == hp.n_layer - 1 and inp.n_outputs < n:
            cur = ctx.get_rows(cur, inp.out_ids)
            x = ctx.get_rows(x, inp.out_ids)
        cur = ctx.mul_mat(w(p + "attn_output.weight"), cur)
        ffn_inp = ctx.add(cur, x)
        cur = ctx.mul(ctx.rms_norm(ffn_inp, hp.rms_eps), w(p + "ffn_norm.weight"))
        return ctx.add(self.build_ffn(ctx, w, p, cur), ffn_inp)

    def build_qkv(self, ctx: Any, w: Weights, p: str, cur: Any, n: int) -> tuple[Any, Any, Any]:
        """cur F32 [n_embd, n] -> q F32 [head_dim, n_head, n], k F32 [head_dim, n_head_kv, n], v F32
        [n_embd_gqa, n] (v may be a strided view)."""
        hp = self.hp
        q = ctx.mul_mat(w(p + "attn_q.weight"), cur)
        k = ctx.mul_mat(w(p + "attn_k.weight"), cur)
        v = ctx.mul_mat(w(p + "attn_v.weight"), cur)
        if self.has_qkv_bias:
            q = ctx.add(q, w(p + "attn_q.bias"))
            k = ctx.add(k, w(p + "attn_k.bias"))
            v = ctx.add(v, w(p + "attn_v.bias"))
        return ctx.reshape(q, [hp.head_dim, hp.n_head, n]), ctx.reshape(k, [hp.head_dim, hp.n_head_kv, n]), v

    def build_ffn(self, ctx: Any, w: Weights, p: str, cur: Any) -> Any:
        """The normed input F32 [n_embd, n] -> F32 [n_embd, n]: SwiGLU with separate gate and up."""
        gate = ctx.mul_mat(w(p + "ffn_gate.weight"), cur)
        up = ctx.mul_mat(w(p + "ffn_up.weight"), cur)
        return ctx.mul_mat(w(p + "ffn_down.weight"), ctx.swiglu_split(gate, up))


def build_attn(ctx: Any, gf: Any, hp: HParams, inp: StepInputs, q: Any, k: Any, v: Any,
               k_cache: Any, v_cache: Any, scale: float) -> Any:
    """Writes k/v into the cache rows of this step and attends over the first n_kv rows.

    q F32 [head_dim, n_head, n_tokens], k F32 [head_dim, n_head_kv, n_tokens],
    v F32 [n_embd_gqa, n_tokens] (rows may be strided); k_cache F16 [n_embd_gqa, n_ctx];
    v_cache F16 [n_embd_gqa, n_ctx] (stored transposed: [n_ctx, n_embd_gqa] when not flash_attn).
    Returns F32 [head_dim*n_head, n_tokens].
    """
    n, n_kv, d, g = inp.n_tokens, inp.n_kv, hp.head_dim, hp.n_embd_gqa
    n_ctx = k_cache.shape[1]
    es = k_cache.element_size
    gf.expand(ctx.set_rows(k_cache, ctx.reshape(k, [g, n]), inp.k_idxs))
    if inp.flash_attn:
        gf.expand(ctx.set_rows(v_cache, v, inp.v_idxs))
    else:
        if v.nb[1] != g * v.element_size:
            v = ctx.cont(v)                      # a view into a fused QKV: rows made contiguous, as llama.cpp
        flat = ctx.reshape(v_cache, [1, g * n_ctx])
        gf.expand(ctx.set_rows(flat, ctx.reshape(v, [1, g * n]), inp.v_idxs))

    kv = ctx.view(k_cache, [d, hp.n_head_kv, n_kv], [d * es, g * es], 0)   # F16 [d, n_head_kv, n_kv]
    qp = ctx.permute(q, 0, 2, 1, 3)                                        # [d, n, n_head]
    kp = ctx.permute(kv, 0, 2, 1, 3)                                       # [d, n_kv, n_head_kv]
    if inp.flash_attn:
        vv = ctx.view(v_cache, [d, hp.n_head_kv, n_kv], [d * es, g * es], 0)
        vp = ctx.permute(vv, 0, 2, 1, 3)                                   # [d, n_kv, n_head_kv]
        if k_cache.type == F32:   # flash attention reads F16 K/V: an F32 cache is cast, as llama.cpp does
            kp, vp = ctx.cast(kp, F16), ctx.cast(vp, F16)
        cur = ctx.flash_attn_ext(qp, kp, vp, inp.mask, scale)             # [d, n_head, n]
        return ctx.reshape(cur, [d * hp.n_head, n])
    vt = ctx.view(v_cache, [n_kv, hp.n_head_kv, d], [n_ctx * d * es, n_ctx * es], 0)  # [n_kv, n_head_kv, d]
    vp = ctx.permute(vt, 0, 2, 1, 3)                                       # [n_kv, d, n_head_kv]
    kq = ctx.mul_mat(kp, qp)                                               # [n_kv, n, n_head]
    ctx.mul_mat_set_prec_f32(kq)
    kq = ctx.soft_max_ext(kq, inp.mask, scale)
    kqv = ctx.mul_mat(vp, kq)                                              # [d, n, n_head]
    cur = ctx.cont(ctx.permute(kqv, 0, 2, 1, 3))                           # [d, n_head, n]
    return ctx.reshape(cur, [d * hp.n_head, n])
