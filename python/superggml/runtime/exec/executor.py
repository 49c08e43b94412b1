"""The executor: forward passes, step by step, over the weights' placement, the sequence memory and the plans.

A forward pass of n tokens runs the steps of a plan (runtime/graph.py) in order: an embedding graph, one
graph per transformer block, an output graph. Before each step its weights are in (the placement's pager), its
layer's memory is bound (the sequence memory's `use`) and, with paged experts, the routed ones are mapped to
cache slots. Activations persist between graphs in a device buffer per device.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, Iterator, Sequence

import numpy as np

from ... import native
from ...arch import Architecture
from ...arch.mtp import MtpArch
from ...devices import server_counters
from ...settings import Settings
from ..memory.arrays import tensor_array
from .graph import LaneRows, GraphPlan, Step, lane_rows, padded_kv
from ..memory.base import MAX_LANES, SequenceMemory
from ..memory.factory import sequence_memory
from ..weights.pagers import WeightPager
from .placement import Placements, Placer
from .profile import PassProfile, timing
from .context import HeadBuffers, PassContext
from .streams import DeviceStreams, activations
from .threads import ThreadTuner
from ..plan.memory_plan import kv_bytes
from ..plan.resolve import Resolved, resolve
from ..memory.saved import SavedSource
from ..memory.sequences import SequenceState, Sequences
from ..weights.placement import WeightPlacement

F32 = native.GGMLType.F32
PLAN_CACHE = 6  # micro-batch shapes whose graphs are kept
Item = tuple[SequenceState, Sequence[int]]


class Executor:
    """Runs an architecture layer by layer on one or more backends (a pipeline by blocks), its weights
    resident or paged (placement), its sequences' memory contiguous or paged (memory, sequences)."""

    def __init__(
        self, arch: Architecture | MtpArch, store: native.WeightStore, resolved: Resolved, *, load: bool = True
    ):
        """On the devices, settings and memory plan that runtime/resolve.py gives (Executor.start does it all),
        with the weights of `store` (a native.WeightStore): activations F32 [n_embd, n_batch] and the quantized
        cache's rotations per device, the weights' placement (resident ones start loading in the background, so
        the reads overlap the rest; not with `load` False: the caller has bound them), the sequence memory."""
        s, devices = resolved.settings, resolved.devices
        self.arch, self.hp = arch, arch.hp
        arch.set_context(s.context.ctx_size)
        self.settings, self.memory_plan, self.devices = s, resolved.memory_plan, devices
        self.backends = devices.backends
        self.n_split = devices.n_split  # the devices the blocks are split over
        self.layer_device = devices.layer_device
        self.endpoints = devices.endpoints  # the RPC servers it computes on
        self.embed_dev = devices.embed_dev
        self.backend = self.backends[0]
        self.store = store  # the weights (a native.WeightStore)
        self.plans: dict[tuple[Any, ...], GraphPlan] = {}  # by micro-batch shape, most recently used last
        self.n_passes = self.pass_sequences = self.pass_tokens = 0  # forward passes and what they held
        self.stream_passes = 0  # passes whose sequences attended at once (streams)
        self.graphs_per_pass = 0  # graphs the last pass computed
        self.record_timings = False  # fill self.timings on every forward pass (metrics)
        self.timings: list[dict[str, Any]] = []
        self.on_hidden: Any = None  # (sequence, first position, F32 [n, n_embd]) per pass item
        self.streams = DeviceStreams(self.backends)  # graphs queued on the devices' streams
        self.profile = PassProfile(self.backends)  # where each pass's time goes (host, device)
        head_dims = {arch.layer_hp(il).head_dim for il in range(self.hp.n_layer)}
        self.acts, self.rot, self.keep = activations(
            self.hp, s.context, self.backends, tuple(head_dims), arch.indexer_rot_size
        )
        self.placement = WeightPlacement(arch, store, resolved, load=load)
        self.weights = self.placement.view
        self.tuner = self.thread_tuner()
        try:
            self.memory: SequenceMemory = sequence_memory(s, arch, devices, self.kv_bytes)
            self.sequences = Sequences(self.memory, s.context.ctx_size, self.hp.n_vocab)
        except BaseException:
            self.placement.close()  # the loader's threads must stop before the caller unmaps the file
            raise
        self.pc = PassContext(
            arch,
            s,
            self.weights,
            self.placement,
            self.memory,
            self.backends,
            self.embed_dev,
            self.layer_device,
            self.n_split,
            self.acts,
            self.rot,
            HeadBuffers(self.hp.n_embd, self.hp.n_vocab, self.backends[self.placement.head_dev]),
        )
        self.saving = SavedSource(arch, s.context, self.memory, self.sequences, self.placement)  # save_sequence's
        self.placements = Placements(self.pc)  # where streamed blocks and missed experts compute, pass by pass

    @property
    def placer(self) -> Placer | None:
        """The streamed blocks' placement (None where they do not switch)."""
        return self.placements.placer

    @property
    def placer_note(self) -> str:
        """Why the streamed blocks do not switch, where that is the question."""
        return self.placements.note

    @classmethod
    def start(
        cls, arch: Architecture | MtpArch, store: native.WeightStore, settings: Settings, *, load: bool = True
    ) -> "Executor":
        """Opens the devices and resolves the settings (runtime/resolve.py), then starts on them."""
        return cls(arch, store, resolve(settings, arch, store), load=load)

    def close(self) -> None:
        """Stops the background load (before the file's mapping goes away) and drops the plans (they refer
        to this executor)."""
        self.placement.close()
        self.plans.clear()

    # -- what the model reads -------------------------------------------------
    @property
    def seq(self) -> SequenceState:
        """The current sequence."""
        return self.sequences.current

    @property
    def scheduler(self) -> Any:
        return self.placement.scheduler

    @property
    def repacked_bytes(self) -> int:
        return self.placement.repacked_bytes

    @property
    def max_lanes(self) -> int:
        """Sequences one pass may hold."""
        return min(MAX_LANES, self.memory.max_lanes)

    def thread_tuner(self) -> ThreadTuner | None:
        """Where the threads were not given (nor batch_invariant) and one CPU computes: a tuner of the decode
        thread count, up to the threads decode may use (one fewer than all while blocks stream, for the prefetch
        worker)."""
        c = self.settings.context
        if c.n_threads is not None or c.batch_invariant or self.n_split != 1 or self.backend.device_type != "cpu":
            return None
        return ThreadTuner(self.placement.decode_threads or c.threads)

    @property
    def kv_bytes(self) -> int:
        """Bytes of a contiguous K/V cache for the whole context (what paged_kv pages)."""
        c = self.settings.context
        return kv_bytes(self.hp, c.ctx_size, c.cache_type_k, c.cache_type_v)

    def stats(self) -> dict[str, Any]:
        """Counters of the sequences, the memory, the pagers and the scheduler, one dict."""
        n = max(self.n_passes, 1)
        d: dict[str, Any] = {
            "sequence": self.seq.id,
            "n_sequences": len(self.sequences),
            "n_tokens": self.seq.n_past,
            "n_threads": self.backends[self.embed_dev].n_threads,
            "weights_loading": self.placement.loader is not None,
            "devices": [b.name for b in self.backends[: self.n_split]],
            "blocks_per_device": [self.layer_device.count(i) for i in range(self.n_split)],
            "passes": self.n_passes,
            "sequences_per_pass": self.pass_sequences / n,
            "tokens_per_pass": self.pass_tokens / n,
            "stream_passes": self.stream_passes,
            "graphs_per_pass": self.graphs_per_pass,
            "pass_profile": self.profile.as_dict(),
        }
        if self.tuner is not None:
            d.update(self.tuner.stats())
        if self.endpoints:
            d.update(server_counters(self.endpoints), remote_bytes=self.placement.remote_bytes)
        d.update(self.memory.stats())
        if self.memory_plan is not None:
            d["budget"] = self.memory_plan.as_dict()
        d.update(self.placement.stats())
        if self.placer is not None:
            d["placement"] = self.placer.table()
        return d

    def device_timing(self, on: bool = True) -> bool:
        """Device events around every graph from now on (pass_profile's device_ms); whether a device has them."""
        return timing(self.backends, on)

    def keep_hidden(self, on_hidden: Any = None) -> None:
        """Every pass (but embeddings) keeps the output norm of all its rows (buffers.hidden) and gives each
        sequence's to on_hidden: what an MTP drafter reads (llama.cpp's unmasked nextn embeddings)."""
        self.pc.buffers.keep_hidden(self.settings.context.n_batch)
        self.on_hidden = on_hidden

    # -- plans ------------------------------------------------------------------
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
    ) -> GraphPlan:
        """The graphs for micro-batches of this shape, built once and reused (embed: ending at the output norm,
        not the logits; streams, chain, merge: see GraphPlan; merge None: where nothing acts between blocks)."""
        buffers = self.pc.buffers
        hidden = buffers.hidden is not None and not embed
        if merge is None:
            merge = self.merges()
        key = (n, n_kv, n_out, lanes, embed, streams, hidden, chain, merge, hosted)
        plan = self.plans.pop(key, None)
        if plan is None or plan.generation != buffers.generation:
            t0 = time.perf_counter()
            plan = GraphPlan(self.pc, n, n_kv, n_out, lanes, embed, streams, hidden, chain, merge, hosted)
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
        c = self.settings.context
        return lane_rows(
            p0,
            n,
            n_kv,
            n_swa=self.arch.n_swa,
            chunked=self.arch.swa_chunked,
            flash_attn=c.flash_attn,
            v_channels=self.hp.v_channels,
            ctx_size=c.ctx_size,
        )

    # -- one pass -----------------------------------------------------------------
    def run_pass(
        self, items: Sequence[Item], out_rows: Sequence[int], embed: bool = False, hidden: np.ndarray | None = None
    ) -> np.ndarray | None:
        """One forward pass over the tokens of one or more sequences (each in its own lane, its rows after the
        previous one's); returns the logits of out_rows (rows of the whole pass), or None. embed: the output
        norm's rows (F32 [n_out, n_embd]) instead. hidden: an MTP block's rows beside the tokens."""
        self.profile.start()
        t0 = time.perf_counter()
        c = self.settings.context
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
            len(items) if (len(items) > 1 and len({x for x, _ in shapes}) == 1 and self.memory.streams(ids)) else 0
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
        )
        self.placements.arrange(hosted)
        plan.fill(np.concatenate([np.asarray(t, dtype=np.int32) for _, t in items]), rows, out_rows, hidden)
        self.memory.bind(ids, streams=bool(streams))
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
            out = tensor_array(logits).reshape(len(out_rows), self.hp.n_embd if embed else self.hp.n_vocab)
        self.profile.done(n)
        if self.tuner is not None and n == 1:
            self.tuner.observe(time.perf_counter() - t0)
        return out

    def merges(self) -> bool:
        """Whether plans merge the blocks that stay into segments: the weights are loaded (the first pass
        computes each block as it arrives), the K/V is not paged (its frames are bound per layer) and the pass
        is not timed block by block."""
        return self.placement.loader is None and not self.record_timings and not self.settings.kv.paged_kv

    def one_graph(self) -> bool:
        """Everything resident on one device, loaded, untimed: nothing to do between blocks."""
        return len(self.backends) == 1 and self.merges() and not self.placement.paged and self.placement.experts is None

    def compute(self, plan: GraphPlan, n: int, lanes: Sequence[tuple[int, int, int]]) -> Any:
        """Runs the micro-batch's graphs in order; returns the tensor that holds its logits (if any). lanes:
        (sequence, n_past, tokens) of each sequence in the pass."""
        first: dict[int, int] = {}  # a sequence's first position in the pass, and its rows
        rows: dict[int, int] = {}
        for seq, p0, m in lanes:
            first[seq] = min(first.get(seq, p0), p0)
            rows[seq] = rows.get(seq, 0) + m
        for seq, p0 in first.items():
            self.memory.begin(seq, p0, rows[seq])
        self.placement.lend({seq: p0 + rows[seq] for seq, p0 in first.items()}, n)
        self.before_pass(n)
        if self.one_graph():
            self.graphs_per_pass = 1
            if plan.whole_graph is None:
                t0 = time.perf_counter()
                plan.whole()
                self.profile.built(time.perf_counter() - t0)
            self.backend.compute(plan.whole())  # one graph per micro-batch, as llama.cpp runs it
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
        self.placement.pass_done()
        if self.placement.experts is not None:
            self.placement.experts.pass_done(n, time.time() - t_pass)
        return plan.logits

    def run_step(
        self, plan: GraphPlan, step: Step, dev: int, lanes: Sequence[tuple[int, int, int]], first: dict[int, int]
    ) -> tuple[int, float]:
        """Runs one graph of a pass once its weights, experts and K/V are in; returns the device the activations
        are on after it and when its computation started."""
        pl = self.placement
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
            k, il, r0 = self.hp.n_expert_used, step.experts, step.expert_row0
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
            else self.memory.use(step.layer, [(seq, first[seq], p0 + m) for seq, p0, m in lanes])
        )
        # a streamed slot or a paged K/V frame may be refilled once released: its graph must have run by then
        queue = (
            not self.record_timings
            and step.key is None
            and step.experts is None
            and (step.layer is None or not self.settings.kv.paged_kv)
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
        pl = self.placement
        if pl.scheduler is not None:
            pl.scheduler.step()
        want = None
        if self.tuner is not None:
            want = self.tuner.threads() if n == 1 else self.settings.context.threads
        elif pl.decode_threads is not None:
            want = pl.decode_threads if n == 1 else self.settings.context.threads
        if want is not None and self.backend.n_threads != want:
            self.backend.n_threads = want

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
        last = self.placement.pagers[step.dev].last_load(step.key)
        if last is not None:
            r.update(load_start=last[0], load_end=last[1], load_ms=(last[1] - last[0]) * 1e3)
        return r

    def time_blocks(self, blocks: Sequence[int], *, repeats: int = 3) -> dict[int | str, float]:
        """time_blocks() over this executor."""
        return time_blocks(self, blocks, repeats=repeats)

    # -- feeding tokens ---------------------------------------------------------
    def eval(self, tokens: Sequence[int], *, logits_all: bool = False, hidden: np.ndarray | None = None) -> np.ndarray:
        """Feeds tokens to the current sequence at positions n_past..; returns F32 logits [n_out, n_vocab]
        (every position if logits_all, else the last one), also kept as the sequence's scores. hidden: an MTP
        block's rows beside the tokens (F32 [n, n_embd])."""
        n, seq = len(tokens), self.seq
        self.sequences.check_feed(seq, tokens)
        outs = []
        b = self.settings.context.n_batch
        start = seq.n_past
        try:
            for i in range(0, n, b):
                chunk = tokens[i : i + b]
                last = i + len(chunk) == n
                rows = list(range(len(chunk))) if logits_all else ([len(chunk) - 1] if last else [])
                r = self.run_pass([(seq, chunk)], rows, hidden=None if hidden is None else hidden[i : i + b])
                if r is not None:
                    outs.append(r)
        except BaseException:
            self.sequences.rollback(seq, start)
            raise
        seq.scores = np.concatenate(outs, axis=0)
        return seq.scores

    def eval_rows(self, tokens: Sequence[int]) -> np.ndarray:
        """Feeds tokens to the current sequence in passes where each token is a lane of its own over the
        sequence's K/V (a recurrent state: one chain of them), as if fed alone: row i of the logits F32 [n,
        n_vocab] (the scores) is eval() of the tokens one by one at token i, bit for bit with batch_invariant."""
        seq = self.seq
        self.sequences.check_feed(seq, tokens)
        start, outs = seq.n_past, []
        step = min(MAX_LANES, self.settings.context.n_batch)
        try:
            for i in range(0, len(tokens), step):
                chunk = tokens[i : i + step]
                r = self.run_pass([(seq, [t]) for t in chunk], list(range(len(chunk))))
                assert r is not None  # every row is wanted
                outs.append(r)
        except BaseException:
            self.sequences.rollback(seq, start)
            raise
        seq.scores = outs[0] if len(outs) == 1 else np.concatenate(outs, axis=0)
        return seq.scores

    def eval_check(self, tokens: Sequence[int]) -> np.ndarray:
        """Every row's logits F32 [n, n_vocab] of tokens fed to the current sequence, to check a draft: one
        causal pass, as llama.cpp checks one; with batch_invariant each row as if fed alone (eval_rows)."""
        if self.settings.context.batch_invariant:
            return self.eval_rows(tokens)
        return self.eval(tokens, logits_all=True)

    def eval_scratch(
        self, prompts: Sequence[Sequence[int]], *, logits_all: bool = False, embed: bool = False
    ) -> list[np.ndarray]:
        """eval_batch over sequences of their own, dropped afterwards: a pass that leaves every sequence's cache
        as it was (echo's prompt logprobs, embeddings)."""
        ids = self.sequences.reserve(len(prompts))
        try:
            return self.eval_batch(list(zip(ids, prompts)), logits_all=logits_all, embed=embed)
        finally:
            self.sequences.release(ids)

    def eval_batch(
        self, batch: Sequence[tuple[int, Sequence[int]]], *, logits_all: bool = False, embed: bool = False
    ) -> list[np.ndarray]:
        """Feeds tokens to several sequences (distinct ids; each at its positions n_past..) in shared forward
        passes: as llama.cpp's llama_batch, each pass holds up to n_batch tokens from up to max_lanes
        sequences, each attending over its own K/V. Returns per item its logits F32 [n_out, n_vocab] (every
        position if logits_all, else the last), also kept as that sequence's scores. The current sequence
        stays current. A sequence's logits are those of eval() on it alone, up to the rounding of matrix
        products over more rows. embed: the output norm's rows F32 [n_out, n_embd] (the hidden states the lm
        head reads; embeddings) instead of logits."""
        return feed_batch(self, batch, logits_all=logits_all, embed=embed)


def feed_batch(
    ex: Executor, batch: Sequence[tuple[int, Sequence[int]]], *, logits_all: bool = False, embed: bool = False
) -> list[np.ndarray]:
    """Executor.eval_batch over ex."""
    seqs = [int(s) for s, _ in batch]
    if len(set(seqs)) != len(seqs):
        raise ValueError("eval_batch: each sequence may appear once")
    if any(s < 0 for s in seqs):
        raise ValueError("sequence ids are >= 0")
    states = [ex.sequences.table.get(s) or SequenceState(s) for s in seqs]
    for st, (_, toks) in zip(states, batch):
        ex.sequences.check_feed(st, toks)
    for st in states:
        ex.sequences.table.setdefault(st.id, st)
    if len(batch) == 1 and states[0] is ex.seq and not embed:
        return [ex.eval(batch[0][1], logits_all=logits_all)]
    starts = [st.n_past for st in states]
    outs: list[list[np.ndarray]] = [[] for _ in batch]
    order = sorted(range(len(batch)), key=lambda i: ex.memory.order(seqs[i]))  # rows in memory order
    try:
        for items, owners, out_rows in micro_batches(
            [states[i] for i in order],
            [batch[i][1] for i in order],
            logits_all,
            ex.settings.context.n_batch,
            ex.max_lanes,
        ):
            logits = ex.run_pass(items, out_rows, embed)
            at = 0
            for i, k in owners:
                if k:
                    assert logits is not None  # rows are wanted: the pass returned them
                    outs[order[i]].append(logits[at : at + k])  # views of the pass's array: no copy
                    at += k
    except BaseException:
        for st, start in zip(states, starts):
            ex.sequences.rollback(st, start)
        raise
    scores = [o[0] if len(o) == 1 else np.concatenate(o, axis=0) for o in outs]
    for st, s in zip(states, scores):
        st.scores = s
    return scores


def time_blocks(ex: Executor, blocks: Sequence[int], *, repeats: int = 3) -> dict[int | str, float]:
    """Seconds of computation of each of `blocks`, and of the lm head ("head"), for one token decoded after
    the current sequence: the median of `repeats` runs after one that brings the weights in. Only their
    weights are read (nothing is prefetched meanwhile). The sequence keeps its tokens; the K/V row after
    them is written (the next eval writes it again). What analyze scales by the blocks of each shape."""
    seq, c = ex.seq, ex.settings.context
    p0 = seq.n_past
    if p0 >= c.ctx_size:
        raise ValueError("time_blocks needs a free position in the context")
    if any(not 0 <= il < ex.hp.n_layer for il in blocks):
        raise ValueError(f"blocks are in 0..{ex.hp.n_layer - 1}")
    n_kv = padded_kv(p0, 1, c.ctx_size)
    plan = ex.plan(1, n_kv, 1, merge=False)
    ex.placements.arrange(((), False))  # every block on its device
    plan.fill(np.zeros(1, dtype=np.int32), [ex.lane_rows(p0, 1, n_kv)], [0])
    ex.memory.bind([seq.id])
    ex.before_pass(1)  # the threads a decoded token computes with
    lanes, first = [(seq.id, p0, 1)], {seq.id: p0}
    ex.memory.checkpoint(seq.id)  # a recurrent state comes back after
    ex.memory.begin(seq.id, p0)
    pagers = [pg for pg in ex.placement.pagers if isinstance(pg, WeightPager)]
    depths = [pg.depth for pg in pagers]
    for pg in pagers:
        pg.depth = 0
    out: dict[int | str, float] = {}
    try:
        dev, _ = ex.run_step(plan, plan.steps[0], plan.steps[0].dev, lanes, first)  # the embedding
        ex.streams.synchronize()
        groups: list[tuple[int | str, list[Step]]] = [
            (il, [st for st in plan.steps if st.group == il and st.kind != "head"]) for il in blocks
        ]
        groups.append(("head", [st for st in plan.steps if st.kind == "head"]))
        for name, steps in groups:
            times = []
            for r in range(repeats + 1):
                t = 0.0
                for st in steps:
                    dev, tc = ex.run_step(plan, st, dev, lanes, first)
                    ex.streams.synchronize()
                    t += time.time() - tc
                if r:
                    times.append(t)
            out[name] = float(np.median(times))
    finally:
        ex.streams.synchronize()
        for pg, d in zip(pagers, depths):
            pg.depth = d
        ex.memory.truncate(seq.id, p0)
    return out


def micro_batches(
    states: Sequence[SequenceState], toks: Sequence[Sequence[int]], logits_all: bool, b: int, lanes: int
) -> Iterator[tuple[list[Item], list[tuple[int, int]], list[int]]]:
    """The passes of eval_batch: (items, owners (index, rows wanted), rows wanted), each up to b tokens
    from up to `lanes` sequences, every sequence's chunks in order."""
    done = [0] * len(toks)
    while any(d < len(t) for d, t in zip(done, toks)):
        items: list[Item] = []
        owners: list[tuple[int, int]] = []
        out_rows: list[int] = []
        row, room = 0, b
        for i, t in enumerate(toks):
            if done[i] >= len(t) or room == 0 or len(items) == lanes:
                continue
            chunk = t[done[i] : done[i] + room]
            last = done[i] + len(chunk) == len(t)
            want = list(range(len(chunk))) if logits_all else ([len(chunk) - 1] if last else [])
            out_rows += [row + r for r in want]
            items.append((states[i], chunk))
            owners.append((i, len(want)))
            row += len(chunk)
            room -= len(chunk)
            done[i] += len(chunk)
        yield items, owners, out_rows
