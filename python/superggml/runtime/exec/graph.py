"""Plans: the graphs of one micro-batch shape, and the inputs they read, which fill themselves from a pass's rows.

A plan is a list of steps: an embedding graph, one graph per transformer block (a MoE block whose experts are
paged: an attention-and-router graph, then experts graphs over chunks of rows), and the head (a streamed head:
the output norm, then one graph per row chunk of the lm head). Activations persist between graphs in a device
buffer per device (`acts`). A plan that merges (`merge`) runs consecutive blocks that stay where they are
(resident, or pinned in their slots) on one device as one graph, a segment, with the head if it follows on
that device: a GPU then computes them without the host between blocks. With everything resident on one
device, `whole` builds the micro-batch as one graph.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ... import native
from ...arch.base import CompressorInputs, CompressorShape
from ...arch.common import StepInputs
from ...arch.deepseek4_attention import compressor_rows
from ...arch.mtp import PRE_NORM_HIDDEN
from ...errors import SuperggmlError
from ..memory.arrays import tensor_array
from .context import PassContext
from .expert_steps import GraphFn, build_paged_block
from ..memory.base import records
from ..weights.pagers import Block, HeadChunk, Key, WeightPager

F16 = native.GGMLType.F16
F32 = native.GGMLType.F32
I32 = native.GGMLType.I32
I64 = native.GGMLType.I64

KV_PAD = 256  # n_kv is padded to this so graph shapes change rarely
GRAPH_NODES = 192  # room for one block graph to start with (and LANE_NODES more per sequence of a pass over
LANE_NODES = 48  # several); doubled while it does not fit, up to GRAPH_NODES_MAX
GRAPH_NODES_MAX = 1 << 16


@dataclass
class Step:
    """One graph of a forward pass and what it needs: paged weights (key), a K/V page (layer), a device, a
    group of the background load."""

    graph: Any
    kind: str  # "embed", "block", "experts" or "head"
    rows_in: int = 0  # activation rows it reads (what moves when the device changes before it)
    key: Key | None = None
    layer: int | None = None  # the block whose K/V the graph reads and writes
    dev: int = 0
    group: int | None = None
    experts: int | None = None  # the block whose routed experts come from the expert cache first
    expert_ids: Any = None  # I32 [k, rows]: the routed experts as cache slots (filled before it runs)
    expert_row0: int = 0  # the first of the pass's rows it computes (a pass splits into row chunks)
    expert_ahead: int = 0  # rows whose lookahead guess it starts loading once mapped (0: none)
    host_experts: Any = None  # the experts the cache lacks, computed on the host first (expert_steps.HostExperts)
    span: tuple[int, ...] = ()  # a segment: the blocks it computes (their groups are waited for)
    keys: tuple[Key, ...] = ()  # a segment's pinned paged blocks (acquired around it)


@dataclass(frozen=True)
class LaneRows:
    """One sequence's rows of a pass at positions p0..p0+n over its first n_kv K/V rows."""

    positions: np.ndarray
    mask: np.ndarray
    mask_swa: np.ndarray | None
    k_idxs: np.ndarray
    v_idxs: np.ndarray


