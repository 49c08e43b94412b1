"""What every family's graphs read: the hyperparameters, the weights by name, a step's input tensors and a
layer's memory."""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Protocol, SupportsFloat, Union, runtime_checkable

import numpy as np

from .. import native
from ..errors import GGUFError, UnsupportedModelError

ROPE_SCALINGS = ("none", "linear", "yarn", "longrope")

_libm = ctypes.CDLL(ctypes.util.find_library("m") or "libm.so.6")
_libm.logf.restype, _libm.logf.argtypes = ctypes.c_float, [ctypes.c_float]


def logf(x: SupportsFloat) -> np.float32:
    """C's logf: llama.cpp derives its scales with it."""
    return np.float32(_libm.logf(np.float32(x)))


def f32(x: SupportsFloat) -> np.float32:
    """x as a C float: hyperparameters derived in float arithmetic, as llama.cpp derives them, so graphs get
    the same bits."""
    return np.float32(x)


def swiglu(
    ctx: native.Context, gate: native.Tensor, up: native.Tensor, limit: float = 0.0, fused: bool = False
) -> native.Tensor:
    """silu(gate) * up; with a limit (Step 3.5's SwiGLU clamps, llama.cpp's build_ffn and build_moe_ffn), up
    clamped to [-limit, limit] and silu(gate) to at most limit (fused: in one op, ggml_swiglu_clamp, as llama.cpp
    computes DeepSeek V4's)."""
    if limit <= 1e-6:
        return ctx.swiglu_split(gate, up)
    if fused:
        return ctx.swiglu_clamp(gate, up, limit)
    up = ctx.clamp(up, -limit, limit)
    return ctx.mul(ctx.clamp(ctx.silu(gate), float("-inf"), limit), up)


