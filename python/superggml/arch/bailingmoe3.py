"""bailingmoe3 family (llama.cpp's src/models/bailingmoe3.cpp; docs/dev/bailingmoe3.md): Ling 3's hybrid of KDA and
absorbed MLA blocks picked by a per-block head_count_kv (0: KDA), kimi-k3's skeleton (arch/kimi_k3.py) with:

- a KDA decay from one full-rank ssm_f_a, lb * sigmoid(exp(A_log) * f) (ssm_a holding +exp(A_log); the "safe"
  gate, which llama.cpp requires), and an output gate from one full-rank ssm_g_a;
- MLA with RoPE (NORM, or M-RoPE where rope.dimension_sections is set) on its rope part, and a sigmoid gate per
  head;
- plain pre-norm residuals, the head norming every row before it picks its rows;
- SwiGLU clamped per block (clamp, silu, mul), the shared limit also on the leading dense blocks; sigmoid routing
  with exp_probs_b, expert groups, the weights' norm and scale from the keys, a shared expert.
The MTP block is not run (drafting refuses this family)."""

from __future__ import annotations

from typing import Any, Mapping

from ..errors import GGUFError, UnsupportedModelError
from ..native import Context, Tensor
from .base import StepInputs, f32
from .common import ROPE_NORM
from .kimi_k3 import KimiK3Arch
from .kimi_k3_kda import KdaShape

ROPE_MROPE = 8  # GGML_ROPE_TYPE_MROPE


class BailingMoe3Arch(KimiK3Arch):
    k3 = False
    rope_mode = ROPE_NORM

    def load_hparams(self, meta: Mapping[str, Any]) -> None:
        hp = self.hp
        lb = float(f32(self.need(meta, "kda.gate_lower_bound")))
        if not self.key(meta, "kda.safe_gate", True) or lb >= 0:  # llama.cpp asserts both (absent: safe)
            raise GGUFError(f"{hp.arch}: KDA needs kda.safe_gate true and a negative kda.gate_lower_bound")
        self.lower_bound = lb
        self.need(meta, "leading_dense_block_count")
        super().load_hparams(meta)
        self.q_lora = int(self.key(meta, "attention.q_lora_rank", 0))
        sections = self.key(meta, "rope.dimension_sections", None)
        if isinstance(sections, (list, tuple)):
            self.rope_sections = [int(x) for x in list(sections)[:4]] + [0] * (4 - min(len(sections), 4))
        n = hp.n_layer + hp.n_nextn
        exp, shexp = (self.every_block(meta, k, n) for k in ("swiglu_clamp_exp", "swiglu_clamp_shexp"))
        self.limits = list(zip(exp, shexp))
        self.moe.norm_w = bool(self.key(meta, "expert_weights_norm", False))
        self.moe.groups = (
            int(self.key(meta, "expert_group_count", 0)),
            int(self.key(meta, "expert_group_used_count", 0)),
        )
        shexp_ff = int(self.key(meta, "expert_shared_feed_forward_length", 0))
        if shexp_ff:
            self.n_ff_shexp = shexp_ff
        if hp.n_expert and not self.n_ff_shexp:
            raise GGUFError(f"{hp.arch}: expert blocks without the shared expert llama.cpp requires")
        if any(x.endswith(".attn_qkv.weight") for x in self.names):  # llama.cpp segfaults on it
            raise UnsupportedModelError(f"{hp.arch} with a fused attn_qkv: llama.cpp cannot run it")

    def every_block(self, meta: Mapping[str, Any], name: str, n: int) -> list[float]:
        v = self.key(meta, name, 0.0)
        per = [float(f32(x)) for x in v] if isinstance(v, (list, tuple)) else [float(f32(v))] * n
        if len(per) < n:
            raise GGUFError(f"'{self.hp.arch}.{name}' has {len(per)} entries for {n} blocks")
        return per[:n]

    def kda_shape(self, n_head: int, head_dim: int, lower_bound: float | None) -> KdaShape:
        return KdaShape(
            n_head,
            head_dim,
            self.d_conv,
            self.lower_bound,
            self.hp.rms_eps,
            a_shape=(1, n_head),
            full_rank_decay=True,
            gate_a_full=True,
        )

    def output_tensor(self, has: Any) -> str:
        return "output.weight" if has("output.weight") else "token_embd.weight"  # tied where the file has none

    def global_tensor_shapes(self, has: Any) -> dict[str, tuple[int, ...]]:
        shapes = super().global_tensor_shapes(has)
        if not has("output.weight"):
            del shapes["output.weight"]
        return shapes

    def swiglu_limits(self, il: int) -> tuple[float, float]:
        return self.limits[il]

    def block_tensor_shapes(self, il: int) -> dict[str, tuple[int, ...]]:
        shapes, p = super().block_tensor_shapes(il), f"blk.{il}."
        if not self.recurrent[il]:
            shapes[p + "attn_gate.weight"] = (self.hp.n_embd, self.hp.n_head)  # one gate per head
        return shapes

    def mla_gate(self, ctx: Context, gate: Tensor, cur: Tensor, out: Tensor) -> Tensor:
        H, n = self.hp.n_head, cur.ne[1]
        g = ctx.sigmoid(ctx.reshape(ctx.mul_mat(gate, cur), [1, H, n]))
        return ctx.reshape(ctx.mul(ctx.reshape(out, [self.v_mla, H, n]), g), [self.v_mla * H, n])

    def mla_rope(self, ctx: Context, inp: StepInputs, x: Tensor) -> Tensor:
        hp = self.hp
        assert inp.positions is not None
        if self.rope_sections:
            return ctx.rope_multi(
                x,
                inp.positions,
                hp.n_rot,
                self.rope_sections,
                ROPE_MROPE,
                hp.n_ctx_orig,
                hp.rope_base,
                hp.rope_scale,
                hp.rope_ext_factor,
                hp.rope_attn_factor,
                *self.yarn_beta,
            )
        return ctx.rope_ext(
            x,
            inp.positions,
            None,
            hp.n_rot,
            ROPE_NORM,
            hp.n_ctx_orig,
            hp.rope_base,
            hp.rope_scale,
            hp.rope_ext_factor,
            hp.rope_attn_factor,
            *self.yarn_beta,
        )
