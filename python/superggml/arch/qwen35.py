"""qwen35 family (llama.cpp's src/models/qwen35.cpp and delta-net-base.cpp): Qwen3.5's hybrid of gated delta-net
layers (linear attention over a fixed-size recurrent state) and gated full attention every few blocks.

- Gated delta-net (the recurrent layers, attention.recurrent_layers or every layer but each
  full_attention_interval-th): attn_qkv projects Q, K and V for a causal depthwise conv1d over the last
  ssm.conv_kernel tokens (its rolling state kept per sequence), then SiLU; Q and K are L2-normed per head, and the
  gated delta rule (ggml_gated_delta_net: the gate from ssm_alpha, ssm_dt and ssm_a, beta from ssm_beta) updates a
  [S, S] state per value head; the output is RMS-normed per head (ssm_norm), gated by SiLU(attn_gate), projected by
  ssm_out.
- Gated full attention: attn_q gives each head's query and an output gate; Q/K head norms; interleaved
  multi-section RoPE (rope.dimension_sections); the attention output times sigmoid(gate), projected by attn_output.
- Both are pre-normed by attn_norm and join the residual; post_attention_norm is the FFN's pre-norm.
- The last block keeps every row: the head picks its rows after the output norm (as llama.cpp's graph does).
- An MTP block (nextn_predict_layers) is a full-attention block (draft_mtp, arch/mtp.py).
"""

from __future__ import annotations

from typing import Any, Mapping

from ..errors import GGUFError
from ..native import Context, Graph, Tensor
from .base import BlockGraph, Memory, StepInputs, Weights, f32
from .common import attend_lanes, each_sequence, inv_sqrt, packed_views
from .hybrid import HybridArch, Shapes

ROPE_IMROPE = 40  # GGML_ROPE_TYPE_IMROPE


