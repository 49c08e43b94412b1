"""Recurrent state: the sequence memory of gated delta-net, mamba2 and short-conv layers (llama.cpp's
llama_memory_recurrent).

A recurrent layer keeps, per sequence, a fixed-size state that each pass reads and overwrites: the conv window
(the last conv_kernel - 1 inputs) and the delta rule's state. It cannot forget its last tokens the way a K/V
cache does, so it keeps checkpoints: copies of a sequence's states where a pass of several tokens begins or ends
(a prompt chunk, a prompt's end, a speculative check) and every CHECKPOINT_EVERY tokens. Going back to position n
restores the latest checkpoint at or before n (`truncate_point`); the caller feeds the tokens after it again.
With state_device_sequences, the least recently run sequences' states wait in host memory (a tier of copies) and
come back before their next pass.
"""

from __future__ import annotations

from typing import Any, Protocol, Sequence, runtime_checkable

import numpy as np

from ... import native
from ..plan.memory_plan import STATE_CHECKPOINTS
from .arrays import tensor_array
from .base import records

F32 = native.GGMLType.F32
CHECKPOINT_EVERY = 256  # tokens fed one pass at a time between two checkpoints at most
REPLAY_NODES = 64  # graph nodes a layer's replay takes, at most


@runtime_checkable
class RecurrentFamily(Protocol):
    """What the recurrent states read of a family with recurrent layers (qwen35, lfm2, mamba2): each layer's
    state sizes, the F32 values a layer records for a pass of n rows, and the graph that replays a recorded
    pass (RecurrentStates' `replay`)."""

    @property
    def state_sizes(self) -> tuple[int, int]: ...

    def record_size(self, n: int) -> int: ...

    def replay(self, *args: Any, **kwargs: Any) -> None: ...


