"""lfm2 family: Liquid's LFM2, a hybrid of short-convolution blocks and attention blocks (llama.cpp's
src/models/lfm2.cpp). The layers whose attention.head_count_kv is 0 are convolutions: in_proj gives B, C and X;
B * X runs through a causal depthwise conv over the last shortconv.l_cache tokens (its window kept per sequence,
as a recurrent state), is gated by C and projected by out_proj. The others attend with Q/K head norms and NeoX
RoPE (a sliding window where attention.sliding_window is set). Every block has a SwiGLU FFN; the output norm is
named token_embd_norm."""

from __future__ import annotations

from typing import Any, Mapping

from ..errors import GGUFError
from ..native import Context, Graph, Tensor
from .base import BlockGraph, Memory, Weights
from .common import ROPE_NEOX, each_sequence
from .hybrid import HybridArch, Shapes


class Lfm2Arch(HybridArch):
    rope_mode = ROPE_NEOX
    rope_factors = False
    qk_norm = True
    output_norm = "token_embd_norm.weight"
    recurrent_output = "shortconv.out_proj"

    def load_hparams(self, meta: Mapping[str, Any]) -> None:
        hp = self.hp
        self.d_conv = int(self.need(meta, "shortconv.l_cache"))
        if self.d_conv < 2:
            raise GGUFError(f"'{hp.arch}.shortconv.l_cache' must be > 1, not {self.d_conv}")
        self.conv_channels = hp.n_embd
        self.recurrent = tuple(x == 0 for x in self.per_layer(meta, "attention.head_count_kv", hp.n_head))
        n_swa = int(self.key(meta, "attention.sliding_window", 0))
        if n_swa > 0:
            self.n_swa, self.swa_layers = n_swa, tuple(not r for r in self.recurrent)
        self.count_states()

    def mixer_note(self) -> str:
        return (
            f"short-convolution layers (a window of {self.d_conv - 1} tokens: {self.hp.state_bytes / 2**10:.1f} KiB "
            "per sequence)"
        )

    # -- memory -------------------------------------------------------------
    def is_moe(self, il: int) -> bool:
        return False  # llama.cpp's lfm2 runs a dense FFN in every block

    @property
    def state_sizes(self) -> tuple[int, int]:
        """Values per sequence and conv layer: the window's; no second state."""
        return (self.d_conv - 1) * self.hp.n_embd, 0

    # -- tensors ---------------------------------------------------------
    def block_tensor_shapes(self, il: int) -> dict[str, tuple[int, ...]]:
        E, p = self.hp.n_embd, f"blk.{il}."
        conv: Shapes = {
            p + "shortconv.conv.weight": (self.d_conv, E),
            p + "shortconv.in_proj.weight": (E, 3 * E),
            p + "shortconv.out_proj.weight": (E, E),
        }
        return self.mixer_shapes(il, super().block_tensor_shapes(il), conv)

    # -- graphs ------------------------------------------------------------
    def build_recurrent(self, blk: BlockGraph, cur: Tensor, k_cache: Memory, v_cache: Memory) -> Tensor:
        ctx, gf, w, inp, il = blk.ctx, blk.gf, blk.w, blk.inp, blk.il
        p, n, E = f"blk.{il}.", inp.n_tokens, self.hp.n_embd
        bcx = ctx.mul_mat(w(p + "shortconv.in_proj.weight"), cur)  # [3 * E, n]: B, C, X
        es, row = bcx.element_size, bcx.nb[1]
        b, c, x = (ctx.view(bcx, [E, n], [row], i * E * es) for i in range(3))
        bx = ctx.mul(b, x)  # [E, n]
        out = each_sequence(  # the conv window per sequence (the second state is empty)
            ctx,
            inp,
            il,
            k_cache,
            k_cache,
            lambda rows, n, window, _, record: self.short_conv(ctx, gf, w, p, rows(bx, 2), n, window, record),
        )
        return ctx.mul(c, out)

    def short_conv(
        self,
        ctx: Context,
        gf: Graph,
        w: Weights,
        p: str,
        bx: Tensor,
        n: int,
        window: Tensor,
        record: Tensor | None = None,
    ) -> Tensor:
        """One sequence's n rows of B * X [E, n] through the conv after its window (written back): F32 [E, n].
        `record`: where the pass leaves the window and its rows for replay."""
        xx = self.conv_window(ctx, gf, bx, n, window)  # [d_conv - 1 + n, E, 1]
        if record is not None:
            gf.expand(ctx.cpy(xx, self.record_view(ctx, record, n)))
        return ctx.reshape(ctx.ssm_conv(xx, w(p + "shortconv.conv.weight")), [self.hp.n_embd, n])

    # -- replay: a window after k rows of a recorded pass ---------------------
    def record_size(self, n: int) -> int:
        """Values a pass of n rows records per conv layer: the window and the rows after it."""
        return (self.d_conv - 1 + n) * self.hp.n_embd

    def record_view(self, ctx: Context, record: Tensor, n: int) -> Tensor:
        t, es = self.d_conv - 1 + n, record.element_size
        return ctx.view(record, [t, self.hp.n_embd, 1], [t * es, t * self.hp.n_embd * es], 0)

    def replay(
        self, ctx: Context, gf: Graph, record: Tensor, n: int, k: int, conv_state: Tensor, state: Tensor, slot: int
    ) -> None:
        """The window after the first k of a recorded pass's n rows."""
        self.slide(ctx, gf, self.record_view(ctx, record, n), k, conv_state)