def situ(ctx: native.Context, gate: native.Tensor, up: native.Tensor, beta: float, linear_beta: float) -> native.Tensor:
    """kimi-k3's situ activation: beta tanh(gate / beta) sigmoid(gate) times up, up through linear_beta tanh(up /
    linear_beta) where linear_beta > 0 (llama.cpp's kimi_k3_situ, in its op order)."""
    a = ctx.mul(ctx.scale(ctx.tanh(ctx.scale(gate, float(f32(1.0) / f32(beta)))), beta), ctx.sigmoid(gate))
    if linear_beta > 0:
        up = ctx.scale(ctx.tanh(ctx.scale(up, float(f32(1.0) / f32(linear_beta)))), linear_beta)
    return ctx.mul(a, up)


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
    rope_scale: float  # freq_scale: 1 / rope.scaling.factor
    n_rot: int
    rope_scaling: str = "linear"  # none, linear, yarn, longrope (llama.cpp's default when the key is absent)
    n_ctx_orig: int = 0  # rope.scaling.original_context_length, else n_ctx_train
    rope_ext_factor: float = 0.0  # YaRN: 1
    rope_attn_factor: float = 1.0  # YaRN's magnitude correction times rope.scaling.attn_factor
    n_expert: int = 0  # mixture of experts: experts per layer (0: a dense FFN)
    n_expert_used: int = 0  # experts each token is routed to
    head_dim_v: int = 0  # value_length where it differs from the key's (0: head_dim)
    latent_kv: bool = False  # the memory holds K only; V is K's first head_dim_v values (MLA)
    n_nextn: int = 0  # next-token-prediction (MTP) blocks after the n_layer of the model
    n_layer_kv: int = 0  # layers with a K/V cache where not all (a hybrid model's attention ones)
    state_bytes: int = 0  # a sequence's recurrent states over every layer (hybrid models)
    n_head_per_layer: tuple[int, ...] = ()  # attention.head_count where it differs by layer (step35)
    n_head_kv_per_layer: tuple[int, ...] = ()  # attention.head_count_kv where it differs by layer (gemma4)
    kv_width: int = 0  # K (and V) values per token and layer in the memory where layers differ: the widest
    kv_width_v: int = 0  # V's where it differs from K's (mimo2: narrower value heads)
    n_residual: int = 0  # values per token of the residual between blocks where it is not n_embd (DeepSeek V4's
    # hyper-connections: 4 streams of n_embd); an MTP block then reads the last block's residual rows, not their
    # output norm (llama.cpp's n_embd_out)

    k_only_rot: bool = False  # a latent (K-only) cache that a quantized type rotates as a K cache (deepseek4)
    n_ffn_inp: int = 0  # values per token a block keeps across its FFN where not residual_width (deepseek4's
    # streams, their post weights and mixing matrix)

    @property
    def residual_width(self) -> int:
        """F32 values per token of the activations a block reads and writes."""
        return self.n_residual or self.n_embd

    @property
    def ffn_inp_width(self) -> int:
        """F32 values per token of what a block's FFN output joins (build_attn_part's ffn_inp)."""
        return self.n_ffn_inp or self.residual_width

    @property
    def n_embd_gqa(self) -> int:
        return self.kv_width or self.head_dim * self.n_head_kv

    @property
    def n_embd_v_gqa(self) -> int:
        """V values per token and layer in the memory (0: none, V is read from K)."""
        if self.latent_kv:
            return 0
        return self.kv_width_v or self.kv_width or (self.head_dim_v or self.head_dim) * self.n_head_kv

    @property
    def v_channels(self) -> int:
        """The channels a transposed V's indices run over: n_embd_v_gqa, or K's width with no V."""
        return self.n_embd_v_gqa or self.n_embd_gqa

    @classmethod
    def from_metadata(
        cls,
        meta: Mapping[str, Any],
        arch: str,
        rms_eps_keys: tuple[str, ...] = ("attention.layer_norm_rms_epsilon",),
        kv_heads_per_layer: bool = False,
    ) -> "HParams":
        """rms_eps_keys: where the family reads its RMS norms' epsilon, the first present (one is required);
        kv_heads_per_layer: the family reads attention.head_count_kv per layer (n_head_kv: the first layer's)."""

        def get(key: str, default: Any = None) -> Any:
            v = meta.get(f"{arch}.{key}", default)
            if v is None:
                raise GGUFError(f"GGUF metadata lacks '{arch}.{key}'")
            return v

        try:
            n_embd = int(get("embedding_length"))
            heads = get("attention.head_count")
            per_head = tuple(int(x) for x in heads) if isinstance(heads, (list, tuple)) else ()
            n_head = per_head[0] if per_head else int(heads)  # llama.cpp's n_head(): the first layer's
            kv = get("attention.head_count_kv", n_head)
            per_kv = tuple(int(x) for x in kv) if isinstance(kv, (list, tuple)) and kv_heads_per_layer else ()
            if per_kv:
                kv = per_kv[0]
            elif isinstance(kv, (list, tuple)):  # per layer (LFM2: 0 in its conv layers): the attention layers' count
                counts = {int(x) for x in kv if int(x)}
                if len(counts) > 1:
                    raise UnsupportedModelError(f"'{arch}.attention.head_count_kv' varies by layer: {sorted(counts)}")
                kv = counts.pop() if counts else n_head
            n_head_kv = int(kv)
            head_dim = int(get("attention.key_length", n_embd // max(n_head, 1)))
            v_dim = int(get("attention.value_length", n_embd // max(n_head, 1)))  # llama.cpp's n_embd_head_v
            n_vocab = meta.get(f"{arch}.vocab_size") or len(meta.get("tokenizer.ggml.tokens") or [])
            n_ctx_train = int(get("context_length"))
            rope = _rope_scaling(meta, arch, n_ctx_train)
            n_nextn = int(get("nextn_predict_layers", 0))
            ff = get("feed_forward_length", 0)  # optional in llama.cpp: a model of experts only
            # per layer (Nemotron-H: 0 in its mixer and attention blocks): the widest; the family reads the rest
            n_ff = max((int(x) for x in ff), default=0) if isinstance(ff, (list, tuple)) else int(ff)
            hp = cls(
                arch=arch,
                n_layer=int(get("block_count")) - n_nextn,  # MTP blocks follow
                n_nextn=n_nextn,
                n_embd=n_embd,
                n_head=n_head,
                n_head_kv=n_head_kv,
                head_dim=head_dim,
                n_ff=n_ff,
                n_vocab=int(n_vocab),
                n_ctx_train=n_ctx_train,
                rms_eps=float(get(next((k for k in rms_eps_keys if f"{arch}.{k}" in meta), rms_eps_keys[0]))),
                rope_base=float(get("rope.freq_base", 10000.0)),
                n_rot=int(get("rope.dimension_count", head_dim)),
                n_expert=int(get("expert_count", 0)),
                n_expert_used=int(get("expert_used_count", 0)),
                head_dim_v=0 if v_dim == head_dim else v_dim,
                n_head_per_layer=per_head if len(set(per_head)) > 1 else (),
                n_head_kv_per_layer=per_kv if len(set(per_kv)) > 1 else (),
                **rope,
            )
        except (TypeError, ValueError) as e:
            if isinstance(e, GGUFError):
                raise
            raise GGUFError(f"GGUF hyperparameters are malformed: {e}") from e
        if min(hp.n_layer, hp.n_embd, hp.n_head, hp.n_head_kv, hp.head_dim, hp.n_vocab) <= 0 or hp.n_ff < 0:
            raise GGUFError(f"GGUF hyperparameters are not positive: {hp}")
        if hp.n_head % hp.n_head_kv or not 0 < hp.n_rot <= hp.head_dim or hp.n_rot % 2:  # 0: llama.cpp hangs
            raise GGUFError(f"GGUF hyperparameters are inconsistent: {hp}")
        if hp.n_expert and not 0 < hp.n_expert_used <= hp.n_expert:
            raise GGUFError(f"expert_used_count ({hp.n_expert_used}) must be in 1..expert_count ({hp.n_expert})")
        return hp


def yarn_attn_factor(freq_scale: SupportsFloat, mscale_all_dims: SupportsFloat | None = None) -> np.float32:
    """YaRN's attn_factor as llama_context derives it, before rope.scaling.attn_factor: get_mscale(factor, 1), or
    with rope.scaling.yarn_log_multiplier that over get_mscale(factor, mscale_all_dims); times the cancelling of
    the factor ggml-cpu's rope applies."""
    fac = f32(1.0) / f32(freq_scale)
    log = logf(fac)

    def get_mscale(m: SupportsFloat) -> np.float32:
        return f32(1.0) if fac <= 1 else f32(0.1) * f32(m) * log + f32(1.0)

    attn = get_mscale(1.0) if mscale_all_dims is None else get_mscale(1.0) / get_mscale(mscale_all_dims)
    return attn * (f32(1.0) / (f32(1.0) + f32(0.1) * log))


def _rope_scaling(meta: Mapping[str, Any], arch: str, n_ctx_train: int) -> dict[str, Any]:
    """RoPE scaling as llama.cpp's context derives it (llama_context's constructor): freq_scale, YaRN's
    ext_factor and attn_factor, the original context."""
    kind = meta.get(f"{arch}.rope.scaling.type", "linear")
    if kind not in ROPE_SCALINGS:
        raise UnsupportedModelError(
            f"RoPE scaling type {kind!r} ('{arch}.rope.scaling.type') is not supported ({', '.join(ROPE_SCALINGS)})"
        )
    # rope.scaling.factor, else the older rope.scale_linear
    factor = f32(meta.get(f"{arch}.rope.scaling.factor") or meta.get(f"{arch}.rope.scale_linear") or 0.0)
    if factor < 0:
        raise GGUFError(f"'{arch}.rope.scaling.factor' is negative: {factor}")
    scale = f32(1.0) if factor == 0 or kind == "none" else f32(1.0) / factor
    ext = f32(1.0 if kind == "yarn" else 0.0)
    attn = yarn_attn_factor(scale) if ext != 0 else f32(1.0)
    attn *= f32(meta.get(f"{arch}.rope.scaling.attn_factor", 1.0))
    n_orig = int(meta.get(f"{arch}.rope.scaling.original_context_length") or n_ctx_train)
    return dict(
        rope_scaling=kind,
        rope_scale=float(scale),
        rope_ext_factor=float(ext),
        rope_attn_factor=float(attn),
        n_ctx_orig=n_orig,
    )


@runtime_checkable
class PassInputs(Protocol):
    """A family whose blocks read inputs of their own (StepInputs.own), filled each pass from its sequences'
    positions, as llama.cpp's graph inputs fill themselves (qwen4exp's block-sparse attention)."""

    def own_inputs(self, n: int, n_kv: int, streams: int) -> dict[str, tuple[native.GGMLType, list[int]]]:
        """name -> (type, shape) of the inputs of a pass (or lane) of n rows over n_kv K/V rows in `streams`."""
        ...

    def own_values(self, positions: Sequence[np.ndarray], n_kv: int) -> dict[str, np.ndarray]:
        """Their values, from each stream's positions in the pass."""
        ...

    def pass_inputs(self, n: int) -> dict[str, tuple[native.GGMLType, list[int]]]:
        """name -> (type, shape) of the inputs of a whole pass of n rows (beside its lanes')."""
        ...

    def pass_values(self, contexts: Sequence[Sequence[int]], rows: Sequence[int]) -> dict[str, np.ndarray]:
        """Their values, from each lane's sequence: its tokens up to the lane's last row, the lane's rows last."""
        ...


class Weights(Protocol):
    """name -> paged tensor (the executor decides where its bytes are)."""

    def __call__(self, name: str) -> native.Tensor: ...
    def has(self, name: str) -> bool: ...


@dataclass
class StepInputs:
    """Tensors shared by every layer graph of one micro-batch (all already filled).

    tokens   I32 [n_tokens]              positions I32 [n_tokens] (4 * n_tokens with rope sections)
    mask     F32 [n_kv, n_tokens]        causal mask, 0 or -inf (F16 with flash_attn)
    mask_swa same as mask                the causal mask of sliding-window layers (None without them)
    k_idxs   I64 [n_tokens]              KV rows written this step
    v_idxs   I64 [n_tokens*n_embd_gqa]   (transposed V) or [n_tokens]
    out_ids  I32 [n_outputs]             rows whose logits are wanted

    A pass over several sequences has `lanes`: per sequence, in row order, its own StepInputs (its rows
    [row0, row0 + n_tokens), its n_kv, masks and K/V indices; no tokens, positions or out_ids), and attends
    over its own K/V (the k_cache/v_cache given to the block are then lists, one per lane). Or, when the
    sequences have as many rows each and their memory is one tensor, n_streams of them attend at once (see
    build_attn): mask [n_kv, n_tokens / n_streams, 1, n_streams], K/V indices into the whole tensor.
    """

    n_tokens: int
    n_kv: int
    n_outputs: int
    tokens: native.Tensor | None  # None in a lane, as positions and out_ids
    positions: native.Tensor | None
    mask: native.Tensor | None  # None in a pass with lanes, as k_idxs and v_idxs
    k_idxs: native.Tensor | None
    v_idxs: native.Tensor | None
    out_ids: native.Tensor | None
    flash_attn: bool
    mask_swa: native.Tensor | None = None
    lanes: list[StepInputs] | None = None
    row0: int = 0
    k_rot: native.Tensor | None = None  # F32 [n, n] Walsh-Hadamard matrices Q and K (k_rot), V and the output
    v_rot: native.Tensor | None = None  # (v_rot) are rotated by for a quantized K (V) cache, as llama.cpp does
    k_rots: Mapping[int, native.Tensor] | None = None  # k_rot of the layers whose heads differ, by head size
    indexer_rot: native.Tensor | None = None  # F32 [n, n]: the Walsh-Hadamard matrix a sparse-attention indexer uses
    kept_mask: native.Tensor | None = None  # like mask: the last sparse-attention mask, for blocks that reuse it
    n_streams: int = 1  # > 1: the rows are that many sequences' runs of equal length, attending at once
    keep_rows: bool = False  # the last block keeps every row (the output norm of each is wanted: an MTP drafter's)
    hidden: native.Tensor | None = None  # F32 [n_embd, n_tokens]: the hidden rows an MTP block reads
    # F32 [n_embd_per_layer, n_tokens, n_layer]: each block's own input (gemma4's per-layer embeddings), written by
    # the embedding's graph (Architecture.build_pass_inputs)
    per_layer: native.Tensor | None = None
    chain: bool = False  # the lanes are one sequence's tokens, each its own lane (a recurrent layer: one chain)
    attn_scale: native.Tensor | None = None  # F32 [1, 1, n_tokens]: the attention temperature (Architecture.attn_temp)
    # layer -> the tensor where a recurrent layer leaves its pass's inputs for replay, or None
    record: Callable[[int], native.Tensor | None] | None = None
    compressed: Mapping[int, CompressorInputs] | None = None  # by ratio: a compressed K/V's inputs (deepseek4)
    own: Mapping[str, native.Tensor] | None = None  # a family's own inputs (PassInputs), in a lane its lane's


@dataclass(frozen=True)
class CompressorShape:
    """One compression ratio's part of a pass's shape (deepseek4): blocks completed in it and the sources they
    read, ring rows written, compressed rows attended, and whether a lightning indexer reads them too."""

    ratio: int
    blocks: int
    reads: int
    persist: int
    width: int
    indexed: bool


@dataclass
class CompressorInputs:
    """One compression ratio's inputs of a pass over one sequence (DeepSeek V4's compressed K/V; see
    arch/deepseek4.py): each row's slot in the ratio's position biases, the compressor's sources and the rows it
    writes (None where no block of `ratio` tokens completes in the pass), the rows its ring keeps, and which
    compressed rows each row sees.

    state_pos   I32 [n]           position mod ratio
    read_idxs   I32 [r * blocks]  sources in [ring rows | the pass's rows | a zero row] (CSA: 2 r per block)
    write_rows  I64 [blocks]      the compressed rows written (block index)
    comp_pos    I32 [blocks]      each block's first position (its RoPE position)
    persist_src I32 [m]           the pass's rows the ring keeps ...
    persist_dst I64 [m]           ... at these ring rows
    mask        [n_comp, n]       0 where the row sees compressed row j, -inf elsewhere (F16 with flash_attn)
    lid_mask    F16 [n_comp, n]   the same for the lightning indexer (ratio 4)
    """

    ratio: int
    state_pos: native.Tensor
    read_idxs: native.Tensor | None
    write_rows: native.Tensor | None
    comp_pos: native.Tensor | None
    persist_src: native.Tensor
    persist_dst: native.Tensor
    mask: native.Tensor
    lid_mask: native.Tensor | None = None


@dataclass(frozen=True)
class CompressedLayer:
    """A block's compressed memory beside its raw K (DeepSeek V4): compressed rows [head_dim, rows] and the
    indexer's [indexer head, rows] (ratio 4), of the cache's K type; the compressors' rings of recent tokens'
    values and scores, F32 [width, ring rows] (the indexer's for ratio 4). None where the block has none."""

    comp: native.Tensor | None
    lid: native.Tensor | None
    ring_kv: native.Tensor | None
    ring_score: native.Tensor | None
    lid_kv: native.Tensor | None
    lid_score: native.Tensor | None


@dataclass(frozen=True)
class BlockGraph:
    """Block il's graph under construction, as its mixer hooks (build_attention, build_recurrent) take it: the
    ggml context, the graph that cache writes join, the weights and the step's inputs."""

    ctx: native.Context
    gf: native.Graph
    w: Weights
    inp: StepInputs
    il: int


# A layer's memory as its graph reads it: a tensor (K, V, or a recurrent state), a list of them, one per lane
# of a pass with lanes (StepInputs.lanes), or None (a latent K/V's V).
Memory = Union[native.Tensor, Sequence[native.Tensor], CompressedLayer, None]


def one_memory(m: Memory) -> native.Tensor:
    """The memory of a pass without lanes: one tensor."""
    assert isinstance(m, native.Tensor)
    return m


def lane_memory(m: Memory, j: int) -> native.Tensor:
    """Lane j's memory in a pass with lanes."""
    assert m is not None and not isinstance(m, (native.Tensor, CompressedLayer))
    return m[j]


def check_sizes(hp: HParams, meta: Mapping[str, Any], own_v_heads: bool, sliding: bool) -> None:
    """The value heads' size and the sliding window, once a family read its keys: GGUFError for a value length
    of 0 (a latent K/V reads its own key instead) and, where blocks slide, a window of 0 (they would attend to
    nothing: llama.cpp computes NaN, or gpt-oss's sinks alone); UnsupportedModelError for value heads narrower
    than the keys' in a family that has none."""
    v_len = meta.get(f"{hp.arch}.attention.value_length")
    if v_len is not None and int(v_len) <= 0 and not hp.latent_kv:
        raise GGUFError(f"'{hp.arch}.attention.value_length' is {v_len}: value heads need a size")
    if hp.head_dim_v and not hp.latent_kv and not own_v_heads:
        raise UnsupportedModelError(
            f"'{hp.arch}.attention.value_length' ({hp.head_dim_v}) differs from the key length ({hp.head_dim}): "
            "not supported"
        )
    if sliding and meta.get(f"{hp.arch}.attention.sliding_window") == 0:
        raise GGUFError(f"'{hp.arch}.attention.sliding_window' is 0: the sliding blocks would attend to nothing")


def padded(shape: Sequence[int]) -> tuple[int, ...]:
    """A shape as ggml's 4 dimensions, the missing ones 1."""
    return (*shape, *(1,) * (4 - len(shape)))


def attn_scale(attn_temp: tuple[float, int, float], positions: np.ndarray) -> np.ndarray:
    """The attention temperature (scale, floor, offset) of each position (llm_graph_input_attn_temp): F32 [n]."""
    scale, floor, offset = attn_temp
    steps = np.floor((positions.astype(np.float32) + f32(offset)) / f32(floor))
    out: np.ndarray = (np.log(steps.astype(np.float64) + 1.0) * float(f32(scale)) + 1.0).astype(np.float32)
    return out


def check_shapes(arch: str, expected: Mapping[str, tuple[int, ...]], table: Mapping[str, tuple[int, ...]]) -> None:
    """GGUFError naming the first tensor of `expected` that `table` lacks or holds in another shape (as llama.cpp
    compares: trailing dimensions of 1 are equal)."""
    for name, shape in expected.items():
        got = table.get(name)
        if got is None:
            raise GGUFError(f"GGUF lacks tensor '{name}' required by {arch}")
        if padded(got) != padded(shape):
            raise GGUFError(f"tensor '{name}' has shape {list(got)}, expected {list(shape)}")
