"""KDA, kimi delta attention (llama.cpp's kimi-k3.cpp build_kda_layer and kimi_k3_conv1d): the recurrent mixer of
kimi-k3's (and kimi-linear's) KDA blocks.

Q, K and V each through a causal depthwise conv over the last d_conv - 1 tokens (three windows, q|k|v, in one
conv state per sequence: the bytes of llama.cpp's three parts), SiLU; Q and K L2-normed per head; the gated delta
rule (ggml_gated_delta_net) with a decay per channel and beta per head, from a state of head_dim^2 per head; the
output RMS-normed per head (ssm_norm) and gated by sigmoid(ssm_g)."""

from __future__ import annotations

from dataclasses import dataclass

from ..native import Context, Graph, Tensor
from .base import BlockGraph, Memory, Weights, f32
from .common import conv_input, each_sequence, inv_sqrt, packed_views, slide_window


@dataclass(frozen=True)
class KdaShape:
    n_head: int
    head_dim: int
    d_conv: int
    lower_bound: float | None  # kda.gate_lower_bound: the bounded-sigmoid decay (K3); None: softplus (kimi-linear)
    eps: float
    low_rank_gate: bool = False  # the output gate through ssm_g_a and ssm_g_b (kimi-linear), not one ssm_g
    fused_qkv: bool = False  # Q, K and V from one attn_qkv (kimi-linear may have it)
    a_shape: tuple[int, ...] = ()  # ssm_a's shape: (n_head,) in K3, (1, n_head) in kimi-linear
    full_rank_decay: bool = False  # bailingmoe3: the decay from one full-rank ssm_f_a, ssm_a holding +exp(A_log)
    gate_a_full: bool = False  # bailingmoe3: the output gate from one full-rank ssm_g_a
    l2_eps: float | None = None  # the L2 norms' epsilon where it is not eps (glm5-next's fixed 1e-6)

    @property
    def d_inner(self) -> int:
        return self.n_head * self.head_dim


