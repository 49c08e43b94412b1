"""minimax-m3 family (llama.cpp's src/models/minimax-m3.cpp; docs/dev/minimax-m3.md): MiniMax-M2's GQA attention with
partial NeoX RoPE but per-head Q/K norms and optional Q/K/V biases; DeepSeek-V3's leading dense blocks and routed
experts with a shared one (sigmoid routing with exp_probs_b, the weights' norm and scale from the keys); gpt-oss's
clamped SwiGLU in every FFN.

Its blocks past the dense ones carry a MiniMax Sparse Attention indexer (arch/minimax_m3_msa.py), which llama.cpp
runs only with flash attention and one sequence (or per-sequence caches); otherwise llama.cpp attends densely in
every block, and so does this: with flash attention a pass over one sequence runs MSA, a pass over several attends
densely (llama.cpp's unified cache). `attention_path` says which ran last, and each fallback is logged once. The
indexer's keys are kept after the block's keys in the K memory rows, so they page, stream and save with them.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Mapping, Sequence

import numpy as np

from .. import native
from ..errors import GGUFError, UnsupportedModelError
from ..native import Context, Tensor
from .base import BlockGraph, HParams, Memory, Weights, lane_memory, one_memory
from .common import ROPE_NEOX, Architecture, fused_qkv, fused_qkv_shapes, row_size
from .minimax_m3_msa import Msa, MsaBlock, msa_attention
from .moe import SWIGLU_OAI_ALPHA, SWIGLU_OAI_LIMIT, load_routing, routing_note, uniform_expert_ff

log = logging.getLogger(__name__)
NO_FLASH = "flash attention disabled; MSA requires it -> running DENSE attention"
SEVERAL = "several sequences in one pass; MSA needs one (or per-sequence streams) -> running DENSE attention"


class MiniMaxM3Arch(Architecture):
    rope_mode = ROPE_NEOX
    qk_norm = True
    rope_factors = False

    def load_hparams(self, meta: Mapping[str, Any]) -> None:
        hp = self.hp
        if hp.head_dim_v:
            raise GGUFError(f"{hp.arch}: attention.value_length must equal key_length, as llama.cpp asserts")
        self.has_qkv_bias = any(n.endswith(".attn_q.bias") for n in self.names)
        self.n_ff_exp = uniform_expert_ff(self, meta)
        if not int(self.key(meta, "expert_gating_func", 0)):
            raise GGUFError(f"GGUF metadata lacks '{hp.arch}.expert_gating_func'")  # llama.cpp aborts on 0
        load_routing(self, meta, 0)
        self.moe.probs_bias = True
        self.moe.act = "swiglu_oai"
        self.idx_heads = int(self.need(meta, "attention.indexer.head_count"))
        self.idx_dim = int(self.need(meta, "attention.indexer.key_length"))
        self.idx_top_k = int(self.need(meta, "attention.indexer.top_k"))
        self.block_size = int(self.need(meta, "attention.indexer.block_size"))
        local = int(self.need(meta, "attention.indexer.local_blocks"))
        if self.block_size <= 0:
            raise GGUFError(f"'{hp.arch}.attention.indexer.block_size' is 0: llama.cpp aborts on it")
        self.msa = Msa(self.block_size, self.idx_top_k, local, self.idx_dim)
        self.attention_path = ""  # what the last graph built ran: "MSA", or the dense fallback's reason
        self.flash_attn: bool | None = None  # the context's (set_context); None: not told, MSA's inputs are made
        self.attn_hp = hp
        if self.n_lead < hp.n_layer:  # each K row: the block's keys, then the indexer's (its own cache in llama.cpp)
            self.hp = dataclasses.replace(hp, kv_width=hp.n_embd_gqa + self.idx_dim, kv_width_v=hp.n_embd_gqa)

    def describe(self) -> list[str]:
        hp = self.hp
        return [
            f"per-head Q/K norms; NeoX RoPE over {hp.n_rot} of {hp.head_dim} head values; clamped SwiGLU everywhere",
            routing_note(self),
            f"sparse attention (MSA, blocks of {self.block_size}, top {self.idx_top_k}, {self.msa.local} local) in "
            f"blocks {self.n_lead}.. with flash attention over one sequence; dense otherwise, as llama.cpp",
        ]

    def layer_hp(self, il: int) -> HParams:
        return self.attn_hp

    def block_tensor_shapes(self, il: int) -> dict[str, tuple[int, ...]]:
        hp, p = self.hp, f"blk.{il}."
        shapes = super().block_tensor_shapes(il)
        g = self.attn_hp.n_embd_gqa  # not the memory rows' width (hp.kv_width)
        shapes.update(
            {n: (hp.n_embd, g) if n.endswith("weight") else (g,) for n in shapes if "attn_k." in n or "attn_v." in n}
        )
        if p + "attn_qkv.weight" in self.names:
            shapes = fused_qkv_shapes(shapes, p, hp.n_embd)
        if self.is_moe(il):
            d = self.idx_dim
            shapes.update(
                {
                    p + "indexer.q_proj.weight": (hp.n_embd, self.idx_heads * d),
                    p + "indexer.k_proj.weight": (hp.n_embd, d),
                    p + "indexer.q_norm.weight": (d,),
                    p + "indexer.k_norm.weight": (d,),
                }
            )
        return shapes

    def build_qkv(
        self, ctx: Context, w: Weights, p: str, cur: Tensor, n: int
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        if w.has(p + "attn_qkv.weight"):
            return fused_qkv(ctx, w, p, cur, self.attn_hp)
        return super().build_qkv(ctx, w, p, cur, n)

    def set_context(self, n_ctx: int, flash_attn: bool = False) -> None:
        super().set_context(n_ctx, flash_attn)
        self.flash_attn = flash_attn

    # -- MSA: the pass's inputs (PassInputs) and the sparse blocks ---------------------
    def own_inputs(self, n: int, n_kv: int, streams: int) -> dict[str, tuple[native.GGMLType, list[int]]]:
        """MSA's inputs where it may run: flash attention, a stream of one sequence, a sparse block."""
        runs = self.flash_attn is not False and streams == 1 and self.n_lead < self.hp.n_layer
        return self.msa.shapes(n, n_kv) if runs else {}

    def own_values(self, positions: Sequence[np.ndarray], n_kv: int) -> dict[str, np.ndarray]:
        return self.msa.values(positions[0], n_kv)

    def pass_inputs(self, n: int) -> dict[str, tuple[native.GGMLType, list[int]]]:
        return {}

    def pass_values(self, contexts: Sequence[Sequence[int]], rows: Sequence[int]) -> dict[str, np.ndarray]:
        return {}

    def note_path(self, path: str) -> None:
        """Records which attention the graphs run, logging a dense fallback once."""
        if path != "MSA" and path != self.attention_path:
            log.warning("%s: %s", self.hp.arch, path)
        self.attention_path = path

    def build_attention(self, blk: BlockGraph, cur: Tensor, k_cache: Memory, v_cache: Memory) -> Tensor:
        inp = blk.inp
        if not inp.flash_attn:
            self.note_path(NO_FLASH)
        else:
            self.check_msa()
        if not inp.flash_attn or not self.is_moe(blk.il):
            return super().build_attention(blk, cur, k_cache, v_cache)
        if inp.lanes is not None or inp.n_streams > 1:
            self.note_path(SEVERAL)
            self.keep_indexer_keys(blk, self.indexer(blk, cur, keys_only=True)[1], k_cache)
            return super().build_attention(blk, cur, k_cache, v_cache)
        if not inp.own:  # a pass of one sequence has them (PassInputs): never attend densely unsaid
            raise RuntimeError(f"{self.hp.arch}: the pass lacks MSA's inputs")
        self.note_path("MSA")
        ctx, w, il = blk.ctx, blk.w, blk.il
        p = f"blk.{il}."
        q, k, v = self.build_qkv(ctx, w, p, cur, inp.n_tokens)
        q, k = self.build_qk_norm(ctx, w, p, q, k)
        assert k is not None and v is not None
        q, k = self.rope(ctx, w, inp, il, q), self.rope(ctx, w, inp, il, k)
        iq, ik = self.indexer(blk, cur)
        assert iq is not None
        msa = MsaBlock(ctx, blk.gf, self.attn_hp, inp, inp.own, one_memory(k_cache), one_memory(v_cache))
        return msa_attention(msa, self.msa, q, k, v, iq, ik)

    def indexer(self, blk: BlockGraph, cur: Tensor, keys_only: bool = False) -> tuple[Tensor | None, Tensor]:
        """The indexer's queries F32 [dim, heads, n] (None with keys_only) and keys [dim, 1, n]: projected, RMS-normed
        per head, roped as Q and K."""
        ctx, w, inp, p, d = blk.ctx, blk.w, blk.inp, f"blk.{blk.il}.", self.idx_dim
        ik = ctx.reshape(ctx.mul_mat(w(p + "indexer.k_proj.weight"), cur), [d, 1, inp.n_tokens])
        ik = self.rope(ctx, w, inp, blk.il, self.norm(ctx, w, ik, p + "indexer.k_norm.weight"))
        if keys_only:
            return None, ik
        iq = ctx.reshape(ctx.mul_mat(w(p + "indexer.q_proj.weight"), cur), [d, self.idx_heads, inp.n_tokens])
        return self.rope(ctx, w, inp, blk.il, self.norm(ctx, w, iq, p + "indexer.q_norm.weight")), ik

    def keep_indexer_keys(self, blk: BlockGraph, ik: Tensor, k_cache: Memory) -> None:
        """A dense pass's indexer keys into the memory all the same, for the MSA passes after it."""
        ctx, d, off = blk.ctx, self.idx_dim, self.attn_hp.n_embd_gqa
        for j, lane in enumerate(blk.inp.lanes or [blk.inp]):
            kc = one_memory(k_cache) if blk.inp.lanes is None else lane_memory(k_cache, j)
            keys = ctx.view(kc, [d, kc.ne[1]], [kc.nb[1]], row_size(kc.type, off))
            rows = ctx.view(ik, [d, lane.n_tokens], [ik.nb[2]], lane.row0 * ik.nb[2])
            assert lane.k_idxs is not None
            blk.gf.expand(ctx.set_rows(keys, rows, lane.k_idxs))

    def check_msa(self) -> None:
        """UnsupportedModelError for the files llama.cpp aborts on in MSA (docs/dev/minimax-m3.md §5)."""
        hp, why = self.hp, ""
        if self.n_lead >= hp.n_layer:
            why = "no sparse block (llama.cpp's MSA inputs then get no buffer: it aborts at the first decode)"
        elif self.idx_heads != hp.n_head_kv:
            why = f"{self.idx_heads} indexer heads for {hp.n_head_kv} K/V heads (it asserts one per K/V head)"
        elif self.idx_dim < hp.n_rot:
            why = f"indexer keys of {self.idx_dim} shorter than the {hp.n_rot} values RoPE turns"
        elif self.idx_top_k <= 0:
            why = "attention.indexer.top_k 0 (every sparse row would attend to nothing)"
        if why:
            raise UnsupportedModelError(f"{hp.arch}: flash attention runs MSA, which cannot run this file: {why}")

    def glu(self, ctx: Context, gate: Tensor, up: Tensor, limit: float = 0.0) -> Tensor:
        return ctx.swiglu_oai(gate, up, SWIGLU_OAI_ALPHA, SWIGLU_OAI_LIMIT)

    def shared_ffn(self, ctx: Context, w: Weights, p: str, cur: Tensor) -> Tensor | None:
        gate, up = ctx.mul_mat(w(p + "ffn_gate_shexp.weight"), cur), ctx.mul_mat(w(p + "ffn_up_shexp.weight"), cur)
        return ctx.mul_mat(w(p + "ffn_down_shexp.weight"), self.glu(ctx, gate, up))
