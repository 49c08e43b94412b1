"""Per-pass placement: where a block streamed to a device behind a link computes, pass by pass.

A block that streams to a device that is not host memory (a GPU behind PCIe, an RPC server behind a network) can
compute in two places: on the device, its bytes copied over the link into a slot of the device's pool; or on the
host, from the file mapping (the page cache is its host tier), the activations crossing the link instead (n_embd
floats a row, each way). A decoded row does little work per byte: on a slow link the host wins. A long prompt does
much work per byte: the device wins, as long as the link keeps up. Blocks pinned on the device stay there.

The cost model (rates measured when the model loads, `PlaceRates`): a block of B bytes computes in
B / row + B (n - 1) / rows seconds over n rows on each side (row: bytes per second through one row, rows: bytes x
rows per second through many), and copies in B / link. A pass that puts k of the N streamed blocks on the device,
spread evenly, takes about max(compute, copies) (the copies of device blocks overlap the compute of the blocks
before them) plus a crossing of the activations at each change of side. The placement takes the k of least
time, per size of pass (rows rounded up to a power of two); the lm head, where it streams, by the same rule.
Measured step times refine the model: a block's compute is more than its matrix products (attention, norms), and
the host's block steps, which run to their end where they are called, measure by how much, per size class; both
sides' compute times are scaled by that factor (a device's graphs are queued, or an RPC server's answered later,
so its steps are not timed one by one). The link's rate is the probe's. A size class is decided again when its factor moved, and changes its placement
only for one predicted to be HYSTERESIS faster than the one it has, so that it settles rather than swings. Each
class keeps its passes' measured time beside its prediction.

A MoE model whose expert cache is on such a device places the experts the cache lacks by the same rates
(`ExpertPlacer`): loaded, or computed on the host. `Placements` does both in an executor: set up at load,
applied before each pass.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from ... import native
from ..memory.arrays import tensor_array
from ..plan.devices import measure_speed, probe_bytes, transfer_rate
from .context import PassContext
from .graph import Step
from ..weights.pagers import Block, HeadChunk, WeightPager

ROWS_PROBE = 64  # rows of the many-rows probe
LINK_PROBE = 16 << 20  # bytes of the link probe (the best of 2 copies)
REFINE = 0.3  # weight of a new measurement in a running estimate
SETTLE = 0.1  # a size class is decided again when its factor moved by more than this
HYSTERESIS = 0.1  # and takes a new placement only if predicted this much faster than its own, re-predicted


@dataclass(frozen=True)
class PlaceRates:
    """Bytes of quantized weights per second through one row and bytes x rows per second through many, on the
    host and on the device, and the link's bytes per second from host to device."""

    host_row: float
    host_rows: float
    dev_row: float
    dev_rows: float
    link: float

    def compute(self, nbytes: int, n: int, host: bool) -> float:
        """Seconds to compute over nbytes of weights for n rows on the host or the device."""
        row, rows = (self.host_row, self.host_rows) if host else (self.dev_row, self.dev_rows)
        return nbytes / row + nbytes * (n - 1) / rows

    def line(self) -> str:
        g = 1e9
        return (
            f"host {self.host_row / g:.1f} GB/s a row, {self.host_rows / g:.0f} GB x rows/s; device "
            f"{self.dev_row / g:.1f} GB/s a row, {self.dev_rows / g:.0f} GB x rows/s; link {self.link / g:.3f} GB/s"
        )


def measure_place_rates(host: str, device: str, n_threads: int) -> PlaceRates:
    """PlaceRates of the host device and the device (ggml device names) by the speed probe (measure_speed) at one
    row and at ROWS_PROBE rows, and the link by a copy into the device."""
    one = [measure_speed(d, n_threads) * probe_bytes() for d in (host, device)]
    many = [measure_speed(d, n_threads, ROWS_PROBE) * probe_bytes() * ROWS_PROBE for d in (host, device)]
    return PlaceRates(one[0], many[0], one[1], many[1], transfer_rate(device, LINK_PROBE, 2))


def bucket(n: int) -> int:
    """The size class of a pass of n rows: n rounded up to a power of two."""
    return 1 << max(0, n - 1).bit_length()