class KdaMixer:
    """A KDA block's graph over its normed input, before attn_output."""

    def __init__(self, shape: KdaShape):
        self.shape = shape

    @property
    def state_sizes(self) -> tuple[int, int]:
        """Values per sequence and block: the three conv windows', the delta rule's state."""
        s = self.shape
        return 3 * (s.d_conv - 1) * s.d_inner, s.head_dim * s.d_inner

    def tensor_shapes(self, p: str, n_embd: int) -> dict[str, tuple[int, ...]]:
        s = self.shape
        Di, Dk = s.d_inner, s.head_dim
        shapes: dict[str, tuple[int, ...]] = {}
        for x in "qkv":
            shapes[p + f"ssm_conv1d_{x}.weight"] = (s.d_conv, 1, Di)
            if not s.fused_qkv:
                shapes[p + f"attn_{x}.weight"] = (n_embd, Di)
        if s.fused_qkv:
            shapes[p + "attn_qkv.weight"] = (n_embd, 3 * Di)
        if s.gate_a_full:
            gate = {p + "ssm_g_a.weight": (n_embd, Di)}
        elif s.low_rank_gate:
            gate = {p + "ssm_g_a.weight": (n_embd, Dk), p + "ssm_g_b.weight": (Dk, Di)}
        else:
            gate = {p + "ssm_g.weight": (n_embd, Di)}
        decay = {p + "ssm_f_a.weight": (n_embd, Di)}
        if not s.full_rank_decay:
            decay = {p + "ssm_f_a.weight": (n_embd, Dk), p + "ssm_f_b.weight": (Dk, Di)}
        rest = {
            p + "ssm_beta.weight": (n_embd, s.n_head),
            p + "ssm_a": s.a_shape or (s.n_head,),
            p + "ssm_dt.bias": (Di,),
            p + "ssm_norm.weight": (Dk,),
            p + "attn_output.weight": (Di, n_embd),
        }
        return shapes | gate | decay | rest

    def build(self, blk: BlockGraph, cur: Tensor, conv_state: Memory, state: Memory) -> Tensor:
        """cur F32 [n_embd, n] -> F32 [d_inner, n]; each sequence's windows and state read and written back."""
        ctx, gf, w, inp, il = blk.ctx, blk.gf, blk.w, blk.inp, blk.il
        s, p, n = self.shape, f"blk.{il}.", inp.n_tokens
        Dk, H = s.head_dim, s.n_head
        if s.fused_qkv:  # llama.cpp's views of one projection, made contiguous
            qkv = ctx.mul_mat(w(p + "attn_qkv.weight"), cur)
            es = qkv.element_size
            xs = [ctx.cont(ctx.view(qkv, [s.d_inner, n], [qkv.nb[1]], i * s.d_inner * es)) for i in range(3)]
        else:
            xs = [ctx.mul_mat(w(p + f"attn_{x}.weight"), cur) for x in "qkv"]  # [d_inner, n] each
        f = ctx.mul_mat(w(p + "ssm_f_a.weight"), cur)
        g = ctx.add(f if s.full_rank_decay else ctx.mul_mat(w(p + "ssm_f_b.weight"), f), w(p + "ssm_dt.bias"))
        a = ctx.reshape(w(p + "ssm_a"), [1, H, 1])
        if s.full_rank_decay:  # lb * sigmoid(exp(A_log) * f): ssm_a holds +exp(A_log)
            assert s.lower_bound is not None
            g = ctx.scale(ctx.sigmoid(ctx.mul(ctx.reshape(g, [Dk, H, n]), a)), s.lower_bound)
        elif s.lower_bound is not None:  # lb * sigmoid(exp(A_log) * f): ssm_a holds -exp(A_log)
            g = ctx.sigmoid(ctx.scale(ctx.mul(ctx.reshape(g, [Dk, H, n]), a), -1.0))
            g = ctx.scale(g, s.lower_bound)
        else:
            g = ctx.mul(ctx.reshape(ctx.softplus(g), [Dk, H, n]), a)
        beta = ctx.sigmoid(ctx.reshape(ctx.mul_mat(w(p + "ssm_beta.weight"), cur), [1, H, n]))

        def run(rows, m: int, conv: Tensor, st: Tensor, record: Tensor | None) -> Tensor:  # type: ignore[no-untyped-def]
            views = self.record_views(ctx, record, m) if record is not None else None
            qkv = [
                self.conv(ctx, gf, w, p, i, rows(x, 2), m, conv, views[i] if views else None) for i, x in enumerate(xs)
            ]
            gm, bm = rows(g), rows(beta)
            if views:
                for src, dst in zip([*qkv, gm, bm], views[3:]):
                    gf.expand(ctx.cpy(src, dst))
            return self.rule(ctx, gf, qkv, gm, bm, m, st)

        out = each_sequence(ctx, inp, il, conv_state, state, run)  # [d_inner, n]
        if s.gate_a_full:
            g2 = ctx.mul_mat(w(p + "ssm_g_a.weight"), cur)
        elif s.low_rank_gate:
            g2 = ctx.mul_mat(w(p + "ssm_g_b.weight"), ctx.mul_mat(w(p + "ssm_g_a.weight"), cur))
        else:
            g2 = ctx.mul_mat(w(p + "ssm_g.weight"), cur)
        g2 = ctx.reshape(g2, [Dk, H, n])
        normed = ctx.mul(ctx.rms_norm(ctx.reshape(out, [Dk, H, n]), s.eps), w(p + "ssm_norm.weight"))
        return ctx.reshape(ctx.cont(ctx.mul(normed, ctx.sigmoid(g2))), [s.d_inner, n])

    def conv(
        self,
        ctx: Context,
        gf: Graph,
        w: Weights,
        p: str,
        part: int,
        x: Tensor,
        n: int,
        conv: Tensor,
        record: Tensor | None = None,
    ) -> Tensor:
        """Part `part` (q, k, v) of one sequence's n rows x [d_inner, n] through its causal conv, SiLU'd: F32
        [head_dim, n_head, n, 1]; its window after the rows written back (and the window with the rows copied to
        `record`)."""
        s = self.shape
        Di = s.d_inner
        xx = conv_input(ctx, gf, self.window(ctx, conv, part), x, n)  # [c + n, Di, 1]
        if record is not None:
            gf.expand(ctx.cpy(xx, record))
        weight = ctx.reshape(w(p + f"ssm_conv1d_{'qkv'[part]}.weight"), [s.d_conv, Di])
        y = ctx.silu(ctx.reshape(ctx.ssm_conv(xx, weight), [Di, n]))
        return ctx.reshape(y, [s.head_dim, s.n_head, n, 1])

    def window(self, ctx: Context, conv: Tensor, part: int) -> Tensor:
        """Part `part`'s window in a sequence's conv state: F32 [d_conv - 1, d_inner, 1]."""
        Di, c, es = self.shape.d_inner, self.shape.d_conv - 1, conv.element_size
        return ctx.view(conv, [c, Di, 1], [c * es, c * Di * es], part * c * Di * es)

    # -- replay: the states k rows into a recorded pass ----------------------
    def record_size(self, n: int) -> int:
        """Values a pass of n rows records per KDA block: each part's window with its rows, each part's conv
        output, the decay and beta."""
        s = self.shape
        return 3 * (s.d_conv - 1 + n) * s.d_inner + 4 * n * s.d_inner + n * s.n_head

    def record_views(self, ctx: Context, record: Tensor, n: int) -> list[Tensor]:
        """The q, k, v windows with their rows [d_conv - 1 + n, d_inner, 1], the q, k, v conv outputs [head_dim,
        n_head, n], the decay [head_dim, n_head, n] and beta [1, n_head, n], one after another in record."""
        s = self.shape
        c, Dk, H = s.d_conv - 1, s.head_dim, s.n_head
        flat = packed_views(ctx, record, [[c + n, s.d_inner, 1]] * 3 + [[s.d_inner, n]] * 4 + [[H, n]])
        heads = [ctx.reshape(v, [Dk, H, n]) for v in flat[3:7]]
        return flat[:3] + heads + [ctx.reshape(flat[7], [1, H, n])]

    def replay(self, ctx: Context, gf: Graph, record: Tensor, n: int, k: int, conv: Tensor, state: Tensor) -> None:
        """The states after the first k of a recorded pass's n rows, from the states before it: each window
        slides k rows, and the delta rule runs the first k rows again (the same arithmetic, row by row)."""
        views = self.record_views(ctx, record, n)
        for part in range(3):
            slide_window(ctx, gf, views[part], k, self.window(ctx, conv, part))
        first = [ctx.view(v, [v.ne[0], v.ne[1], k], [v.nb[1], v.nb[2]], 0) for v in views[3:]]
        qkv = [ctx.reshape(v, [v.ne[0], v.ne[1], k, 1]) for v in first[:3]]
        self.rule(ctx, gf, qkv, first[3], first[4], k, state)

    def rule(
        self, ctx: Context, gf: Graph, qkv: list[Tensor], g: Tensor, beta: Tensor, n: int, state: Tensor
    ) -> Tensor:
        """The gated delta rule over one sequence's n rows from `state` (written back): F32 [d_inner, n]."""
        s = self.shape
        Dk, H = s.head_dim, s.n_head
        q, k = (self.l2_norm(ctx, t) for t in qkv[:2])
        if g.nb[2] != Dk * H * g.element_size:
            g, beta = ctx.cont(g), ctx.cont(beta)
        s0 = ctx.reshape(state, [Dk, Dk, H, 1])
        out = ctx.gated_delta_net(q, k, qkv[2], ctx.reshape(g, [Dk, H, n, 1]), ctx.reshape(beta, [1, H, n, 1]), s0, 1)
        oe = out.element_size
        new = ctx.view(out, [Dk, Dk, H, 1], [Dk * oe, Dk * Dk * oe, Dk * Dk * H * oe], Dk * H * n * oe)
        gf.expand(ctx.cpy(new, s0))
        return ctx.view(out, [Dk * H, n], [Dk * H * oe], 0)

    def l2_norm(self, ctx: Context, x: Tensor) -> Tensor:
        """llama.cpp's build_gdn_l2_norm: x / |x| per head, an RMS norm of eps / d scaled by 1 / sqrt(d)."""
        d = x.ne[0]
        eps = self.shape.eps if self.shape.l2_eps is None else self.shape.l2_eps
        return ctx.scale(ctx.rms_norm(x, float(f32(eps) / f32(d))), inv_sqrt(d))
