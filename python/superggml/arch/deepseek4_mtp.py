"""deepseek4's next-token-prediction block (llama.cpp's llama_model_deepseek4::graph_mtp): the token's embedding,
RMS-normed and repeated in each of the 4 streams, beside the model's last streams of the position before, each
stream RMS-normed; projected back by nextn.eh_proj into 4 streams, one block over a raw sliding-window memory of
its own (its compression ratio must be 0), and the model's head over its streams (nextn.shared_head_norm and
shared_head_head where the file has them)."""

from __future__ import annotations

from ..errors import UnsupportedModelError
from ..native import Context, Tensor
from .base import StepInputs, Weights
from .deepseek4 import HC, Deepseek4Arch
from .mtp import MtpArch


class Deepseek4Mtp(MtpArch):
    def __init__(self, base: Deepseek4Arch):
        super().__init__(base)
        self.ds4 = base
        if base.hp.n_nextn != 1:
            raise UnsupportedModelError("deepseek4 drafts with one MTP block, as llama.cpp")
        if base.all_ratios[self.il] != 0 or self.il < base.n_hash:
            raise UnsupportedModelError(
                "deepseek4's MTP block must be uncompressed and routed by its router, as llama.cpp's graph_mtp"
            )

    def compressed_layout(self) -> tuple[tuple[int, ...], int] | None:
        return (0,), self.ds4.idx_dim

    def build_embed(self, ctx: Context, w: Weights, inp: StepInputs) -> Tensor:
        """eh_proj([enorm(embedding) in every stream; hnorm(each of the model's streams)]): F32 [4 * n_embd, n]."""
        b, p, E = self.ds4, self.p, self.hp.n_embd
        assert inp.tokens is not None and inp.hidden is not None
        n = inp.n_tokens
        e = b.norm(ctx, w, ctx.get_rows(w(self.embed_w), inp.tokens), p + "nextn.enorm.weight")
        e = ctx.repeat_4d(ctx.reshape(e, [E, 1, n]), [E, HC, n, 1])
        h = b.norm(ctx, w, ctx.reshape(inp.hidden, [E, HC, n]), p + "nextn.hnorm.weight")
        x = ctx.mul_mat(w(p + "nextn.eh_proj.weight"), ctx.concat(e, h, 0))  # [n_embd, 4, n]
        return ctx.reshape(x, [HC * E, n])

    def build_output_norm(self, ctx: Context, w: Weights, x: Tensor) -> Tensor:
        return self.ds4.hc_head(ctx, w, x, self.head_norm)