class Qwen35Arch(HybridArch):
    rope_factors = False
    qk_norm = True
    ffn_norm = "post_attention_norm"
    late_gather = True
    rope_mode = ROPE_IMROPE

    def load_hparams(self, meta: Mapping[str, Any]) -> None:
        hp = self.hp

        def need(name: str) -> int:
            return int(self.need(meta, name))

        self.d_conv = need("ssm.conv_kernel")
        self.d_inner = need("ssm.inner_size")
        self.d_state = need("ssm.state_size")  # S: the head size of K and V
        self.n_v_heads = need("ssm.time_step_rank")
        self.n_k_heads = need("ssm.group_count")
        if (
            not self.n_v_heads
            or self.d_inner % self.n_v_heads
            or self.d_inner // self.n_v_heads != self.d_state
            or not self.n_k_heads
            or self.n_v_heads % self.n_k_heads
            or self.d_conv < 2
        ):
            raise GGUFError(
                f"{hp.arch} delta-net hyperparameters are inconsistent: inner_size {self.d_inner}, "
                f"state_size {self.d_state}, time_step_rank {self.n_v_heads}, group_count "
                f"{self.n_k_heads}, conv_kernel {self.d_conv}"
            )
        self.conv_channels = self.d_inner + 2 * self.n_k_heads * self.d_state
        if self.rope_mode == ROPE_IMROPE:
            sections = self.key(meta, "rope.dimension_sections", None)
            if not isinstance(sections, (list, tuple)) or len(sections) < 3:
                raise GGUFError(f"GGUF metadata lacks '{hp.arch}.rope.dimension_sections'")
            self.rope_sections = [int(x) for x in list(sections)[:4]] + [0] * (4 - min(len(sections), 4))
        flags = self.key(meta, "attention.recurrent_layers", None)
        if isinstance(flags, (list, tuple)):
            if len(flags) < hp.n_layer:
                raise GGUFError(f"attention.recurrent_layers has {len(flags)} entries for {hp.n_layer} layers")
            self.recurrent = tuple(bool(x) for x in list(flags)[: hp.n_layer]) + (False,) * hp.n_nextn
        else:
            every = int(self.key(meta, "full_attention_interval", 4))
            if every < 1:
                raise GGUFError(f"full_attention_interval must be >= 1, not {every}")
            self.recurrent = tuple((il + 1) % every != 0 for il in range(hp.n_layer)) + (False,) * hp.n_nextn
        self.count_states()

    def attention_note(self) -> str:
        return "gated full-attention layers with a K/V cache"

    def mixer_note(self) -> str:
        return (
            f"gated delta-net layers (a state of {self.n_v_heads} x {self.d_state}^2 values and a conv window of "
            f"{self.d_conv - 1} tokens: {self.hp.state_bytes / 2**20:.2f} MiB per sequence, whatever its length)"
        )

    # -- memory -------------------------------------------------------------
    @property
    def state_sizes(self) -> tuple[int, int]:
        """Values per sequence and recurrent layer: the conv window's, the delta rule's state."""
        return (self.d_conv - 1) * self.conv_channels, self.d_state * self.d_inner

    # -- tensors ---------------------------------------------------------
    def block_tensor_shapes(self, il: int) -> dict[str, tuple[int, ...]]:
        hp, p = self.hp, f"blk.{il}."
        shapes = super().block_tensor_shapes(il)
        shapes[p + "attn_q.weight"] = (hp.n_embd, hp.head_dim * hp.n_head * 2)  # each head's query and gate
        delta_net: Shapes = {
            p + "attn_qkv.weight": (hp.n_embd, self.conv_channels),
            p + "attn_gate.weight": (hp.n_embd, self.d_inner),
            p + "ssm_conv1d.weight": (self.d_conv, self.conv_channels),
            p + "ssm_dt.bias": (self.n_v_heads,),
            p + "ssm_a": (self.n_v_heads,),
            p + "ssm_beta.weight": (hp.n_embd, self.n_v_heads),
            p + "ssm_alpha.weight": (hp.n_embd, self.n_v_heads),
            p + "ssm_norm.weight": (self.d_state,),
            p + "ssm_out.weight": (self.d_inner, hp.n_embd),
        }
        return self.mixer_shapes(il, shapes, delta_net)

    # -- graphs ------------------------------------------------------------
    def rope(self, ctx: Context, w: Weights, inp: StepInputs, il: int, x: Tensor) -> Tensor:
        return self.rope_at(ctx, x, inp.positions)

    def rope_at(self, ctx: Context, x: Tensor, pos: Tensor | None) -> Tensor:
        """Multi-section RoPE of x [d, heads, m] over its first n_rot values at positions pos (4 * m)."""
        hp = self.hp
        assert pos is not None and self.rope_sections is not None
        return ctx.rope_multi(
            x,
            pos,
            hp.n_rot,
            self.rope_sections,
            self.rope_mode,
            hp.n_ctx_orig,
            hp.rope_base,
            hp.rope_scale,
            hp.rope_ext_factor,
            hp.rope_attn_factor,
        )

    def build_attention(self, blk: BlockGraph, cur: Tensor, k_cache: Memory, v_cache: Memory) -> Tensor:
        if self.recurrent[blk.il]:
            return self.build_recurrent(blk, cur, k_cache, v_cache)
        q, k, v, gate = self.gated_qkv(blk, cur)
        out = self.attend(blk, cur, q, k, v, k_cache, v_cache)
        return blk.ctx.mul(out, blk.ctx.sigmoid(gate))

    def gated_qkv(self, blk: BlockGraph, cur: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Q and K [head_dim, heads, n] normed and roped, V [n_embd_gqa, n] and the output gate [head_dim * n_head,
        n] of an attention block."""
        ctx, w, inp, il = blk.ctx, blk.w, blk.inp, blk.il
        hp, p, n = self.hp, f"blk.{il}.", inp.n_tokens
        qg = ctx.mul_mat(w(p + "attn_q.weight"), cur)  # [2 * head_dim * n_head, n]
        es, d = qg.element_size, hp.head_dim
        q = ctx.view(qg, [d, hp.n_head, n], [2 * d * es, 2 * d * hp.n_head * es], 0)
        gate = ctx.cont(ctx.view(qg, [d, hp.n_head, n], [2 * d * es, 2 * d * hp.n_head * es], d * es))
        gate = ctx.reshape(gate, [d * hp.n_head, n])
        k = ctx.reshape(ctx.mul_mat(w(p + "attn_k.weight"), cur), [d, hp.n_head_kv, n])
        v = ctx.mul_mat(w(p + "attn_v.weight"), cur)
        q, kn = self.build_qk_norm(ctx, w, p, q, k)
        assert kn is not None
        return self.rope(ctx, w, inp, il, q), self.rope(ctx, w, inp, il, kn), v, gate

    def attend(
        self, blk: BlockGraph, cur: Tensor, q: Tensor, k: Tensor, v: Tensor, k_cache: Memory, v_cache: Memory
    ) -> Tensor:
        """Attention of an attention block over its K/V (cur: the block's normed input), before the gate."""
        hp = self.layer_hp(blk.il)
        return attend_lanes(blk, hp, q, k, v, k_cache, v_cache, inv_sqrt(hp.head_dim))

    def build_recurrent(self, blk: BlockGraph, cur: Tensor, conv_state: Memory, state: Memory) -> Tensor:
        """A gated delta-net layer over the normed input cur F32 [n_embd, n], before ssm_out: F32 [d_inner, n].
        conv_state F32 [(d_conv - 1) * conv_channels] and state F32 [S * S * n_v_heads] (or lists, one per lane)
        are read and written back."""
        ctx, gf, w, inp, il = blk.ctx, blk.gf, blk.w, blk.inp, blk.il
        p, n = f"blk.{il}.", inp.n_tokens
        qkv = ctx.mul_mat(w(p + "attn_qkv.weight"), cur)  # [conv_channels, n]
        z = ctx.mul_mat(w(p + "attn_gate.weight"), cur)  # [d_inner, n]
        beta, alpha = self.beta_alpha(ctx, w, p, cur)
        g = ctx.mul(ctx.softplus(ctx.add(alpha, w(p + "ssm_dt.bias"))), w(p + "ssm_a"))  # [n_v_heads, n]
        out = each_sequence(
            ctx,
            inp,
            il,
            conv_state,
            state,
            lambda rows, n, conv, st, record: self.delta_rule(
                ctx, gf, w, p, rows(qkv, 2), rows(beta, 2), rows(g, 2), n, conv, st, record
            ),
        )
        S, H = self.d_state, self.n_v_heads
        normed = self.norm(ctx, w, ctx.reshape(out, [S, H, n]), p + "ssm_norm.weight")
        gated = ctx.mul(normed, self.output_gate(ctx, ctx.reshape(z, [S, H, n])))
        return ctx.reshape(gated, [self.d_inner, n])

    def output_gate(self, ctx: Context, z: Tensor) -> Tensor:
        """The delta-net output's gate of z [S, n_v_heads, n]: SiLU (qwen4exp: sigmoid)."""
        return ctx.silu(z)

    def beta_alpha(self, ctx: Context, w: Weights, p: str, cur: Tensor) -> tuple[Tensor, Tensor]:
        """The delta rule's beta (sigmoid) and its gate's input, F32 [n_v_heads, n] each."""
        return (ctx.sigmoid(ctx.mul_mat(w(p + "ssm_beta.weight"), cur)), ctx.mul_mat(w(p + "ssm_alpha.weight"), cur))

    def delta_rule(
        self,
        ctx: Context,
        gf: Graph,
        w: Weights,
        p: str,
        qkv: Tensor,
        beta: Tensor,
        g: Tensor,
        n: int,
        conv_state: Tensor,
        state: Tensor,
        record: Tensor | None = None,
    ) -> Tensor:
        """One sequence's n rows: the conv over its window (the window written back), then the delta rule from
        its state (the state written back); F32 [S * n_v_heads, n]. `record` (F32, record_size(n) values or
        more): where the pass leaves the rule's inputs for replay."""
        x = self.conv_window(ctx, gf, qkv, n, conv_state)  # [d_conv - 1 + n, ch, 1]
        mixed = ctx.silu(ctx.ssm_conv(x, w(p + "ssm_conv1d.weight")))  # [ch, n, 1]
        if beta.nb[1] != self.n_v_heads * beta.element_size:
            beta, g = ctx.cont(beta), ctx.cont(g)
        if record is not None:
            for src, dst in zip((x, mixed, beta, g), self.record_views(ctx, record, n)):
                gf.expand(ctx.cpy(src, dst))
        return self.rule(ctx, gf, mixed, beta, g, n, state)

    def rule(self, ctx: Context, gf: Graph, mixed: Tensor, beta: Tensor, g: Tensor, n: int, state: Tensor) -> Tensor:
        """The delta rule over n rows of the conv's output mixed [ch, n] from `state` (written back)."""
        S, Hk, Hv = self.d_state, self.n_k_heads, self.n_v_heads
        es, row = mixed.element_size, mixed.nb[1]
        q = ctx.view(mixed, [S, Hk, n, 1], [S * es, row, row * n], 0)
        k = ctx.view(mixed, [S, Hk, n, 1], [S * es, row, row * n], S * Hk * es)
        v = ctx.view(mixed, [S, Hv, n, 1], [S * es, row, row * n], 2 * S * Hk * es)
        q, k = self.heads_of(ctx, self.l2_norm(ctx, q), n), self.heads_of(ctx, self.l2_norm(ctx, k), n)
        s0 = ctx.reshape(state, [S, S, Hv, 1])
        out = ctx.gated_delta_net(q, k, v, ctx.reshape(g, [1, Hv, n, 1]), ctx.reshape(beta, [1, Hv, n, 1]), s0, 1)
        oe = out.element_size
        new = ctx.view(out, [S, S, Hv, 1], [S * oe, S * S * oe, S * S * Hv * oe], S * Hv * n * oe)
        gf.expand(ctx.cpy(new, s0))
        return ctx.view(out, [S * Hv, n], [S * Hv * oe], 0)

    # -- replay: a state after k rows of a recorded pass ------------------------
    def record_size(self, n: int) -> int:
        """Values a pass of n rows records per recurrent layer: its conv input with the window before it, the
        conv's output, beta and the gate."""
        return (self.d_conv - 1 + 2 * n) * self.conv_channels + 2 * n * self.n_v_heads

    def record_views(self, ctx: Context, record: Tensor, n: int) -> list[Tensor]:
        """x [dc - 1 + n, ch, 1], mixed [ch, n, 1], beta and g [n_v_heads, n], one after another in record."""
        ch, dc, Hv = self.conv_channels, self.d_conv, self.n_v_heads
        return packed_views(ctx, record, [[dc - 1 + n, ch, 1], [ch, n, 1], [Hv, n], [Hv, n]])

    def replay(
        self, ctx: Context, gf: Graph, record: Tensor, n: int, k: int, conv_state: Tensor, state: Tensor, slot: int
    ) -> None:
        """The states after the first k of a recorded pass's n rows, from the states before it: the window
        slides k rows, and the delta rule runs the first k rows again (the same arithmetic, row by row)."""
        x, mixed, beta, g = self.record_views(ctx, record, n)
        ch, Hv, es = self.conv_channels, self.n_v_heads, record.element_size
        self.slide(ctx, gf, x, k, conv_state)
        mixed = ctx.view(mixed, [ch, k, 1], [mixed.nb[1], mixed.nb[1] * k], 0)
        beta, g = (ctx.view(t, [Hv, k], [Hv * es], 0) for t in (beta, g))
        self.rule(ctx, gf, mixed, beta, g, k, state)

    def heads_of(self, ctx: Context, x: Tensor, n: int) -> Tensor:
        """Q or K [S, n_k_heads, n, 1] for the value heads: the delta rule broadcasts them (value head h reads
        key head h % n_k_heads: Qwen3.5's converter orders the value heads so)."""
        return x

    def l2_norm(self, ctx: Context, x: Tensor) -> Tensor:
        """llama.cpp's build_gdn_l2_norm: x / |x| per head, as an RMS norm of eps / S scaled by 1 / sqrt(S)."""
        S = x.ne[0]
        return ctx.scale(ctx.rms_norm(x, float(f32(self.hp.rms_eps) / f32(S))), inv_sqrt(S))
