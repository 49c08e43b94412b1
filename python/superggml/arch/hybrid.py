"""Hybrid families: blocks with a recurrent mixer (a state per sequence, whatever its length) beside blocks that
attend with a K/V cache. What they share: which blocks are recurrent, the bytes of one sequence's states, and a
recurrent block's tensors in place of the attention's."""

from __future__ import annotations

import abc
import dataclasses

from ..native import Context, Graph, Tensor
from .common import Architecture, conv_input, slide_window

Shapes = dict[str, tuple[int, ...]]
ATTENTION_TENSORS = ("attn_q", "attn_k", "attn_v", "attn_output", "attn_q_norm", "attn_k_norm")


class HybridArch(Architecture, abc.ABC):
    d_conv: int  # the conv's kernel: its window keeps the last d_conv - 1 rows of each sequence
    conv_channels: int  # the conv's channels

    @property
    @abc.abstractmethod
    def state_sizes(self) -> tuple[int, int]:
        """Values per sequence and recurrent block: its conv window's and its mixer's state."""

    def attention_note(self) -> str:
        """What describe says of the blocks that attend."""
        return "attention layers with a K/V cache"

    @abc.abstractmethod
    def mixer_note(self) -> str:
        """What describe says of the recurrent blocks: their kind and state."""

    def describe(self) -> list[str]:
        n = sum(self.recurrent)
        return [f"hybrid: {n} {self.mixer_note()}, {self.hp.n_layer - n} {self.attention_note()}"]

    def count_states(self, n_recurrent: int | None = None, n_layer_kv: int | None = None) -> None:
        """Sets what the memory plans from, once the blocks' kinds are known: the blocks with a K/V cache (all
        but the recurrent ones unless given), and one sequence's states in bytes (F32)."""
        n = sum(self.recurrent) if n_recurrent is None else n_recurrent
        n_kv = self.hp.n_layer - n if n_layer_kv is None else n_layer_kv
        self.hp = dataclasses.replace(self.hp, n_layer_kv=n_kv, state_bytes=4 * n * sum(self.state_sizes))

    def mixer_shapes(self, il: int, shapes: Shapes, mixer: Shapes) -> Shapes:
        """Block il's tensors: the attention's where it attends, else the mixer's in their place."""
        if not self.is_recurrent(il):
            return shapes
        for n in ATTENTION_TENSORS:
            for part in (".weight", ".bias"):
                shapes.pop(f"blk.{il}.{n}{part}", None)
        return shapes | mixer

    # -- the conv over each sequence's window ---------------------------------
    def conv_window(self, ctx: Context, gf: Graph, x: Tensor, n: int, conv_state: Tensor) -> Tensor:
        """One sequence's n rows x [conv_channels, n] after its window: [d_conv - 1 + n, conv_channels, 1], the
        conv's input; the window after the rows written back to conv_state."""
        return conv_input(ctx, gf, self.window(ctx, conv_state), x, n)

    def window(self, ctx: Context, conv_state: Tensor) -> Tensor:
        return ctx.reshape(conv_state, [self.d_conv - 1, self.conv_channels, 1])

    def slide(self, ctx: Context, gf: Graph, xx: Tensor, k: int, conv_state: Tensor) -> None:
        """The window after k of xx's rows (xx: the window, then the rows) written back to conv_state."""
        slide_window(ctx, gf, xx, k, self.window(ctx, conv_state))
