"""What every decoder-only family shares: the attention block, the head and tail (the hyperparameters and a
step's inputs: arch/base.py)."""

from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping, Protocol

import numpy as np

from .. import native
from ..errors import GGUFError, UnsupportedModelError
from ..native import Context, Graph, Tensor
from .base import HParams as HParams  # re-exported: the runtime imports both from here
from .base import StepInputs as StepInputs
from .base import (
    BlockGraph,
    Memory,
    Weights,
    attn_scale,
    check_shapes,
    check_sizes,
    f32,
    lane_memory,
    one_memory,
    swiglu,
)
from .moe import MoeConfig, build_moe_ffn, build_shared_expert_only, moe_tensor_shapes

F32 = native.GGMLType.F32
F16 = native.GGMLType.F16
ROPE_NORM = 0
ROPE_NEOX = 2
YARN_BETA_FAST, YARN_BETA_SLOW = 32.0, 1.0  # llama.cpp's defaults (rope.scaling.yarn_beta_* for mistral3)


def row_size(t: native.GGMLType, n: int) -> int:
    """Bytes of n values of ggml type t (a whole number of blocks for a quantized type)."""
    return int(native.row_size(t, n))


def inv_sqrt(x: float) -> float:
    """1.0f / sqrtf(x)"""
    return float(f32(1.0) / np.sqrt(f32(x)))


