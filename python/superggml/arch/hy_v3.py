"""hy_v3 family (llama.cpp's src/models/hy-v3.cpp; docs/dev/hy-v4.md part 2): Hunyuan HY V3, GQA with per-head Q/K
norms before NeoX RoPE over the whole head; a block is dense where it has no router, else sigmoid-routed experts
(the selection bias `blk.N.exp_probs_b`, no suffix) with an always-on shared expert; an MTP block drafts as
glm4moe's."""

from __future__ import annotations

from typing import Any, Mapping

from ..errors import GGUFError, UnsupportedModelError
from ..native import Context, Tensor
from .base import Weights
from .common import fused_qkv, fused_qkv_shapes
from .moe import set_gating, uniform_expert_ff
from .qwen3 import Qwen3Arch


class HyV3Arch(Qwen3Arch):
    late_gather = True  # the head norms every row, then picks its rows

    def load_hparams(self, meta: Mapping[str, Any]) -> None:
        hp = self.hp
        n_all = hp.n_layer + hp.n_nextn
        if hp.n_rot != hp.head_dim:  # llama.cpp asserts it
            raise GGUFError(f"{hp.arch} rotates whole heads: rope.dimension_count {hp.n_rot} != head_dim {hp.head_dim}")
        self.moe_layers = tuple(f"blk.{il}.ffn_gate_inp.weight" in self.names for il in range(n_all))
        self.n_ff_exp = uniform_expert_ff(self, meta)
        self.n_ff_shexp = int(self.key(meta, "expert_shared_feed_forward_length", 0)) or self.n_ff_exp
        self.shexp_gate = False
        set_gating(self, int(self.key(meta, "expert_gating_func", 0)) or 2)  # none: sigmoid
        self.moe.fused_gate_up = any(n.endswith(".ffn_gate_up_exps.weight") for n in self.names)
        self.moe.probs_bias_name = "exp_probs_b"
        self.moe.probs_bias = any(f"blk.{il}.exp_probs_b" in self.names for il in range(n_all))
        self.moe.norm_w = bool(self.key(meta, "expert_weights_norm", False))
        self.moe.w_scale = float(self.key(meta, "expert_weights_scale", 0.0))
        for il in range(n_all):
            p = f"blk.{il}."
            if self.moe_layers[il] and p + "ffn_gate_shexp.weight" not in self.names:
                # llama.cpp adds silu of the input in its place
                raise GGUFError(f"{hp.arch}: block {il} has experts but no shared expert, which llama.cpp always adds")
            if self.moe_layers[il] and self.moe.probs_bias != (p + "exp_probs_b" in self.names):
                raise UnsupportedModelError(f"{hp.arch}: exp_probs_b in some expert blocks only")

    def block_tensor_shapes(self, il: int) -> dict[str, tuple[int, ...]]:
        shapes, p = super().block_tensor_shapes(il), f"blk.{il}."
        return fused_qkv_shapes(shapes, p, self.hp.n_embd) if p + "attn_qkv.weight" in self.names else shapes

    def build_qkv(
        self, ctx: Context, w: Weights, p: str, cur: Tensor, n: int
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        if w.has(p + "attn_qkv.weight"):
            return fused_qkv(ctx, w, p, cur, self.hp)
        return super().build_qkv(ctx, w, p, cur, n)

    def is_moe(self, il: int) -> bool:
        return il < len(self.moe_layers) and self.moe_layers[il]

    def describe(self) -> list[str]:
        n = sum(self.moe_layers[: self.hp.n_layer])
        return [f"experts in {n} of {self.hp.n_layer} blocks (sigmoid routing, a shared expert), dense elsewhere"]
