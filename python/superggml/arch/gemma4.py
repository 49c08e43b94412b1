"""gemma4 family: Google's Gemma 4, dense (E2B, E4B, 31B) and MoE (26B-A4B), text only (llama.cpp's
src/models/gemma4.cpp).

- Attention: sliding layers (attention.sliding_window_pattern, an array) have heads of key_length_swa and their own
  K/V head count (head_count_kv per layer), RoPE over rope.dimension_count_swa with rope.freq_base_swa; the full
  layers have heads of key_length and NeoX RoPE over whole heads with rope_freqs, whose 1e30 entries leave the
  rest of each head unrotated ("proportional" RoPE). Q and K are RMS-normed per head with weights, V without; KQ
  is not scaled. A layer without attn_v reads K's projection as V. The K/V memory is as wide as the widest layer.
- The last attention.shared_kv_layers blocks keep no K/V: each attends over that of the last earlier block of its
  kind (kv_source), as llama.cpp's layer reuse.
- FFN: a GELU-gated MLP between RMS norms. In a block with a router (ffn_gate_inp) the MLP runs beside experts
  (post_ffw_norm_1 after it): the router reads the block's residual, RMS-normed, scaled by 1/sqrt(n_embd) and by
  ffn_gate_inp.scale; the experts read it through pre_ffw_norm_2, are GELU-gated, each output scaled by
  ffn_down_exps.scale, and their sum goes through post_ffw_norm_2 before the MLP's output joins it.
- Per-layer embeddings (embedding_length_per_layer_input > 0, E2B and E4B): the embedding's graph computes each
  block's own input from per_layer_token_embd's row of the token and a projection of the token's embedding
  (StepInputs.per_layer); each block gates it by its output (inp_gate, GELU), projects it back and adds it.
- layer_output_scale multiplies a block's output; the final logits are soft-capped (30 when the key is absent).
- The last block keeps every row; the head picks its rows after the output norm, as llama.cpp.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

import numpy as np

from ..errors import GGUFError, UnsupportedModelError
from ..native import Context, Graph, Tensor
from .base import HParams, StepInputs, Weights, f32
from .common import ROPE_NEOX, Architecture, inv_sqrt
from .moe import moe_tensor_shapes, uniform_expert_ff

PER_LAYER_TENSORS = ("per_layer_token_embd.weight", "per_layer_model_proj.weight", "per_layer_proj_norm.weight")


class Gemma4Arch(Architecture):
    rope_mode = ROPE_NEOX
    post_norms = True
    qk_norm = True
    ffn_glu = "geglu"
    kv_heads_per_layer = True
    late_gather = True

    def load_hparams(self, meta: Mapping[str, Any]) -> None:
        hp = self.hp
        n = hp.n_layer
        pattern = self.need(meta, "attention.sliding_window_pattern")
        if not isinstance(pattern, (list, tuple)):
            raise GGUFError(f"'{hp.arch}.attention.sliding_window_pattern' must be an array of {n} layers")
        self.n_swa = int(self.need(meta, "attention.sliding_window"))
        self.set_swa_pattern(meta, 0)
        swa = [self.is_swa(il) for il in range(n)]
        self.rope_base_swa = float(self.key(meta, "rope.freq_base_swa", 10000.0))
        self.rope_scale_swa = 1.0
        hd_swa = int(self.need(meta, "attention.key_length_swa"))
        if hd_swa != int(self.need(meta, "attention.value_length_swa")):
            raise GGUFError("Gemma 4 requires attention.key_length_swa == attention.value_length_swa")
        n_rot_swa = int(self.key(meta, "rope.dimension_count_swa", hp.n_rot))
        kv = hp.n_head_kv_per_layer or (hp.n_head_kv,) * n
        if len(kv) < n or any(not h or hp.n_head % h for h in kv[:n]):
            raise GGUFError(f"'{hp.arch}.attention.head_count_kv' does not fit {n} layers of {hp.n_head} heads")
        if not 0 < n_rot_swa <= hd_swa or n_rot_swa % 2:  # 0: llama.cpp hangs
            raise GGUFError(f"'{hp.arch}.rope.dimension_count_swa' ({n_rot_swa}) does not fit heads of {hd_swa}")
        ff = [int(x) for x in self.per_layer(meta, "feed_forward_length", hp.n_ff)]
        heads = [(hd_swa if swa[il] else hp.head_dim, kv[il]) for il in range(n)]  # (head size, K/V heads)
        n_shared = int(self.key(meta, "attention.shared_kv_layers", 0))
        n_own = n - n_shared
        if n_shared and n_own < 2:
            raise GGUFError(f"'{hp.arch}.attention.shared_kv_layers' ({n_shared}) leaves fewer than 2 of {n} blocks")
        # llama.cpp's reuse: a sliding block reads block n_own - 2, a full one block n_own - 1
        self.sources = tuple(il if il < n_own else n_own - (2 if swa[il] else 1) for il in range(n))
        for il, src in enumerate(self.sources):
            if swa[src] != swa[il] or heads[src] != heads[il]:
                raise GGUFError(f"gemma4 block {il} would read the K/V of block {src}, which is of another kind")
        width = max(d * k for d, k in heads[:n_own])
        hp = self.hp = dataclasses.replace(hp, kv_width=width, n_layer_kv=n_own if n_shared else 0)
        self.layer_hps = tuple(
            dataclasses.replace(
                hp,
                head_dim=heads[il][0],
                n_head_kv=heads[il][1],
                n_rot=n_rot_swa if swa[il] else hp.n_rot,
                n_ff=ff[il],
                n_head_kv_per_layer=(),
                kv_width=0,
            )
            for il in range(n)
        )
        self.n_embd_per_layer = int(self.need(meta, "embedding_length_per_layer_input"))
        if not self.n_embd_per_layer and any(n in self.names for n in PER_LAYER_TENSORS):  # as llama.cpp refuses
            raise GGUFError(f"'{hp.arch}.embedding_length_per_layer_input' is 0, but the GGUF has per-layer embeddings")
        if self.n_embd_per_layer:
            self.embed_tensors = ("token_embd.weight", *PER_LAYER_TENSORS)
        self.f_attention_scale = 1.0
        self.final_softcap = float(self.key(meta, "final_logit_softcapping", 30.0))
        self.moe_layers = tuple(f"blk.{il}.ffn_gate_inp.weight" in self.names for il in range(n))
        if any(self.moe_layers):
            if not hp.n_expert:
                raise GGUFError(f"GGUF has expert routers but no '{hp.arch}.expert_count'")
            self.n_ff_exp = uniform_expert_ff(self, meta)
            self.n_ff_shexp = max(ff)  # the MLP beside the experts
            self.moe.act = "geglu"
            moe = [il for il in range(n) if self.moe_layers[il]]
            for attr, name in (
                ("fused_gate_up", "ffn_gate_up_exps.weight"),
                ("down_scale", "ffn_down_exps.scale"),
            ):
                has = {f"blk.{il}.{name}" in self.names for il in moe}
                if len(has) > 1:
                    raise UnsupportedModelError(f"{hp.arch}: {name} in some expert blocks only")
                setattr(self.moe, attr, has.pop())

    def describe(self) -> list[str]:
        hp = self.hp
        n_shared = sum(1 for il, s in enumerate(self.sources) if s != il)
        lines = [
            f"heads of {self.layer_hps[0].head_dim if self.is_swa(0) else hp.head_dim} and {hp.head_dim} values "
            f"(sliding, full); K/V heads per layer {sorted({h.n_head_kv for h in self.layer_hps})}; "
            f"{n_shared} block(s) read an earlier block's K/V"
        ]
        if self.n_embd_per_layer:
            lines.append(f"per-layer embeddings: {self.n_embd_per_layer} values per block and token")
        if any(self.moe_layers):
            lines.append(f"experts in {sum(self.moe_layers)} of {hp.n_layer} blocks, beside a dense MLP")
        return lines

    def layer_hp(self, il: int) -> HParams:
        return self.layer_hps[il]

    def is_moe(self, il: int) -> bool:
        return self.moe_layers[il]

    def kv_source(self, il: int) -> int:
        return self.sources[il]

    # -- tensors ---------------------------------------------------------
    def block_tensor_shapes(self, il: int) -> dict[str, tuple[int, ...]]:
        h, p = self.layer_hp(il), f"blk.{il}."
        e, q = h.n_embd, h.n_head * h.head_dim
        shapes = {
            p + "attn_norm.weight": (e,),
            p + "attn_q.weight": (e, q),
            p + "attn_q_norm.weight": (h.head_dim,),
            p + "attn_output.weight": (q, e),
            p + "post_attention_norm.weight": (e,),
            p + "ffn_norm.weight": (e,),
            p + "ffn_gate.weight": (e, h.n_ff),
            p + "ffn_up.weight": (e, h.n_ff),
            p + "ffn_down.weight": (h.n_ff, e),
            p + "post_ffw_norm.weight": (e,),
        }
        if self.kv_source(il) == il:
            shapes[p + "attn_k.weight"] = (e, h.n_embd_gqa)
            shapes[p + "attn_k_norm.weight"] = (h.head_dim,)
            if p + "attn_v.weight" in self.names:
                shapes[p + "attn_v.weight"] = (e, h.n_embd_gqa)
        if p + "layer_output_scale.weight" in self.names:
            shapes[p + "layer_output_scale.weight"] = (1,)
        if self.is_moe(il):
            shapes.update({n: s for n, s in moe_tensor_shapes(self, il).items() if "_shexp" not in n})
            for name in ("pre_ffw_norm_2", "post_ffw_norm_1", "post_ffw_norm_2"):
                shapes[p + name + ".weight"] = (e,)
            shapes[p + "ffn_gate_inp.scale"] = (e,)
            if self.moe.down_scale:
                shapes[p + "ffn_down_exps.scale"] = (h.n_expert,)
        if self.n_embd_per_layer:
            shapes[p + "inp_gate.weight"] = (e, self.n_embd_per_layer)
            shapes[p + "proj.weight"] = (self.n_embd_per_layer, e)
            shapes[p + "post_norm.weight"] = (e,)
        return shapes

    def is_unused(self, name: str) -> bool:
        """Beyond the base's: a block that reads another's K/V keeps its K/V projections, unused."""
        parts = name.split(".")
        if len(parts) > 2 and parts[0] == "blk" and parts[1].isdigit() and int(parts[1]) < self.hp.n_layer:
            il = int(parts[1])
            return self.kv_source(il) != il and parts[2] in ("attn_k", "attn_v", "attn_k_norm")
        return super().is_unused(name)

    def global_tensor_shapes(self, has: Callable[[str], bool]) -> dict[str, tuple[int, ...]]:
        hp = self.hp
        shapes = super().global_tensor_shapes(has)
        if not all(self.is_swa(il) for il in range(hp.n_layer)):
            shapes["rope_freqs.weight"] = (hp.head_dim // 2,)
        if self.n_embd_per_layer:
            m = self.n_embd_per_layer * hp.n_layer
            shapes.update(
                {
                    PER_LAYER_TENSORS[0]: (m, hp.n_vocab),
                    PER_LAYER_TENSORS[1]: (hp.n_embd, m),
                    PER_LAYER_TENSORS[2]: (self.n_embd_per_layer,),
                }
            )
        return shapes

    # -- graphs ------------------------------------------------------------
    def build_embed(self, ctx: Context, w: Weights, inp: StepInputs) -> Tensor:
        return ctx.scale(super().build_embed(ctx, w, inp), float(np.sqrt(f32(self.hp.n_embd))))  # sqrtf(n_embd)

    def build_pass_inputs(self, ctx: Context, gf: Graph, w: Weights, inp: StepInputs, x: Tensor) -> None:
        """Each block's own input (llama.cpp's build_inp_per_layer and project_per_layer_inputs) into
        inp.per_layer F32 [n_embd_per_layer, n, n_layer]."""
        if not self.n_embd_per_layer:
            return
        assert inp.tokens is not None and inp.per_layer is not None
        d, n_layer, n = self.n_embd_per_layer, self.hp.n_layer, inp.n_tokens
        proj = ctx.scale(ctx.mul_mat(w(PER_LAYER_TENSORS[1]), x), inv_sqrt(self.hp.n_embd))
        proj = self.norm(ctx, w, ctx.reshape(proj, [d, n_layer, n]), PER_LAYER_TENSORS[2])
        rows = ctx.reshape(ctx.get_rows(w(PER_LAYER_TENSORS[0]), inp.tokens), [d, n_layer, n])
        own = ctx.scale(ctx.add(proj, ctx.scale(rows, float(np.sqrt(f32(d))))), inv_sqrt(2.0))
        gf.expand(ctx.cpy(ctx.permute(own, 0, 2, 1, 3), inp.per_layer))

    def build_qkv(
        self, ctx: Context, w: Weights, p: str, cur: Tensor, n: int
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """q [head_dim, n_head, n]; k [head_dim, n_head_kv, n] and V RMS-normed without a weight [n_embd_gqa, n],
        or None where the block reads another's K/V."""
        il = int(p.split(".")[1])
        h = self.layer_hp(il)
        q = ctx.reshape(ctx.mul_mat(w(p + "attn_q.weight"), cur), [h.head_dim, h.n_head, n])
        if self.kv_source(il) != il:
            return q, None, None
        k = ctx.mul_mat(w(p + "attn_k.weight"), cur)
        v = ctx.mul_mat(w(p + "attn_v.weight"), cur) if w.has(p + "attn_v.weight") else k
        v = ctx.rms_norm(ctx.reshape(v, [h.head_dim, h.n_head_kv, n]), h.rms_eps)
        return q, ctx.reshape(k, [h.head_dim, h.n_head_kv, n]), ctx.reshape(v, [h.n_embd_gqa, n])

    def rope(self, ctx: Context, w: Weights, inp: StepInputs, il: int, x: Tensor) -> Tensor:
        h = self.layer_hp(il)
        assert inp.positions is not None
        swa = self.is_swa(il)
        base, scale = (self.rope_base_swa, self.rope_scale_swa) if swa else (h.rope_base, h.rope_scale)
        return ctx.rope_ext(
            x,
            inp.positions,
            None if swa else w("rope_freqs.weight"),
            h.n_rot,
            self.rope_mode,
            h.n_ctx_orig,
            base,
            scale,
            h.rope_ext_factor,
            h.rope_attn_factor,
            *self.yarn_beta,
        )

    def build_attn_part(
        self, ctx: Context, gf: Graph, w: Weights, inp: StepInputs, il: int, x: Tensor, k_cache: Any, v_cache: Any
    ) -> tuple[Tensor, Tensor]:
        """A block with experts gives the residual itself as the FFN's input: its MLP, router and experts each
        norm it their own way."""
        ffn_inp, cur = super().build_attn_part(ctx, gf, w, inp, il, x, k_cache, v_cache)
        return (ffn_inp, ffn_inp) if self.is_moe(il) else (ffn_inp, cur)

    def router_input(self, ctx: Context, w: Weights, p: str, cur: Tensor) -> Tensor:
        x = ctx.scale(ctx.rms_norm(cur, self.hp.rms_eps), inv_sqrt(self.hp.n_embd))
        return ctx.mul(x, w(p + "ffn_gate_inp.scale"))

    def expert_input(self, ctx: Context, w: Weights, p: str, cur: Tensor) -> Tensor:
        return self.norm(ctx, w, cur, p + "pre_ffw_norm_2.weight")

    def experts_out(self, ctx: Context, w: Weights, p: str, out: Tensor) -> Tensor:
        return self.norm(ctx, w, out, p + "post_ffw_norm_2.weight")

    def shared_ffn(self, ctx: Context, w: Weights, p: str, cur: Tensor) -> Tensor | None:
        """The dense MLP beside the experts, over its own norm of the residual."""
        x = self.norm(ctx, w, cur, p + "ffn_norm.weight")
        gate, up = ctx.mul_mat(w(p + "ffn_gate.weight"), x), ctx.mul_mat(w(p + "ffn_up.weight"), x)
        out = ctx.mul_mat(w(p + "ffn_down.weight"), ctx.geglu_split(gate, up))
        return self.norm(ctx, w, out, p + "post_ffw_norm_1.weight")

    def build_block_out(self, ctx: Context, w: Weights, inp: StepInputs, il: int, x: Tensor, r0: int = 0) -> Tensor:
        p = f"blk.{il}."
        if self.n_embd_per_layer:
            assert inp.per_layer is not None
            t, n, d = inp.per_layer, x.ne[1], self.n_embd_per_layer
            own = ctx.view(t, [d, n], [t.nb[1]], il * t.nb[2] + r0 * t.nb[1])
            g = ctx.mul(ctx.gelu(ctx.mul_mat(w(p + "inp_gate.weight"), x)), own)
            x = ctx.add(x, self.norm(ctx, w, ctx.mul_mat(w(p + "proj.weight"), g), p + "post_norm.weight"))
        if w.has(p + "layer_output_scale.weight"):
            x = ctx.mul(x, w(p + "layer_output_scale.weight"))
        return x