class Architecture:
    """One model family: names its tensors and builds the block graph.

    The block is llama's (pre-norm attention and a gated FFN, each added to the residual); families change
    it through the class attributes and hooks below, the way llama.cpp's src/models/*.cpp differ."""

    rope_mode = ROPE_NORM
    has_qkv_bias = False
    rope_factors = True  # reads rope_freqs / rope_factors_long|short (llama and phi3 do; qwen, gemma do not)
    post_norms = False  # RMS norms of the attention and FFN outputs before they join the residual (gemma)
    qk_norm = False  # an RMS norm of every Q and K head before RoPE (qwen3, gemma3)
    attn_sinks = False  # a learned per-head logit in every attention row's softmax (gpt-oss)
    out_bias = False  # attn_output.bias (gpt-oss)
    ffn_norm = "ffn_norm"  # the FFN's pre-norm tensor (gpt-oss calls it post_attention_norm)
    output_norm = "output_norm.weight"  # the norm before the lm head (lfm2 calls it token_embd_norm)
    rope_whole_heads = False  # RoPE must span each head (llama.cpp asserts n_rot == head_dim in the graph)
    ffn_glu = "swiglu"  # swiglu or geglu
    out_prec_f32 = False  # the attention output's matmul accumulates in F32 (glm4moe; on the CPU it always does)
    reads_hidden = False  # a pass reads hidden rows beside its tokens (StepInputs.hidden: an MTP block)
    own_v_heads = False  # V heads may be narrower than K's (head_dim_v: deepseek2's legacy MHA)
    late_gather = False  # the last block keeps every row; the head picks its rows after the output norm
    rope_sections: list[int] | None = None  # multi-section RoPE: positions [4 * n_tokens] (rope_multi)
    rms_eps_keys: tuple[str, ...] = ("attention.layer_norm_rms_epsilon",)  # the norms' epsilon: the first present
    heads_per_layer = False  # reads attention.head_count per layer (HParams.n_head_per_layer)
    kv_heads_per_layer = False  # reads attention.head_count_kv per layer (HParams.n_head_kv_per_layer)
    embed_tensors: tuple[str, ...] = ("token_embd.weight",)  # read by the embedding's graph only, from the mapping
    n_embd_per_layer = 0  # values of each block's own input per token (StepInputs.per_layer; gemma4)
    indexer_rot_size = 0  # a sparse-attention indexer's rotation (StepInputs.indexer_rot; deepseek32)
    keeps_mask = False  # blocks reuse an earlier block's sparse-attention mask (StepInputs.kept_mask; glm-dsa)
    recurrent_output = "ssm_out"  # the matmul after a recurrent block's mixer

    def __init__(self, hp: HParams, meta: Mapping[str, Any] | None = None, names: Iterable[str] = ()):
        self.hp = hp
        self.names = frozenset(names)  # the GGUF's tensors (empty when unknown): optional ones present
        self.q_scale: float | None = None  # Q scaled by this before attention (then KQ is not scaled)
        self.attn_softcap = 0.0  # KQ -> c * tanh(KQ / c) before the softmax
        self.final_softcap = 0.0  # the same on the logits
        self.f_attention_scale = 0.0  # KQ's scale where the file sets one (attention.scale; 0: 1 / sqrt(head_dim))
        self.residual_scale = 0.0  # attention's and FFN's outputs scaled by this before the residual (granite)
        self.n_swa = 0  # sliding window (tokens) of the layers is_swa marks
        self.swa_chunked = False  # those layers attend within chunks of n_swa tokens instead (llama4)
        self.swa_layers: tuple[bool, ...] = (False,) * hp.n_layer
        self.rope_base_swa, self.rope_scale_swa = hp.rope_base, hp.rope_scale
        self.yarn_beta = (YARN_BETA_FAST, YARN_BETA_SLOW)
        # attention temperature (Llama 4, Mistral 3): Q times log(floor((pos + offset) / floor) + 1) * scale + 1
        self.attn_temp: tuple[float, int, float] | None = None  # (scale, floor, offset)
        self.n_ctx_seq = hp.n_ctx_train  # the context the model runs with (set_context)
        meta = meta or {}
        # mixture of experts (hp.n_expert > 0): the experts' FFN size, a shared expert's (0: none)
        self.n_ff_exp = hp.n_ff
        self.n_ff_shexp = 0
        self.moe = MoeConfig()  # how its experts route and compute (the family sets what differs)
        self.shexp_gate = True  # the shared expert behind a sigmoid gate (qwen2moe)
        self.shexp_sigmoid = False  # that gate as ggml_sigmoid, not silu(x) / x (qwen2moe's form)
        self.n_lead = 0  # leading blocks with a dense FFN
        self.recurrent: tuple[bool, ...] = ()  # per block: a recurrent mixer instead of attention (hybrids)
        if self.rope_whole_heads and hp.n_rot != hp.head_dim:
            raise GGUFError(f"{hp.arch} rotates whole heads: rope.dimension_count {hp.n_rot} != head_dim {hp.head_dim}")
        if not hp.n_nextn and any(".nextn." in n for n in self.names):  # llama.cpp: tensors it did not load
            raise GGUFError(f"GGUF has next-token-prediction tensors but no '{hp.arch}.nextn_predict_layers'")
        if hp.n_head_per_layer and not self.heads_per_layer:
            raise UnsupportedModelError(f"{hp.arch}: attention.head_count varies by layer: {list(hp.n_head_per_layer)}")
        self.load_hparams(meta)
        if not self.hp.n_ff and not all(self.is_moe(il) for il in range(self.hp.n_layer)):
            raise GGUFError(f"GGUF metadata lacks '{self.hp.arch}.feed_forward_length' (a block has a dense FFN)")
        check_sizes(self.hp, meta, self.own_v_heads, any(self.swa_layers))

    def load_hparams(self, meta: Mapping[str, Any]) -> None:
        """Family keys beyond HParams (llama.cpp's load_arch_hparams)."""

    def key(self, meta: Mapping[str, Any], name: str, default: Any) -> Any:
        return meta.get(f"{self.hp.arch}.{name}", default)

    def need(self, meta: Mapping[str, Any], name: str) -> Any:
        """The family's key `name`; GGUFError when the GGUF lacks it."""
        v = self.key(meta, name, None)
        if v is None:
            raise GGUFError(f"GGUF metadata lacks '{self.hp.arch}.{name}'")
        return v

    def per_layer(self, meta: Mapping[str, Any], name: str, default: float) -> list[float]:
        """The family's key `name` per layer, as llama.cpp's get_key_or_arr reads it: one value for every layer, or
        an array of at least n_layer (the first n_layer); `default` where the key is absent."""
        n, v = self.hp.n_layer, self.key(meta, name, default)
        per = [float(x) for x in v] if isinstance(v, (list, tuple)) else [float(v)] * n
        if len(per) < n:
            raise GGUFError(f"'{self.hp.arch}.{name}' has {len(per)} entries for {n} layers")
        return per[:n]

    def set_swa_pattern(self, meta: Mapping[str, Any], n_pattern: int) -> None:
        """As llama.cpp's load_swa_pattern: attention.sliding_window_pattern is a per-layer array, or a period
        whose last layer is global (the others slide); n_pattern when absent."""
        v = self.key(meta, "attention.sliding_window_pattern", n_pattern)
        n = self.hp.n_layer
        if isinstance(v, (list, tuple)):
            if len(v) != n:
                raise GGUFError(f"attention.sliding_window_pattern has {len(v)} entries for {n} layers")
            self.swa_layers = tuple(bool(x) for x in v)
        else:
            k = int(v)
            self.swa_layers = tuple(k == 0 or il % k < k - 1 for il in range(n))

    def describe(self) -> list[str]:
        """Lines on what sets this model's layout apart (analyze prints them)."""
        return []

    @property
    def ffn_width(self) -> int:
        """The widest FFN intermediate of one row: a dense block's n_ff, or a MoE block's routed experts' and
        shared expert's together."""
        hp = self.hp
        moe = self.n_ff_exp * hp.n_expert_used + self.n_ff_shexp if hp.n_expert else 0
        dense = hp.n_ff if not all(self.is_moe(il) for il in range(hp.n_layer)) else 0
        return max(moe, dense, 1)

    def is_moe(self, il: int) -> bool:
        """Whether block il's FFN is the mixture of experts."""
        return self.hp.n_expert > 0 and il >= self.n_lead

    # -- mixture of experts: what a family may change (arch/moe.py builds it) --
    def expert_tensors(self, il: int) -> list[str]:
        """Block il's 3-D expert tensors, which an expert cache pages one expert at a time."""
        return [f"blk.{il}.ffn_{n}_exps.weight" for n in self.moe.parts] if self.is_moe(il) else []

    def swiglu_limits(self, il: int) -> tuple[float, float]:
        """Block il's SwiGLU clamps (Step 3.5): the routed experts', the dense and shared FFNs'; 0: none."""
        return 0.0, 0.0

    def router_input(self, ctx: Context, w: Weights, p: str, cur: Tensor) -> Tensor:
        return cur  # what block p's router multiplies

    def expert_input(self, ctx: Context, w: Weights, p: str, cur: Tensor) -> Tensor:
        return cur  # what block p's routed experts read

    def experts_out(self, ctx: Context, w: Weights, p: str, out: Tensor) -> Tensor:
        return out  # the routed experts' weighted sum, before the shared expert's output joins it

    def is_swa(self, il: int) -> bool:
        return self.n_swa > 0 and self.swa_layers[il]

    def is_recurrent(self, il: int) -> bool:
        """Whether block il keeps a recurrent state instead of a K/V cache (a hybrid model's linear attention)."""
        return il < len(self.recurrent) and self.recurrent[il]

    def is_stateless(self, il: int) -> bool:
        """Whether block il keeps nothing per sequence (a hybrid model's FFN-only blocks)."""
        return False

    def compressed_layout(self) -> tuple[tuple[int, ...], int] | None:
        """A compressed K/V's ratio per block and indexer head size (deepseek4); None: a K/V of every token."""
        return None

    def kv_source(self, il: int) -> int:
        """The block whose K/V block il attends over: itself, or an earlier one whose memory it shares (gemma4)."""
        return il

    def attn_output(self, il: int) -> str:
        """The matmul after block il's attention (or its recurrent mixer's)."""
        return f"blk.{il}.{self.recurrent_output if self.is_recurrent(il) else 'attn_output'}.weight"

    def build_recurrent(self, blk: BlockGraph, cur: Tensor, conv_state: Memory, state: Memory) -> Tensor:
        """A recurrent block's mixer over its normed input, before recurrent_output (hybrid families)."""
        raise NotImplementedError(f"{self.hp.arch} has no recurrent mixer")

    def attn_scale_of(self, positions: np.ndarray) -> np.ndarray:
        assert self.attn_temp is not None
        return attn_scale(self.attn_temp, positions)

    def set_context(self, n_ctx: int, flash_attn: bool = False) -> None:
        """The context size the model runs with, padded as llama.cpp pads it (it picks LongRoPE's factors)."""
        self.n_ctx_seq = -(-n_ctx // 256) * 256

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
            p + self.ffn_norm + ".weight": (hp.n_embd,),
        }
        if self.attn_sinks:
            shapes[p + "attn_sinks.weight"] = (hp.n_head,)
        if self.out_bias:
            shapes[p + "attn_output.bias"] = (hp.n_embd,)
        if self.is_moe(il):
            shapes.update(moe_tensor_shapes(self, il))
        else:
            shapes.update(
                {
                    p + "ffn_gate.weight": (hp.n_embd, hp.n_ff),
                    p + "ffn_up.weight": (hp.n_embd, hp.n_ff),
                    p + "ffn_down.weight": (hp.n_ff, hp.n_embd),
                }
            )
        if self.has_qkv_bias:
            shapes[p + "attn_q.bias"] = (hp.n_head * hp.head_dim,)
            shapes[p + "attn_k.bias"] = (hp.n_embd_gqa,)
            shapes[p + "attn_v.bias"] = (hp.n_embd_gqa,)
        if self.post_norms:
            shapes[p + "post_attention_norm.weight"] = (hp.n_embd,)
            shapes[p + "post_ffw_norm.weight"] = (hp.n_embd,)
        if self.qk_norm:
            shapes[p + "attn_q_norm.weight"] = (hp.head_dim,)
            shapes[p + "attn_k_norm.weight"] = (hp.head_dim,)
        return shapes

    def block_tensors(self, il: int) -> list[str]:
        return list(self.block_tensor_shapes(il))

    def is_unused(self, name: str) -> bool:
        """Whether `name` belongs to a block this architecture's forward pass does not use: the
        next-token-prediction blocks after the model's own (nextn_predict_layers)."""
        if not name.startswith("blk."):
            return False
        il = name.split(".", 2)[1]
        return il.isdigit() and int(il) >= self.hp.n_layer

    def matmul_weights(self, has: Callable[[str], bool]) -> list[str]:
        """Weights used only as the left side of mul_mat, or of mul_mat_id (the experts): candidates for re-laid
        kernels."""
        names = [
            n for il in range(self.hp.n_layer) for n, shape in self.block_tensor_shapes(il).items() if len(shape) == 2
        ]
        names += [n for il in range(self.hp.n_layer) for n in self.expert_tensors(il)]
        if has("output.weight") and self.output_tensor(has) == "output.weight":
            names.append("output.weight")
        return names

    def output_tensor(self, has: Callable[[str], bool]) -> str:
        return "output.weight" if has("output.weight") else "token_embd.weight"

    def global_tensor_shapes(self, has: Callable[[str], bool]) -> dict[str, tuple[int, ...]]:
        hp = self.hp
        shapes = {
            "token_embd.weight": (hp.n_embd, hp.n_vocab),
            self.output_norm: (hp.n_embd,),
            self.output_tensor(has): (hp.n_embd, hp.n_vocab),
        }
        if self.rope_factors:
            for name in ("rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight"):
                if has(name):
                    shapes[name] = (hp.n_rot // 2,)
        return shapes

    def validate(self, table: Mapping[str, tuple[int, ...]]) -> None:
        """GGUFError naming the first missing or misshapen tensor."""
        expected = dict(self.global_tensor_shapes(lambda n: n in table))
        for il in range(self.hp.n_layer):
            expected.update(self.block_tensor_shapes(il))
        check_shapes(self.hp.arch, expected, table)

    # -- graphs ------------------------------------------------------------
    def build_embed(self, ctx: Context, w: Weights, inp: StepInputs) -> Tensor:
        """F32 [n_embd, n_tokens]"""
        assert inp.tokens is not None
        return ctx.get_rows(w("token_embd.weight"), inp.tokens)

    def build_pass_inputs(self, ctx: Context, gf: Graph, w: Weights, inp: StepInputs, x: Tensor) -> None:
        """In the embedding's graph, after the embedding x F32 [n_embd, n_tokens]: what the pass's blocks read
        beside the activations (inp.per_layer, where the family has per-layer inputs)."""

    def build_block_out(self, ctx: Context, w: Weights, inp: StepInputs, il: int, x: Tensor, r0: int = 0) -> Tensor:
        """The end of block il after the FFN joined the residual: x F32 [n_embd, n] (the pass's rows r0..r0+n)."""
        return x

    def build_output_norm(self, ctx: Context, w: Weights, x: Tensor) -> Tensor:
        """x F32 [n_embd, n_outputs] -> the normed input of the lm head, same shape"""
        return ctx.mul(ctx.rms_norm(x, self.hp.rms_eps), w(self.output_norm))

    def build_output(self, ctx: Context, w: Weights, inp: StepInputs, x: Tensor) -> Tensor:
        """x F32 [n_embd, n_outputs] (the last block kept only those rows) -> logits F32 [n_vocab, n_outputs]"""
        return self.build_logits(ctx, ctx.mul_mat(w(self.output_tensor(w.has)), self.build_output_norm(ctx, w, x)))

    @property
    def reshapes_logits(self) -> bool:
        """Whether build_logits changes what the lm head's matmul gives (a soft cap, a scale)."""
        return bool(self.final_softcap)

    def build_logits(self, ctx: Context, logits: Tensor) -> Tensor:
        """What follows the lm head's matmul: the final soft cap where the family has one."""
        c = self.final_softcap
        if not c:
            return logits
        return ctx.scale(ctx.tanh(ctx.scale(logits, float(f32(1.0) / f32(c)))), c)

    def build_qk_norm(
        self, ctx: Context, w: Weights, p: str, q: Tensor, k: Tensor | None
    ) -> tuple[Tensor, Tensor | None]:
        """Before RoPE: q F32 [head_dim, n_head, n_tokens], k F32 [head_dim, n_head_kv, n_tokens] (or None), each
        head RMS-normed where the family has qk_norm."""
        if not self.qk_norm:
            return q, k
        q = self.norm(ctx, w, q, p + "attn_q_norm.weight")
        return q, None if k is None else self.norm(ctx, w, k, p + "attn_k_norm.weight")

    def rope_factors_of(self, w: Weights) -> Tensor | None:
        """llama.cpp's get_rope_factors: Llama 3.1's rope_freqs, else LongRoPE's long factors when the context
        exceeds the original one, its short ones otherwise; None without them."""
        if not self.rope_factors:
            return None
        names = (
            "rope_freqs.weight",
            "rope_factors_long.weight" if self.n_ctx_seq > self.hp.n_ctx_orig else "rope_factors_short.weight",
        )
        return next((w(n) for n in names if w.has(n)), None)

    def rope(self, ctx: Context, w: Weights, inp: StepInputs, il: int, x: Tensor) -> Tensor:
        """RoPE of x F32 [head_dim, heads, n_tokens] at the step's positions, with layer il's base and scale."""
        hp = self.hp
        assert inp.positions is not None
        base, scale = (self.rope_base_swa, self.rope_scale_swa) if self.is_swa(il) else (hp.rope_base, hp.rope_scale)
        return ctx.rope_ext(
            x,
            inp.positions,
            self.rope_factors_of(w),
            hp.n_rot,
            self.rope_mode,
            hp.n_ctx_orig,
            base,
            scale,
            hp.rope_ext_factor,
            hp.rope_attn_factor,
            *self.yarn_beta,
        )

    def temperature(self, ctx: Context, inp: StepInputs, il: int, q: Tensor) -> Tensor:
        """Q after RoPE times the attention temperature of its position, where the family has one."""
        return q if inp.attn_scale is None else ctx.mul(q, inp.attn_scale)

    def norm(self, ctx: Context, w: Weights, x: Tensor, name: str) -> Tensor:
        return ctx.mul(ctx.rms_norm(x, self.hp.rms_eps), w(name))

    def build_block(
        self, ctx: Context, gf: Graph, w: Weights, inp: StepInputs, il: int, x: Tensor, k_cache: Memory, v_cache: Memory
    ) -> Tensor:
        """One transformer block: x F32 [n_embd, n_tokens] -> same shape, except that the last
        block keeps only the rows whose logits are wanted ([n_embd, n_outputs], as llama.cpp)."""
        p = f"blk.{il}."
        ffn_inp, cur = self.build_attn_part(ctx, gf, w, inp, il, x, k_cache, v_cache)
        out = self.build_ffn_out(ctx, w, p, self.build_ffn(ctx, w, p, cur), ffn_inp)
        return self.build_block_out(ctx, w, inp, il, out)

    def build_attn_part(
        self, ctx: Context, gf: Graph, w: Weights, inp: StepInputs, il: int, x: Tensor, k_cache: Memory, v_cache: Memory
    ) -> tuple[Tensor, Tensor]:
        """The block up to its FFN: (ffn_inp, the residual after attention, F32 [n_embd, rows]; the FFN's
        normed input, same shape). rows: n_tokens, or n_outputs in the last block."""
        hp = self.hp
        p = f"blk.{il}."
        cur = self.norm(ctx, w, x, p + "attn_norm.weight")
        cur = self.build_attention(BlockGraph(ctx, gf, w, inp, il), cur, k_cache, v_cache)
        cur = ctx.mul_mat(w(self.attn_output(il)), cur)
        if self.out_prec_f32:
            ctx.mul_mat_set_prec_f32(cur)
        if self.out_bias:
            cur = ctx.add(cur, w(p + "attn_output.bias"))
        if il == hp.n_layer - 1 and inp.n_outputs < inp.n_tokens and not inp.keep_rows:
            # after the output projection, as llama.cpp's build_attn: its matmul sees every row (F32 and F16
            # kernels round by the number of rows)
            assert inp.out_ids is not None
            cur = ctx.get_rows(cur, inp.out_ids)
            x = ctx.get_rows(x, inp.out_ids)
        if self.post_norms:
            cur = self.norm(ctx, w, cur, p + "post_attention_norm.weight")
        if self.residual_scale:
            cur = ctx.scale(cur, self.residual_scale)
        ffn_inp = ctx.add(cur, x)
        return ffn_inp, self.norm(ctx, w, ffn_inp, p + self.ffn_norm + ".weight")

    def build_attention(self, blk: BlockGraph, cur: Tensor, k_cache: Memory, v_cache: Memory) -> Tensor:
        """Block il's attention over its normed input cur F32 [n_embd, n_tokens], before the output projection:
        F32 [head_dim * n_head, n_tokens]. A recurrent block runs its mixer instead."""
        if self.is_recurrent(blk.il):
            return self.build_recurrent(blk, cur, k_cache, v_cache)
        ctx, w, inp, il = blk.ctx, blk.w, blk.inp, blk.il
        hp = self.layer_hp(il)
        p = f"blk.{il}."
        q, k, v = self.build_qkv(ctx, w, p, cur, inp.n_tokens)  # k, v None: the block reads another's K/V
        q, k = self.build_qk_norm(ctx, w, p, q, k)
        q = self.rope(ctx, w, inp, il, q)
        k = None if k is None else self.rope(ctx, w, inp, il, k)
        q = self.temperature(ctx, inp, il, q)
        kq_scale = self.f_attention_scale or inv_sqrt(hp.head_dim)
        if self.q_scale is not None:  # Q scaled before attention, as some families' graphs do
            q, kq_scale = ctx.scale(q, self.q_scale), 1.0
        sinks = w(p + "attn_sinks.weight") if self.attn_sinks else None
        out = attend_lanes(blk, hp, q, k, v, k_cache, v_cache, kq_scale, self.is_swa(il), self.attn_softcap, sinks)
        return self.gate_heads(ctx, w, il, cur, out)

    def layer_hp(self, il: int) -> HParams:
        """The hyperparameters block il attends with (a family with per-layer head counts changes n_head)."""
        return self.hp

    def gate_heads(self, ctx: Context, w: Weights, il: int, cur: Tensor, out: Tensor) -> Tensor:
        """Block il's attention output F32 [head_dim * n_head, n] gated per head, where the family gates it (cur:
        the attention's normed input)."""
        return out

    def build_ffn_out(self, ctx: Context, w: Weights, p: str, ffn_out: Tensor, ffn_inp: Tensor) -> Tensor:
        """The FFN's output joins the residual (after its post norm, where the family has one)."""
        if self.post_norms:
            ffn_out = self.norm(ctx, w, ffn_out, p + "post_ffw_norm.weight")
        if self.residual_scale:
            ffn_out = ctx.scale(ffn_out, self.residual_scale)
        return ctx.add(ffn_out, ffn_inp)

    def build_qkv(
        self, ctx: Context, w: Weights, p: str, cur: Tensor, n: int
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """cur F32 [n_embd, n] -> q F32 [head_dim, n_head, n], k F32 [head_dim, n_head_kv, n], v F32
        [n_embd_gqa, n] (v may be a strided view); k and v None where the block reads another's K/V."""
        hp = self.layer_hp(int(p.split(".")[1]))
        q = ctx.mul_mat(w(p + "attn_q.weight"), cur)
        k = ctx.mul_mat(w(p + "attn_k.weight"), cur)
        v = ctx.mul_mat(w(p + "attn_v.weight"), cur)
        if self.has_qkv_bias:
            q = ctx.add(q, w(p + "attn_q.bias"))
            k = ctx.add(k, w(p + "attn_k.bias"))
            v = ctx.add(v, w(p + "attn_v.bias"))
        return ctx.reshape(q, [hp.head_dim, hp.n_head, n]), ctx.reshape(k, [hp.head_dim, hp.n_head_kv, n]), v

    def build_ffn(self, ctx: Context, w: Weights, p: str, cur: Tensor) -> Tensor:
        """The normed input F32 [n_embd, n] -> F32 [n_embd, n]: a gated FFN with separate gate and up, or the
        mixture of experts (arch/moe.py)."""
        if self.is_moe(int(p.split(".")[1])):
            return build_moe_ffn(self, ctx, w, p, cur)
        gate = ctx.mul_mat(w(p + "ffn_gate.weight"), cur)
        up = ctx.mul_mat(w(p + "ffn_up.weight"), cur)
        return ctx.mul_mat(
            w(p + "ffn_down.weight"), self.glu(ctx, gate, up, self.swiglu_limits(int(p.split(".")[1]))[1])
        )

    def glu(self, ctx: Context, gate: Tensor, up: Tensor, limit: float = 0.0) -> Tensor:
        return ctx.geglu_split(gate, up) if self.ffn_glu == "geglu" else swiglu(ctx, gate, up, limit)

    # -- mixture of experts: the FFN (its hooks are above, beside is_moe) ------------
    def shared_ffn(self, ctx: Context, w: Weights, p: str, cur: Tensor) -> Tensor | None:
        """What runs beside block p's routed experts over the FFN's input cur (a shared expert; None: nothing)."""
        return build_shared_expert_only(self, ctx, w, p, cur)


class Rows(Protocol):
    """each_lane's rows(t, dims): a lane's rows of t."""

    def __call__(self, t: Tensor, dims: int = 3) -> Tensor: ...


def each_lane(ctx: Context, inp: StepInputs, attend_one: Callable[[int, StepInputs, Rows], Tensor]) -> Tensor:
    """A pass whose sequences each attend over their own memory: attend_one(j, lane, rows) per lane j of
    inp.lanes, where rows(t, dims=3) views the lane's rows of t (a 2-D or 3-D tensor whose last dimension is the
    tokens); the results joined along the tokens."""
    cur: Tensor | None = None
    for j, lane in enumerate(inp.lanes or []):

        def rows(t: Tensor, dims: int = 3, lane: StepInputs = lane) -> Tensor:
            return ctx.view(t, list(t.ne[: dims - 1]) + [lane.n_tokens], list(t.nb[1:dims]), lane.row0 * t.nb[dims - 1])

        out = attend_one(j, lane, rows)
        cur = out if cur is None else ctx.concat(cur, out, 1)
    assert cur is not None
    return cur


def leading(ctx: Context, cache: Tensor, g: int) -> Tensor:
    """The first g values of every row of a cache (all of it where g is its width)."""
    return cache if g == cache.ne[0] else ctx.view(cache, [g, cache.ne[1]], [cache.nb[1]], 0)


def build_attn(
    ctx: Context,
    gf: Graph,
    hp: HParams,
    inp: StepInputs,
    q: Tensor,
    k: Tensor | None,
    v: Tensor | None,
    k_cache: Tensor,
    v_cache: Tensor,
    scale: float,
    mask: Tensor | None,
    softcap: float = 0.0,
    sinks: Tensor | None = None,
) -> Tensor:
    """Writes k/v into the cache rows of this step and attends over the first n_kv rows, as `mask` lets
    (F32 [n_kv, n_tokens], F16 with flash attention); softcap: KQ -> softcap * tanh(KQ / softcap).

    q F32 [head_dim, n_head, n_tokens], k F32 [head_dim, n_head_kv, n_tokens],
    v F32 [n_embd_v_gqa, n_tokens] (rows may be strided); k_cache F16 [n_embd_gqa, n_ctx];
    v_cache F16 [n_embd_v_gqa, n_ctx] (stored transposed: [n_ctx, n_embd_v_gqa] when not flash_attn).
    The caches may be wider than the layer's K and V (hp.kv_width: layers differ); k and v None: the layer
    writes nothing and attends over another's K/V (Architecture.kv_source).
    Returns F32 [head_dim_v*n_head, n_tokens] (head_dim_v: head_dim unless V heads are narrower).

    With inp.n_streams = S > 1 the caches hold S sequences one after another ([n_embd_gqa, n_ctx * S]), the rows
    are S runs of n / S tokens, one per sequence, and the mask is [n_kv, n / S, 1, S]: one attention over the S
    sequences, each over its own rows of the cache (a 4-D batch, as llama.cpp's K/V streams).
    """
    k_rot = inp.k_rots.get(hp.head_dim, inp.k_rot) if inp.k_rots else inp.k_rot
    if k_rot is not None:  # a quantized cache's rotations: Q, K and V turned before, the output back after
        q = ctx.mul_mat_hadamard(q, k_rot)
        k = None if k is None else ctx.mul_mat_hadamard(k, k_rot)
    if inp.v_rot is not None and v is not None:
        v = ctx.mul_mat_hadamard(v, inp.v_rot)
    S = inp.n_streams
    n, n_kv, d = inp.n_tokens, inp.n_kv, hp.head_dim
    dv = hp.head_dim_v or d
    t = n // S
    n_ctx = k_cache.shape[1] // S
    es = v_cache.element_size  # a transposed V is of whole elements (F32, F16, BF16)
    gw = v_cache.ne[0]  # the V cache's width (wider than the layer's V where layers differ)
    if k is not None and v is not None:
        write_kv(ctx, gf, hp, inp, k, v, k_cache, v_cache)

    def heads(cache: Tensor, d: int) -> Tensor:  # [d, n_head_kv, n_kv, S]
        rs = cache.nb[1]
        return ctx.view(cache, [d, hp.n_head_kv, n_kv, S], [row_size(cache.type, d), rs, rs * n_ctx], 0)

    if S > 1:
        q = ctx.reshape(q, [d, hp.n_head, t, S])
    qp = ctx.permute(q, 0, 2, 1, 3)  # [d, t, n_head, S]
    kp = ctx.permute(heads(k_cache, d), 0, 2, 1, 3)  # [d, n_kv, n_head_kv, S]
    if inp.flash_attn:
        vp = ctx.permute(heads(v_cache, dv), 0, 2, 1, 3)  # [dv, n_kv, n_head_kv, S]
        if k_cache.type == F32:  # flash attention reads F16 K/V: an F32 cache is cast, as llama.cpp does
            kp = ctx.cast(kp, F16)
        if v_cache.type == F32:
            vp = ctx.cast(vp, F16)
        cur = ctx.flash_attn_ext(qp, kp, vp, mask, scale, softcap=softcap, sinks=sinks)  # [dv, n_head, t, S]
        return unrotated(ctx, inp, ctx.reshape(cur, [dv * hp.n_head, n]))
    vt = ctx.view(v_cache, [n_kv, hp.n_head_kv, dv, S], [n_ctx * dv * es, n_ctx * es, n_ctx * gw * es], 0)
    vp = ctx.permute(vt, 0, 2, 1, 3)  # [n_kv, dv, n_head_kv, S]
    kq = ctx.mul_mat(kp, qp)  # [n_kv, t, n_head, S]
    ctx.mul_mat_set_prec_f32(kq)
    if softcap:
        kq = ctx.scale(ctx.tanh(ctx.scale(kq, float(f32(1.0) / f32(softcap)))), softcap)
    kq = ctx.soft_max_ext(kq, mask, scale, sinks=sinks)
    kqv = ctx.mul_mat(vp, kq)  # [dv, t, n_head, S]
    cur = ctx.cont(ctx.permute(kqv, 0, 2, 1, 3))  # [dv, n_head, t, S]
    return unrotated(ctx, inp, ctx.reshape(cur, [dv * hp.n_head, n]))


def write_kv(
    ctx: Context, gf: Graph, hp: HParams, inp: StepInputs, k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor
) -> None:
    """This step's K and V rows into their caches, at inp.k_idxs and inp.v_idxs (V transposed without flash
    attention)."""
    n, g, gv, gw = inp.n_tokens, hp.n_embd_gqa, hp.n_embd_v_gqa, v_cache.ne[0]
    assert inp.k_idxs is not None and inp.v_idxs is not None
    gf.expand(ctx.set_rows(leading(ctx, k_cache, g), ctx.reshape(k, [g, n]), inp.k_idxs))
    if inp.flash_attn:
        gf.expand(ctx.set_rows(leading(ctx, v_cache, gv), v, inp.v_idxs))
        return
    if v.nb[1] != gv * v.element_size:
        v = ctx.cont(v)  # a view into a fused QKV: rows made contiguous, as llama.cpp
    if gv < gw:  # the indices run over the cache's width: zeros after the layer's values, as llama.cpp pads
        v = ctx.pad(ctx.reshape(v, [gv, n]), [gw - gv])
    flat = ctx.reshape(v_cache, [1, gw * k_cache.shape[1]])  # every stream's rows
    gf.expand(ctx.set_rows(flat, ctx.reshape(v, [1, gw * n]), inp.v_idxs))


def unrotated(ctx: Context, inp: StepInputs, out: Tensor) -> Tensor:
    """An attention's output turned back by the V cache's rotation, where it has one."""
    return out if inp.v_rot is None else ctx.mul_mat_hadamard(out, inp.v_rot)


def attend_latent(
    ctx: Context,
    gf: Graph,
    hp: HParams,
    inp: StepInputs,
    q: Tensor,
    k: Tensor,
    k_cache: Tensor,
    scale: float,
    mask: Tensor | None,
    v_b: Tensor,
    sinks: Tensor | None = None,
) -> Tensor:
    """Multi-head latent attention over a memory of K only (llama.cpp's build_attn with a K-only cache and
    v_mla): writes k F32 [g, 1, n] (g = kv_lora_rank + n_rot) into this step's rows of k_cache [g, n_ctx * S];
    q F32 [g, n_head, n] attends as MQA over the first n_kv rows, V being the first head_dim_v (kv_lora_rank)
    values of each row; the result is decompressed per head by v_b [kv_lora_rank, v_head, n_head]. Streams as in
    build_attn. Returns F32 [v_head * n_head, n]."""
    S = inp.n_streams
    n, n_kv, g, dv = inp.n_tokens, inp.n_kv, hp.n_embd_gqa, hp.head_dim_v
    n_ctx = k_cache.shape[1] // S
    assert inp.k_idxs is not None
    gf.expand(ctx.set_rows(leading(ctx, k_cache, g), ctx.reshape(k, [g, n]), inp.k_idxs))
    rs = k_cache.nb[1]  # wider than g where the rows hold more (deepseek32's indexer keys)
    kp = ctx.permute(ctx.view(k_cache, [g, 1, n_kv, S], [rs, rs, rs * n_ctx], 0), 0, 2, 1, 3)  # [g, n_kv, 1, S]
    vp = ctx.permute(ctx.view(k_cache, [dv, 1, n_kv, S], [rs, rs, rs * n_ctx], 0), 0, 2, 1, 3)  # [dv, n_kv, 1, S]
    if S > 1:
        q = ctx.reshape(q, [g, hp.n_head, n // S, S])
    qp = ctx.permute(q, 0, 2, 1, 3)  # [g, t, n_head, S]
    if inp.flash_attn:
        if k_cache.type == F32:
            kp, vp = ctx.cast(kp, F16), ctx.cast(vp, F16)
        cur = ctx.permute(ctx.flash_attn_ext(qp, kp, vp, mask, scale, sinks=sinks), 0, 2, 1, 3)  # [dv, t, n_head, S]
    else:
        kq = ctx.mul_mat(kp, qp)  # [n_kv, t, n_head, S]
        ctx.mul_mat_set_prec_f32(kq)
        kq = ctx.soft_max_ext(kq, mask, scale, sinks=sinks)
        cur = ctx.mul_mat(ctx.cont(ctx.transpose(vp)), kq)  # [dv, t, n_head, S]
    cur = ctx.cont(ctx.permute(ctx.mul_mat(v_b, cur), 0, 2, 1, 3))  # [v_head, n_head, t, S]
    return ctx.reshape(cur, [cur.ne[0] * hp.n_head, n])


def fused_qkv(ctx: Context, w: Weights, p: str, cur: Tensor, hp: HParams) -> tuple[Tensor, Tensor, Tensor]:
    """Q [head_dim, n_head, n] and K [head_dim, n_head_kv, n] as views of one attn_qkv's rows, V [value width, n]
    after them, as llama.cpp's build_qkv views a fused projection (with its bias where the file has one)."""
    qkv = ctx.mul_mat(w(p + "attn_qkv.weight"), cur)
    if w.has(p + "attn_qkv.bias"):
        qkv = ctx.add(qkv, w(p + "attn_qkv.bias"))
    es, d, n, row = qkv.element_size, hp.head_dim, cur.ne[1], qkv.nb[1]
    n_q, n_k = hp.n_head * d, hp.n_head_kv * d
    q = ctx.view(qkv, [d, hp.n_head, n], [d * es, row], 0)
    k = ctx.view(qkv, [d, hp.n_head_kv, n], [d * es, row], n_q * es)
    v = ctx.view(qkv, [(hp.head_dim_v or d) * hp.n_head_kv, n], [row], (n_q + n_k) * es)
    return q, k, v


def fused_qkv_shapes(shapes: dict[str, tuple[int, ...]], p: str, n_embd: int) -> dict[str, tuple[int, ...]]:
    """`shapes` with block p's attn_q, attn_k and attn_v (and their biases) as one attn_qkv."""
    rows = sum(shapes.pop(p + f"attn_{x}.weight")[1] for x in "qkv")
    biases = [shapes.pop(p + f"attn_{x}.bias", None) for x in "qkv"]
    shapes[p + "attn_qkv.weight"] = (n_embd, rows)
    if all(biases):
        shapes[p + "attn_qkv.bias"] = (rows,)
    return shapes


def whole(t: Tensor, dims: int = 3) -> Tensor:
    """Rows of a pass that is one sequence: all of t."""
    return t


def top_k_mask(ctx: Context, mask: Tensor, top: Tensor, scratch: Tensor) -> Tensor:
    """llama.cpp's top-k mask of sparse attention: -inf but at each query's chosen rows top (I32 [k, t, S]), plus
    the visibility mask [n_kv, t, 1, S] (F16 with flash attention); its zeros filled over a view of scratch (F32, k *
    t * S values at least, as llama.cpp fills them over the indexer's scores)."""
    n_kv, t, S, k = mask.ne[0], mask.ne[1], mask.ne[3], top.ne[0]
    shut = ctx.fill(mask, float("-inf"))
    es = shut.element_size
    shut = ctx.view(shut, [1, n_kv, t, S], [es, es * n_kv, es * n_kv * t])
    zeros = ctx.fill(ctx.view(scratch, [1, k, t, S], [4, 4 * k, 4 * k * t]), 0.0)
    opened = ctx.set_rows(shut, zeros, top)
    opened = ctx.view(opened, [n_kv, t, 1, S], [es * n_kv, es * n_kv * t, es * n_kv * t])
    return ctx.add(opened, mask)


def attend_lanes(
    blk: BlockGraph,
    hp: HParams,
    q: Tensor,
    k: Tensor | None,
    v: Tensor | None,
    k_cache: Memory,
    v_cache: Memory,
    scale: float,
    swa: bool = False,
    softcap: float = 0.0,
    sinks: Tensor | None = None,
) -> Tensor:
    """build_attn over the pass's K/V, or, in a pass with lanes, each sequence's rows over its own; each with its
    own mask (its sliding-window one where swa)."""

    def attend_one(lane: StepInputs, rows: Rows, kc: Tensor, vc: Tensor) -> Tensor:
        kr = None if k is None else rows(k)
        vr = None if v is None else rows(v, 2)
        mask = lane.mask_swa if swa else lane.mask
        return build_attn(blk.ctx, blk.gf, hp, lane, rows(q), kr, vr, kc, vc, scale, mask, softcap, sinks)

    if blk.inp.lanes is None:
        return attend_one(blk.inp, whole, one_memory(k_cache), one_memory(v_cache))
    return each_lane(
        blk.ctx, blk.inp, lambda j, lane, rows: attend_one(lane, rows, lane_memory(k_cache, j), lane_memory(v_cache, j))
    )


def each_sequence(
    ctx: Context,
    inp: StepInputs,
    il: int,
    conv_state: Memory,
    state: Memory,
    run: Callable[[Rows, int, Tensor, Tensor, Tensor | None], Tensor],
) -> Tensor:
    """A recurrent layer's pass, sequence by sequence: run(rows, n, conv_state, state, record) over one chain of
    rows from lane 0's states (one sequence, or its tokens as lanes: inp.chain; `record` where the layer leaves
    the pass's inputs for replay), or over each lane's rows from its own states (record None); the results
    joined along the tokens."""
    if inp.lanes is None or inp.chain:
        mem = (
            (lane_memory(conv_state, 0), lane_memory(state, 0))
            if inp.chain
            else (one_memory(conv_state), one_memory(state))
        )
        return run(whole, inp.n_tokens, *mem, inp.record(il) if inp.record is not None else None)
    return each_lane(
        ctx,
        inp,
        lambda j, lane, rows: run(rows, lane.n_tokens, lane_memory(conv_state, j), lane_memory(state, j), None),
    )


def conv_input(ctx: Context, gf: Graph, window: Tensor, x: Tensor, n: int) -> Tensor:
    """A causal conv's input: one sequence's n rows x [ch, n] after its window (F32 [w, ch, 1], in its conv
    state), F32 [w + n, ch, 1]; the window after the rows written back."""
    ch = window.ne[1]
    if x.nb[1] != ch * x.element_size:
        x = ctx.cont(x)
    xx = ctx.concat(window, ctx.transpose(ctx.reshape(x, [ch, n, 1])), 0)
    slide_window(ctx, gf, xx, n, window)
    return xx


def slide_window(ctx: Context, gf: Graph, xx: Tensor, k: int, window: Tensor) -> None:
    """The window after k of xx's rows (xx: the window's rows, then a pass's: conv_input's, or a record of it)
    written back to `window` (F32 [w, ch, 1])."""
    rows = ctx.view(xx, list(window.ne[:3]), [xx.nb[1], xx.nb[2]], k * xx.element_size)
    gf.expand(ctx.cpy(rows, window))


def packed_views(ctx: Context, record: Tensor, shapes: list[list[int]]) -> list[Tensor]:
    """Views of contiguous tensors of `shapes` (2-D or 3-D), one after another in record."""
    views, off, es = [], 0, record.element_size
    for shape in shapes:
        nb = [shape[0] * es] + ([shape[0] * shape[1] * es] if len(shape) == 3 else [])
        views.append(ctx.view(record, shape, nb, off))
        off += shape[0] * shape[1] * es
    return views
