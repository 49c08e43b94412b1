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
so its steps are not timed one by one). The link's rate is the probe's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from .. import native
from ..devices import transfer_rate
from .devices import PROBE_ROWS, measure_speed

ROWS_PROBE = 64  # rows of the many-rows probe
LINK_PROBE = 16 << 20  # bytes of the link probe (the best of 2 copies)
REFINE = 0.3  # weight of a new measurement in a running estimate


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
    product = int(native.row_size(native.GGMLType.Q4_0, PROBE_ROWS)) * PROBE_ROWS
    one = [measure_speed(d, n_threads) * product for d in (host, device)]
    many = [measure_speed(d, n_threads, ROWS_PROBE) * product * ROWS_PROBE for d in (host, device)]
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
    passes: int = 0


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

    def link_rate(self) -> float:
        return self.rates.link

    def compute(self, nbytes: int, n: int, host: bool) -> float:
        return self.rates.compute(nbytes, n, host) * self.factor.get(bucket(n), 1.0)

    def crossing(self, n: int) -> float:
        return n * self.n_embd * 4 / self.link_rate()

    def pass_time(self, n: int, on_device: set[int]) -> float:
        """Predicted seconds of the streamed blocks of a pass of n rows with `on_device` computing there."""
        host = sum(self.compute(b, n, True) for il, b in zip(self.blocks, self.sizes) if il not in on_device)
        dev = sum(self.compute(b, n, False) for il, b in zip(self.blocks, self.sizes) if il in on_device)
        copies = sum(b for il, b in zip(self.blocks, self.sizes) if il in on_device) / self.link_rate()
        streamed = set(self.blocks)
        sides = [il not in streamed or il in on_device for il in range(self.n_layer)]
        changes = sum(a != b for a, b in zip(sides, sides[1:])) + (not sides[-1])  # back to the device's head
        return max(host + dev, copies) + changes * self.crossing(n)

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
        every = set(self.blocks)
        all_device, all_host = self.pass_time(n, every), self.pass_time(n, set())
        if self.mode == "host":
            return Choice(tuple(self.blocks), bool(self.head_bytes), all_host, all_device, all_host, n_out)
        best = min(range(len(self.blocks) + 1), key=lambda k: (self.pass_time(n, self.spread(k)), k))
        on_device = self.spread(best)
        h = self.head_bytes
        head_host = bool(h) and self.compute(h, n_out, True) + self.crossing(n_out) < max(
            self.compute(h, n_out, False), h / self.link_rate()
        )
        hosted = tuple(il for il in self.blocks if il not in on_device)
        return Choice(hosted, head_host, self.pass_time(n, on_device), all_device, all_host, n_out)

    def observe(self, n: int, nbytes: int, seconds: float) -> None:
        """A host step of a pass of n rows computed nbytes of streamed weights in `seconds`: the size class's
        factor moves towards measured / model."""
        if nbytes <= 0 or seconds <= 0:
            return
        key = bucket(n)
        ratio = seconds / max(self.rates.compute(nbytes, n, True), 1e-9)
        old = self.factor.get(key)
        self.factor[key] = ratio if old is None else (1 - REFINE) * old + REFINE * ratio

    def settle(self, n: int) -> None:
        """After a pass of n rows: its size class is decided again on what the pass measured (auto)."""
        c = self.choices.get(bucket(n))
        if c is not None and self.mode == "auto":
            new = self.decide(bucket(n), c.n_out)
            new.passes = c.passes
            self.choices[bucket(n)] = new

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
                    all_device_s=c.all_device,
                    all_host_s=c.all_host,
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
                f"(all on the device {r['all_device_s'] * 1e3:.1f}, all on the host {r['all_host_s'] * 1e3:.1f}); "
                f"{r['passes']} passes"
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
