"""The mixture-of-experts FFN, as llama.cpp's llm_graph_context::build_moe_ffn builds it for the MoE families
(qwen2moe, qwen3moe, olmoe, Mixtral-style llama, gpt-oss, deepseek2): a router picks n_expert_used of n_expert
experts per token, their FFNs run through ggml_mul_mat_id over 3-D expert tensors, and the outputs are summed with
the router's weights (gating, selection bias, expert groups, renormalisation, scale and activation per the
family's MoeConfig). A shared expert is added (qwen2moe's behind a sigmoid gate). With the experts paged
(the expert cache), the runtime builds a block in parts from these pieces (runtime/exec/expert_steps.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Protocol

import numpy as np

from ..errors import GGUFError, UnsupportedModelError
from ..native import Context, Graph, Tensor
from .base import HParams, Memory, StepInputs, Weights, situ, swiglu


@dataclass
class MoeConfig:
    """How a family's experts route and compute (llama.cpp's build_moe_ffn arguments); a family sets what
    differs from these defaults when it loads."""

    norm_w: bool = True  # the chosen experts' weights renormalised to sum to 1
    gating: str = "softmax"  # or softmax_weight (gpt-oss), sigmoid
    act: str = "swiglu"  # or swiglu_oai (gpt-oss), geglu (gemma4), situ (kimi-k3)
    situ: tuple[float, float] = (0.0, 0.0)  # situ's beta and linear beta
    biases: bool = False  # router and expert biases (gpt-oss)
    probs_bias: bool = False  # exp_probs_b: added to the probabilities experts are chosen by
    probs_bias_name: str = "exp_probs_b.bias"  # its tensor in a block (hy_v3's has no suffix)
    groups: tuple[int, int] = (0, 0)  # expert groups, groups chosen per token (each scored by its top 2)
    w_scale: float = 0.0  # the chosen weights scaled by this (0 or 1: not)
    select_logits: bool = False  # experts chosen by the router's logits, not the probabilities (llama4)
    weight_before: bool = False  # the weights scale each expert's input, not its output (llama4)
    fused_gate_up: bool = False  # one ffn_gate_up_exps (gate rows, then up rows) for the two
    relu2: bool = False  # experts and shared expert ungated: down(relu(up x)^2) (nemotron_h_moe)
    down_scale: bool = False  # each expert's output scaled by ffn_down_exps.scale (gemma4)
    clamp_fused: bool = False  # SwiGLU limits computed by ggml_swiglu_clamp (deepseek4), not clamp, silu and mul
    # blocks whose experts a table picks by token id (deepseek4's hash-routed blocks: ffn_gate_tid2eid, I32 [k, vocab])
    token_table: frozenset[int] = frozenset()

    @property
    def parts(self) -> tuple[str, ...]:
        """The 3-D expert tensors of a block, by the middle of their names (ffn_<part>_exps)."""
        return ("gate_up", "down") if self.fused_gate_up else ("up", "down") if self.relu2 else ("gate", "up", "down")


class Architecture(Protocol):
    """What this module reads and sets of an arch.common.Architecture (which imports this module)."""

    hp: HParams
    names: frozenset[str]
    n_lead: int
    n_ff_exp: int
    n_ff_shexp: int
    shexp_gate: bool
    shexp_sigmoid: bool
    moe: MoeConfig

    def key(self, meta: Mapping[str, Any], name: str, default: Any) -> Any: ...
    def swiglu_limits(self, il: int) -> tuple[float, float]: ...
    def is_moe(self, il: int) -> bool: ...
    def expert_tensors(self, il: int) -> list[str]: ...
    def build_attn_part(
        self, ctx: Context, gf: Graph, w: Weights, inp: StepInputs, il: int, x: Tensor, k_cache: Memory, v_cache: Memory
    ) -> tuple[Tensor, Tensor]: ...
    def build_ffn_out(self, ctx: Context, w: Weights, p: str, ffn_out: Tensor, ffn_inp: Tensor) -> Tensor: ...
    def build_block_out(self, ctx: Context, w: Weights, inp: StepInputs, il: int, x: Tensor, r0: int = 0) -> Tensor: ...
    def router_input(self, ctx: Context, w: Weights, p: str, cur: Tensor) -> Tensor: ...
    def expert_input(self, ctx: Context, w: Weights, p: str, cur: Tensor) -> Tensor: ...
    def experts_out(self, ctx: Context, w: Weights, p: str, out: Tensor) -> Tensor: ...
    def shared_ffn(self, ctx: Context, w: Weights, p: str, cur: Tensor) -> Tensor | None: ...


WEIGHTS_SUM_MIN = 6.103515625e-5  # llama.cpp clamps the sum of the chosen weights to the smallest F16 normal


def qwen_expert_ff(arch: Architecture, meta: Mapping[str, Any]) -> int:
    """Qwen MoE experts' FFN size: expert_feed_forward_length, else n_ff / n_expert_used (llama.cpp's rule)."""
    return int(arch.key(meta, "expert_feed_forward_length", 0)) or arch.hp.n_ff // max(arch.hp.n_expert_used, 1)


GATING = {1: "softmax", 2: "sigmoid", 3: "softmax_weight", 4: "sqrt_softplus"}  # llama_expert_gating_func_type


def set_gating(arch: Architecture, gating: int) -> None:
    """arch.moe.gating from llama_expert_gating_func_type `gating`; UnsupportedModelError for another."""
    if gating not in GATING:
        raise UnsupportedModelError(f"'{arch.hp.arch}.expert_gating_func' {gating} is not supported")
    arch.moe.gating = GATING[gating]


def uniform_expert_ff(arch: Architecture, meta: Mapping[str, Any], default: int | None = None) -> int:
    """expert_feed_forward_length (llama.cpp's get_key_or_arr), required unless a default is given: one size, or a
    per-layer array of one."""
    hp = arch.hp
    ff = arch.key(meta, "expert_feed_forward_length", default)
    if ff is None:
        raise GGUFError(f"GGUF metadata lacks '{hp.arch}.expert_feed_forward_length'")
    ffs = {int(x) for x in ff} if isinstance(ff, (list, tuple)) else {int(ff)}
    if len(ffs) != 1:
        raise UnsupportedModelError(f"'{hp.arch}.expert_feed_forward_length' varies by layer: not supported")
    return ffs.pop()


def load_routing(arch: Architecture, meta: Mapping[str, Any], gating: int) -> None:
    """The expert keys deepseek2 and glm4moe share (llama.cpp's load_arch_hparams): leading dense blocks, shared
    experts (ungated, expert_shared_count of n_ff_exp), the chosen weights' norm and scale, the gating function
    (`gating` when the key is absent) and the expert groups. arch.n_ff_exp must be set."""
    hp = arch.hp
    shared = arch.key(meta, "expert_shared_count", None)
    if shared is None:
        raise GGUFError(f"GGUF metadata lacks '{hp.arch}.expert_shared_count'")
    # llama.cpp's deepseek2 loads shared experts of 0 columns; glm4moe none, and then refuses a file that has them
    shexp = any("_shexp." in n for n in arch.names)
    if int(shared) <= 0 and (hp.arch != "glm4moe" or shexp):
        raise GGUFError(f"'{hp.arch}.expert_shared_count' is {shared}, but its blocks have shared experts")
    arch.n_lead = int(arch.key(meta, "leading_dense_block_count", 0))
    arch.n_ff_shexp = arch.n_ff_exp * int(shared)
    arch.shexp_gate = False
    arch.moe.norm_w = bool(arch.key(meta, "expert_weights_norm", False))
    arch.moe.w_scale = float(np.float32(arch.key(meta, "expert_weights_scale", 0.0)))
    set_gating(arch, int(arch.key(meta, "expert_gating_func", 0)) or gating)
    n_group, n_used = arch.moe.groups = (
        int(arch.key(meta, "expert_group_count", 0)),
        int(arch.key(meta, "expert_group_used_count", 0)),
    )
    if n_group > 1 and (
        hp.n_expert % n_group or not 0 < n_used <= n_group or hp.n_expert_used > hp.n_expert // n_group * n_used
    ):
        raise GGUFError(
            f"{hp.arch}: {hp.n_expert} experts in {n_group} groups, {n_used} used, cannot give "
            f"{hp.n_expert_used} per token"
        )


def routing_note(arch: Architecture) -> str:
    """analyze's line on load_routing's families' experts."""
    n_group, n_used = arch.moe.groups
    groups = f", chosen within {n_used} of {n_group} expert groups" if n_group > 1 else ""
    return (
        f"routing: {arch.moe.gating} gating{' with exp_probs_b' if arch.moe.probs_bias else ''}{groups}; "
        f"{arch.n_ff_shexp // max(arch.n_ff_exp, 1)} shared expert(s); the first {arch.n_lead} block(s) dense"
    )


def moe_tensor_shapes(arch: Architecture, il: int) -> dict[str, tuple[int, ...]]:
    """The FFN tensors of block il: router [n_embd, n_expert]; experts [n_embd, n_ff_exp, n_expert] (gate, up)
    and [n_ff_exp, n_embd, n_expert] (down); and the shared expert where the family has one."""
    hp, p = arch.hp, f"blk.{il}."
    n_ff = arch.n_ff_exp
    shapes = {
        p + "ffn_gate_inp.weight": (hp.n_embd, hp.n_expert),
        **(
            {p + "ffn_gate_up_exps.weight": (hp.n_embd, 2 * n_ff, hp.n_expert)}
            if arch.moe.fused_gate_up
            else {p + "ffn_up_exps.weight": (hp.n_embd, n_ff, hp.n_expert)}
            if arch.moe.relu2
            else {
                p + "ffn_gate_exps.weight": (hp.n_embd, n_ff, hp.n_expert),
                p + "ffn_up_exps.weight": (hp.n_embd, n_ff, hp.n_expert),
            }
        ),
        p + "ffn_down_exps.weight": (n_ff, hp.n_embd, hp.n_expert),
    }
    if arch.moe.biases:
        shapes.update(
            {
                p + "ffn_gate_inp.bias": (hp.n_expert,),
                p + "ffn_gate_exps.bias": (n_ff, hp.n_expert),
                p + "ffn_up_exps.bias": (n_ff, hp.n_expert),
                p + "ffn_down_exps.bias": (hp.n_embd, hp.n_expert),
            }
        )
    if arch.moe.probs_bias:
        shapes[p + arch.moe.probs_bias_name] = (hp.n_expert,)
    if arch.n_ff_shexp and arch.shexp_gate:
        shapes[p + "ffn_gate_inp_shexp.weight"] = (hp.n_embd,)
    if arch.n_ff_shexp:
        shapes.update(
            {
                p + "ffn_gate_shexp.weight": (hp.n_embd, arch.n_ff_shexp),
                p + "ffn_up_shexp.weight": (hp.n_embd, arch.n_ff_shexp),
                p + "ffn_down_shexp.weight": (arch.n_ff_shexp, hp.n_embd),
            }
        )
        if arch.moe.relu2:
            del shapes[p + "ffn_gate_shexp.weight"]
    return shapes


def select_experts(
    arch: Architecture, ctx: Context, w: Weights, p: str, cur: Tensor, tokens: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """cur F32 [n_embd, n] -> (the experts block p's router picks, I32 [k, n] (a view); the probabilities their
    weights come from, F32 [n_expert, n]), as llama.cpp's build_moe_ffn: softmax, sigmoid or sqrt-softplus gating
    (or the logits, softmax_weight); the choice made on the probabilities plus exp_probs_b where the family has
    it, and within the expert groups whose top two score highest; or, in a block routed by token id, the table's
    row of each of `tokens` (I32 [n])."""
    hp = arch.hp
    n, k = cur.ne[1], hp.n_expert_used
    logits = ctx.mul_mat(w(p + "ffn_gate_inp.weight"), arch.router_input(ctx, w, p, cur))  # F32 [n_expert, n]
    if arch.moe.biases:
        logits = ctx.add(logits, w(p + "ffn_gate_inp.bias"))
    probs = {
        "softmax": lambda: ctx.soft_max_ext(logits, None, 1.0),
        "sigmoid": lambda: ctx.sigmoid(logits),
        "softmax_weight": lambda: logits,
        "sqrt_softplus": lambda: ctx.sqrt(ctx.softplus(logits)),
    }[arch.moe.gating]()
    if int(p.split(".")[1]) in arch.moe.token_table:
        if tokens is None:
            raise ValueError(f"{p}ffn_gate_tid2eid routes by token id: the pass's tokens are needed")
        return ctx.get_rows(w(p + "ffn_gate_tid2eid.weight"), tokens), probs  # I32 [k, n]
    chosen_by = ctx.add(probs, w(p + arch.moe.probs_bias_name)) if arch.moe.probs_bias else probs
    if arch.moe.select_logits:  # llama4: the top k of the logits (sigmoid is applied after)
        chosen_by = logits
    n_group, n_group_used = arch.moe.groups
    if n_group > 1:
        per = hp.n_expert // n_group
        groups = ctx.reshape(chosen_by, [per, n_group, n])
        top2 = ctx.get_rows(ctx.reshape(groups, [1, per, n_group, n]), ctx.argsort_top_k(groups, 2))
        scores = ctx.reshape(ctx.sum_rows(ctx.reshape(top2, [2, n_group, n])), [n_group, n])
        kept = ctx.argsort_top_k(scores, n_group_used)  # I32 [n_group_used, n]
        masked = ctx.set_rows(ctx.fill(groups, float("-inf")), ctx.get_rows(groups, kept), kept)
        chosen_by = ctx.reshape(masked, [hp.n_expert, n])
    return ctx.argsort_top_k(chosen_by, k), probs


def build_router(
    arch: Architecture, ctx: Context, w: Weights, p: str, cur: Tensor, tokens: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """cur F32 [n_embd, n] -> (selected experts I32 [k, n], their weights F32 [1, k, n]); tokens: the rows' token
    ids, for a block routed by them."""
    hp = arch.hp
    n, k = cur.ne[1], hp.n_expert_used
    selected, probs = select_experts(arch, ctx, w, p, cur, tokens)
    weights = ctx.get_rows(ctx.reshape(probs, [1, hp.n_expert, n]), selected)  # F32 [1, k, n]
    if arch.moe.gating == "softmax_weight":  # gpt-oss: the chosen experts' logits, softmaxed among themselves
        weights = ctx.reshape(ctx.soft_max_ext(ctx.reshape(weights, [k, n]), None, 1.0), [1, k, n])
    if arch.moe.norm_w:
        weights = ctx.reshape(weights, [k, n])
        total = ctx.clamp(ctx.sum_rows(weights), WEIGHTS_SUM_MIN, float("inf"))  # [1, n]
        weights = ctx.reshape(ctx.div(weights, total), [1, k, n])
    if arch.moe.w_scale not in (0.0, 1.0):
        weights = ctx.scale(weights, arch.moe.w_scale)
    return selected, weights


def build_router_lookahead(
    arch: Architecture, ctx: Context, w: Weights, il: int, cur: Tensor, tokens: Tensor | None = None
) -> Tensor:
    """Block il+1's router applied to block il's FFN input: the experts it would pick, I32 [k, n] (a guess of
    what block il+1 will route to, made a whole block early; exact where it routes by the rows' tokens)."""
    return select_experts(arch, ctx, w, f"blk.{il + 1}.", cur, tokens)[0]


def build_moe_ffn(arch: Architecture, ctx: Context, w: Weights, p: str, cur: Tensor) -> Tensor:
    """The normed input F32 [n_embd, n] -> F32 [n_embd, n], every expert resident."""
    selected, weights = build_router(arch, ctx, w, p, cur)
    out = build_expert_outputs(
        arch,
        ctx,
        w,
        p,
        cur,
        selected,
        selected,
        weights,
        *(w(n) for n in arch.expert_tensors(int(p.split(".")[1]))),
    )
    return build_shared_expert(arch, ctx, w, p, cur, arch.experts_out(ctx, w, p, sum_experts(ctx, out)))


SWIGLU_OAI_ALPHA, SWIGLU_OAI_LIMIT = 1.702, 7.0  # gpt-oss's clamped SwiGLU, as llama.cpp fixes them


def sum_experts(ctx: Context, experts: Tensor) -> Tensor:
    """The weighted outputs F32 [n_embd, k, n] of build_expert_outputs summed in order: F32 [n_embd, n]."""
    n_embd, k, n = experts.ne[0], experts.ne[1], experts.ne[2]
    out: Tensor | None = None
    for i in range(k):  # the chosen experts' outputs, summed in order
        view = ctx.view(experts, [n_embd, n], [experts.nb[2]], i * experts.nb[1])
        out = view if out is None else ctx.add(out, view)
    assert out is not None
    return ctx.cont(out) if k == 1 else out


def build_expert_outputs(
    arch: Architecture,
    ctx: Context,
    w: Weights,
    p: str,
    cur: Tensor,
    ids: Tensor,
    experts_ids: Tensor,
    weights: Tensor,
    *exps: Tensor,
) -> Tensor:
    """The routed experts' gated FFNs, each weighted, before sum_experts adds them: cur F32 [n_embd, n], ids I32 [k, n]
    (indices into the expert tensors' third dimension: experts, or expert cache slots), experts_ids I32 [k, n] (the
    experts themselves, for their biases), weights F32 [1, k, n] -> F32 [n_embd, k, n]. Each of the k x n outputs
    is computed on its own, so experts computed apart (on two devices) add up to the same bits. exps: the expert
    tensors (or their cache slots) as arch.expert_tensors names them: gate, up and down, or gate_up and down."""
    x = arch.expert_input(ctx, w, p, cur)  # [n_embd, n], or a latent width (kimi-k3)
    n_embd, n = x.ne[0], x.ne[1]
    x = ctx.reshape(x, [n_embd, 1, n])
    if arch.moe.weight_before:  # llama4: each expert's input scaled by its weight, the output not
        x = ctx.mul(ctx.repeat_4d(x, [n_embd, ids.ne[0], n, 1]), weights)
    if arch.moe.relu2:  # up and down, no gate
        up_exps, down_exps = exps
        act = ctx.sqr(ctx.relu(ctx.mul_mat_id(up_exps, x, ids)))  # F32 [n_ff_exp, k, n]
        return ctx.mul(ctx.mul_mat_id(down_exps, act, ids), weights)
    if len(exps) == 2:  # gate_up: its first n_ff_exp rows are the gate, the rest up (llama.cpp's views)
        gate_up, down_exps = exps
        both = ctx.mul_mat_id(gate_up, x, ids)  # F32 [2 * n_ff_exp, k, n]
        f = both.ne[0] // 2
        gate = ctx.view(both, [f, both.ne[1], both.ne[2]], [both.nb[1], both.nb[2]], 0)
        up = ctx.view(both, [f, both.ne[1], both.ne[2]], [both.nb[1], both.nb[2]], f * both.nb[0])
        return finish_experts(arch, ctx, w, p, gate, up, down_exps, ids, experts_ids, weights)
    gate_exps, up_exps, down_exps = exps
    up = ctx.mul_mat_id(up_exps, x, ids)  # F32 [n_ff_exp, k, n]
    if arch.moe.biases:
        up = ctx.add_id(up, w(p + "ffn_up_exps.bias"), experts_ids)
    gate = ctx.mul_mat_id(gate_exps, x, ids)
    if arch.moe.biases:
        gate = ctx.add_id(gate, w(p + "ffn_gate_exps.bias"), experts_ids)
    return finish_experts(arch, ctx, w, p, gate, up, down_exps, ids, experts_ids, weights)


def finish_experts(
    arch: Architecture,
    ctx: Context,
    w: Weights,
    p: str,
    gate: Tensor,
    up: Tensor,
    down_exps: Tensor,
    ids: Tensor,
    experts_ids: Tensor,
    weights: Tensor,
) -> Tensor:
    """The experts' activation, down projection and weights (build_expert_outputs' end)."""
    act = (
        ctx.swiglu_oai(gate, up, SWIGLU_OAI_ALPHA, SWIGLU_OAI_LIMIT)
        if arch.moe.act == "swiglu_oai"
        else ctx.geglu_split(gate, up)
        if arch.moe.act == "geglu"
        else situ(ctx, gate, up, *arch.moe.situ)
        if arch.moe.act == "situ"
        else swiglu(ctx, gate, up, arch.swiglu_limits(int(p.split(".")[1]))[0], arch.moe.clamp_fused)
    )
    experts = ctx.mul_mat_id(down_exps, act, ids)  # F32 [n_embd, k, n]
    if arch.moe.down_scale:  # each expert's output times its own scale (ffn_down_exps.scale, F32 [n_expert])
        scales = w(p + "ffn_down_exps.scale")
        per = ctx.repeat_4d(ctx.reshape(scales, [1, scales.ne[0], 1]), [1, scales.ne[0], experts_ids.ne[1]])
        experts = ctx.mul(experts, ctx.get_rows(per, experts_ids))  # [1, k, n] broadcast
    if arch.moe.biases:
        experts = ctx.add_id(experts, w(p + "ffn_down_exps.bias"), experts_ids)
    return experts if arch.moe.weight_before else ctx.mul(experts, weights)


def build_shared_expert(arch: Architecture, ctx: Context, w: Weights, p: str, cur: Tensor, out: Tensor) -> Tensor:
    """What runs beside the experts (qwen2moe's shared expert behind its sigmoid gate) added to the routed experts'
    output `out`."""
    shared = arch.shared_ffn(ctx, w, p, cur)
    return out if shared is None else ctx.add(out, shared)


def build_shared_expert_only(arch: Architecture, ctx: Context, w: Weights, p: str, cur: Tensor) -> Tensor | None:
    """The shared expert's output F32 [n_embd, n], gated where the family gates it (None without one)."""
    if not arch.n_ff_shexp:
        return None
    if arch.moe.relu2:
        return ctx.mul_mat(
            w(p + "ffn_down_shexp.weight"), ctx.sqr(ctx.relu(ctx.mul_mat(w(p + "ffn_up_shexp.weight"), cur)))
        )
    gate, up = ctx.mul_mat(w(p + "ffn_gate_shexp.weight"), cur), ctx.mul_mat(w(p + "ffn_up_shexp.weight"), cur)
    limit = arch.swiglu_limits(int(p.split(".")[1]))[1]
    shared = ctx.mul_mat(w(p + "ffn_down_shexp.weight"), swiglu(ctx, gate, up, limit, arch.moe.clamp_fused))
    if not arch.shexp_gate:
        return shared
    g = ctx.mul_mat(w(p + "ffn_gate_inp_shexp.weight"), cur)  # F32 [1, n]
    gate_s = ctx.sigmoid(g) if arch.shexp_sigmoid else ctx.div(ctx.silu(g), g)  # as each llama.cpp graph writes it
    return ctx.mul(shared, gate_s)
