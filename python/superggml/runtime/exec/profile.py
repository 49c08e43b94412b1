"""Where a forward pass's time goes: the host's own work against the device's, pass by pass.

Each pass is timed from the executor's call to its logits in host memory. The backends count the rest
(native Backend.stats): preparing graphs (checks, allocation), ggml's graph compute (the CPU computing, or a GPU
being queued its kernels) and waiting for a device. The host's time is the pass less what it spent waiting for
the computation: on the CPU the graph compute itself, on a GPU the waits. Decode passes (one row) and the others
are kept apart. With `timing` on, a GPU's own span per graph comes from its events.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Sequence

from ... import native

STAT_KEYS = ("graphs", "reused", "nodes", "prepare_s", "launch_s", "wait_s", "device_s", "device_graphs")


@dataclass
class PassTimes:
    """Sums over the passes of one kind (seconds, counts)."""

    passes: int = 0
    rows: int = 0
    wall_s: float = 0.0  # the passes, from the call to the logits in host memory
    build_s: float = 0.0  # graph plans built (a new micro-batch shape)
    prepare_s: float = 0.0  # the backends' checks and allocations
    launch_s: float = 0.0  # in a device's graph compute: the host queuing kernels (a GPU) or a CUDA graph's launch
    compute_s: float = 0.0  # the host waiting for the computation: the CPU's graph compute, a device's waits
    device_s: float = 0.0  # the devices' own span per graph (events; timing on)
    graphs: int = 0
    reused: int = 0  # graphs computed again unchanged (no allocation; ggml-cuda replays its CUDA graph as it was)
    nodes: int = 0  # operations computed

    @property
    def host_s(self) -> float:
        """The host's own time: the passes less the computation it waited for."""
        return max(self.wall_s - self.compute_s, 0.0)

    def per_pass(self) -> dict[str, float]:
        """Means per pass: milliseconds, graphs, reused graphs and operations."""
        n = max(self.passes, 1)
        ms = {
            "wall_ms": self.wall_s,
            "host_ms": self.host_s,
            "build_ms": self.build_s,
            "prepare_ms": self.prepare_s,
            "launch_ms": self.launch_s,
            "python_ms": max(self.host_s - self.build_s - self.prepare_s - self.launch_s, 0.0),
            "compute_ms": self.compute_s,
            "device_ms": self.device_s,
        }
        out = {k: round(1e3 * v / n, 4) for k, v in ms.items()}
        out.update(
            passes=self.passes,
            rows_per_pass=round(self.rows / n, 2),
            graphs_per_pass=round(self.graphs / n, 2),
            reused_per_pass=round(self.reused / n, 2),
            ops_per_pass=round(self.nodes / n, 1),
        )
        return out


@dataclass
class PassProfile:
    """The executor's passes, decode (one row) and the rest, from the backends' counters."""

    backends: Sequence[native.Backend]
    decode: PassTimes = field(default_factory=PassTimes)
    other: PassTimes = field(default_factory=PassTimes)
    build_s: float = 0.0  # plans built during the current pass
    before: list[dict[str, float]] = field(default_factory=list)
    t0: float = 0.0

    def start(self) -> None:
        """A pass begins."""
        self.before = [b.stats() for b in self.backends]
        self.build_s = 0.0
        self.t0 = time.perf_counter()

    def built(self, seconds: float) -> None:
        """A plan for the pass was built in `seconds`."""
        self.build_s += seconds

    def done(self, rows: int) -> None:
        """The pass's logits are in host memory."""
        wall = time.perf_counter() - self.t0
        acc = self.decode if rows == 1 else self.other
        acc.passes += 1
        acc.rows += rows
        acc.wall_s += wall
        acc.build_s += self.build_s
        for b, st0 in zip(self.backends, self.before):
            st = b.stats()
            d = {k: st[k] - st0[k] for k in STAT_KEYS}
            acc.prepare_s += d["prepare_s"]
            acc.compute_s += d["wait_s"] + (d["launch_s"] if b.is_host else 0.0)
            acc.launch_s += 0.0 if b.is_host else d["launch_s"]
            acc.device_s += d["device_s"]
            acc.graphs += int(d["graphs"])
            acc.reused += int(d["reused"])
            acc.nodes += int(d["nodes"])

    def reset(self) -> None:
        self.decode, self.other = PassTimes(), PassTimes()

    def mark(self) -> tuple[int, float]:
        """Rows and seconds of every pass so far: what speed() measures between."""
        return self.decode.rows + self.other.rows, self.decode.wall_s + self.other.wall_s

    def as_dict(self) -> dict[str, dict[str, float]]:
        """Per pass, by kind: {"decode": {...}, "prefill": {...}} (PassTimes.per_pass), the kinds that ran."""
        out = {}
        for name, acc in (("decode", self.decode), ("prefill", self.other)):
            if acc.passes:
                out[name] = acc.per_pass()
        return out


def timing(backends: Sequence[native.Backend], on: bool) -> bool:
    """Device events around every graph (a GPU's span per graph in the profile); whether any device has them."""
    for b in backends:
        b.timing = on
    return any(b.timing for b in backends)


def speed(start: tuple[int, float], first: tuple[int, float], end: tuple[int, float]) -> dict[str, float]:
    """Tokens and tokens/s of the prompt (the passes from `start` to the first token, PassProfile.mark) and of the
    generation (from there to `end`), each over the passes' own time, as llama.cpp's perf lines count them."""
    out: dict[str, float] = {}
    for name, a, b in (("prompt", start, first), ("generation", first, end)):
        rows, secs = b[0] - a[0], b[1] - a[1]
        out[f"{name}_tokens"] = rows
        out[f"{name}_tok_s"] = rows / secs if secs > 0 else 0.0
    return out
