"""Forward passes: the graph plans of each micro-batch shape (built once, reused), and the passes and steps run
over them, with the counters and timings they leave."""

from __future__ import annotations

import contextlib
import time
from typing import Any, Callable, Sequence

import numpy as np

from ... import native
from ..memory.arrays import tensor_array
from ..memory.sequences import SequenceState
from ..weights.pagers import WeightPager
from .context import PassContext
from ...arch.deepseek4_attention import pass_shape
from .graph import GraphPlan, LaneRows, Step, lane_rows, padded_kv
from .placement import Placements, Placer
from .profile import PassProfile
from .streams import DeviceStreams
from .threads import ThreadTuner

PLAN_CACHE = 6  # micro-batch shapes whose graphs are kept
Item = tuple[SequenceState, Sequence[int]]


class PassRunner:
    """Runs forward passes over one PassContext: a plan per micro-batch shape (PLAN_CACHE kept, most recently
    used last), each pass's steps with their weights, experts and memory in, the graphs queued on the devices'
    streams (`streams`), where its time goes (`profile`), per-step timings when `record_timings`."""

    def __init__(
        self,
        pc: PassContext,
        placements: Placements,
        streams: DeviceStreams,
        profile: PassProfile,
        tuner: ThreadTuner | None,
    ):
        self.pc, self.placements, self.streams, self.profile, self.tuner = pc, placements, streams, profile, tuner
        self.plans: dict[tuple[Any, ...], GraphPlan] = {}
        self.n_passes = self.pass_sequences = self.pass_tokens = 0  # forward passes and what they held
        self.stream_passes = 0  # passes whose sequences attended at once (streams)
        self.graphs_per_pass = 0  # graphs the last pass computed
        self.record_timings = False  # fill self.timings on every forward pass (metrics)
        self.timings: list[dict[str, Any]] = []
        self.on_hidden: Callable[[int, int, np.ndarray], None] | None = None  # keep_hidden's receiver
        self.on_pass: Callable[[list[dict[str, Any]]], None] | None = None  # each pass's timings (metrics)

    def observe(self, on_pass: Callable[[list[dict[str, Any]]], None]) -> None:
        """Every pass from now on records its per-step timings and hands them to on_pass (the metrics), whoever
        asked for the pass: the one place passes are observed."""
        self.record_timings = True
        self.on_pass = on_pass

    @property
    def placer(self) -> Placer | None:
        return self.placements.placer

    def plan(
        self,
        n: int,
        n_kv: int,
        n_out: int,
        lanes: tuple[tuple[int, int], ...] | None = None,
        embed: bool = False,
        streams: int = 0,
        chain: bool = False,
        merge: bool | None = None,
        hosted: tuple[tuple[int, ...], bool] = ((), False),
        p0: int = 0,
    ) -> GraphPlan:
        """The graphs for micro-batches of this shape, built once and reused (embed: ending at the output norm,
        not the logits; streams, chain, merge: see GraphPlan; merge None: where nothing acts between blocks)."""
        buffers = self.pc.buffers
        hidden = buffers.hidden is not None and not embed
        if merge is None:
            merge = self.merges()
        # a compressed K/V's work depends on where the pass starts (p0: its one sequence's first position)
        layout = self.pc.arch.compressed_layout()
        compressed = pass_shape(layout[0], p0, n) if layout else ()
        key = (n, n_kv, n_out, lanes, embed, streams, hidden, chain, merge, hosted, compressed)
        plan = self.plans.pop(key, None)
        if plan is None or plan.generation != buffers.generation:
            t0 = time.perf_counter()
            plan = GraphPlan(self.pc, n, n_kv, n_out, lanes, embed, streams, hidden, chain, merge, hosted, compressed)
            self.profile.built(time.perf_counter() - t0)
            stale = [k for k, p in self.plans.items() if p.generation != plan.generation]
            for k in stale:  # built over buffers that have since grown
                del self.plans[k]
        self.plans[key] = plan  # most recently used last
        if len(self.plans) > PLAN_CACHE:
            while len(self.plans) > PLAN_CACHE:
                self.plans.pop(next(iter(self.plans)))
            native.host_memory_trim()  # the graphs' contexts are a few MiB: give the heap back
        return plan

    def lane_rows(self, p0: int, n: int, n_kv: int) -> LaneRows:
        c = self.pc.settings.context
        return lane_rows(
            p0,
            n,
            n_kv,
            n_swa=self.pc.arch.n_swa,
            chunked=self.pc.arch.swa_chunked,
            flash_attn=c.flash_attn,
            v_channels=self.pc.hp.v_channels,
            ctx_size=c.ctx_size,
        )

    def run_pass(
        self, items: Sequence[Item], out_rows: Sequence[int], embed: bool = False, hidden: np.ndarray | None = None
    ) -> np.ndarray | None:
        """One forward pass over the tokens of one or more sequences (each in its own lane, its rows after the
        previous one's); returns the logits of out_rows (rows of the whole pass), or None. embed: the output
        norm's rows (F32 [n_out, n_embd]) instead. hidden: an MTP block's rows beside the tokens."""
        self.profile.start()
        t0 = time.perf_counter()
        self.pc.placement.pass_done()  # a load that ended since the last pass: this one merges
        c = self.pc.settings.context
        shapes: list[tuple[int, int]] = []
        starts: list[int] = []
        ahead: dict[int, int] = {}
        for seq, toks in items:  # a sequence may have several lanes, one after another
            p0, n = seq.n_past + ahead.get(seq.id, 0), len(toks)
            ahead[seq.id] = ahead.get(seq.id, 0) + n
            shapes.append((n, padded_kv(p0, n, c.ctx_size)))
            starts.append(p0)
        n = sum(x for x, _ in shapes)
        ids = [seq.id for seq, _ in items]
        # sequences of as many rows each whose memory is one tensor: one attention over all of them
        streams = (
            len(items) if (len(items) > 1 and len({x for x, _ in shapes}) == 1 and self.pc.memory.streams(ids)) else 0
        )
        if streams:
            n_kv = max(k for _, k in shapes)
            shapes = [(x, n_kv) for x, _ in shapes]
        rows = [self.lane_rows(p0, x, k) for p0, (x, k) in zip(starts, shapes)]
        lanes = tuple(shapes) if len(items) > 1 and not streams else None
        hosted = self.placements.choose(n, len(out_rows))
        plan = self.plan(
            n,
            0 if lanes else shapes[0][1],
            len(out_rows),
            lanes,
            embed,
            streams,
            chain=bool(lanes) and len(set(ids)) == 1,
            hosted=hosted,
            p0=starts[0],
        )
        self.placements.arrange(hosted)
        contexts: list[list[int]] = []
        seen: dict[int, list[int]] = {}
        for seq, toks in items if self.pc.family_inputs is not None else ():  # each lane's sequence so far
            seen[seq.id] = seen.get(seq.id, list(seq.tokens)) + [int(t) for t in toks]
            contexts.append(seen[seq.id])
        plan.fill(np.concatenate([np.asarray(t, dtype=np.int32) for _, t in items]), rows, out_rows, hidden, contexts)
        self.pc.memory.bind(ids, streams=bool(streams))
        self.n_passes += 1
        self.stream_passes += bool(streams)
        self.pass_sequences += len(items)
        self.pass_tokens += n
        logits = self.compute(plan, n, [(seq.id, p0, len(t)) for (seq, t), p0 in zip(items, starts)])
        for seq, toks in items:
            seq.tokens.extend(int(t) for t in toks)
        if plan.hidden and self.on_hidden is not None:
            h = plan.hidden_out()
            for (seq, toks), p0, at in zip(items, starts, np.cumsum([0] + [len(t) for _, t in items])):
                self.on_hidden(seq.id, p0, h[at : at + len(toks)])
        out = None
        if out_rows:
            out = tensor_array(logits).reshape(len(out_rows), self.pc.hp.n_embd if embed else self.pc.hp.n_vocab)
        self.profile.done(n)
        if self.on_pass is not None and self.record_timings:
            self.on_pass(self.timings)
        if self.tuner is not None and n == 1:
            self.tuner.observe(time.perf_counter() - t0)
        return out

    def merges(self) -> bool:
        """Whether plans merge the blocks that stay into segments: the weights are loaded (the first pass
        computes each block as it arrives), the K/V is not paged (its frames are bound per layer) and the pass
        is not timed block by block."""
        return self.pc.placement.loader is None and not self.record_timings and not self.pc.settings.kv.paged_kv

    def one_graph(self) -> bool:
        """Everything resident on one device, loaded, untimed: nothing to do between blocks."""
        return (
            len(self.pc.backends) == 1
            and self.merges()
            and not self.pc.placement.paged
            and self.pc.placement.experts is None
        )

    def compute(self, plan: GraphPlan, n: int, lanes: Sequence[tuple[int, int, int]]) -> Any:
        """Runs the micro-batch's graphs in order; returns the tensor that holds its logits (if any). lanes:
        (sequence, n_past, tokens) of each sequence in the pass."""
        first: dict[int, int] = {}  # a sequence's first position in the pass, and its rows
        rows: dict[int, int] = {}
        for seq, p0, m in lanes:
            first[seq] = min(first.get(seq, p0), p0)
            rows[seq] = rows.get(seq, 0) + m
        for seq, p0 in first.items():
            self.pc.memory.begin(seq, p0, rows[seq])
        self.pc.placement.lend({seq: p0 + rows[seq] for seq, p0 in first.items()}, n)
        self.before_pass(n)
        if self.one_graph():
            self.graphs_per_pass = 1
            if plan.whole_graph is None:
                t0 = time.perf_counter()
                plan.whole()
                self.profile.built(time.perf_counter() - t0)
            self.pc.backends[0].compute(plan.whole())  # one graph per micro-batch, as llama.cpp runs it
            return plan.whole_logits
        self.graphs_per_pass = len(plan.steps)
        rec = self.timings if self.record_timings else None
        if rec is not None:
            rec.clear()
        dev = plan.steps[0].dev
        t_pass = time.time()
        try:
            for i, step in enumerate(plan.steps):
                t0 = time.time()
                dev, tc = self.run_step(plan, step, dev, lanes, first)
                if rec is not None:
                    rec.append(self.timing(i, step, t0, tc))
                if self.placer is not None:
                    self.placements.observe(step, n, tc)
        finally:
            self.streams.synchronize()  # the host reads the logits next
        if self.placer is not None:
            self.placer.settle(n, time.time() - t_pass)
        self.pc.placement.pass_done()
        if self.pc.placement.experts is not None:
            self.pc.placement.experts.pass_done(n, time.time() - t_pass)
        return plan.logits

    def run_step(
        self, plan: GraphPlan, step: Step, dev: int, lanes: Sequence[tuple[int, int, int]], first: dict[int, int]
    ) -> tuple[int, float]:
        """Runs one graph of a pass once its weights, experts and K/V are in; returns the device the activations
        are on after it and when its computation started."""
        pl = self.pc.placement
        for g in step.span or (step.group,):
            pl.loaded(g)
        if step.dev != dev:  # a pipeline by blocks: the activations move along
            self.streams.wait(dev)
            for src, dst in plan.move(dev, step.dev, step.rows_in):
                native.tensor_copy(src, dst)
            dev = step.dev
        if step.experts is not None:  # the router's choice for its rows, as cache slots
            assert pl.experts is not None and pl.moe is not None
            self.streams.wait(dev)  # its graph may be queued: the host reads what it chose
            k, il, r0 = self.pc.hp.n_expert_used, step.experts, step.expert_row0
            rows = step.expert_ids.ne[1]
            sel = tensor_array(pl.moe.sel).reshape(-1)[r0 * k : (r0 + rows) * k]
            if step.host_experts is None:
                native.tensor_set(step.expert_ids, pl.experts.map(il, sel))
            else:
                self.placements.split_experts(step, il, sel)
            if step.expert_ahead:  # the next block's first chunk loads while this computes
                assert pl.moe.guess is not None  # the router's lookahead is what gives a step expert_ahead
                pl.experts.lookahead(il + 1, tensor_array(pl.moe.guess).reshape(-1)[: step.expert_ahead * k])
        mem = (
            contextlib.nullcontext()
            if step.layer is None
            else self.pc.memory.use(step.layer, [(seq, first[seq], p0 + m) for seq, p0, m in lanes])
        )
        # a streamed slot or a paged K/V frame may be refilled once released: its graph must have run by then
        queue = (
            not self.record_timings
            and step.key is None
            and step.experts is None
            and (step.layer is None or not self.pc.settings.kv.paged_kv)
        )
        with contextlib.ExitStack() as held, mem:
            for key in step.keys or (step.key,):
                held.enter_context(pl.pagers[dev].use(key))
            tc = time.time()
            try:
                self.streams.compute(dev, step.graph, queue)
            finally:
                if step.experts is not None:
                    assert pl.experts is not None
                    pl.experts.release()
        return dev, tc

    def before_pass(self, n: int) -> None:
        pl = self.pc.placement
        if pl.scheduler is not None:
            pl.scheduler.step()
        want = None
        if self.tuner is not None:
            want = self.tuner.threads() if n == 1 else self.pc.settings.context.threads
        elif pl.decode_threads is not None:
            want = pl.decode_threads if n == 1 else self.pc.settings.context.threads
        if want is not None and self.pc.backends[0].n_threads != want:
            self.pc.backends[0].n_threads = want

    def timing(self, i: int, step: Step, t0: float, tc: float) -> dict[str, Any]:
        t1 = time.time()
        r = dict(
            layer=i,
            kind=step.kind,
            t_start=t0,
            t_end=t1,
            wait_ms=(tc - t0) * 1e3,
            load_ms=0.0,
            compute_ms=(t1 - tc) * 1e3,
        )
        last = self.pc.placement.pagers[step.dev].last_load(step.key)
        if last is not None:
            r.update(load_start=last[0], load_end=last[1], load_ms=(last[1] - last[0]) * 1e3)
        return r

    def time_blocks(self, seq: SequenceState, blocks: Sequence[int], *, repeats: int = 3) -> dict[int | str, float]:
        """Seconds of computation of each of `blocks`, and of the lm head ("head"), for one token decoded after
        `seq`: the median of `repeats` runs after one that brings the weights in. Only their
        weights are read (nothing is prefetched meanwhile). The sequence keeps its tokens; the K/V row after
        them is written (the next eval writes it again). What analyze scales by the blocks of each shape."""
        c = self.pc.settings.context
        p0 = seq.n_past
        if p0 >= c.ctx_size:
            raise ValueError("time_blocks needs a free position in the context")
        if any(not 0 <= il < self.pc.hp.n_layer for il in blocks):
            raise ValueError(f"blocks are in 0..{self.pc.hp.n_layer - 1}")
        n_kv = padded_kv(p0, 1, c.ctx_size)
        plan = self.plan(1, n_kv, 1, merge=False, p0=p0)
        self.placements.arrange(((), False))  # every block on its device
        plan.fill(np.zeros(1, dtype=np.int32), [self.lane_rows(p0, 1, n_kv)], [0])
        self.pc.memory.bind([seq.id])
        self.before_pass(1)  # the threads a decoded token computes with
        lanes, first = [(seq.id, p0, 1)], {seq.id: p0}
        self.pc.memory.checkpoint(seq.id)  # a recurrent state comes back after
        self.pc.memory.begin(seq.id, p0)
        pagers = [pg for pg in self.pc.placement.pagers if isinstance(pg, WeightPager)]
        depths = [pg.depth for pg in pagers]
        for pg in pagers:
            pg.depth = 0
        out: dict[int | str, float] = {}
        try:
            dev, _ = self.run_step(plan, plan.steps[0], plan.steps[0].dev, lanes, first)  # the embedding
            self.streams.synchronize()
            groups: list[tuple[int | str, list[Step]]] = [
                (il, [st for st in plan.steps if st.group == il and st.kind != "head"]) for il in blocks
            ]
            groups.append(("head", [st for st in plan.steps if st.kind == "head"]))
            for name, steps in groups:
                times = []
                for r in range(repeats + 1):
                    t = 0.0
                    for st in steps:
                        dev, tc = self.run_step(plan, st, dev, lanes, first)
                        self.streams.synchronize()
                        t += time.time() - tc
                    if r:
                        times.append(t)
                out[name] = float(np.median(times))
        finally:
            self.streams.synchronize()
            for pg, d in zip(pagers, depths):
                pg.depth = d
            self.pc.memory.truncate(seq.id, p0)
        return out
