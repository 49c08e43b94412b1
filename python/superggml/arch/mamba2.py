"""Mamba-2 mixer layers, as llama.cpp's llm_build_mamba_base::build_mamba2_layer builds them (src/models/
mamba-base.cpp), for the hybrid families that interleave them with attention (granitehybrid, nemotron_h).

ssm_in projects z (the output gate), xBC (x, B and C: the conv's channels) and dt (one step per head). xBC runs
through a causal depthwise conv over the last ssm.conv_kernel tokens (its window a recurrent state per
sequence), plus its bias, then SiLU. The selective scan (ggml_ssm_scan) runs x, B and C with dt + ssm_dt.bias and
A from a [d_state, head_dim, n_head] state per sequence; y + x * D is gated by SiLU(z), RMS-normed per group
(ssm_norm) and projected by ssm_out (the family's attn_output).
"""

from __future__ import annotations

from typing import Any, Mapping

from .. import native
from ..errors import GGUFError
from ..native import Context, Graph, Tensor
from .base import BlockGraph, Memory, Weights
from .common import each_sequence, packed_views
from .hybrid import HybridArch


class Mamba2Layers(HybridArch):
    """The Mamba-2 half of a hybrid family: its keys, state, tensors, layer graph and replay."""

    def load_ssm(self, meta: Mapping[str, Any]) -> None:
        def need(name: str) -> int:
            return int(self.need(meta, name))

        self.d_conv = need("ssm.conv_kernel")
        self.d_inner = need("ssm.inner_size")
        self.d_state = need("ssm.state_size")
        self.n_ssm_head = need("ssm.time_step_rank")
        self.n_group = need("ssm.group_count")
        if (
            self.d_conv < 2
            or min(self.d_inner, self.d_state, self.n_ssm_head, self.n_group) < 1
            or self.d_inner % self.n_ssm_head
            or self.d_inner % self.n_group
            or self.n_ssm_head % self.n_group
        ):
            raise GGUFError(
                f"{self.hp.arch} Mamba-2 hyperparameters are inconsistent: conv_kernel {self.d_conv}, inner_size "
                f"{self.d_inner}, state_size {self.d_state}, time_step_rank {self.n_ssm_head}, group_count "
                f"{self.n_group}"
            )
        self.conv_channels = self.d_inner + 2 * self.n_group * self.d_state

    def mixer_note(self) -> str:
        return (
            f"Mamba-2 layers (a state of {self.n_ssm_head} heads x {self.d_inner // self.n_ssm_head} x {self.d_state} "
            f"and a conv window of {self.d_conv - 1} tokens: {self.hp.state_bytes / 2**20:.2f} MiB per sequence, "
            "whatever its length)"
        )

    @property
    def state_sizes(self) -> tuple[int, int]:
        """Values per sequence and Mamba-2 layer: the conv window's, the scan's state."""
        return (self.d_conv - 1) * self.conv_channels, self.d_state * self.d_inner

    def ssm_tensor_shapes(self, p: str) -> dict[str, tuple[int, ...]]:
        E, ch, H = self.hp.n_embd, self.conv_channels, self.n_ssm_head
        return {
            p + "ssm_in.weight": (E, self.d_inner + ch + H),
            p + "ssm_conv1d.weight": (self.d_conv, ch),
            p + "ssm_conv1d.bias": (ch,),
            p + "ssm_dt.bias": (H,),
            p + "ssm_a": (1, H),
            p + "ssm_d": (1, H),
            p + "ssm_norm.weight": (self.d_inner // self.n_group, self.n_group),
            p + "ssm_out.weight": (self.d_inner, E),
        }

    def build_recurrent(self, blk: BlockGraph, cur: Tensor, conv_state: Memory, state: Memory) -> Tensor:
        """Layer il's mixer over its normed input cur F32 [n_embd, n], before ssm_out: F32 [d_inner, n]. The conv
        window F32 [(d_conv - 1) * conv_channels] and the scan's state F32 [d_state * d_inner] (or lists, one per
        lane) are read and written back."""
        ctx, gf, w, inp, il = blk.ctx, blk.gf, blk.w, blk.inp, blk.il
        p, n, es = f"blk.{il}.", inp.n_tokens, 4
        zxbcdt = ctx.mul_mat(w(p + "ssm_in.weight"), cur)  # [d_inner + conv_channels + n_head, n]
        row, di, ch = zxbcdt.nb[1], self.d_inner, self.conv_channels
        z = ctx.view(zxbcdt, [di, n], [row], 0)
        xbc = ctx.view(zxbcdt, [ch, n], [row], di * es)
        dt = ctx.view(zxbcdt, [self.n_ssm_head, n], [row], (di + ch) * es)
        y = each_sequence(
            ctx,
            inp,
            il,
            conv_state,
            state,
            lambda rows, n, conv, st, record: self.mamba_rows(
                ctx, gf, w, p, rows(xbc, 2), rows(dt, 2), n, conv, st, record
            ),
        )
        y = ctx.swiglu_split(ctx.cont(z), y)
        g = self.n_group
        y = self.norm(ctx, w, ctx.reshape(y, [di // g, g, n]), p + "ssm_norm.weight")
        return ctx.reshape(y, [di, n])

    def mamba_rows(
        self,
        ctx: Context,
        gf: Graph,
        w: Weights,
        p: str,
        xbc: Tensor,
        dt: Tensor,
        n: int,
        conv_state: Tensor,
        state: Tensor,
        record: Tensor | None = None,
    ) -> Tensor:
        """One sequence's n rows of xBC [conv_channels, n] and dt [n_head, n]: the conv over its window (written
        back), then the scan from its state (written back); y + x * D, F32 [d_inner, n]. `record`: where the
        pass leaves the scan's inputs for replay."""
        xx = self.conv_window(ctx, gf, xbc, n, conv_state)  # [d_conv - 1 + n, ch, 1]
        mixed = ctx.add(ctx.ssm_conv(xx, w(p + "ssm_conv1d.weight")), w(p + "ssm_conv1d.bias"))
        mixed = ctx.silu(mixed)  # [ch, n, 1]
        dt = ctx.add(ctx.cont(dt), w(p + "ssm_dt.bias"))  # [n_head, n]
        a = w(p + "ssm_a")
        if record is not None:
            for src, dst in zip((xx, mixed, dt, a), self.record_views(ctx, record, n)):
                gf.expand(ctx.cpy(src, dst))
        y, x = self.scan(ctx, gf, mixed, dt, a, n, state)
        return ctx.reshape(ctx.add(y, ctx.mul(x, w(p + "ssm_d"))), [self.d_inner, n])

    def scan(
        self, ctx: Context, gf: Graph, mixed: Tensor, dt: Tensor, a: Tensor, n: int, state: Tensor
    ) -> tuple[Tensor, Tensor]:
        """The selective scan over n rows of the conv's output mixed [ch, n] and dt [n_head, n] from `state`
        (written back): y and x, F32 [head_dim, n_head, n, 1] each."""
        N, G, H, di = self.d_state, self.n_group, self.n_ssm_head, self.d_inner
        hd, es, row = di // H, mixed.element_size, mixed.nb[1]
        x = ctx.view(mixed, [hd, H, n, 1], [hd * es, row, row * n], 0)
        B = ctx.view(mixed, [N, G, n, 1], [N * es, row, row * n], di * es)
        C = ctx.view(mixed, [N, G, n, 1], [N * es, row, row * n], (di + G * N) * es)
        s0 = ctx.reshape(state, [N, hd, H, 1])
        zero = ctx.fill(ctx.view(a, [1], [], 0), 0.0)  # the scan's state index (one sequence, row 0)
        ids = ctx.cast(zero, native.GGMLType.I32)
        out = ctx.ssm_scan(s0, x, ctx.reshape(dt, [H, n, 1]), a, B, C, ids)
        gf.expand(ctx.cpy(ctx.view(out, [N * di], [], di * n * 4), ctx.reshape(state, [N * di])))
        return ctx.view(out, [hd, H, n, 1], [hd * 4, di * 4, di * n * 4], 0), x

    # -- replay: the states after k rows of a recorded pass ------------------------
    def record_size(self, n: int) -> int:
        """Values a pass of n rows records per Mamba-2 layer: the conv's input with the window before it, the
        conv's output, dt and A."""
        return (self.d_conv - 1 + 2 * n) * self.conv_channels + (n + 1) * self.n_ssm_head

    def record_views(self, ctx: Context, record: Tensor, n: int) -> list[Tensor]:
        """xx [dc - 1 + n, ch, 1], mixed [ch, n, 1], dt [n_head, n] and A [1, n_head], one after another in
        record."""
        ch, dc, H = self.conv_channels, self.d_conv, self.n_ssm_head
        return packed_views(ctx, record, [[dc - 1 + n, ch, 1], [ch, n, 1], [H, n], [1, H]])

    def replay(
        self, ctx: Context, gf: Graph, record: Tensor, n: int, k: int, conv: Tensor, state: Tensor, slot: int
    ) -> None:
        """The states after the first k of a recorded pass's n rows, from the states before it: the window
        slides k rows, and the scan runs the first k rows again."""
        xx, mixed, dt, a = self.record_views(ctx, record, n)
        ch, H, es = self.conv_channels, self.n_ssm_head, record.element_size
        self.slide(ctx, gf, xx, k, conv)
        mixed = ctx.view(mixed, [ch, k, 1], [mixed.nb[1], mixed.nb[1] * k], 0)
        self.scan(ctx, gf, mixed, ctx.view(dt, [H, k], [H * es], 0), a, k, state)