@dataclass
class Choice:
    """One size class's placement: the streamed blocks computing on the host, whether the head does, and the
    predicted seconds of the pass's streamed blocks with the choice, all on the device, and all on the host."""

    hosted: tuple[int, ...]
    head_host: bool
    predicted: float
    all_device: float
    all_host: float
    n_out: int = 1
    factor: float = 1.0  # the size class's factor it was decided with
    passes: int = 0
    measured: float = 0.0  # the mean measured seconds of its passes (whole passes)
    timed: int = 0  # passes measured
    changes: int = 0  # times a new factor changed where its blocks go


@dataclass
class Placer:
    """The placement of one model's streamed blocks (`blocks`, in pass order, `sizes` their bytes) and of its
    streamed lm head (`head_bytes`, 0: none), over `n_layer` blocks on one device behind a link (the others
    pinned there), by `mode` ("auto", "host"). n_embd: the activations' width."""

    mode: str
    blocks: list[int]
    sizes: list[int]
    head_bytes: int
    n_layer: int
    n_embd: int
    rates: PlaceRates
    factor: dict[int, float] = field(default_factory=dict)  # bucket -> the host's measured time / the model's
    choices: dict[int, Choice] = field(default_factory=dict)

    def compute(self, nbytes: int, n: int, host: bool) -> float:
        return self.rates.compute(nbytes, n, host) * self.factor.get(bucket(n), 1.0)

    def crossing(self, n: int) -> float:
        return n * self.n_embd * 4 / self.rates.link

    def times(self, n: int, masks: np.ndarray) -> np.ndarray:
        """Predicted seconds of the streamed blocks of a pass of n rows, for each row of `masks` (bool
        [m, len(blocks)]: the blocks that compute on the device)."""
        sizes = np.asarray(self.sizes, dtype=np.float64)
        on_dev = masks @ sizes
        compute = self.compute(1, n, True) * (sizes.sum() - on_dev) + self.compute(1, n, False) * on_dev  # per byte
        sides = np.ones((len(masks), self.n_layer), dtype=bool)  # the device's (pinned) blocks, and the streamed
        sides[:, self.blocks] = masks
        changes = np.count_nonzero(sides[:, 1:] != sides[:, :-1], axis=1) + ~sides[:, -1]  # and back to the head
        return np.maximum(compute, on_dev / self.rates.link) + changes * self.crossing(n)

    @functools.cached_property
    def size_of(self) -> dict[int, int]:
        """Each streamed block's bytes."""
        return dict(zip(self.blocks, self.sizes))

    @functools.cached_property
    def spreads(self) -> np.ndarray:
        """Row k: spread(k) as a mask over `blocks`, for k in 0..len(blocks)."""
        n = len(self.blocks)
        out = np.zeros((n + 1, n), dtype=bool)
        for k in range(1, n + 1):
            out[k, np.minimum(n - 1, ((np.arange(k) + 0.5) * n / k).astype(int))] = True
        return out

    def spread(self, k: int) -> set[int]:
        """k of the streamed blocks, evenly spread over them."""
        n = len(self.blocks)
        return {self.blocks[min(n - 1, int((j + 0.5) * n / k))] for j in range(k)} if k else set()

    def choose(self, n: int, n_out: int) -> Choice:
        """The placement of a pass of n rows, n_out of them to the head (cached per size class)."""
        key = bucket(n)
        c = self.choices.get(key)
        if c is None:
            c = self.choices[key] = self.decide(key, max(1, min(n_out, key)))
        c.passes += 1
        return c

    def decide(self, n: int, n_out: int) -> Choice:
        masks = self.spreads
        times = self.times(n, masks)
        all_device, all_host = float(times[-1]), float(times[0])
        factor = self.factor.get(bucket(n), 1.0)
        if self.mode == "host":
            return Choice(tuple(self.blocks), bool(self.head_bytes), all_host, all_device, all_host, n_out, factor)
        best = int(np.argmin(times))  # the first of the least: the fewest copies
        h = self.head_bytes
        head_host = bool(h) and self.compute(h, n_out, True) + self.crossing(n_out) < max(
            self.compute(h, n_out, False), h / self.rates.link
        )
        hosted = tuple(il for il, on in zip(self.blocks, masks[best]) if not on)
        return Choice(hosted, head_host, float(times[best]), all_device, all_host, n_out, factor)

    def observe(self, n: int, nbytes: int, seconds: float) -> None:
        """A host step of a pass of n rows computed nbytes of streamed weights in `seconds`: the size class's
        factor moves towards measured / model."""
        if nbytes <= 0 or seconds <= 0:
            return
        key = bucket(n)
        ratio = seconds / max(self.rates.compute(nbytes, n, True), 1e-9)
        old = self.factor.get(key)
        self.factor[key] = ratio if old is None else (1 - REFINE) * old + REFINE * ratio

    def settle(self, n: int, seconds: float = 0.0) -> None:
        """After a pass of n rows that took `seconds` (0: not timed): its size class is decided again on what the
        pass measured (auto), where that moved its factor by more than SETTLE since the class was last decided;
        it keeps its blocks where they are unless the new placement is predicted HYSTERESIS faster."""
        key = bucket(n)
        c = self.choices.get(key)
        if c is None:
            return
        if seconds > 0:
            c.timed += 1
            c.measured += (seconds - c.measured) / c.timed
        if self.mode != "auto" or abs(self.factor.get(key, 1.0) / c.factor - 1) <= SETTLE:
            return
        new = self.decide(key, c.n_out)
        on_dev = np.array([il not in set(c.hosted) for il in self.blocks], dtype=bool)
        now = float(self.times(key, on_dev[None, :])[0])  # the blocks where they are, under the new factor
        if (new.hosted, new.head_host) != (c.hosted, c.head_host) and new.predicted < (1 - HYSTERESIS) * now:
            new.changes = c.changes + 1
        else:
            new.hosted, new.head_host, new.predicted, new.changes = c.hosted, c.head_host, now, c.changes
        new.passes, new.measured, new.timed = c.passes, c.measured, c.timed
        self.choices[key] = new

    def table(self) -> list[dict[str, Any]]:
        """Per size class seen: where the streamed blocks went, and the predictions that sent them there."""
        out = []
        for key, c in sorted(self.choices.items()):
            hosted = set(c.hosted)
            out.append(
                dict(
                    rows=key,
                    passes=c.passes,
                    host=[il for il in self.blocks if il in hosted],
                    device=[il for il in self.blocks if il not in hosted],
                    head="host" if c.head_host else "device" if self.head_bytes else "-",
                    predicted_s=c.predicted,
                    measured_s=c.measured if c.timed else None,
                    all_device_s=c.all_device,
                    all_host_s=c.all_host,
                    changes=c.changes,
                )
            )
        return out

    def lines(self, sizes: Sequence[int] = ()) -> list[str]:
        """The table, a line per size class seen; with `sizes`, the choices for passes of those rows instead
        (what the rates alone say, before any pass)."""
        out = [f"superggml: placement ({self.mode}) of {len(self.blocks)} streamed blocks: {self.rates.line()}"]
        rows = self.table()
        if sizes:
            seen, self.choices = self.choices, {}
            try:
                for n in sizes:
                    self.choices[bucket(n)] = self.decide(bucket(n), 1)
                rows = self.table()
            finally:
                self.choices = seen
        for r in rows:
            out.append(
                f"  {r['rows']:>5} rows: {len(r['device'])} on the device {compact(r['device'])}, {len(r['host'])} on "
                f"the host {compact(r['host'])}, head on {r['head']}; predicted {r['predicted_s'] * 1e3:.1f} ms "
                f"(all on the device {r['all_device_s'] * 1e3:.1f}, all on the host {r['all_host_s'] * 1e3:.1f})"
                + ("" if sizes else f"; {r['passes']} passes")
                + (f", measured {r['measured_s'] * 1e3:.1f} ms a pass" if r["measured_s"] is not None else "")
                + (f", placed again {r['changes']} times" if r["changes"] else "")
            )
        return out


