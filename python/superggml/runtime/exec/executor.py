"""The executor: builds what a model runs on (the weights' placement, the sequence memory, the PassContext) and
feeds tokens through it, in micro-batches of n_batch from one or more sequences; its PassRunner (passes.py) runs
each forward pass step by step.
"""

from __future__ import annotations

import sys
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from ... import native
from ...arch import Architecture
from ...arch.mtp import MtpArch
from ...devices import server_counters
from ...settings import Settings
from ..memory.base import MAX_LANES, SequenceMemory
from ..memory.factory import sequence_memory
from .placement import Placements, Placer
from .profile import PassProfile, timing
from .context import HeadBuffers, PassContext
from .passes import Item, PassRunner
from .streams import DeviceStreams, activations
from .threads import ThreadTuner
from ..plan.memory_plan import kv_bytes
from ..plan.resolve import Resolved, resolve
from ..memory.saved import SavedSource
from ..memory.sequences import SequenceState, Sequences
from ..weights.placement import WeightPlacement


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
        arch.set_context(s.context.ctx_size, s.context.flash_attn)
        self.settings, self.memory_plan, self.devices = s, resolved.memory_plan, devices
        self.backends = devices.backends
        self.n_split = devices.n_split  # the devices the blocks are split over
        self.layer_device = devices.layer_device
        self.endpoints = devices.endpoints  # the RPC servers it computes on
        self.embed_dev = devices.embed_dev
        self.backend = self.backends[0]
        self.store = store  # the weights (a native.WeightStore)
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
        self.passes = PassRunner(self.pc, self.placements, self.streams, self.profile, self.tuner)

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
        self.passes.plans.clear()

    # -- what the model reads -------------------------------------------------
    @property
    def seq(self) -> SequenceState:
        """The current sequence."""
        return self.sequences.current

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
        ps = self.passes
        n = max(ps.n_passes, 1)
        d: dict[str, Any] = {
            "sequence": self.seq.id,
            "n_sequences": len(self.sequences),
            "n_tokens": self.seq.n_past,
            "n_threads": self.backends[self.embed_dev].n_threads,
            "weights_loading": self.placement.loader is not None and not self.placement.loader.done(),
            "devices": [b.name for b in self.backends[: self.n_split]],
            "blocks_per_device": [self.layer_device.count(i) for i in range(self.n_split)],
            "passes": ps.n_passes,
            "sequences_per_pass": ps.pass_sequences / n,
            "tokens_per_pass": ps.pass_tokens / n,
            "stream_passes": ps.stream_passes,
            "graphs_per_pass": ps.graphs_per_pass,
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

    def report(self, path: str) -> None:
        """The budget's line on stderr (an automatic budget that streams, or verbose), and verbose's summary of the
        model at `path`."""
        plan, c = self.memory_plan, self.settings.context
        if plan is not None and plan.draft_dropped:
            print(plan.draft_dropped, file=sys.stderr)
        if plan is not None and (c.verbose or (plan.mode == "auto" and not plan.resident)):
            st = self.stats()
            pinned = (
                f", {min(st['layers_pinned'], self.hp.n_layer)} of {self.hp.n_layer} blocks pinned"
                if "layers_pinned" in st
                else ""
            )
            if st.get("expert_slots_lent"):
                pinned += (
                    f", expert cache {st['expert_slots']} slots ({st['expert_slots_lent']} lent by the K/V and compute "
                    f"until they are used)"
                )
            print(plan.line(pinned), file=sys.stderr)
        placer = self.placer
        if placer is not None:
            print("\n".join(placer.lines((1, c.n_batch))), file=sys.stderr)
        elif c.verbose and self.placer_note:
            print(f"superggml: {self.placer_note}", file=sys.stderr)
        if c.verbose:
            hp = self.hp
            print(
                f"superggml: {path}: {hp.arch}, {hp.n_layer} blocks, n_embd {hp.n_embd}, "
                f"vocab {hp.n_vocab}; ctx {c.ctx_size}, {self.backend.n_threads} threads, "
                f"{self.placement.repacked_bytes / 2**20:.0f} MiB re-laid, KV {self.kv_bytes / 2**20:.0f} MiB",
                file=sys.stderr,
            )

    def device_timing(self, on: bool = True) -> bool:
        """Device events around every graph from now on (pass_profile's device_ms); whether a device has them."""
        return timing(self.backends, on)

    def keep_hidden(self, on_hidden: Callable[[int, int, np.ndarray], None] | None = None) -> None:
        """Every pass (but embeddings) keeps the output norm of all its rows (buffers.hidden) and gives each
        sequence's to on_hidden: what an MTP drafter reads (llama.cpp's unmasked nextn embeddings)."""
        self.pc.buffers.keep_hidden(self.settings.context.n_batch, self.hp.residual_width)
        self.passes.on_hidden = on_hidden

    # -- one pass -----------------------------------------------------------------

    def time_blocks(self, blocks: Sequence[int], *, repeats: int = 3) -> dict[int | str, float]:
        """PassRunner.time_blocks after the current sequence."""
        return self.passes.time_blocks(self.seq, blocks, repeats=repeats)

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
                r = self.passes.run_pass([(seq, chunk)], rows, hidden=None if hidden is None else hidden[i : i + b])
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
        step = min(MAX_LANES, self.settings.context.n_batch, self.memory.max_lanes)
        try:
            for i in range(0, len(tokens), step):
                chunk = tokens[i : i + step]
                r = self.passes.run_pass([(seq, [t]) for t in chunk], list(range(len(chunk))))
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
        seqs = [int(s) for s, _ in batch]
        if len(set(seqs)) != len(seqs):
            raise ValueError("eval_batch: each sequence may appear once")
        if any(s < 0 for s in seqs):
            raise ValueError("sequence ids are >= 0")
        states = [self.sequences.table.get(s) or SequenceState(s) for s in seqs]
        for st, (_, toks) in zip(states, batch):
            self.sequences.check_feed(st, toks)
        for st in states:
            self.sequences.table.setdefault(st.id, st)
        if len(batch) == 1 and states[0] is self.seq and not embed:
            return [self.eval(batch[0][1], logits_all=logits_all)]
        starts = [st.n_past for st in states]
        outs: list[list[np.ndarray]] = [[] for _ in batch]
        order = sorted(range(len(batch)), key=lambda i: self.memory.order(seqs[i]))  # rows in memory order
        try:
            for items, owners, out_rows in micro_batches(
                [states[i] for i in order],
                [batch[i][1] for i in order],
                logits_all,
                self.settings.context.n_batch,
                self.max_lanes,
            ):
                logits = self.passes.run_pass(items, out_rows, embed)
                at = 0
                for i, k in owners:
                    if k:
                        assert logits is not None  # rows are wanted: the pass returned them
                        outs[order[i]].append(logits[at : at + k])  # views of the pass's array: no copy
                        at += k
        except BaseException:
            for st, start in zip(states, starts):
                self.sequences.rollback(st, start)
            raise
        scores = [o[0] if len(o) == 1 else np.concatenate(o, axis=0) for o in outs]
        for st, s in zip(states, scores):
            st.scores = s
        return scores


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
