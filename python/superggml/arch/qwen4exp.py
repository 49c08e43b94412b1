"""qwen4exp family (llama.cpp's src/models/qwen4exp.cpp; docs/dev/qwen4exp.md cites it line by line): Qwen3.5's
hybrid of gated delta-net and gated full-attention blocks with experts (arch/qwen35moe.py), with

- hyper-connections in place of every norm: `hc` residual streams; before each sublayer a mixer RMS-norms each
  stream, gates it by a low-rank projection of all of them (down, SiLU, up, sigmoid) and takes the gated mean
  (dsv4_hc_pre_gated), and its inject projection gives each stream's weight 2 sigmoid(inject / hc) for the
  sublayer's output (dsv4_hc_post, no mixing between streams); the head's mixer (unfused) is the output norm;
- a sigmoid (not SiLU) gate on the delta-net's output;
- QSA on the attention blocks with a compress ratio r: each query attends to whole blocks of r positions chosen
  by an indexer (one mean-pooled raw key per complete block, RMS-normed and roped at the block's start, scored by
  the relu'd dot products of its heads' queries, summed), top `indexer.top_k + r - 1` cells, plus the incomplete
  tail. The raw keys are kept after each attention row's K (HParams.kv_width), so they page, stream and save with it;
  the pass's block layout comes from the positions (PassInputs: qsa_inputs).

The PLE n-gram hash embedding is refused for now. There is no MTP.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

import numpy as np

from .. import native
from ..errors import GGUFError
from ..native import Context, Graph, Tensor
from .base import BlockGraph, HParams, Memory, StepInputs, Weights, f32, lane_memory, one_memory
from .common import Rows, build_attn, each_lane, inv_sqrt, row_size, slide_window, top_k_mask, whole
from .qwen35moe import Qwen35MoeArch
from .qwen4exp_ple import build_ple, history, load_ple, ple_rows
from .qwen4exp_qsa import qsa_inputs, qsa_values

I32 = native.GGMLType.I32
F32 = native.GGMLType.F32
HC_NORMS = ("hc_attn_norm", "hc_ffn_norm")
PLE_NORMS = ("ple_norm_key", "ple_norm_query", "ple_norm_conv")
PLE_TABLE = "per_layer_token_embd.weight"


class Qwen4ExpArch(Qwen35MoeArch):
    ffn_norm = ""
    output_norm = "output_hc_norm.weight"  # the head's mixer (its down and up load with the global tensors)
    late_gather = False  # the last block gathers its rows after attention, as llama.cpp

    def load_hparams(self, meta: Mapping[str, Any]) -> None:
        super().load_hparams(meta)
        hp = self.hp
        if not any(self.recurrent[: hp.n_layer]) or all(self.recurrent[: hp.n_layer]):
            # llama.cpp's empty half leaves its inputs unallocated and aborts
            raise GGUFError("qwen4exp needs both delta-net and attention blocks")
        self.moe.w_scale = 0.0  # llama.cpp reads no expert_weights_scale, expert_weights_norm or gating key
        self.moe.norm_w = True
        self.moe.gating = "softmax"
        self.moe.fused_gate_up = any(n.endswith(".ffn_gate_up_exps.weight") for n in self.names)
        self.hc = int(self.need(meta, "hyper_connection.count"))
        self.hc_rank = int(self.need(meta, "hyper_connection.low_rank"))
        if self.hc <= 1 or self.hc_rank <= 0:
            raise GGUFError(f"qwen4exp: hyper_connection.count {self.hc} (> 1), low_rank {self.hc_rank} (> 0)")
        self.idx_heads = int(self.need(meta, "attention.indexer.head_count"))
        self.idx_dim = int(self.need(meta, "attention.indexer.key_length"))
        self.idx_top_k = int(self.need(meta, "attention.indexer.top_k"))
        if min(self.idx_heads, self.idx_dim, self.idx_top_k) <= 0:
            raise GGUFError("qwen4exp: attention.indexer.head_count, key_length and top_k must be > 0")
        ratios = self.per_layer(meta, "attention.compress_ratios", 0.0)
        self.ratios = tuple(0 if self.recurrent[il] else int(r) for il, r in enumerate(ratios))
        if any(r > 64 for r in self.ratios):  # llama.cpp asserts at the first pass
            raise GGUFError(f"qwen4exp: a compress ratio above 64: {list(self.ratios)}")
        if any(self.ratios) and hp.n_rot > self.idx_dim:
            raise GGUFError(f"qwen4exp: rope.dimension_count {hp.n_rot} > the indexer's key length {self.idx_dim}")
        self.ple = load_ple(self.key, meta, hp.n_embd, self.recurrent[: hp.n_layer])
        self.count_states()  # with the PLE's conv history
        self.hc_inv = float(f32(1.0) / f32(self.hc))
        self.attn_hp = hp  # the attention's own widths (the memory's rows are wider with QSA)
        g = hp.n_embd_gqa
        self.hp = dataclasses.replace(
            hp,
            n_residual=self.hc * hp.n_embd,
            n_ffn_inp=self.hc * (hp.n_embd + 1),
            kv_width=g + self.idx_dim if any(self.ratios) else 0,  # the raw indexer keys after each K row
            kv_width_v=g if any(self.ratios) else 0,
        )

    def layer_hp(self, il: int) -> HParams:
        return self.attn_hp

    def describe(self) -> list[str]:
        qsa = sorted({r for r in self.ratios if r})
        return (
            super().describe()
            + [
                f"hyper-connections: {self.hc} residual streams of {self.hp.n_embd}, low-rank gated mixers in place of "
                "norms",
                f"block-sparse attention (QSA) in {sum(1 for r in self.ratios if r)} block(s), blocks of {qsa} tokens: "
                f"top {self.idx_top_k} cells by an indexer of {self.idx_heads} heads of {self.idx_dim} over pooled keys"
                if qsa
                else "attention blocks dense (no compress ratio)",
            ]
            + (
                [
                    f"PLE n-gram embedding in block {self.ple.layer}: {self.ple.n_heads} hashed heads of {self.ple.dim} "
                    f"over up to {self.ple.ngram} tokens, a dilated conv of {self.ple.conv} taps"
                ]
                if self.ple
                else []
            )
        )

    # -- memory: the PLE's conv history after the conv window in every recurrent block's row -----------
    @property
    def state_sizes(self) -> tuple[int, int]:
        conv, state = super().state_sizes
        ple = getattr(self, "ple", None)
        return conv + (ple.history(self.hc * self.hp.n_embd) if ple else 0), state

    @property
    def ple_at(self) -> int:
        """Where the PLE's history starts in its block's conv row: after the conv window."""
        return (self.d_conv - 1) * self.conv_channels

    def window(self, ctx: Context, conv_state: Tensor) -> Tensor:
        dc, ch, es = self.d_conv - 1, self.conv_channels, conv_state.element_size
        return ctx.view(conv_state, [dc, ch, 1], [dc * es, dc * ch * es], 0)

    def record_size(self, n: int) -> int:
        """The delta-net's record, then (every layer as wide) the PLE conv's input with its history."""
        ple = self.ple
        return super().record_size(n) + ((ple.history_rows + n) * self.hc * self.hp.n_embd if ple else 0)

    def ple_record(self, ctx: Context, record: Tensor, n: int) -> Tensor:
        """Where a pass of n rows leaves the PLE conv's input with its history: F32 [hist + n, hc * n_embd, 1]."""
        assert self.ple is not None
        rows, hcd, es = self.ple.history_rows + n, self.hc * self.hp.n_embd, record.element_size
        return ctx.view(record, [rows, hcd, 1], [rows * es, rows * hcd * es], super().record_size(n) * es)

    def replay(
        self, ctx: Context, gf: Graph, record: Tensor, n: int, k: int, conv: Tensor, state: Tensor, slot: int
    ) -> None:
        super().replay(ctx, gf, record, n, k, conv, state, slot)
        if self.ple and slot == sum(self.recurrent[: self.ple.layer]):  # the PLE's block: its history slides too
            past = history(ctx, self.ple, conv, self.hc * self.hp.n_embd, self.ple_at)
            slide_window(ctx, gf, self.ple_record(ctx, record, n), k, past)

    # -- inputs the passes fill (PassInputs) ---------------------------------------
    def own_inputs(self, n: int, n_kv: int, streams: int) -> dict[str, tuple[native.GGMLType, list[int]]]:
        return qsa_inputs({r for r in self.ratios if r}, n, n_kv, streams)

    def own_values(self, positions: Sequence[np.ndarray], n_kv: int) -> dict[str, np.ndarray]:
        return qsa_values({r for r in self.ratios if r}, positions, n_kv)

    def pass_inputs(self, n: int) -> dict[str, tuple[native.GGMLType, list[int]]]:
        return {"ple_rows": (I32, [self.ple.n_heads * n])} if self.ple else {}

    def pass_values(self, contexts: Sequence[Sequence[int]], rows: Sequence[int]) -> dict[str, np.ndarray]:
        return {"ple_rows": ple_rows(self.ple, contexts, rows)} if self.ple else {}

    # -- tensors ---------------------------------------------------------
    def global_tensor_shapes(self, has: Any) -> dict[str, tuple[int, ...]]:
        hp, hcE = self.hp, self.hc * self.hp.n_embd
        shapes: dict[str, tuple[int, ...]] = {
            "token_embd.weight": (hp.n_embd, hp.n_vocab),
            self.output_tensor(has): (hp.n_embd, hp.n_vocab),
            "output_hc_norm.weight": (hp.n_embd, self.hc),
            "output_hc_down.weight": (hcE, self.hc_rank),
            "output_hc_up.weight": (self.hc_rank, hcE),
        }
        if self.ple:
            shapes[PLE_TABLE] = (self.ple.dim, self.ple.rows_needed)
        return shapes

    def block_tensor_shapes(self, il: int) -> dict[str, tuple[int, ...]]:
        hp, p, hcE = self.hp, f"blk.{il}.", self.hc * self.hp.n_embd
        shapes = super().block_tensor_shapes(il)
        shapes.pop(p + "attn_norm.weight", None)
        shapes.pop(p + "ffn_norm.weight", None)
        shapes.pop(p + ".weight", None)
        if not self.is_recurrent(il):
            shapes[p + "attn_k.weight"] = shapes[p + "attn_v.weight"] = (hp.n_embd, self.attn_hp.n_embd_gqa)
        for part in ("attn", "ffn"):
            shapes[p + f"hc_{part}_norm.weight"] = (hp.n_embd, self.hc)
            shapes[p + f"hc_{part}_down.weight"] = (hcE, self.hc_rank)
            shapes[p + f"hc_{part}_up.weight"] = (self.hc_rank, hcE)
            shapes[p + f"hc_{part}_inject.weight"] = (hcE, self.hc)
        if self.ple and il == self.ple.layer:
            shapes[p + "ple_key.weight"] = (hp.n_embd, hcE)
            shapes[p + "ple_value.weight"] = (hp.n_embd, hp.n_embd)
            for n in PLE_NORMS:
                shapes[p + f"{n}.weight"] = (hp.n_embd, self.hc)
            shapes[p + "ple_conv1d.weight"] = (self.ple.conv, hcE)
        if not self.is_recurrent(il):
            d, h = self.idx_dim, self.idx_heads
            shapes[p + "indexer.q_proj.weight"] = (hp.n_embd, h * d)
            shapes[p + "indexer.k_proj.weight"] = (hp.n_embd, d)
            shapes[p + "indexer.q_norm.weight"] = (d,)
            shapes[p + "indexer.k_norm.weight"] = (d,)
        return shapes

    def validate(self, table: Mapping[str, tuple[int, ...]]) -> None:
        """The hc norms' gammas load in any shape of n_embd * hc values (llama.cpp's TENSOR_ALLOW_RESHAPE)."""
        E, hc = self.hp.n_embd, self.hc
        fixed = dict(table)
        for name, shape in table.items():
            if name.endswith("hc_norm.weight") or any(name.endswith(f"{n}.weight") for n in HC_NORMS + PLE_NORMS):
                if int(np.prod(shape)) == E * hc:
                    fixed[name] = (E, hc)
        if not self.ple and any(n == PLE_TABLE or ".ple_" in n for n in table):
            raise GGUFError("qwen4exp: PLE tensors but no 'qwen4exp.ple.layers' (llama.cpp: wrong number of tensors)")
        table_rows = table.get(PLE_TABLE)
        if self.ple and table_rows is not None and len(table_rows) == 2 and table_rows[1] >= self.ple.rows_needed:
            fixed[PLE_TABLE] = (table_rows[0], self.ple.rows_needed)  # more rows than the heads read load
        super().validate(fixed)

    def matmul_weights(self, has: Any) -> list[str]:
        return [n for n in super().matmul_weights(has) if "_norm" not in n]

    # -- hyper-connections -------------------------------------------------------
    def hc_mix(self, ctx: Context, w: Weights, x: Tensor, p: str, fused: bool = True) -> tuple[Tensor, Tensor | None]:
        """(the sublayer's input F32 [n_embd, n], the streams' inject weights F32 [hc, n] or None at the head) of
        the streams x F32 [n_embd, hc, n] (llama.cpp's build_hc_mix)."""
        E, hc, n = self.hp.n_embd, self.hc, x.ne[2]
        norm = ctx.reshape(w(p + "_norm.weight"), [E, hc])
        xn = ctx.reshape(ctx.mul(ctx.rms_norm(x, self.hp.rms_eps), norm), [hc * E, n])
        lo = ctx.silu(ctx.scale(ctx.mul_mat(w(p + "_down.weight"), xn), self.hc_inv))
        gate = ctx.mul_mat(w(p + "_up.weight"), lo)  # [hc * E, n]
        if fused:
            mixed = ctx.dsv4_hc_pre_gated(ctx.reshape(xn, [E, hc, n]), ctx.reshape(gate, [E, hc, n]), self.hc_inv)
            return mixed, ctx.mul_mat(w(p + "_inject.weight"), xn)
        gated = ctx.reshape(ctx.mul(xn, ctx.sigmoid(gate)), [E, hc, n])
        es = gated.element_size
        mixed = ctx.cont(ctx.view(gated, [E, n], [E * es * hc], 0))
        for c in range(1, hc):
            mixed = ctx.add(mixed, ctx.view(gated, [E, n], [E * es * hc], E * es * c))
        return ctx.scale(mixed, self.hc_inv), None

    def hc_combine(self, ctx: Context, x: Tensor, out: Tensor, inject: Tensor) -> Tensor:
        """Each stream of x F32 [n_embd, hc, n] plus the sublayer's output times 2 sigmoid(inject / hc)."""
        weights = ctx.scale(ctx.sigmoid(ctx.scale(inject, self.hc_inv)), 2.0)
        return ctx.dsv4_hc_post(out, x, weights, None)

    # -- graphs ------------------------------------------------------------
    def build_embed(self, ctx: Context, w: Weights, inp: StepInputs) -> Tensor:
        x = super().build_embed(ctx, w, inp)
        E, n = self.hp.n_embd, inp.n_tokens
        return ctx.reshape(ctx.repeat_4d(ctx.reshape(x, [E, 1, n]), [E, self.hc, n, 1]), [self.hc * E, n])

    def build_attn_part(
        self, ctx: Context, gf: Graph, w: Weights, inp: StepInputs, il: int, x: Tensor, k_cache: Memory, v_cache: Memory
    ) -> tuple[Tensor, Tensor]:
        """(the streams after the sublayer with the FFN's inject weights, F32 [hc * n_embd + hc, rows]; the FFN's
        input F32 [n_embd, rows]); the last block keeps only the output rows from the attention's output on."""
        E, hc, p = self.hp.n_embd, self.hc, f"blk.{il}."
        streams = ctx.reshape(x, [E, hc, inp.n_tokens])
        if self.ple and il == self.ple.layer:
            blk = BlockGraph(ctx, gf, w, inp, il)
            streams = build_ple(
                blk,
                self.ple,
                hc,
                self.hp.rms_eps,
                streams,
                k_cache,
                v_cache,
                self.ple_at,
                lambda r, m: self.ple_record(ctx, r, m),
            )
        cur, inject = self.hc_mix(ctx, w, streams, p + "hc_attn")
        assert inject is not None
        cur = self.build_attention(BlockGraph(ctx, gf, w, inp, il), cur, k_cache, v_cache)
        cur = ctx.mul_mat(w(self.attn_output(il)), cur)
        if il == self.hp.n_layer - 1 and inp.n_outputs < inp.n_tokens and not inp.keep_rows:
            assert inp.out_ids is not None
            cur, inject = ctx.get_rows(cur, inp.out_ids), ctx.get_rows(inject, inp.out_ids)
            kept = ctx.get_rows(ctx.reshape(streams, [hc * E, inp.n_tokens]), inp.out_ids)
            streams = ctx.reshape(kept, [E, hc, kept.ne[1]])
        streams = self.hc_combine(ctx, streams, cur, inject)
        cur, inject = self.hc_mix(ctx, w, streams, p + "hc_ffn")
        assert inject is not None
        m = streams.ne[2]
        return ctx.concat(ctx.reshape(streams, [hc * E, m]), inject, 0), cur

    def build_ffn_out(self, ctx: Context, w: Weights, p: str, ffn_out: Tensor, ffn_inp: Tensor) -> Tensor:
        E, hc, n, es = self.hp.n_embd, self.hc, ffn_inp.ne[1], ffn_inp.element_size
        streams = ctx.view(ffn_inp, [E, hc, n], [E * es, ffn_inp.nb[1]], 0)
        inject = ctx.view(ffn_inp, [hc, n], [ffn_inp.nb[1]], hc * E * es)
        return ctx.reshape(self.hc_combine(ctx, ctx.cont(streams), ffn_out, ctx.cont(inject)), [hc * E, n])

    def build_output_norm(self, ctx: Context, w: Weights, x: Tensor) -> Tensor:
        E, n = self.hp.n_embd, x.ne[1]
        mixed, _ = self.hc_mix(ctx, w, ctx.reshape(x, [E, self.hc, n]), "output_hc", fused=False)
        return mixed

    def output_gate(self, ctx: Context, z: Tensor) -> Tensor:
        return ctx.sigmoid(z)

    # -- QSA ------------------------------------------------------------------------
    def attend(
        self, blk: BlockGraph, cur: Tensor, q: Tensor, k: Tensor, v: Tensor, k_cache: Memory, v_cache: Memory
    ) -> Tensor:
        r = self.ratios[blk.il]
        if not r:
            return super().attend(blk, cur, q, k, v, k_cache, v_cache)
        ctx, gf, w, inp, p = blk.ctx, blk.gf, blk.w, blk.inp, f"blk.{blk.il}."
        hp, scale, n = self.attn_hp, inv_sqrt(self.hp.head_dim), inp.n_tokens
        raw = ctx.mul_mat(w(p + "indexer.k_proj.weight"), cur)  # [d, n]: cached raw
        iq = ctx.reshape(ctx.mul_mat(w(p + "indexer.q_proj.weight"), cur), [self.idx_dim, self.idx_heads, n])
        iq = self.rope_at(ctx, self.norm(ctx, w, iq, p + "indexer.q_norm.weight"), inp.positions)

        def one(lane: StepInputs, rows: Rows, kc: Tensor, vc: Tensor) -> Tensor:
            mask = self.qsa_mask(blk, lane, rows(raw, 2), rows(iq), kc, r)
            return build_attn(ctx, gf, hp, lane, rows(q), rows(k), rows(v, 2), kc, vc, scale, mask)

        if inp.lanes is None:
            return one(inp, whole, one_memory(k_cache), one_memory(v_cache))
        return each_lane(
            ctx, inp, lambda j, lane, rows: one(lane, rows, lane_memory(k_cache, j), lane_memory(v_cache, j))
        )

    def qsa_mask(self, blk: BlockGraph, inp: StepInputs, raw: Tensor, iq: Tensor, k_cache: Tensor, r: int) -> Tensor:
        """The attention mask of QSA (llama.cpp's build_qsa_top_k and build_attn_qsa): the pass's (lane's) mask
        at each query's top cells, -inf elsewhere; the raw indexer keys raw [d, n] of its rows written first, its
        indexer queries iq [d, heads, n] normed and roped."""
        ctx, gf, w, p = blk.ctx, blk.gf, blk.w, f"blk.{blk.il}."
        assert inp.mask is not None and inp.k_idxs is not None and inp.own is not None
        d, S, n_kv, n = self.idx_dim, inp.n_streams, inp.n_kv, inp.n_tokens
        t, n_ctx, nb = n // S, k_cache.ne[1] // S, -(-n_kv // r)
        off, rs = row_size(k_cache.type, self.attn_hp.n_embd_gqa), k_cache.nb[1]
        gf.expand(ctx.set_rows(ctx.view(k_cache, [d, k_cache.ne[1]], [rs], off), raw, inp.k_idxs))
        keys = ctx.view(k_cache, [d, n_kv, S], [rs, rs * n_ctx], off)
        members = ctx.reshape(ctx.get_rows(keys, inp.own[f"qsa{r}_blk_cells"]), [d, r, nb, S])
        pooled: Tensor | None = None
        for i in range(r):  # the mean of each block's keys, summed in order as llama.cpp
            s = ctx.cont(ctx.view(members, [d, nb, S], [members.nb[2], members.nb[3]], i * members.nb[1]))
            pooled = s if pooled is None else ctx.add(pooled, s)
        assert pooled is not None
        pooled = ctx.reshape(ctx.scale(pooled, float(f32(1.0) / f32(r))), [d, nb * S, 1])
        pooled = self.norm(ctx, w, pooled, p + "indexer.k_norm.weight")
        pooled = self.rope_at(ctx, ctx.reshape(pooled, [d, 1, nb * S]), inp.own[f"qsa{r}_blk_pos"])
        score = ctx.mul_mat(ctx.reshape(pooled, [d, nb, S]), ctx.reshape(ctx.cont(iq), [d, self.idx_heads * t, S]))
        score = ctx.relu(ctx.reshape(score, [nb, self.idx_heads, t, S]))
        summed = ctx.cont(ctx.view(score, [nb, t, S], [score.nb[2], score.nb[3]], 0))
        for h in range(1, self.idx_heads):
            summed = ctx.add(summed, ctx.view(score, [nb, t, S], [score.nb[2], score.nb[3]], h * score.nb[1]))
        summed = ctx.add(summed, inp.own[f"qsa{r}_bias"])
        cells = ctx.get_rows(ctx.cont(ctx.permute(summed, 1, 0, 2, 3)), inp.own[f"qsa{r}_cell_blk"])
        mask = inp.mask if inp.mask.type == F32 else ctx.cast(inp.mask, F32)
        scores = ctx.add(ctx.cont(ctx.permute(cells, 1, 0, 2, 3)), ctx.reshape(mask, [n_kv, t, S]))
        k = min(n_kv, self.idx_top_k + r - 1)
        top = ctx.cont(ctx.top_k(scores, k))  # I32 [k, t, S]
        return top_k_mask(ctx, ctx.reshape(inp.mask, [n_kv, t, 1, S]), top, scores)