def lane_rows(
    p0: int,
    n: int,
    n_kv: int,
    *,
    n_swa: int,
    flash_attn: bool,
    v_channels: int,
    ctx_size: int,
    chunked: bool = False,
) -> LaneRows:
    """The causal mask (and the sliding-window one: keys more than n_swa - 1 positions back are masked too, or
    with `chunked` keys outside the query's chunk of n_swa positions: llama.cpp's is_masked_swa), and the K rows
    and V indices a sequence's rows write."""
    pos = np.arange(p0, p0 + n, dtype=np.int32)
    mtype = np.float16 if flash_attn else np.float32
    mask = causal_mask(p0, n, n_kv, mtype)
    if not n_swa:
        mask_swa = None
    else:
        kv_pos = np.arange(n_kv)[None, :]
        inside = (kv_pos // n_swa == pos[:, None] // n_swa) if chunked else (pos[:, None] - kv_pos < n_swa)
        mask_swa = np.where((mask == 0) & inside, mtype(0), mtype(-np.inf))
    if flash_attn:
        v_idxs = pos.astype(np.int64)
    else:
        chan = np.arange(v_channels, dtype=np.int64)
        v_idxs = (chan[None, :] * ctx_size + pos[:, None]).reshape(-1)
    return LaneRows(pos, mask, mask_swa, pos.astype(np.int64), v_idxs)


def causal_mask(p0: int, n: int, n_kv: int, mtype: Any) -> np.ndarray:
    """[n, n_kv]: 0 where key j is at or before row i's position p0 + i, -inf after. Row i is a window of one
    row of n_kv zeros then n_kv -infs, starting one value earlier per row: one copy, no per-element compare (for
    a few rows, where the window's own cost is more, a fill per row)."""
    if n < 16:
        mask = np.full((n, n_kv), -np.inf, dtype=mtype)
        for i in range(n):
            mask[i, : p0 + i + 1] = 0
        return mask
    z = np.concatenate([np.zeros(n_kv, mtype), np.full(n_kv, -np.inf, mtype)])
    start = n_kv - p0 - 1  # row 0 keeps p0 + 1 zeros
    windows = np.lib.stride_tricks.sliding_window_view(z, n_kv)
    return np.ascontiguousarray(windows[start - n + 1 : start + 1][::-1])


def padded_kv(p0: int, n: int, ctx_size: int) -> int:
    """The K/V rows a pass ending at p0 + n attends over: padded to KV_PAD, within the context."""
    return min(ctx_size, -(-(p0 + n) // KV_PAD) * KV_PAD)


class GraphPlan:
    """Step inputs plus the embedding, block and output graphs for one micro-batch shape."""

    def __init__(
        self,
        pc: PassContext,
        n: int,
        n_kv: int,
        n_out: int,
        lanes: tuple[tuple[int, int], ...] | None,
        embed: bool,
        streams: int = 0,
        hidden: bool = False,
        chain: bool = False,
        merge: bool = False,
        hosted: tuple[tuple[int, ...], bool] = ((), False),
        compressed: tuple[CompressorShape, ...] = (),
    ):
        """`pc`: what the graphs are built from (the arch, weights, memory, activations, rotations, devices). `lanes`: a pass over several
        sequences, (tokens, n_kv) of each in row order, each attending over its own K/V (its lane's
        tensors). `streams`: a pass over that many sequences of n / streams rows each, whose memory is one
        tensor per layer, attending at once over n_kv rows of each. `embed`: ending at the output norm
        (embeddings), not the logits. `hidden`: the output norm of every row goes to pc.buffers.hidden too (the
        last block keeps all rows; the head picks its rows after the norm, as llama.cpp with nextn
        embeddings). `chain`: the lanes are one sequence's tokens (a recurrent layer runs them as one chain).
        `merge`: segments (see the module), where the executor has nothing to do between the blocks' graphs.
        `hosted`: the streamed blocks that compute on the host device (pc.embed_dev) from the file mapping, and
        whether the lm head does (runtime/exec/placement.py)."""
        self.pc = pc
        self.hosted, self.head_host = set(hosted[0]), hosted[1]
        self.merge = merge
        self.n, self.n_kv, self.n_out, self.lanes, self.embed = n, n_kv, n_out, lanes, embed
        self.hidden = hidden
        self.keep_rows = hidden or pc.arch.late_gather  # the last block keeps every row
        self.chain = chain
        self.streams = streams
        self.n_lanes = len(lanes) if lanes else 0
        self.compressed = compressed  # a compressed K/V's work per ratio (one sequence: arch.pass_shape)
        self.keep: list[Any] = []  # contexts and buffers the graphs point into
        self.steps: list[Step] = []
        self.whole_graph: Any = None
        self.whole_logits: Any = None
        self.logits: Any = None
        self.moves: dict[tuple[int, int, int], tuple[Any, Any, Any]] = {}
        self.all_inputs = [self.new_inputs(di, b) for di, b in enumerate(pc.backends)]  # one set per device
        self.build()
        self.generation = pc.buffers.generation  # the shared buffers it was built over

    # -- inputs ---------------------------------------------------------------
    def new_inputs(self, di: int, backend: Any) -> StepInputs:
        c, hp, n = self.pc.settings.context, self.pc.hp, self.n
        mtype = F16 if c.flash_attn else F32
        arch = self.pc.family_inputs
        n_own = len(arch.own_inputs(n, self.n_kv, max(self.streams, 1))) + len(arch.pass_inputs(n)) if arch else 0
        ictx = native.Context(max_tensors=8 + (5 + n_own) * max(self.n_lanes, 1) + 8 * len(self.compressed))

        def named(tag: str, **t: Any) -> dict[str, Any]:
            for name, x in t.items():
                x.name = "inp_" + name + tag
            return t

        def kv(n: int, n_kv: int, tag: str) -> dict[str, Any]:
            mshape = [n_kv, n // self.streams, 1, self.streams] if self.streams else [n_kv, n]
            return named(
                tag,
                mask=ictx.new_tensor(mtype, mshape),
                **({"mask_swa": ictx.new_tensor(mtype, mshape)} if self.pc.arch.n_swa else {}),
                **({"kept_mask": ictx.new_tensor(mtype, mshape)} if self.pc.arch.keeps_mask else {}),
                k_idxs=ictx.new_tensor(I64, [n]),
                v_idxs=ictx.new_tensor(I64, [n] if c.flash_attn else [n * hp.v_channels]),
            ) | self.own_inputs(ictx, n, n_kv, tag)

        n_pos = 4 * n if self.pc.arch.rope_sections else n
        t = named(
            "",
            tokens=ictx.new_tensor(I32, [n]),
            positions=ictx.new_tensor(I32, [n_pos]),
            out_ids=ictx.new_tensor(I32, [max(self.n_out, 1)]),
        )
        if self.pc.arch.reads_hidden:
            t.update(named("", hidden=ictx.new_tensor(F32, [hp.residual_width, n])))
        if self.pc.arch.attn_temp:
            t.update(named("", attn_scale=ictx.new_tensor(F32, [1, 1, n])))
        if self.pc.arch.n_embd_per_layer:
            t.update(named("", per_layer=ictx.new_tensor(F32, [self.pc.arch.n_embd_per_layer, n, hp.n_layer])))
        rots = self.pc.rot[di]
        rot: dict[str, Any] = {
            "k_rot": rots.get("k"),
            "v_rot": rots.get("v"),
            "k_rots": {int(x[1:]): t for x, t in rots.items() if x[1:].isdigit()},
            "indexer_rot": rots.get("indexer"),
        }
        if self.compressed:
            t["compressed"] = {s.ratio: self.compressor_inputs(ictx, s, mtype) for s in self.compressed}
        one = (self.lanes is None and not self.streams) or self.chain
        record = self.pc.memory.record_tensor if records(n, one) else None
        whole = arch.pass_inputs(n) if arch else {}
        own = {name: named("", **{name: ictx.new_tensor(ty, shape)})[name] for name, (ty, shape) in whole.items()}
        if self.lanes is None:
            lane0 = kv(n, self.n_kv, "")
            inp = StepInputs(
                n_tokens=n,
                n_kv=self.n_kv,
                n_outputs=self.n_out,
                flash_attn=c.flash_attn,
                **t,
                **rot,
                n_streams=max(self.streams, 1),
                keep_rows=self.keep_rows,
                record=record,
                **lane0,
            )
            inp.own = {**own, **(inp.own or {})} or None
        else:
            lane_inputs, r0 = [], 0
            for j, (nj, kvj) in enumerate(self.lanes):
                lane_inputs.append(
                    StepInputs(
                        n_tokens=nj,
                        n_kv=kvj,
                        n_outputs=0,
                        tokens=None,
                        positions=None,
                        out_ids=None,
                        flash_attn=c.flash_attn,
                        row0=r0,
                        **rot,
                        **kv(nj, kvj, f"_s{j}"),
                    )
                )
                r0 += nj
            inp = StepInputs(
                n_tokens=n,
                n_kv=self.n_kv,
                n_outputs=self.n_out,
                flash_attn=c.flash_attn,
                mask=None,
                k_idxs=None,
                v_idxs=None,
                lanes=lane_inputs,
                indexer_rot=rot["indexer_rot"],  # the indexer runs over the whole pass before its lanes attend
                keep_rows=self.keep_rows,
                chain=self.chain,
                record=record,
                own=own or None,
                **t,
            )
        self.keep += [ictx, backend.alloc_tensors(ictx)]
        return inp

    def own_inputs(self, ictx: Any, n: int, n_kv: int, tag: str) -> dict[str, Any]:
        """The family's own inputs of a pass or lane (PassInputs), as StepInputs.own."""
        arch = self.pc.family_inputs
        if arch is None:
            return {}
        own = {}
        for name, (t, shape) in arch.own_inputs(n, n_kv, max(self.streams, 1)).items():
            own[name] = ictx.new_tensor(t, shape)
            own[name].name = f"inp_{name}{tag}"
        return {"own": own}

    def compressor_inputs(self, ictx: Any, s: CompressorShape, mtype: Any) -> CompressorInputs:
        n, nb = self.n, s.blocks
        return CompressorInputs(
            ratio=s.ratio,
            state_pos=ictx.new_tensor(I32, [n]),
            read_idxs=ictx.new_tensor(I32, [s.reads]) if nb else None,
            write_rows=ictx.new_tensor(I64, [nb]) if nb else None,
            comp_pos=ictx.new_tensor(I32, [nb]) if nb else None,
            persist_src=ictx.new_tensor(I32, [s.persist]),
            persist_dst=ictx.new_tensor(I64, [s.persist]),
            mask=ictx.new_tensor(mtype, [s.width, n]),
            lid_mask=ictx.new_tensor(F16, [s.width, n]) if s.indexed else None,
        )

    def fill(
        self,
        tokens: np.ndarray,
        rows: Sequence[LaneRows],
        out_rows: Sequence[int],
        hidden: np.ndarray | None = None,
        contexts: Sequence[Sequence[int]] = (),
    ) -> None:
        """Sets every device's inputs: the pass's tokens, each lane's rows, the rows whose output is wanted,
        the hidden rows an MTP block reads (F32 [n, n_embd]), and the family's own inputs (PassInputs; contexts:
        each lane's sequence through its last row)."""
        arch = self.pc.family_inputs
        whole: dict[str, np.ndarray] = {}
        if arch is not None and arch.pass_inputs(self.n):
            if not contexts:
                contexts = [[0] * (int(r.positions[-1]) + 1) for r in rows]  # a scratch pass of no real tokens
            whole = arch.pass_values(contexts, [len(r.positions) for r in rows])
        pos = np.concatenate([r.positions for r in rows])
        temp = self.pc.arch.attn_scale_of(pos) if self.pc.arch.attn_temp else None
        if self.pc.arch.rope_sections:  # text positions for every section but the last (llama.cpp's)
            pos = np.concatenate([pos, pos, pos, np.zeros_like(pos)])
        out = np.asarray(out_rows or [0], dtype=np.int32)
        own_pos = [[r.positions for r in rows]] if self.streams else [[r.positions] for r in rows]
        if self.streams:
            rows = [self.stacked(rows)]
        for inp, backend in zip(self.all_inputs, self.pc.backends):  # a pass's inputs (new_inputs) have what only
            put = backend.tensor_set_async  # its lanes lack; queued on a GPU's stream, before the pass's graphs
            assert inp.tokens is not None and inp.positions is not None and inp.out_ids is not None
            put(inp.tokens, tokens)
            put(inp.positions, pos)
            put(inp.out_ids, out)
            if inp.own:
                for name, arr in whole.items():
                    put(inp.own[name], arr)
            if inp.attn_scale is not None and temp is not None:
                put(inp.attn_scale, temp)
            if inp.hidden is not None:
                if hidden is None:
                    raise ValueError("an MTP pass needs the hidden rows its tokens follow")
                put(inp.hidden, np.ascontiguousarray(hidden, dtype=np.float32))
            for shape in self.compressed:
                assert inp.compressed is not None
                arrays = compressor_rows(shape, int(pos[0]), self.n, self.pc.settings.context.flash_attn)
                for name, tensor in vars(inp.compressed[shape.ratio]).items():
                    if isinstance(tensor, native.Tensor):
                        put(tensor, arrays[name])
            for lane, r, lane_pos in zip(inp.lanes or [inp], rows, own_pos):  # each with its masks, K/V indices (kv)
                assert lane.mask is not None and lane.k_idxs is not None and lane.v_idxs is not None
                if lane.own:
                    assert arch is not None
                    for name, arr in arch.own_values(lane_pos, lane.n_kv).items():
                        put(lane.own[name], arr)
                put(lane.mask, r.mask)
                if r.mask_swa is not None:
                    assert lane.mask_swa is not None  # both there with sliding-window layers
                    put(lane.mask_swa, r.mask_swa)
                put(lane.k_idxs, r.k_idxs)
                put(lane.v_idxs, r.v_idxs)

    def stacked(self, rows: Sequence[LaneRows]) -> LaneRows:
        """The streams' rows as one: masks one after another, K/V indices into the stream j's part of the
        memory tensor (j * ctx_size rows on)."""
        c, g = self.pc.settings.context, self.pc.hp.v_channels
        v_stride = c.ctx_size if c.flash_attn else g * c.ctx_size
        return LaneRows(
            np.concatenate([r.positions for r in rows]),
            np.concatenate([r.mask for r in rows]),
            None if rows[0].mask_swa is None else np.concatenate([r.mask_swa for r in rows]),
            np.concatenate([r.k_idxs + j * c.ctx_size for j, r in enumerate(rows)]),
            np.concatenate([r.v_idxs + j * v_stride for j, r in enumerate(rows)]),
        )

    def kv(self, il: int) -> tuple[Any, Any]:
        """Layer il's memory tensors for this plan's graphs."""
        if self.streams:
            return self.pc.memory.layer_tensors(il, self.streams, streams=True)
        return self.pc.memory.layer_tensors(il, self.n_lanes)

    # -- graphs ---------------------------------------------------------------
    def move(self, a: int, b: int, rows: int) -> list[tuple[Any, Any]]:
        """What moves from device a to device b when the pass changes device, as (source, destination) pairs: the
        first `rows` activation rows (F32 [n_embd, rows] views), and the blocks' own inputs (per_layer)."""
        v = self.moves.get((a, b, rows))
        if v is None:
            cx = native.Context(max_tensors=2)
            src, dst, n_embd = self.pc.acts[a], self.pc.acts[b], self.pc.hp.residual_width
            v = self.moves[(a, b, rows)] = (
                cx.view(src, [n_embd, rows], [src.nb[1]], 0),
                cx.view(dst, [n_embd, rows], [dst.nb[1]], 0),
                cx,
            )
        pairs = [(v[0], v[1])]
        ia, ib = self.all_inputs[a], self.all_inputs[b]
        if ia.per_layer is not None and ib.per_layer is not None:
            pairs.append((ia.per_layer, ib.per_layer))
        for la, lb in zip(ia.lanes or [ia], ib.lanes or [ib]):
            if la.kept_mask is not None and lb.kept_mask is not None:
                pairs.append((la.kept_mask, lb.kept_mask))
            # own inputs a block writes for later blocks (glm5-next's kept selection)
            pairs += [(t, lb.own[name]) for name, t in (la.own or {}).items() if name.startswith("kept_") and lb.own]
        return pairs

    def graph(
        self,
        build: GraphFn,
        kind: str,
        rows_in: int | None = None,
        rows_out: int | None = None,
        dev: int = 0,
        blocks: int = 1,
        **step: Any,
    ) -> Any:
        """A step's graph: build(ctx, gf, act, act_out, inp) over the device's activations (rows_in read,
        rows_out written) gives its output; in a context as small as the graph allows (room for `blocks`
        blocks to start with), grown on overflow."""
        pc, n = self.pc, self.n
        rows_in = n if rows_in is None else rows_in
        rows_out = n if rows_out is None else rows_out
        nodes = (GRAPH_NODES + LANE_NODES * self.n_lanes) * blocks
        while True:
            ctx = native.Context(max_tensors=nodes, graph_size=nodes)
            gf = ctx.new_graph()
            a = pc.acts[dev]
            pc.weights.device = dev  # the weights as this device holds them
            width = pc.hp.residual_width
            act = ctx.view(a, [width, rows_in], [a.nb[1]], 0)
            act_out = act if rows_out == rows_in else ctx.view(a, [width, rows_out], [a.nb[1]], 0)
            try:
                out = build(ctx, gf, act, act_out, self.all_inputs[dev])
                gf.expand(out)
                break
            except SuperggmlError as e:
                if "is full" not in str(e) or nodes >= GRAPH_NODES_MAX:
                    raise
                nodes *= 2
        self.keep.append(ctx)
        self.steps.append(Step(gf, kind, rows_in, dev=dev, **step))
        return out

    def stays(self, il: int) -> bool:
        """Whether block il's weights stay where they are from pass to pass (resident, or pinned in a slot that
        nothing moves) and nothing acts between its graph and the next (no paged experts)."""
        pl = self.pc.placement
        if pl.experts is not None and self.pc.arch.is_moe(il):
            return False
        if not pl.paged or il in self.hosted:
            return True
        pager = pl.pagers[self.pc.layer_device[il]]
        return pl.scheduler is None and isinstance(pager, WeightPager) and pager.core.pinned(pager.index(Block(il)))

    def segments(self) -> list[list[int]]:
        """The blocks in order, in runs that one graph computes: consecutive blocks that stay, on one device,
        where the plan merges; one block a run otherwise."""
        runs: list[list[int]] = []
        for il in range(self.pc.hp.n_layer):
            run = runs[-1] if runs else None
            if (
                self.merge
                and run
                and self.stays(il)
                and self.stays(run[-1])
                and self.block_dev(run[-1]) == self.block_dev(il)
            ):
                run.append(il)
            else:
                runs.append([il])
        return runs

    def block_dev(self, il: int) -> int:
        """The device block il computes on in this plan."""
        return self.pc.embed_dev if il in self.hosted else self.pc.layer_device[il]

    def build(self) -> None:
        pc, hp, arch, w = self.pc, self.pc.hp, self.pc.arch, self.pc.weights
        n_last = self.n if self.keep_rows else min(self.n, max(self.n_out, 1))  # rows the last block keeps
        paged, placement = pc.placement.paged, pc.placement

        def embed(ctx: Any, gf: Any, act: Any, act_out: Any, inp: StepInputs) -> Any:
            x = arch.build_embed(ctx, w, inp)
            arch.build_pass_inputs(ctx, gf, w, inp, x)
            return ctx.cpy(x, act)

        def alone(il: int) -> GraphFn:  # block il, a graph of its own
            return lambda ctx, gf, act, act_out, inp: ctx.cpy(self.block(ctx, gf, inp, il, act), act_out)

        self.graph(embed, "embed", dev=pc.embed_dev)
        rows_in = n_last if self.keep_rows else self.n_out
        # the head joins the last segment where it is one graph on the last block's device
        head_joins = (
            self.merge
            and bool(self.n_out)
            and not self.hidden
            and not (paged and not self.embed)
            and self.stays(hp.n_layer - 1)
        )
        for run in self.segments():
            il = run[-1]
            rows = n_last if il == hp.n_layer - 1 else self.n
            key = Block(il) if paged and il not in self.hosted else None
            if len(run) == 1 and placement.experts is not None and arch.is_moe(il):
                build_paged_block(self, arch, w, il, rows, key, self.kv(il))
                continue
            with_head = head_joins and il == hp.n_layer - 1
            if len(run) == 1 and not with_head:
                self.graph(
                    alone(il),
                    "block",
                    rows_out=rows,
                    key=key,
                    layer=il,
                    dev=self.block_dev(il),
                    group=il,
                )
                continue

            def segment(
                ctx: Any,
                gf: Any,
                act: Any,
                act_out: Any,
                inp: StepInputs,
                run: list[int] = run,
                with_head: bool = with_head,
            ) -> Any:
                x = act
                for j in run:
                    x = self.block(ctx, gf, inp, j, x)
                return self.head(ctx, inp, self.outputs(ctx, inp, x)) if with_head else ctx.cpy(x, act_out)

            out = self.graph(
                segment,
                "block",
                rows_out=self.n_out if with_head else rows,
                dev=self.block_dev(il),
                blocks=len(run) + with_head,
                span=tuple(run) + ((hp.n_layer,) if with_head else ()),
                keys=tuple(Block(j) for j in run if j not in self.hosted) if paged else (),
            )
            if with_head:
                self.logits = out
                return
        if self.hidden:
            self.graph(
                lambda ctx, gf, act, act_out, inp: ctx.cpy(self.hidden_of(ctx, act), self.hidden_rows(ctx)),
                "head",
                rows_in=rows_in,
                rows_out=rows_in,
                dev=pc.placement.head_dev,
                group=hp.n_layer,
            )
        if self.n_out and paged and not self.embed and not self.head_host:
            self.build_chunked_head(rows_in)
        elif self.n_out:
            self.logits = self.graph(
                lambda ctx, gf, act, act_out, inp: self.head(ctx, inp, self.outputs(ctx, inp, act)),
                "head",
                rows_in=rows_in,
                rows_out=self.n_out,
                dev=pc.embed_dev if self.head_host else pc.layer_device[-1],
                group=hp.n_layer,
            )

    def hidden_of(self, ctx: Any, x: Any) -> Any:
        """The hidden rows an MTP block reads of the last block's rows x: their output norm, or x itself where the
        residual is wider than n_embd (deepseek4's streams, as llama.cpp's nextn embeddings) or the family's MTP
        reads them before the norm (mimo2)."""
        hp = self.pc.hp
        if hp.n_residual or hp.arch in PRE_NORM_HIDDEN:
            return x
        return self.pc.arch.build_output_norm(ctx, self.pc.weights, x)

    def hidden_rows(self, ctx: Any) -> Any:
        """The pass's rows of pc.buffers.hidden (F32 [residual_width, n])."""
        h = self.pc.buffers.hidden
        assert h is not None, "a plan reading the hidden rows without keep_hidden"
        return ctx.view(h, [self.pc.hp.residual_width, self.n], [h.nb[1]], 0)

    def hidden_out(self) -> np.ndarray:
        """After the pass (hidden): its rows' hidden rows, F32 [n, residual_width]."""
        cx = native.Context(max_tensors=1)
        return tensor_array(self.hidden_rows(cx)).reshape(self.n, self.pc.hp.residual_width)

    def outputs(self, ctx: Any, inp: StepInputs, x: Any) -> Any:
        """x's rows whose output is wanted: all of x, unless the last block kept every row (keep_rows)."""
        return ctx.get_rows(x, inp.out_ids) if self.keep_rows and self.n_out < self.n else x

    def block(self, ctx: Any, gf: Any, inp: StepInputs, il: int, x: Any) -> Any:
        """Block il's output over x: the family's graph, over the layer's sequence memory."""
        pc = self.pc
        return pc.arch.build_block(ctx, gf, pc.weights, inp, il, x, *self.kv(il))

    def head(self, ctx: Any, inp: StepInputs, x: Any) -> Any:
        """The output rows x to logits (or, embedding, to the output norm), marked as the graph's output."""
        arch, w = self.pc.arch, self.pc.weights
        out = arch.build_output_norm(ctx, w, x) if self.embed else arch.build_output(ctx, w, inp, x)
        out.set_output()
        return out

    def whole(self) -> Any:
        """The micro-batch as one graph, built on first use, as llama.cpp builds it: each block's output is
        the next block's input (no copy through the activation buffer), one allocation and one thread-pool
        launch per step. The same operations as the per-block graphs: the same results. Only for resident
        weights on one device (the paged paths need to act between blocks); whole_logits holds the logits."""
        if self.whole_graph is None:
            pc = self.pc
            inp = self.all_inputs[0]
            pc.weights.device = 0
            size = 2 * sum(s.graph.n_nodes for s in self.steps) + 512
            ctx = native.Context(max_tensors=size, graph_size=size)
            gf = ctx.new_graph()
            x = pc.arch.build_embed(ctx, pc.weights, inp)
            pc.arch.build_pass_inputs(ctx, gf, pc.weights, inp, x)
            for il in range(pc.hp.n_layer):
                x = self.block(ctx, gf, inp, il, x)
            if self.hidden:
                gf.expand(ctx.cpy(self.hidden_of(ctx, x), self.hidden_rows(ctx)))
            if inp.n_outputs:
                x = self.whole_logits = self.head(ctx, inp, self.outputs(ctx, inp, x))
            gf.expand(x)
            self.keep.append(ctx)
            self.whole_graph = gf
        return self.whole_graph

    def build_chunked_head(self, rows_in: int) -> None:
        """Output norm into head_in (F32 [n_embd, n_out]), then one graph per streamed row chunk
        of the lm head, each writing its rows of the logits (F32 [n_vocab, n_out]). rows_in: the rows the last
        block kept."""
        pc, n_out = self.pc, self.n_out
        hp, w = pc.hp, pc.weights
        shared = pc.buffers.head_out(n_out)
        vctx = native.Context(max_tensors=2)
        head_in = vctx.view(shared[2], [hp.n_embd, n_out], [shared[2].nb[1]], 0)
        lb = vctx.view(shared[3], [hp.n_vocab, n_out], [shared[3].nb[1]], 0)
        self.keep += [shared, vctx]
        dev = pc.placement.head_dev
        self.graph(
            lambda ctx, gf, act, act_out, inp: ctx.cpy(
                self.outputs(ctx, inp, pc.arch.build_output_norm(ctx, w, act)), head_in
            ),
            "head",
            rows_in=rows_in,
            rows_out=n_out,
            dev=dev,
        )

        def chunk(name: str, r0: int, rows: int) -> GraphFn:  # the head's rows [r0, r0 + rows) of the logits
            return lambda ctx, gf, act, act_out, inp: ctx.cpy(
                ctx.mul_mat(w(name), head_in), ctx.view(lb, [rows, n_out], [lb.nb[1]], r0 * lb.element_size)
            )

        row0 = 0
        for c, name in enumerate(pc.placement.head_chunks):
            rows = w(name).ne[1]
            self.graph(chunk(name, row0, rows), "head", rows_in=n_out, rows_out=n_out, key=HeadChunk(c), dev=dev)
            row0 += rows
        if pc.arch.reshapes_logits:  # what follows the head's matmul, over all of its rows
            self.graph(
                lambda ctx, gf, act, act_out, inp: ctx.cpy(pc.arch.build_logits(ctx, lb), lb),
                "head",
                rows_in=n_out,
                rows_out=n_out,
                dev=dev,
            )
        self.logits = lb
