"""qwen3next family (llama.cpp's src/models/qwen3next.cpp): Qwen3-Next, the hybrid of gated delta-net layers and
gated full attention that Qwen3.5 grew from (arch/qwen35.py, with qwen35moe's experts), but for: NeoX RoPE over
part of each head (no sections), and beta and alpha from one fused projection (ssm_ba, interleaved per key head).
Older GGUFs with the fused ssm_in (Q, K, V and the gate in one) are refused: the current converter splits it."""

from __future__ import annotations

from typing import Any, Mapping

from ..errors import UnsupportedModelError
from ..native import Context, Tensor
from .base import Weights
from .common import ROPE_NEOX, Architecture
from .qwen35moe import Qwen35MoeArch


class Qwen3NextArch(Qwen35MoeArch):
    rope_mode = ROPE_NEOX
    rope = Architecture.rope

    def load_hparams(self, meta: Mapping[str, Any]) -> None:
        super().load_hparams(meta)
        first = next((il for il, r in enumerate(self.recurrent) if r), None)
        if first is not None and f"blk.{first}.ssm_in.weight" in self.names:
            raise UnsupportedModelError(
                "this qwen3next GGUF has the fused ssm_in projection of older converters: "
                "convert it again with a current llama.cpp (attn_qkv and attn_gate)"
            )

    def block_tensor_shapes(self, il: int) -> dict[str, tuple[int, ...]]:
        shapes = super().block_tensor_shapes(il)
        if self.recurrent[il]:
            p = f"blk.{il}."
            del shapes[p + "ssm_beta.weight"], shapes[p + "ssm_alpha.weight"]
            shapes[p + "ssm_ba.weight"] = (self.hp.n_embd, 2 * self.n_v_heads)
        return shapes

    def beta_alpha(self, ctx: Context, w: Weights, p: str, cur: Tensor) -> tuple[Tensor, Tensor]:
        """ssm_ba's rows per key head: its value heads' betas, then their alphas."""
        n, per = cur.ne[1], self.n_v_heads // self.n_k_heads
        ba = ctx.reshape(ctx.mul_mat(w(p + "ssm_ba.weight"), cur), [2 * per, self.n_k_heads, n])
        b = ctx.cont(ctx.view(ba, [per, self.n_k_heads, n], [ba.nb[1], ba.nb[2]], 0))
        a = ctx.cont(ctx.view(ba, [per, self.n_k_heads, n], [ba.nb[1], ba.nb[2]], per * ba.element_size))
        return ctx.reshape(ctx.sigmoid(b), [self.n_v_heads, n]), ctx.reshape(a, [self.n_v_heads, n])

    def heads_of(self, ctx: Context, x: Tensor, n: int) -> Tensor:
        """Q or K repeated per key head (value head h reads key head h // (n_v_heads / n_k_heads)), as llama.cpp's
        qwen3next graph repeats them."""
        S, Hk, r = self.d_state, self.n_k_heads, self.n_v_heads // self.n_k_heads
        if r == 1:
            return x
        x = ctx.repeat_4d(ctx.reshape(x, [S, 1, Hk, n]), [S, r, Hk, n])
        return ctx.reshape(x, [S, Hk * r, n, 1])