@dataclass
class ExpertPlacer:
    """Where the experts a pass routes to and the device's expert cache lacks compute: loaded into the cache
    (copied over the link) or on the host device `host` from the file mapping, by the cost model for the rows
    routed to each (mode "auto"), or always on the host ("host"). The cache's experts compute on the device."""

    mode: str
    rates: PlaceRates
    expert_bytes: int
    host: int
    loaded: int = 0  # misses loaded, and computed on the host
    hosted: int = 0

    def loads(self, rows: dict[int, int]) -> list[int]:
        """Of the missed experts (expert -> rows routed to it in this pass), those cheaper to load."""
        e, r = self.expert_bytes, self.rates
        out = (
            []
            if self.mode == "host"
            else [x for x, n in rows.items() if e / r.link + r.compute(e, n, False) < r.compute(e, n, True)]
        )
        self.loaded += len(out)
        self.hosted += len(rows) - len(out)
        return out


def compact(blocks: Sequence[int]) -> str:
    """Block numbers as ranges: [3-7, 9]."""
    runs: list[list[int]] = []
    for b in blocks:
        if runs and b == runs[-1][-1] + 1:
            runs[-1].append(b)
        else:
            runs.append([b])
    return "[" + ", ".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs) + "]"


class Placements:
    """Per-pass placement over one executor's PassContext (`pc`): set up at load (start), applied before each pass (arrange),
    told the host's step times (observe), and splitting the routed experts of a device's expert cache
    (split_experts). `placer`: the streamed blocks' Placer, None where they do not switch (`note` says why)."""

    def __init__(self, pc: PassContext):
        self.pc = pc
        self.placer: Placer | None = None
        self.note = ""
        self.start()

    def choose(self, n: int, n_out: int) -> tuple[tuple[int, ...], bool]:
        """The hosted blocks and whether the head is hosted, for a pass of n rows (GraphPlan's `hosted`)."""
        if self.placer is None:
            return (), False
        c = self.placer.choose(n, n_out)
        return c.hosted, c.head_host

    def start(self) -> None:
        """Per-pass placement (runtime/exec/placement.py) where blocks stream to one device that is not host memory:
        their tensors get copies on the host device, bound to the file mapping (the matrices re-laid for its
        faster kernels with `repack`, where its memory holds them), and their K/V a host copy."""
        pc = self.pc
        pl, p = pc.placement, pc.settings.paging
        pager = pl.pagers[0]
        if pl.experts is not None and pl.experts_split:
            self.start_host_experts()
        if not (pl.paged and pc.n_split == 1 and not pc.backends[0].is_host and isinstance(pager, WeightPager)):
            return
        why = (
            "placement=device"
            if p.placement == "device"
            else "dynamic_layers moves the pinned blocks"
            if pl.scheduler is not None
            else "its expert cache's blocks stay there; the experts it lacks are placed"
            if pl.experts is not None
            else ""
        )
        core = pager.core
        blocks = [k.b for i, k in enumerate(pager.keys) if isinstance(k, Block) and not core.pinned(i)]
        if not why and not blocks:
            why = "every block is pinned on the device"
        if not why and not pc.memory.mirror(blocks, pc.backends[pc.embed_dev]):
            why = "the sequence memory (paged_kv, recurrent states) stays on the device"
        if why:
            self.note = f"streamed blocks compute on {pc.backends[0].name} ({why})"
            return
        pl.host_copies([n for il in blocks for n in pl.block_tensors(il)], pc.embed_dev, pc.settings.context.repack)
        sizes = [int(core.layer_bytes(pager.index(Block(il)))) for il in blocks]
        head = sum(int(core.layer_bytes(pager.index(HeadChunk(c)))) for c in range(len(pl.head_chunks)))
        self.placer = Placer(p.placement, blocks, sizes, head, pc.hp.n_layer, pc.hp.n_embd, self.measure())

    def measure(self) -> PlaceRates:
        """The rates of the host device and the model's device."""
        pc = self.pc
        return measure_place_rates(
            pc.backends[pc.embed_dev].device_name, pc.backends[0].device_name, pc.settings.context.threads
        )

    def start_host_experts(self) -> None:
        """The experts the device's expert cache lacks compute on the host where that costs less than loading
        them (placement.ExpertPlacer): the host gets copies of the expert tensors (and their biases) bound to the
        file mapping."""
        pc = self.pc
        pl, host = pc.placement, pc.embed_dev
        assert pl.experts is not None
        names = [
            n
            for il in range(pc.hp.n_layer)
            if pc.arch.is_moe(il)
            for n in pc.arch.expert_tensors(il)
            + [f"blk.{il}.ffn_{x}_exps.bias" for x in ("gate", "up", "down") if pc.arch.moe.biases]
        ]
        pl.host_copies(names, host)
        pl.host_experts = ExpertPlacer(pc.settings.paging.placement, self.measure(), pl.experts.expert_bytes, host)

    def split_experts(self, step: Step, il: int, sel: np.ndarray) -> None:
        """A row chunk's routed experts (sel, I32 [rows * k]): those the cache holds (or loads, where the placer
        says loading costs less) compute on the device, the others on the host first (step.host_experts), each
        position's output on one side and 0 on the other, so their sum is the device's alone."""
        pc = self.pc
        pl, hx, k = pc.placement, step.host_experts, pc.hp.n_expert_used
        assert pl.experts is not None and pl.moe is not None and pl.host_experts is not None
        ids = sel.reshape(-1, k)
        rows, r0 = ids.shape[0], step.expert_row0
        missed = {int(e) for e in np.unique(ids) if not pl.experts.core.holds(il, int(e))}
        if missed:
            per = {e: int((ids == e).any(axis=1).sum()) for e in missed}
            pl.experts.load(il, pl.host_experts.loads(per))
        slots = np.asarray(pl.experts.map(il, sel, held_only=True)).reshape(rows, k)
        weights = tensor_array(pl.moe.w).reshape(-1)[r0 * k : (r0 + rows) * k].reshape(rows, k)
        host = slots < 0
        held = ~host

        def fill(values: np.ndarray, use: np.ndarray, fallback: int) -> np.ndarray:
            """values where `use`, else the row's first value used (else `fallback`): ids that exist, weight 0."""
            first = np.where(use.any(axis=1), values[np.arange(rows), use.argmax(axis=1)], fallback)
            return np.where(use, values, first[:, None]).astype(np.int32)

        # the device's positions computed on the host read the zero slots: each row's ids stay distinct
        zeros = pl.experts.core.n_slots + np.cumsum(host, axis=1) - 1
        native.tensor_set(step.expert_ids, np.where(held, slots, zeros).astype(np.int32))
        native.tensor_set(hx.w_d, np.where(held, weights, 0).astype(np.float32))
        if not host.any():
            native.tensor_set(hx.part_d, np.zeros((rows, k, hx.part_d.ne[0]), np.float32))
            return
        native.tensor_set(hx.ids_h, fill(ids, host, int(ids[host][0])))
        native.tensor_set(hx.w_h, np.where(host, weights, 0).astype(np.float32))
        cx = native.Context(max_tensors=1)
        cur = pl.moe.cur
        native.tensor_copy(cx.view(cur, [pc.hp.n_embd, rows], [cur.nb[1]], r0 * cur.nb[1]), hx.cur_h)
        pc.backends[pl.host_experts.host].compute(hx.graph)
        native.tensor_copy(hx.out_h, hx.part_d)

    def arrange(self, hosted: tuple[tuple[int, ...], bool]) -> None:
        """Before a pass placed so (GraphPlan's `hosted`): the K/V of each streamed block where it computes, and
        the device's pager prefetching only what the pass computes there."""
        pc = self.pc
        if self.placer is None:
            return
        on_host = set(hosted[0])
        for il in self.placer.blocks:
            pc.memory.place(il, il in on_host)
        pager = pc.placement.pagers[0]
        assert isinstance(pager, WeightPager)  # start's condition
        skip = {pager.index(Block(il)) for il in on_host}
        if hosted[1]:
            skip |= {pager.index(HeadChunk(c)) for c in range(len(pc.placement.head_chunks))}
        pager.skip = frozenset(skip)

    def observe(self, step: Step, n: int, tc: float) -> None:
        """A host step's compute time over streamed blocks, to the placer."""
        pc = self.pc
        placer = self.placer
        assert placer is not None
        if step.kind != "block" or step.dev != pc.embed_dev:
            return
        size = placer.size_of
        blocks = [b for b in (step.span or (step.group,)) if b in size]
        if blocks:
            placer.observe(n, sum(size[b] for b in blocks), time.time() - tc)
