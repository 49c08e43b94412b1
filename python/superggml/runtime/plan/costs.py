"""The cost model: rates measured on this machine, and the decisions they settle before a model loads.

Rates (`measure_rates`; `superggml plan -m MODEL` prints them): the disk's, an O_DIRECT read of part of the
model's file (the page cache left out); the host's compute, bytes of quantized weights per second through a
matrix-vector product as a decoded token does them (plan/devices.measure_speed's probe); and the link into
each device that is not host memory, a copy from pinned host memory (plan/devices.transfer_rate). A decoded token's
pass costs about the larger of its weights' compute and the bytes it reads from the disk, which prefetching
overlaps.

`draft_verdict` settles whether a draft model can pay where its memory pushes the model's streamed blocks out of
the page cache: then every checking pass reads them from the disk, where a plain pass found them in memory. With
acceptance rate a per drafted token, a step of k drafted tokens yields (1 - a^(k+1)) / (1 - a) tokens (the
speculative module's model); the verdict takes a = DRAFT_ACCEPT_HIGH, a draft better than most, so that it drops
only a draft that could not pay even then. Measured (Qwen2.5-1.5B Q4_K_M with its 0.5B draft in a 1280 MiB memory
cgroup, default options, 64 tokens; bench/auto_speculative.py): plain 8.75 tok/s, with the draft 5.40.
"""

from __future__ import annotations

import mmap
import os
import time
from dataclasses import dataclass
from typing import Sequence

from .devices import measure_speed, probe_bytes, transfer_rate

DISK_PROBE = 64 << 20  # bytes the disk's rate is timed on
COMPUTE_PROBES = 3  # the compute rate is the best of these probes: one may land while other work holds the cores
LINK_PROBE = 32 << 20  # bytes a link's rate is timed on (the best of 3 copies)
DRAFT_ACCEPT_HIGH = 0.9  # the acceptance a draft is given the benefit of
DRAFT_K_MAX = 32


@dataclass(frozen=True)
class Rates:
    """Bytes per second: the disk's (O_DIRECT where the file system allows it), the host's compute, and the
    link into each device that is not host memory (a GPU's PCIe, an RPC server's network), by device name."""

    disk: float
    compute: float
    links: tuple[tuple[str, float], ...] = ()

    def line(self) -> str:
        links = "".join(f", link to {name} {rate / 1e9:.2f} GB/s" for name, rate in self.links)
        return f"disk {self.disk / 1e9:.2f} GB/s, compute {self.compute / 1e9:.1f} GB/s of weights{links}"


def disk_rate(path: str, size: int = DISK_PROBE) -> float:
    """Bytes per second of one read of `size` bytes from the middle of `path`, with O_DIRECT where the file
    system takes it (else buffered: what reads of that file cost anyway)."""
    total = os.path.getsize(path)
    size = max(4096, min(size, total // 4096 * 4096))
    off = max(0, (total // 2 - size // 2)) // 4096 * 4096
    direct = getattr(os, "O_DIRECT", 0)
    buf = mmap.mmap(-1, size)  # page-aligned, as O_DIRECT wants
    try:
        if direct:
            try:
                return timed_read(path, os.O_RDONLY | direct, buf, off)
            except OSError:  # a file system that refuses O_DIRECT (tmpfs)
                pass
        return timed_read(path, os.O_RDONLY, buf, off)
    finally:
        buf.close()


def timed_read(path: str, flags: int, buf: mmap.mmap, off: int) -> float:
    """Bytes per second of reading len(buf) bytes of `path` from `off` into buf, the file opened with flags."""
    fd = os.open(path, flags)
    try:
        t = time.perf_counter()
        got = 0
        while got < len(buf):
            n = os.preadv(fd, [memoryview(buf)[got:]], off + got)
            if n <= 0:
                break
            got += n
        return got / max(time.perf_counter() - t, 1e-9)
    finally:
        os.close(fd)


def measure_rates(path: str, n_threads: int, devices: Sequence[str] = ()) -> Rates:
    """The disk's rate on `path`, the host's compute rate with n_threads threads, and the host-to-device copy
    rate of each of `devices` (ggml device names)."""
    links = tuple((d, transfer_rate(d, LINK_PROBE, 3)) for d in devices)
    compute = max(measure_speed("CPU", n_threads) for _ in range(COMPUTE_PROBES)) * probe_bytes()
    return Rates(disk=disk_rate(path), compute=compute, links=links)


@dataclass(frozen=True)
class DraftVerdict:
    """Tokens per second predicted plain and, at best, with the draft; `pays` whether drafting can win."""

    plain: float
    speculative: float
    rates: Rates

    @property
    def pays(self) -> bool:
        return self.speculative > self.plain

    def line(self) -> str:
        return (
            f"superggml: the draft model is not used: its memory pushes the streamed blocks out of the page cache, "
            f"so each checking pass reads them from the disk; predicted {self.plain:.1f} tok/s plain and at most "
            f"{self.speculative:.1f} with the draft at {DRAFT_ACCEPT_HIGH:.0%} acceptance ({self.rates.line()}); "
            f"draft_k keeps it"
        )


def draft_verdict(rates: Rates, weights: int, streamed: int, draft_weights: int) -> DraftVerdict:
    """Plain decoding computes `weights` bytes per token, its streamed blocks in the page cache; with the draft,
    a checking pass also reads `streamed` bytes from the disk (overlapped with its compute), and a drafted token
    computes `draft_weights` bytes."""
    compute = weights / rates.compute
    check = max(compute, streamed / rates.disk)
    draft = draft_weights / rates.compute
    a = DRAFT_ACCEPT_HIGH
    best = max((1 - a ** (k + 1)) / (1 - a) / (check + k * draft) for k in range(1, DRAFT_K_MAX + 1))
    return DraftVerdict(plain=1 / compute, speculative=best, rates=rates)


def judge_draft(path: str, n_threads: int, weights: int, streamed: int, draft_weights: int) -> DraftVerdict:
    """draft_verdict on the rates measured now (measure_rates on the model's file at `path`)."""
    return draft_verdict(measure_rates(path, n_threads), weights, streamed, draft_weights)
