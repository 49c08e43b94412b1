"""kimi-k3 family (llama.cpp's src/models/kimi-k3.cpp; docs/dev/kimi-k3.md cites it line by line): a hybrid of
KDA blocks (kimi delta attention: recurrent) and MLA blocks, picked by a per-block head_count_kv (0: KDA).

- KDA: Q, K and V each through a causal conv of its own over the last ssm.conv_kernel tokens (the three windows
  kept per sequence), SiLU; Q and K L2-normed per head; the gated delta rule with a decay per channel (from the
  low-rank ssm_f_a, ssm_f_b, ssm_dt and ssm_a: a bounded sigmoid where kda.gate_lower_bound is set, kimi-linear's
  softplus otherwise) and beta from ssm_beta; the output RMS-normed per head, gated by sigmoid(ssm_g), projected
  by attn_output (arch/kimi_k3_kda.py).
- MLA: deepseek2's absorbed latent attention with no RoPE at all (the rope part of Q and K passes as it is), an
  optional sigmoid output gate (attn_gate) before attn_output.
- Cross-layer residual attention (attn_res.block_size B > 0): every B-th block banks its input on a stack of
  checkpoints, and its residual restarts from the attention's output; before each sublayer and before the head
  the residual is a softmax-weighted sum of the stack and the current stream (dsv4_hc_pre over the stack). The
  stack travels with the residual between blocks (HParams.residual_width: n_embd for the stream and each slot).
- FFN: the leading dense blocks and the experts through the situ activation; a latent MoE: the router scores the
  full-width input, the routed experts run on ffn_routed_down's projection, their sum RMS-normed
  (ffn_routed_norm) and projected back (ffn_routed_up); shared experts at full width. Sigmoid routing with
  exp_probs_b.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from ..errors import GGUFError, UnsupportedModelError
from ..native import Context, Graph, Tensor
from .base import BlockGraph, Memory, StepInputs, Weights, f32, lane_memory, one_memory, situ
from .common import Rows, attend_latent, each_lane, inv_sqrt, whole
from .hybrid import HybridArch, Shapes
from .kimi_k3_kda import KdaMixer, KdaShape
from .moe import moe_tensor_shapes, set_gating, uniform_expert_ff


class KimiK3Arch(HybridArch):
    rope_factors = False
    late_gather = True  # the head mixes the last residual with the stack, then picks its rows
    recurrent_output = "attn_output"
    k3 = True  # kimi-linear (arch/kimi_linear.py) has none of K3's additions

    def load_hparams(self, meta: Mapping[str, Any]) -> None:
        hp = self.hp
        kinds = self.key(meta, "attention.head_count_kv", None)
        kv = [int(x) for x in kinds] if isinstance(kinds, (list, tuple)) else [hp.n_head_kv] * hp.n_layer
        self.recurrent = tuple(x == 0 for x in kv[: hp.n_layer + hp.n_nextn])  # the MTP blocks' too
        if any(x not in (0, 1) for x in kv):
            raise GGUFError(f"kimi-k3: an MLA block has one K/V head (head_count_kv 0 or 1 per block), not {kv}")
        trunk = self.recurrent[: hp.n_layer]
        if all(trunk) or not any(trunk):  # llama.cpp asserts at its first decode
            raise UnsupportedModelError("kimi-k3 with only KDA or only MLA blocks: llama.cpp cannot run it either")
        self.kv_lora = int(self.need(meta, "attention.kv_lora_rank"))
        self.k_mla = int(self.need(meta, "attention.key_length_mla"))
        self.v_mla = int(self.need(meta, "attention.value_length_mla"))
        self.n_nope = self.k_mla - hp.n_rot
        if hp.head_dim != self.kv_lora + hp.n_rot or self.n_nope < 1 or not self.v_mla:
            raise GGUFError(
                f"kimi-k3 MLA hyperparameters are inconsistent: key_length {hp.head_dim}, kv_lora_rank "
                f"{self.kv_lora}, rope {hp.n_rot}, key_length_mla {self.k_mla}, value_length_mla {self.v_mla}"
            )
        self.q_lora = int(self.key(meta, "attention.q_lora_rank", 0)) if self.k3 else 0
        self.d_conv = int(self.need(meta, "ssm.conv_kernel"))
        dk = int(self.need(meta, "kda.head_dim"))
        lb = self.key(meta, "kda.gate_lower_bound", None) if self.k3 else None
        self.conv_channels = 3 * hp.n_head * dk
        self.kda = KdaMixer(self.kda_shape(hp.n_head, dk, None if lb is None else float(f32(lb))))
        self.res_block = int(self.need(meta, "attn_res.block_size")) if self.k3 else 0
        if not self.res_block and any(n.endswith("_res_score.weight") for n in self.names):
            # llama.cpp does not load them then, and refuses a file with tensors it did not load
            raise GGUFError(f"{hp.arch}: residual-attention score tensors, but no residual attention's block size")
        self.situ = (0.0, 0.0)
        if self.k3:
            self.situ = (
                float(f32(self.need(meta, "activation.situ_beta"))),
                float(f32(self.need(meta, "activation.situ_linear_beta"))),
            )
        self.load_ffn_keys(meta)
        banks = -(-hp.n_layer // self.res_block) if self.res_block else 0  # blocks 0, B, 2B, ... bank their input
        self.hp = dataclasses.replace(
            self.hp, latent_kv=True, head_dim_v=self.kv_lora, n_residual=hp.n_embd * (1 + banks) if banks else 0
        )
        self.count_states()

    def kda_shape(self, n_head: int, head_dim: int, lower_bound: float | None) -> KdaShape:
        return KdaShape(n_head, head_dim, self.d_conv, lower_bound, self.hp.rms_eps)

    def load_ffn_keys(self, meta: Mapping[str, Any]) -> None:
        hp = self.hp
        self.n_lead = int(self.key(meta, "leading_dense_block_count", 0))
        self.n_ff_exp = uniform_expert_ff(self, meta)
        self.n_latent = int(self.key(meta, "expert_latent_length", 0)) if self.k3 else 0
        shared = int(self.need(meta, "expert_shared_count"))
        self.n_ff_shexp = (
            self.n_ff_exp * max(shared, 1) if f"blk.{self.n_lead}.ffn_gate_shexp.weight" in self.names else 0
        )
        self.shexp_gate = False
        set_gating(self, int(self.need(meta, "expert_gating_func")))
        self.moe.probs_bias = True
        self.moe.act = "situ" if self.k3 else "swiglu"
        self.moe.situ = self.situ
        # kimi-linear normalizes the chosen weights whatever the key says
        self.moe.norm_w = bool(self.key(meta, "expert_weights_norm", False)) if self.k3 else True
        self.moe.w_scale = float(f32(self.key(meta, "expert_weights_scale", 0.0)))
        if hp.n_expert and not 0 < hp.n_expert_used <= hp.n_expert:
            raise GGUFError(f"kimi-k3: {hp.n_expert_used} of {hp.n_expert} experts per token")

    def attention_note(self) -> str:
        return f"MLA blocks without RoPE (a latent row of {self.kv_lora} + {self.hp.n_rot} values per token)"

    def mixer_note(self) -> str:
        s = self.kda.shape
        return (
            f"KDA blocks (three conv windows of {self.d_conv - 1} tokens and a {s.head_dim}^2 state per head, "
            f"{s.n_head} heads: {self.hp.state_bytes / 2**20:.2f} MiB per sequence)"
        )

    def describe(self) -> list[str]:
        res = (
            f"residual attention: every {self.res_block} blocks bank their input; each sublayer and the head read a "
            "softmax mix of the banked inputs and the stream"
            if self.res_block
            else "plain residuals"
        )
        lat = f"routed experts in a latent space of {self.n_latent}" if self.n_latent else "routed experts at n_embd"
        return super().describe() + [res, f"situ activations; {lat}, sigmoid routing with exp_probs_b"]

    @property
    def state_sizes(self) -> tuple[int, int]:
        return self.kda.state_sizes

    def record_size(self, n: int) -> int:
        return self.kda.record_size(n)

    def replay(
        self, ctx: Context, gf: Graph, record: Tensor, n: int, k: int, conv: Tensor, state: Tensor, slot: int
    ) -> None:
        self.kda.replay(ctx, gf, record, n, k, conv, state)

    def is_moe(self, il: int) -> bool:
        return self.hp.n_expert > 0 and il >= self.n_lead

    # -- tensors ---------------------------------------------------------
    def global_tensor_shapes(self, has: Any) -> dict[str, tuple[int, ...]]:
        hp = self.hp
        shapes = {
            "token_embd.weight": (hp.n_embd, hp.n_vocab),
            "output_norm.weight": (hp.n_embd,),
            "output.weight": (hp.n_embd, hp.n_vocab),
        }
        if self.res_block:
            shapes["output_res_score.weight"] = (hp.n_embd,)
        return shapes

    def output_tensor(self, has: Any) -> str:
        return "output.weight"

    def block_tensor_shapes(self, il: int) -> dict[str, tuple[int, ...]]:
        hp, p, E = self.hp, f"blk.{il}.", self.hp.n_embd
        shapes: Shapes = {p + "attn_norm.weight": (E,), p + "ffn_norm.weight": (E,)}
        if self.res_block:
            shapes[p + "attn_res_score.weight"] = (E,)
            shapes[p + "ffn_res_score.weight"] = (E,)
        if self.recurrent[il]:
            shapes.update(self.kda.tensor_shapes(p, E))
        else:
            if self.q_lora:
                shapes[p + "attn_q_a.weight"] = (E, self.q_lora)
                shapes[p + "attn_q_a_norm.weight"] = (self.q_lora,)
                shapes[p + "attn_q_b.weight"] = (self.q_lora, hp.n_head * self.k_mla)
            else:
                shapes[p + "attn_q.weight"] = (E, hp.n_head * self.k_mla)
            shapes[p + "attn_kv_a_mqa.weight"] = (E, self.kv_lora + hp.n_rot)
            shapes[p + "attn_kv_a_norm.weight"] = (self.kv_lora,)
            shapes[p + "attn_k_b.weight"] = (self.n_nope, self.kv_lora, hp.n_head)
            shapes[p + "attn_v_b.weight"] = (self.kv_lora, self.v_mla, hp.n_head)
            if p + "attn_gate.weight" in self.names:
                shapes[p + "attn_gate.weight"] = (E, hp.n_head * self.v_mla)
            shapes[p + "attn_output.weight"] = (hp.n_head * self.v_mla, E)
        if not self.is_moe(il):
            shapes.update(
                {
                    p + "ffn_gate.weight": (E, hp.n_ff),
                    p + "ffn_up.weight": (E, hp.n_ff),
                    p + "ffn_down.weight": (hp.n_ff, E),
                }
            )
            return shapes
        moe = moe_tensor_shapes(self, il)
        if self.n_latent:
            La, F, X = self.n_latent, self.n_ff_exp, hp.n_expert
            moe[p + "ffn_gate_exps.weight"] = moe[p + "ffn_up_exps.weight"] = (La, F, X)
            moe[p + "ffn_down_exps.weight"] = (F, La, X)
            moe[p + "ffn_routed_down.weight"] = (E, La)
            moe[p + "ffn_routed_up.weight"] = (La, E)
            if p + "ffn_routed_norm.weight" in self.names:
                moe[p + "ffn_routed_norm.weight"] = (La,)
        return shapes | moe

    # -- the residual and its stack of banked inputs --------------------------
    def banked_before(self, il: int) -> int:
        """Checkpoints on the stack when block il starts (blocks 0, B, 2B, ... before it banked)."""
        return -(-il // self.res_block) if self.res_block else 0

    def split(self, ctx: Context, x: Tensor, m: int) -> tuple[Tensor, Tensor | None]:
        """The residual rows x F32 [residual_width, n] as (the stream [n_embd, n], the first m checkpoints [n_embd,
        m, n] or None), contiguous."""
        E, n = self.hp.n_embd, x.ne[1]
        if not self.res_block:
            return x, None
        es = x.element_size
        stream = ctx.cont(ctx.view(x, [E, n], [x.nb[1]], 0))
        stack = ctx.cont(ctx.view(x, [E, m, n], [E * es, x.nb[1]], E * es)) if m else None
        return stream, stack

    def join(self, ctx: Context, stream: Tensor, stack: Tensor | None) -> Tensor:
        """The stream and the stack back in the residual's layout, F32 [residual_width, n] (unused slots zero)."""
        if not self.res_block:
            return stream
        E, n = self.hp.n_embd, stream.ne[1]
        rows = stream if stack is None else ctx.concat(stream, ctx.reshape(stack, [E * stack.ne[1], n]), 0)
        pad = self.hp.residual_width - rows.ne[0]
        return ctx.pad(rows, [pad]) if pad else rows

    def mix(self, ctx: Context, w: Weights, cur: Tensor, stack: Tensor | None, name: str) -> Tensor:
        """llama.cpp's res_mix: the stream cur and the stack weighted by a softmax of their scores (score weights
        `name`); cur where nothing is banked yet."""
        if stack is None:
            return cur
        eps, m, n = self.hp.rms_eps, stack.ne[1], cur.ne[1]
        sw = w(name)
        sc_src = ctx.reshape(ctx.sum_rows(ctx.mul(ctx.rms_norm(stack, eps), sw)), [m, n])
        sc_cur = ctx.sum_rows(ctx.mul(ctx.rms_norm(cur, eps), sw))  # [1, n]
        probs = ctx.soft_max_ext(ctx.concat(sc_src, sc_cur, 0), None, 1.0)  # [m + 1, n]
        p_src = ctx.cont(ctx.view(probs, [m, n], [probs.nb[1]], 0))
        p_cur = ctx.cont(ctx.view(probs, [1, n], [probs.nb[1]], m * probs.element_size))
        return ctx.add(ctx.dsv4_hc_pre(stack, p_src), ctx.mul(cur, p_cur))

    # -- graphs ------------------------------------------------------------
    def build_embed(self, ctx: Context, w: Weights, inp: StepInputs) -> Tensor:
        return self.join(ctx, super().build_embed(ctx, w, inp), None)

    def build_attn_part(
        self, ctx: Context, gf: Graph, w: Weights, inp: StepInputs, il: int, x: Tensor, k_cache: Memory, v_cache: Memory
    ) -> tuple[Tensor, Tensor]:
        """(the residual after the mixer, the stack with this block's checkpoint included, in the residual's
        layout; the FFN's normed input F32 [n_embd, n])."""
        p, B = f"blk.{il}.", self.res_block
        stream, stack = self.split(ctx, x, self.banked_before(il))
        cur = self.mix(ctx, w, stream, stack, p + "attn_res_score.weight") if B else stream
        banked = bool(B) and il % B == 0
        if banked:
            ckpt = ctx.reshape(stream, [self.hp.n_embd, 1, stream.ne[1]])
            stack = ckpt if stack is None else ctx.concat(stack, ckpt, 1)
        cur = self.norm(ctx, w, cur, p + "attn_norm.weight")
        cur = self.mixer(BlockGraph(ctx, gf, w, inp, il), cur, k_cache, v_cache)
        stream = cur if banked else ctx.add(stream, cur)
        cur = self.mix(ctx, w, stream, stack, p + "ffn_res_score.weight") if B else stream
        return self.join(ctx, stream, stack), self.norm(ctx, w, cur, p + "ffn_norm.weight")

    def build_ffn_out(self, ctx: Context, w: Weights, p: str, ffn_out: Tensor, ffn_inp: Tensor) -> Tensor:
        """The FFN's output added to the stream build_attn_part kept, the stack after it as it was."""
        il = int(p.split(".")[1])
        stream, stack = self.split(ctx, ffn_inp, self.banked_before(il + 1))
        return self.join(ctx, ctx.add(stream, ffn_out), stack)

    def mixer(self, blk: BlockGraph, cur: Tensor, k_cache: Memory, v_cache: Memory) -> Tensor:
        """Block il's KDA or MLA over its normed input, after its output projection: F32 [n_embd, n]."""
        ctx, w, il = blk.ctx, blk.w, blk.il
        p = f"blk.{il}."
        if self.recurrent[il]:
            out = self.kda.build(blk, cur, k_cache, v_cache)
        else:
            out = self.mla(blk, cur, k_cache)
            if w.has(p + "attn_gate.weight"):
                out = self.mla_gate(ctx, w(p + "attn_gate.weight"), cur, out)
        return ctx.mul_mat(w(p + "attn_output.weight"), out)

    def mla_gate(self, ctx: Context, gate: Tensor, cur: Tensor, out: Tensor) -> Tensor:
        """The MLA output [n_head * value_length_mla, n] gated by sigmoid(gate cur), value by value."""
        return ctx.mul(out, ctx.sigmoid(ctx.mul_mat(gate, cur)))

    def mla_rope(self, ctx: Context, inp: StepInputs, x: Tensor) -> Tensor:
        """The rope part of an MLA query or key [n_rot, heads, n]: as it is (kimi-k3's MLA is nope-only)."""
        return x

    def mla(self, blk: BlockGraph, cur: Tensor, k_cache: Memory) -> Tensor:
        """The absorbed latent attention without RoPE: F32 [n_head * value_length_mla, n]."""
        ctx, gf, w, inp, il = blk.ctx, blk.gf, blk.w, blk.inp, blk.il
        hp, p, n = self.hp, f"blk.{il}.", inp.n_tokens
        if self.q_lora:
            qr = self.norm(ctx, w, ctx.mul_mat(w(p + "attn_q_a.weight"), cur), p + "attn_q_a_norm.weight")
            q = ctx.mul_mat(w(p + "attn_q_b.weight"), qr)
        else:
            q = ctx.mul_mat(w(p + "attn_q.weight"), cur)
        kv_pe = ctx.mul_mat(w(p + "attn_kv_a_mqa.weight"), cur)  # [kv_lora + n_rot, n]
        row = kv_pe.nb[1]
        kv = self.norm(ctx, w, ctx.view(kv_pe, [self.kv_lora, n], [row], 0), p + "attn_kv_a_norm.weight")
        k_pe = ctx.view(kv_pe, [hp.n_rot, 1, n], [row, row], self.kv_lora * kv_pe.element_size)
        qs = q.element_size * self.k_mla
        q_nope = ctx.view(q, [self.n_nope, hp.n_head, n], [qs, qs * hp.n_head], 0)
        q_pe = ctx.view(q, [hp.n_rot, hp.n_head, n], [qs, qs * hp.n_head], self.n_nope * q.element_size)
        q_pe, k_pe = self.mla_rope(ctx, inp, q_pe), self.mla_rope(ctx, inp, k_pe)
        absorbed = ctx.mul_mat(w(p + "attn_k_b.weight"), ctx.permute(q_nope, 0, 2, 1, 3))  # [kv_lora, n, n_head]
        q = ctx.concat(ctx.permute(absorbed, 0, 2, 1, 3), q_pe, 0)  # [kv_lora + n_rot, n_head, n]
        k = ctx.concat(ctx.reshape(kv, [self.kv_lora, 1, n]), k_pe, 0)  # [kv_lora + n_rot, 1, n]
        v_b, scale = w(p + "attn_v_b.weight"), inv_sqrt(self.k_mla)

        def attend(lane: StepInputs, rows: Rows, cache: Tensor) -> Tensor:
            return attend_latent(ctx, gf, hp, lane, rows(q), rows(k), cache, scale, lane.mask, v_b)

        if inp.lanes is None:
            return attend(inp, whole, one_memory(k_cache))
        return each_lane(ctx, inp, lambda j, lane, rows: attend(lane, rows, lane_memory(k_cache, j)))

    def build_ffn(self, ctx: Context, w: Weights, p: str, cur: Tensor) -> Tensor:
        if self.is_moe(int(p.split(".")[1])) or not self.k3:
            return super().build_ffn(ctx, w, p, cur)
        gate = ctx.mul_mat(w(p + "ffn_gate.weight"), cur)
        up = ctx.mul_mat(w(p + "ffn_up.weight"), cur)
        return ctx.mul_mat(w(p + "ffn_down.weight"), situ(ctx, gate, up, *self.situ))

    def expert_input(self, ctx: Context, w: Weights, p: str, cur: Tensor) -> Tensor:
        return ctx.mul_mat(w(p + "ffn_routed_down.weight"), cur) if self.n_latent else cur

    def experts_out(self, ctx: Context, w: Weights, p: str, out: Tensor) -> Tensor:
        if not self.n_latent:
            return out
        if w.has(p + "ffn_routed_norm.weight"):
            out = self.norm(ctx, w, out, p + "ffn_routed_norm.weight")
        return ctx.mul_mat(w(p + "ffn_routed_up.weight"), out)

    def shared_ffn(self, ctx: Context, w: Weights, p: str, cur: Tensor) -> Tensor | None:
        if not self.n_ff_shexp or not self.k3:
            return super().shared_ffn(ctx, w, p, cur)
        gate, up = ctx.mul_mat(w(p + "ffn_gate_shexp.weight"), cur), ctx.mul_mat(w(p + "ffn_up_shexp.weight"), cur)
        return ctx.mul_mat(w(p + "ffn_down_shexp.weight"), situ(ctx, gate, up, *self.situ))

    def build_output_norm(self, ctx: Context, w: Weights, x: Tensor) -> Tensor:
        """The last residual rows mixed with the whole stack (output_res_score), RMS-normed: F32 [n_embd, n]."""
        stream, stack = self.split(ctx, x, self.banked_before(self.hp.n_layer))
        cur = self.mix(ctx, w, stream, stack, "output_res_score.weight") if self.res_block else stream
        return self.norm(ctx, w, cur, "output_norm.weight")
