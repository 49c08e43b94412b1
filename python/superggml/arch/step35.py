"""step35 family: StepFun's Step 3.5 (llama.cpp's src/models/step35.cpp).

- Attention: a head count per layer (attention.head_count is an array: the sliding layers have their own), optional
  Q/K head norms, NeoX RoPE over half of each head in the full layers (with rope_freqs) and over whole heads in
  the sliding ones (their own base, rope.freq_base_swa, and no scaling), and an optional head-wise gate:
  sigmoid(attn_gate x) scales each head's output.
- FFN: a dense SwiGLU, or, in the blocks that have a router, experts (sigmoid gating unless expert_gating_func
  says otherwise, exp_probs_b where the block has it) plus a shared expert.
- SwiGLU clamps per layer (swiglu_clamp_exp for the experts, swiglu_clamp_shexp for the dense and shared FFNs).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

from ..errors import GGUFError, UnsupportedModelError
from ..native import Context, Tensor
from .base import HParams, StepInputs, Weights
from .common import ROPE_NEOX, Architecture
from .moe import set_gating, uniform_expert_ff


class Step35Arch(Architecture):
    rope_mode = ROPE_NEOX
    heads_per_layer = True
    kv_heads_per_layer = True

    def load_hparams(self, meta: Mapping[str, Any]) -> None:
        hp = self.hp
        n = hp.n_layer
        self.n_head_of = hp.n_head_per_layer[:n] if hp.n_head_per_layer else (hp.n_head,) * n
        self.n_head_kv_of = hp.n_head_kv_per_layer[:n] if hp.n_head_kv_per_layer else (hp.n_head_kv,) * n
        if (
            len(self.n_head_of) < n
            or len(self.n_head_kv_of) < n
            or any(not k or h % k for h, k in zip(self.n_head_of, self.n_head_kv_of))
        ):
            raise GGUFError(
                f"'{hp.arch}.attention.head_count' ({list(self.n_head_of)}) does not fit {n} layers of "
                f"{list(self.n_head_kv_of)} K/V heads"
            )
        self.n_swa = int(self.need(meta, "attention.sliding_window"))
        pattern = self.need(meta, "attention.sliding_window_pattern")
        if not isinstance(pattern, (list, tuple)) or len(pattern) < n:
            raise GGUFError(f"'{hp.arch}.attention.sliding_window_pattern' must be an array of {n} layers")
        self.swa_layers = tuple(bool(x) for x in list(pattern)[:n])
        self.rope_base_swa = float(self.key(meta, "rope.freq_base_swa", 10000.0))
        self.rope_scale_swa = 1.0
        self.n_rot_full = hp.n_rot // 2  # full layers rotate half of what rope.dimension_count says
        self.n_rot_swa = int(self.key(meta, "rope.dimension_count_swa", hp.n_rot))
        if not 0 < self.n_rot_swa <= hp.head_dim or self.n_rot_swa % 2:  # 0: llama.cpp hangs
            raise GGUFError(
                f"'{hp.arch}.rope.dimension_count_swa' ({self.n_rot_swa}) does not fit heads of {hp.head_dim}"
            )
        self.moe_layers = tuple(f"blk.{il}.ffn_gate_inp.weight" in self.names for il in range(n))
        self.n_ff_exp = uniform_expert_ff(self, meta)
        self.n_ff_shexp = int(self.key(meta, "expert_shared_feed_forward_length", 0))
        self.shexp_gate = False
        set_gating(self, int(self.key(meta, "expert_gating_func", 0)) or 2)  # none: sigmoid
        self.moe.w_scale = float(self.key(meta, "expert_weights_scale", 0.0))
        self.moe.norm_w = bool(self.key(meta, "expert_weights_norm", False))
        moe = [il for il in range(n) if self.moe_layers[il]]
        if moe and not (hp.n_expert and self.n_ff_shexp):
            raise GGUFError(
                f"{hp.arch}: blocks with experts need '{hp.arch}.expert_count' and "
                f"'{hp.arch}.expert_shared_feed_forward_length'"
            )
        biased = {f"blk.{il}.exp_probs_b.bias" in self.names for il in moe}
        if len(biased) > 1:
            raise UnsupportedModelError(f"{hp.arch}: exp_probs_b in some expert blocks only")
        self.moe.probs_bias = biased == {True}
        exp, shexp = self.per_layer(meta, "swiglu_clamp_exp", 0.0), self.per_layer(meta, "swiglu_clamp_shexp", 0.0)
        self.limits = tuple(zip(exp, shexp))
        self.qk_norms = tuple(f"blk.{il}.attn_q_norm.weight" in self.names for il in range(n))
        self.gates = tuple(f"blk.{il}.attn_gate.weight" in self.names for il in range(n))
        # the widest layer, for the buffers' sizes; K/V heads that differ by layer share a memory as wide as the
        # widest layer's (HParams.kv_width), each layer writing and reading its own leading values
        width = 0
        if len(set(self.n_head_kv_of)) > 1:
            if (hp.head_dim_v or hp.head_dim) != hp.head_dim:
                raise UnsupportedModelError(f"{hp.arch}: K/V heads per layer with value heads of another size")
            width = hp.head_dim * max(self.n_head_kv_of)
        self.hp = dataclasses.replace(hp, n_head=max(self.n_head_of), kv_width=width)
        self.layer_hps = tuple(
            dataclasses.replace(self.hp, n_head=h, n_head_kv=k, n_head_kv_per_layer=(), kv_width=0)
            for h, k in zip(self.n_head_of, self.n_head_kv_of)
        )

    def describe(self) -> list[str]:
        n_moe = sum(self.moe_layers)
        return [
            f"attention heads per layer: {sorted(set(self.n_head_of))}, K/V heads {sorted(set(self.n_head_kv_of))}; RoPE over {self.n_rot_full} of "
            f"{self.hp.head_dim} head values in the full layers, {self.n_rot_swa} in the sliding ones",
            f"experts in {n_moe} of {self.hp.n_layer} blocks, each with a shared expert",
        ]

    def is_moe(self, il: int) -> bool:
        return self.moe_layers[il]

    def swiglu_limits(self, il: int) -> tuple[float, float]:
        return self.limits[il]

    def n_rot_of(self, il: int) -> int:
        return self.n_rot_swa if self.is_swa(il) else self.n_rot_full

    # -- tensors ---------------------------------------------------------
    def block_tensor_shapes(self, il: int) -> dict[str, tuple[int, ...]]:
        hp, p = self.hp, f"blk.{il}."
        shapes = super().block_tensor_shapes(il)
        q, kv = self.n_head_of[il] * hp.head_dim, self.n_head_kv_of[il]
        shapes[p + "attn_q.weight"] = (hp.n_embd, q)
        shapes[p + "attn_k.weight"] = (hp.n_embd, hp.head_dim * kv)
        shapes[p + "attn_v.weight"] = (hp.n_embd, (hp.head_dim_v or hp.head_dim) * kv)
        shapes[p + "attn_output.weight"] = (q, hp.n_embd)
        if self.qk_norms[il]:
            shapes[p + "attn_q_norm.weight"] = shapes[p + "attn_k_norm.weight"] = (hp.head_dim,)
        if self.gates[il]:
            shapes[p + "attn_gate.weight"] = (hp.n_embd, self.n_head_of[il])
        return shapes

    def global_tensor_shapes(self, has: Callable[[str], bool]) -> dict[str, tuple[int, ...]]:
        shapes = super().global_tensor_shapes(has)
        n_rot_max = max(self.n_rot_of(il) for il in range(self.hp.n_layer))
        for name in ("rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight"):
            if name in shapes:
                shapes[name] = (n_rot_max // 2,)
        return shapes

    # -- graphs ------------------------------------------------------------
    def rope(self, ctx: Context, w: Weights, inp: StepInputs, il: int, x: Tensor) -> Tensor:
        hp, swa = self.hp, self.is_swa(il)
        assert inp.positions is not None
        return ctx.rope_ext(
            x,
            inp.positions,
            None if swa else self.rope_factors_of(w),
            self.n_rot_of(il),
            self.rope_mode,
            hp.n_ctx_orig,
            self.rope_base_swa if swa else hp.rope_base,
            self.rope_scale_swa if swa else hp.rope_scale,
            hp.rope_ext_factor,
            hp.rope_attn_factor,
            *self.yarn_beta,
        )

    def layer_hp(self, il: int) -> HParams:
        return self.layer_hps[il]

    def build_qk_norm(
        self, ctx: Context, w: Weights, p: str, q: Tensor, k: Tensor | None
    ) -> tuple[Tensor, Tensor | None]:
        if not self.qk_norms[int(p.split(".")[1])]:
            return q, k
        q = self.norm(ctx, w, q, p + "attn_q_norm.weight")
        return q, None if k is None else self.norm(ctx, w, k, p + "attn_k_norm.weight")

    def gate_heads(self, ctx: Context, w: Weights, il: int, cur: Tensor, out: Tensor) -> Tensor:
        if not self.gates[il]:
            return out
        d, h, n = self.hp.head_dim, self.n_head_of[il], out.ne[1]
        gate = ctx.sigmoid(ctx.mul_mat(w(f"blk.{il}.attn_gate.weight"), cur))  # [n_head, n]
        return ctx.reshape(ctx.mul(ctx.reshape(out, [d, h, n]), ctx.reshape(gate, [1, h, n])), [d * h, n])
