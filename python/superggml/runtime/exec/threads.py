"""How many CPU threads a decoded token computes with, found by timing it.

Decode on a CPU is one matrix-vector product after another, each ending in a barrier where ggml's threads spin
until the last one arrives. When another program holds a core, a thread of ours waits for that core and the
others spin meanwhile: on 2 cores with one busy, 2 threads decode at about half the speed of 1 (bench/busy.py).
No count fits every machine and every moment, so the tuner times it: after a few decoded tokens, and again every
RECHECK tokens, it runs PHASE tokens at the current count and PHASE at a neighbour (one fewer, or one more once
fewer did not pay), and keeps the neighbour where its median is faster by MARGIN. Its first count leaves out the
cores other programs kept busy between the load and the first decoded token (/proc/stat, less this process's own
CPU time); where that window was long enough to tell, the first trial waits RECHECK tokens. Prompts (passes of
many rows) compute with every thread.
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass, field

WARMUP = 2  # decoded tokens before the first trial
PHASE = 3  # tokens per count in a trial
RECHECK = 96  # decoded tokens between trials
MARGIN = 0.15  # a neighbour is kept where it is this much faster (a busy core costs 40-70%)
MIN_WINDOW = 0.05  # seconds of /proc/stat that tell how busy the other cores are


@dataclass(frozen=True)
class CpuSample:
    """CPU seconds spent on the CPUs this process may use (by anyone) and by this process, at a wall time."""

    busy: float
    own: float
    wall: float

    @staticmethod
    def take() -> "CpuSample | None":
        """Now, or None where /proc cannot tell."""
        try:
            cpus = {f"cpu{c}" for c in os.sched_getaffinity(0)}
            busy = 0
            with open("/proc/stat") as f:
                for line in f:
                    parts = line.split()
                    if parts and parts[0] in cpus:
                        v = [int(x) for x in parts[1:9]]
                        busy += v[0] + v[1] + v[2] + v[5] + v[6] + v[7]  # user nice system irq softirq steal
            with open("/proc/self/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            own = int(fields[11]) + int(fields[12])  # utime, stime
        except (OSError, ValueError, IndexError, AttributeError):
            return None
        tick = os.sysconf("SC_CLK_TCK")
        return CpuSample(busy / tick, own / tick, time.monotonic())

    def others_since(self, before: "CpuSample") -> float:
        """The CPUs other programs kept busy since `before`, on average."""
        wall = self.wall - before.wall
        if wall <= 0:
            return 0.0
        return max(0.0, (self.busy - before.busy) - (self.own - before.own)) / wall


@dataclass
class ThreadTuner:
    """The decode thread count, between 1 and `top` (the threads decode may use)."""

    top: int
    current: int = 0
    decoded: int = 0
    trials: int = 0
    changes: int = 0
    down: bool = True  # the next trial tries one thread fewer (else one more)
    trial: list[tuple[int, list[float]]] = field(default_factory=list)  # (count, pass seconds) being timed
    next_trial: int = WARMUP
    since: CpuSample | None = field(default_factory=CpuSample.take)  # the load's end: others' use is counted from

    def __post_init__(self) -> None:
        self.current = self.current or self.top

    def start(self) -> None:
        """Before the first decoded token: leave out the cores others kept busy since the load (where at least
        MIN_WINDOW seconds tell)."""
        now, before, self.since = CpuSample.take(), self.since, None
        if now is None or before is None or now.wall - before.wall < MIN_WINDOW:
            return
        self.current = max(1, min(self.top, self.top - round(now.others_since(before))))
        self.next_trial = self.decoded + RECHECK  # a measurement already: the first trial comes later

    def threads(self) -> int:
        """The count for the next decoded token."""
        if self.since is not None:
            self.start()
        for n, times in self.trial:
            if len(times) < PHASE:
                return n
        return self.current

    def observe(self, seconds: float) -> None:
        """A decoded token took `seconds`, at threads()'s count."""
        self.decoded += 1
        if self.trial:
            n = self.threads()
            next(times for c, times in self.trial if c == n and len(times) < PHASE).append(seconds)
            if all(len(times) == PHASE for _, times in self.trial):
                self.decide()
            return
        if self.top > 1 and self.decoded >= self.next_trial:
            other = (
                self.current - 1 if (self.down and self.current > 1) or self.current == self.top else self.current + 1
            )
            self.trial = [(self.current, []), (other, [])]

    def decide(self) -> None:
        (cur, t_cur), (other, t_other) = self.trial
        self.trials += 1
        if statistics.median(t_other) < (1.0 - MARGIN) * statistics.median(t_cur):
            self.current = other
            self.changes += 1
            self.down = other < cur  # keep going the way that paid
        else:
            self.down = not self.down
        self.trial = []
        self.next_trial = self.decoded + RECHECK

    def stats(self) -> dict[str, int]:
        return {"decode_threads": self.current, "thread_trials": self.trials, "thread_changes": self.changes}