class RecurrentStates:
    """Per sequence and recurrent layer: the conv window F32 [n_r] and the delta state F32 [n_s], in buffers of the
    sequence's own, one on each layer's backend (`layer_backends`); lane j's tensors point at the sequence of the
    pass's lane j (bind)."""

    def __init__(
        self,
        layer_backends: Sequence[Any],
        n_r: int,
        n_s: int,
        max_device: int | None = None,
        replay: Any = None,
        record_size: int = 0,
    ):
        """`max_device`: sequences whose states stay in device buffers (None: all); the least recently bound
        others are paged to host memory (numpy copies) and back when they next run. `replay(ctx, gf, record, n,
        k, conv, state, slot)` builds the graph that takes a layer's states k rows into a recorded pass of n rows
        (slot: the layer's index among the recurrent layers);
        `record_size`: the F32 values a layer records for a pass of RECORD_ROWS rows."""
        self.n_layer, self.n_r, self.n_s = len(layer_backends), n_r, n_s
        self.groups: list[tuple[Any, list[int]]] = []  # backend, its layers
        for il, b in enumerate(layer_backends):
            if not self.groups or self.groups[-1][0] is not b:
                self.groups.append((b, []))
            self.groups[-1][1].append(il)
        self.max_device = max_device
        self.host: dict[int, list[np.ndarray]] = {}  # seq -> its paged-out states
        self.paged_out = self.paged_in = 0
        self.lanes: list[tuple[list[Any], list[Any]]] = []
        self.lane_ctx: list[Any] = []
        self.held: dict[int, tuple[list[Any], list[Any], list[Any], list[Any]]] = {}  # seq -> ctxs, buffers,
        self.length: dict[int, int] = {}  # conv, state; seq -> its tokens
        self.checkpoints: dict[int, list[tuple[int, list[np.ndarray]]]] = {}
        self.last_n: dict[int, int] = {}  # seq -> tokens its last pass fed
        self.replay_fn = replay
        self.record: list[Any] = []  # per layer, where a pass records
        self.record_keep: list[Any] = []  # their contexts and buffers
        self.recorded: tuple[int, int, int] | None = None  # seq, p0, n of the recording pass
        self.pass_seqs: set[int] = set()
        self.replays = 0
        if replay is not None and record_size:
            self.record_keep = [self.allocate_record(b, layers, record_size) for b, layers in self.groups]
            self.record = [t for _, ts in self.record_keep for t in ts]
        self.ensure(1)

    def allocate_record(self, backend: Any, layers: list[int], size: int) -> tuple[Any, list[Any]]:
        cx = native.Context(max_tensors=len(layers))
        ts = [cx.new_tensor(F32, [size]) for _ in layers]
        return (cx, backend.alloc_tensors(cx)), ts

    @property
    def bytes_per_sequence(self) -> int:
        return 4 * self.n_layer * (self.n_r + self.n_s)

    def ensure(self, n: int) -> None:
        while len(self.lanes) < n:
            j = len(self.lanes)
            cx = native.Context(max_tensors=2 * self.n_layer)
            conv = [cx.new_tensor(F32, [self.n_r]) for _ in range(self.n_layer)]
            state = [cx.new_tensor(F32, [self.n_s]) for _ in range(self.n_layer)]
            for kind, ts in (("conv", conv), ("state", state)):
                for il, t in enumerate(ts):
                    t.name = f"rs_{kind}_l{il}" + (f"_s{j}" if j else "")
            self.lanes.append((conv, state))
            self.lane_ctx.append(cx)

    def storage(self, seq: int, keep: Sequence[int] = ()) -> tuple[Any, Any, list[Any], list[Any]]:
        """The sequence's device buffer, most recently used last: made (zeroed: an empty sequence's state, or
        filled from the host tier) when it has none; others but `keep` paged out beyond max_device."""
        got = self.held.pop(seq, None)
        if got is None:
            got = self.allocate()
            _, _, conv, state = got
            saved = self.host.pop(seq, None)
            if saved is not None:
                for t, arr in zip(conv + state, saved):
                    native.tensor_set(t, arr)
                self.paged_in += 1
        self.held[seq] = got
        if self.max_device is not None:
            for other in [s for s in self.held if s != seq and s not in keep][
                : max(0, len(self.held) - self.max_device)
            ]:
                _, _, conv, state = self.held.pop(other)
                self.host[other] = [tensor_array(t).copy() for t in conv + state]
                self.paged_out += 1
        return got

    def allocate(self) -> tuple[list[Any], list[Any], list[Any], list[Any]]:
        """One sequence's states, zeroed, each layer's on its backend."""
        ctxs: list[native.Context] = []
        bufs: list[Any] = []
        conv: list[native.Tensor | None] = [None] * self.n_layer  # every layer's filled below
        state: list[native.Tensor | None] = [None] * self.n_layer
        for backend, layers in self.groups:
            cx = native.Context(max_tensors=2 * len(layers))
            for il in layers:
                conv[il], state[il] = cx.new_tensor(F32, [self.n_r]), cx.new_tensor(F32, [self.n_s])
            bufs.append(backend.alloc_tensors(cx))
            bufs[-1].clear(0)
            ctxs.append(cx)
        return ctxs, bufs, conv, state

    def layer_tensors(self, il: int, n_lanes: int) -> tuple[Any, Any]:
        if not n_lanes:
            return self.lanes[0][0][il], self.lanes[0][1][il]
        self.ensure(n_lanes)
        return [self.lanes[j][0][il] for j in range(n_lanes)], [self.lanes[j][1][il] for j in range(n_lanes)]

    def bind(self, seqs: Sequence[int]) -> None:
        self.ensure(len(seqs))
        self.pass_seqs = set(seqs)
        if self.max_device is not None and len(set(seqs)) > self.max_device:
            raise ValueError(
                f"a pass over {len(set(seqs))} sequences needs their recurrent states on the device: "
                f"state_device_sequences is {self.max_device}"
            )
        for j, seq in enumerate(seqs):
            _, _, conv, state = self.storage(seq, keep=seqs)
            for lane_t, t in zip(self.lanes[j][0] + self.lanes[j][1], conv + state):
                native.tensor_alias(lane_t, t, 0)

    def begin(self, seq: int, p0: int, n: int) -> None:
        """A pass feeds n tokens of `seq` from position p0: a checkpoint of the state at p0 first when it or the
        pass before fed several, or when the last is CHECKPOINT_EVERY tokens back."""
        if self.length.get(seq, 0) != p0:
            raise ValueError(f"sequence {seq}'s recurrent state holds {self.length.get(seq, 0)} tokens, not {p0}")
        marks = self.checkpoints.get(seq) or [(0, [])]
        if n > 1 or self.last_n.get(seq, 1) > 1 or p0 - marks[-1][0] >= CHECKPOINT_EVERY:
            self.checkpoint(seq)
        self.length[seq] = p0 + n
        self.last_n[seq] = n
        self.forget_record(seq)
        if self.record and records(n, self.pass_seqs == {seq}):
            self.recorded = (seq, p0, n)

    def restored(self, seq: int, n: int) -> None:
        """`seq`, empty, holds n tokens once its states are written directly (a saved sequence)."""
        self.length[seq], self.last_n[seq] = n, 1
        self.checkpoints.pop(seq, None)
        self.forget_record(seq)

    def checkpoint(self, seq: int) -> None:
        """A checkpoint of `seq` where it is now."""
        n = self.length.get(seq, 0)
        marks = self.checkpoints.setdefault(seq, [])
        if n > 0 and not (marks and marks[-1][0] == n):
            _, _, conv, state = self.storage(seq)
            marks.append((n, [tensor_array(t).copy() for t in conv + state]))
            del marks[:-STATE_CHECKPOINTS]

    def truncate_point(self, seq: int, n: int) -> int:
        """The latest position at or before n that `seq`'s state can return to."""
        if n >= self.length.get(seq, 0):
            return self.length.get(seq, 0)
        if self.replayable(seq, n):
            return n
        return max([p for p, _ in self.checkpoints.get(seq, []) if p <= n], default=0)

    def forget_record(self, seq: int) -> None:
        """`seq`'s state leaves the one its recorded pass began from: the record no longer serves it."""
        if self.recorded is not None and self.recorded[0] == seq:
            self.recorded = None

    def replayable(self, seq: int, n: int) -> bool:
        """Whether `seq` can go back to n inside its last pass by replaying the pass's record over the checkpoint
        where it began."""
        r = self.recorded
        return (
            r is not None
            and r[0] == seq
            and self.length.get(seq, 0) == r[1] + r[2]
            and r[1] < n < r[1] + r[2]
            and any(p == r[1] for p, _ in self.checkpoints.get(seq, []))
        )

    def truncate(self, seq: int, n: int) -> None:
        """`seq` goes back to position n: 0, its length, a checkpoint, or a row of its last recorded pass
        (truncate_point)."""
        if n == self.length.get(seq, 0):
            return
        replay = self.recorded if self.replayable(seq, n) else None
        self.forget_record(seq)
        to = replay[1] if replay else n
        marks = self.checkpoints.get(seq, [])
        if to == 0:
            for buf in self.held[seq][1] if seq in self.held else ():
                buf.clear(0)
            self.host.pop(seq, None)
            self.checkpoints.pop(seq, None)
        else:
            saved = next((arrs for p, arrs in marks if p == to), None)
            if saved is None:
                raise ValueError(f"sequence {seq}'s recurrent state has no checkpoint at {to}")
            _, _, conv, state = self.storage(seq)
            for t, arr in zip(conv + state, saved):
                native.tensor_set(t, arr)
            self.checkpoints[seq] = [(p, a) for p, a in marks if p <= to]
        if replay:
            self.run_replay(seq, replay[2], n - to)
        self.length[seq] = n

    def run_replay(self, seq: int, n: int, k: int) -> None:
        """Takes `seq`'s states (at the start of the recorded pass of n rows) k rows into it."""
        _, _, conv, state = self.storage(seq)
        for backend, layers in self.groups:
            size = REPLAY_NODES * len(layers)
            ctx = native.Context(max_tensors=size, graph_size=size)
            gf = ctx.new_graph()
            for il in layers:
                self.replay_fn(ctx, gf, self.record[il], n, k, conv[il], state[il], il)
            backend.compute(gf)
        self.replays += 1

    def drop(self, seq: int) -> None:
        self.forget_record(seq)
        self.held.pop(seq, None)
        self.host.pop(seq, None)
        self.length.pop(seq, None)
        self.checkpoints.pop(seq, None)
        self.last_n.pop(seq, None)

    def stats(self) -> dict[str, Any]:
        marks = sum(len(v) for v in self.checkpoints.values())
        return {
            "state_bytes_per_sequence": self.bytes_per_sequence,
            "state_sequences": len(self.held),
            "state_sequences_host": len(self.host),
            "state_paged_out": self.paged_out,
            "state_paged_in": self.paged_in,
            "state_checkpoints": marks,
            "state_replays": self.replays,
            "state_checkpoint_bytes": marks * self.bytes_per_sequence,
            "state_tier": ",".join(dict.fromkeys(b.name for b, _ in self.groups)),
        }
