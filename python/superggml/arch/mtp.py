"""A model's next-token-prediction block (MTP, `nextn`) as an architecture of one block, after the graph_mtp of
llama.cpp's src/models/deepseek2.cpp and glm4-moe.cpp.

The block after the model's own reads a token and the model's output-normed hidden row of the position before
it: RMS-normed each (nextn.enorm, nextn.hnorm), concatenated, projected back to n_embd (nextn.eh_proj), then one
block of the family (its attention over a memory of its own, its MoE FFN). Its output norm (nextn.shared_head_norm,
else the model's) gives the hidden row of the next draft step, and its head (nextn.shared_head_head, else the
model's) the logits of the token after.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from ..errors import GGUFError, UnsupportedModelError
from ..native import Context, Graph, Tensor
from .base import Memory, StepInputs, Weights
from .common import Architecture

MTP_FAMILIES = (
    "bailingmoe3",
    "deepseek2",
    "deepseek4",
    "glm4moe",
    "hy_v3",
    "mimo2",
    "qwen35",
    "qwen35moe",
    "qwen3next",
)  # llama.cpp's graph_mtp
PRE_NORM_HIDDEN = frozenset({"mimo2"})  # families whose MTP block reads the hidden rows before the output norm


class MtpArch:
    """`base`'s first MTP block (block base.hp.n_layer) as block 0 of a one-block model; everything else is
    base's."""

    reads_hidden = True
    final_softcap = 0.0

    def __init__(self, base: Architecture):
        hp = base.hp
        if hp.n_nextn < 1:
            raise UnsupportedModelError(
                f"this model has no next-token-prediction (MTP) block ('{hp.arch}.nextn_predict_layers' is absent or 0)"
            )
        if hp.arch not in MTP_FAMILIES:
            raise UnsupportedModelError(f"MTP drafting runs {', '.join(MTP_FAMILIES)} models, not {hp.arch}")
        self.base, self.il = base, hp.n_layer
        self.p = p = f"blk.{self.il}."
        missing = [n for n in ("eh_proj", "enorm", "hnorm") if f"{p}nextn.{n}.weight" not in base.names]
        if missing:
            raise GGUFError(
                f"the GGUF declares {hp.n_nextn} MTP block(s) but lacks {p}nextn.{missing[0]}.weight "
                "(converted without its MTP layers?)"
            )
        if hp.arch in ("deepseek2", "glm4moe") and not base.is_moe(self.il):
            raise UnsupportedModelError("the MTP block is expected to have experts, as llama.cpp's graph_mtp")
        if hp.arch == "mimo2" and p + "attn_qkv.weight" not in base.names:  # llama.cpp asserts
            raise UnsupportedModelError("mimo2's MTP block needs a fused attn_qkv, as llama.cpp's graph_mtp")
        if hp.arch == "deepseek2" and not hp.latent_kv:
            raise UnsupportedModelError(
                "deepseek2's MTP block needs the absorbed MLA layout, as llama.cpp's graph_mtp: convert the model again"
            )
        if hp.arch == "deepseek2" and p + "attn_q_a.weight" not in base.names:
            raise UnsupportedModelError(
                "deepseek2's MTP block needs the low-rank queries (q_lora_rank), as llama.cpp's graph_mtp"
            )
        self.hp = dataclasses.replace(hp, n_layer=1, n_nextn=0, n_layer_kv=0, state_bytes=0)
        self.swa_layers = (False,)
        self.embed_w = self.own("embed_tokens", "token_embd.weight")
        # nextn.shared_head_norm, else the block's layer_output_norm (bailingmoe3's), else the model's
        later = f"{p}layer_output_norm.weight"
        self.head_norm = self.own("shared_head_norm", later if later in base.names else base.output_norm)
        self.head_w = self.own("shared_head_head", base.output_tensor(base.names.__contains__))

    def own(self, name: str, fallback: str) -> str:
        """The block's nextn.<name>.weight where the GGUF has it, else the model's tensor."""
        t = f"{self.p}nextn.{name}.weight"
        return t if t in self.base.names else fallback

    def __getattr__(self, name: str) -> Any:
        return getattr(self.base, name)

    def describe(self) -> list[str]:
        return [f"MTP block {self.il}: its tensors resident, a one-layer memory of its own"]

    # -- tensors ---------------------------------------------------------
    def block_tensors(self, il: int) -> list[str]:
        own = sorted(n for n in self.base.names if n.startswith(self.p + "nextn."))
        return self.base.block_tensors(self.il) + own

    def expert_tensors(self, il: int) -> list[str]:
        return self.base.expert_tensors(self.il)

    def is_moe(self, il: int) -> bool:
        return self.base.is_moe(self.il)

    def is_swa(self, il: int) -> bool:
        return False

    def is_recurrent(self, il: int) -> bool:
        return False

    def is_unused(self, name: str) -> bool:
        return name.startswith("blk.") and not name.startswith(self.p)

    def matmul_weights(self, has: Callable[[str], bool]) -> list[str]:
        names = [n for n, shape in self.base.block_tensor_shapes(self.il).items() if len(shape) == 2]
        names += self.expert_tensors(0) + [self.p + "nextn.eh_proj.weight"]
        if self.head_w != "token_embd.weight":
            names.append(self.head_w)
        return names

    def output_tensor(self, has: Callable[[str], bool]) -> str:
        return self.head_w

    # -- graphs ------------------------------------------------------------
    def build_embed(self, ctx: Context, w: Weights, inp: StepInputs) -> Tensor:
        """eh_proj([enorm(the tokens' embeddings); hnorm(the hidden rows)]) F32 [n_embd, n_tokens]"""
        b, p = self.base, self.p
        assert inp.tokens is not None and inp.hidden is not None
        e = b.norm(ctx, w, ctx.get_rows(w(self.embed_w), inp.tokens), p + "nextn.enorm.weight")
        h = b.norm(ctx, w, inp.hidden, p + "nextn.hnorm.weight")
        return ctx.mul_mat(w(p + "nextn.eh_proj.weight"), ctx.concat(e, h, 0))

    def build_block(
        self, ctx: Context, gf: Graph, w: Weights, inp: StepInputs, il: int, x: Tensor, k_cache: Memory, v_cache: Memory
    ) -> Tensor:
        return self.base.build_block(ctx, gf, w, inp, self.il, x, k_cache, v_cache)

    def build_output_norm(self, ctx: Context, w: Weights, x: Tensor) -> Tensor:
        return self.base.norm(ctx, w, x, self.head_norm)

    def build_output(self, ctx: Context, w: Weights, inp: StepInputs, x: Tensor) -> Tensor:
        return ctx.mul_mat(w(self.head_w), self.build_output_norm(ctx, w, x))

    def build_logits(self, ctx: Context, logits: Tensor) -> Tensor:
        return logits
