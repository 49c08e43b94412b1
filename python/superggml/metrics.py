"""JSON-lines metrics: one object per token (or every N tokens), plus event lines.

The fields are docs/design.md's schema (``metrics.schema.json`` in this package):
counters of the layer pager, the scheduler and the paged KV cache, memory
telemetry and speed. "gpu"/"vram" mean the compute device, whatever its kind
(on a CPU build: the host). Event lines carry an ``event`` field:
``layer`` (per-layer timings of one forward pass: wait, load, compute),
``layer_demote`` / ``layer_promote`` (the scheduler's moves), and per token
the counts that moved: ``layer_load``, ``layer_evict``, ``kv_page_load``,
``kv_page_prefetch``, ``kv_page_writeback``, ``kv_page_spill``.

Writing never slows decoding: lines go into an in-memory queue that one
thread writes out, so they are never interleaved either.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections import deque
from datetime import datetime, timezone
from importlib import resources
from typing import IO, Any, Protocol

from . import native
from .telemetry import device_memory_fn

SCHEMA_FILE = "metrics.schema.json"


def schema() -> dict[str, Any]:
    """The JSON schema every metrics line validates against."""
    return json.loads(resources.files(__package__).joinpath(SCHEMA_FILE).read_text())


def iso_now(t: float | None = None) -> str:
    """ISO 8601 with milliseconds and Z."""
    d = datetime.fromtimestamp(time.time() if t is None else t, tz=timezone.utc)
    return d.strftime("%Y-%m-%dT%H:%M:%S.") + f"{d.microsecond // 1000:03d}Z"


EXPERT_FIELDS = (
    "expert_hits",
    "expert_misses",
    "expert_bytes_loaded",
    "expert_slots",
    "expert_slots_used",
    "expert_lookahead_precision",
    "expert_lookahead_recall",
    "expert_lookahead",
)


class MetricsWriter:
    """Writes dict lines from a background thread; emit() only appends to a queue."""

    def __init__(self, out: str | os.PathLike[str] | IO[str] | None = None, *, pretty: bool = False):
        if out is None:
            self._f: IO[str] = sys.stderr
            self._own = False
        elif isinstance(out, (str, os.PathLike)):
            self._f = open(out, "w", encoding="utf-8")  # noqa: SIM115 - closed in close()
            self._own = True
        else:
            self._f = out
            self._own = False
        self.pretty = pretty
        self._q: deque[dict[str, Any]] = deque()
        self._cv = threading.Condition()
        self._stop = False
        self.written = 0
        self._thread = threading.Thread(target=self._run, name="superggml-metrics", daemon=True)
        self._thread.start()

    def emit(self, line: dict[str, Any]) -> None:
        with self._cv:
            self._q.append(line)
            self._cv.notify()

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._q and not self._stop:
                    self._cv.wait()
                batch = list(self._q)
                self._q.clear()
                stop = self._stop
            for line in batch:
                self._f.write(
                    json.dumps(line, indent=2 if self.pretty else None, separators=None if self.pretty else (",", ":"))
                    + "\n"
                )
                self.written += 1
            if batch:
                self._f.flush()
            if stop:
                return

    def close(self) -> None:
        """Writes what is queued and stops the thread."""
        with self._cv:
            self._stop = True
            self._cv.notify()
        self._thread.join()
        if self._own:
            self._f.close()


class HasLayers(Protocol):
    @property
    def n_layer(self) -> int: ...


class Observed(Protocol):
    """What the lines read of the model they describe (superggml.Model is one)."""

    @property
    def hparams(self) -> HasLayers: ...

    @property
    def device(self) -> tuple[str, str]: ...

    def stats(self) -> dict[str, Any]: ...

    def layer_events(self) -> list[dict[str, Any]]: ...


class Metrics:
    """Builds the lines for one Model: a snapshot line per `interval` tokens and event lines."""

    def __init__(self, model: Observed, writer: MetricsWriter | None, *, interval: int = 1):
        """`interval` comes checked from MetricsSettings. `writer` None: snapshots only (the server's stats)."""
        self.model = model
        self.writer = writer
        self.interval = interval
        self.prompt_tokens = 0
        self.generated_tokens = 0
        self.token = 0
        self._t0: float | None = None
        self._t_last: float | None = None
        self._n_events = 0
        self._prev: dict[str, int] = {}

    COUNTED = (
        ("loads", "layer_load"),
        ("evictions", "layer_evict"),
        ("kv_pages_spilled", "kv_page_spill"),
        ("kv_pages_prefetched", "kv_page_prefetch"),
        ("kv_pages_written_back", "kv_page_writeback"),
        ("kv_pages_loaded", "kv_page_load"),
    )

    def emit(self, line: dict[str, Any]) -> None:
        assert self.writer is not None, "a Metrics without a writer takes snapshots only"
        self.writer.emit(line)

    def close(self) -> None:
        """Writes what is queued and stops the writer."""
        if self.writer is not None:
            self.writer.close()

    # -- hooks the model calls --------------------------------------------
    def on_prompt(self, n: int) -> None:
        self.prompt_tokens += n
        self._t_last = time.perf_counter()

    def on_token(self) -> None:
        now = time.perf_counter()
        if self._t0 is None:
            self._t0 = self._t_last if self._t_last is not None else now
        dt = now - (self._t_last if self._t_last is not None else now)
        self._t_last = now
        self.generated_tokens += 1
        self.token += 1
        st = self.model.stats()
        self._flush_events(st)
        if self.generated_tokens % self.interval == 0:
            self.emit(self.snapshot(tokens_per_sec=1.0 / dt if dt > 0 else 0.0, stats=st))

    def on_layer_timings(self, timings: list[dict[str, Any]]) -> None:
        """Per-layer timings of one forward pass (the executor's record)."""
        for t in timings:
            self.emit({"timestamp": iso_now(t["t_start"]), "event": "layer", "token": self.token, **t})

    # -- lines ----------------------------------------------------------
    def _flush_events(self, st: dict[str, Any]) -> None:
        for ev in self.model.layer_events()[self._n_events :]:
            self.emit({"timestamp": iso_now(ev["t"]), "token": self.token, **ev})
            self._n_events += 1
        now = iso_now()
        for key, event in self.COUNTED:  # what moved during this token, one line per kind
            if key not in st:
                continue
            n = int(st[key]) - self._prev.get(key, 0)
            self._prev[key] = int(st[key])
            if n > 0:
                self.emit({"timestamp": now, "event": event, "token": self.token, "count": n})

    def snapshot(self, *, tokens_per_sec: float = 0.0, stats: dict[str, Any] | None = None) -> dict[str, Any]:
        """The snapshot line now (`stats`: the model's stats() if the caller has them)."""
        m = self.model
        st = m.stats() if stats is None else stats
        n_layer = m.hparams.n_layer
        pinned = int(st.get("layers_pinned", n_layer))
        gpu = m.device[0] != "cpu"
        h = native.host_memory()
        dev_used, dev_total = device_memory_fn(*m.device)()
        elapsed = (self._t_last or 0.0) - (self._t0 or 0.0)
        avg = self.generated_tokens / elapsed if elapsed > 0 else tokens_per_sec
        host_pressure = float(h["pressure"])
        line = {
            "timestamp": iso_now(),
            "token": self.token,
            "prompt_tokens": self.prompt_tokens,
            "generated_tokens": self.generated_tokens,
            "gpu_layers_active": min(pinned, n_layer) if (gpu or "n_slots" in st) else n_layer,
            "cpu_layers_active": 0 if gpu else n_layer,
            "layers_evicted": int(st.get("evictions", 0)),
            "layers_loaded": int(st.get("loads", 0)),
            "layers_demoted": int(st.get("layers_demoted", 0)),
            "layers_promoted": int(st.get("layers_promoted", 0)),
            "kv_pages_gpu": int(st.get("kv_pages_device", 0)),
            "kv_pages_cpu": int(st.get("kv_pages_host", 0)),
            "kv_pages_disk": int(st.get("kv_pages_disk", 0)),
            "kv_pages_evicted": int(st.get("kv_pages_evicted", 0)),
            "kv_pages_prefetched": int(st.get("kv_pages_prefetched", 0)),
            "vram_used_mb": round(dev_used / 2**20, 1),
            "vram_total_mb": round(dev_total / 2**20, 1),
            "ram_used_mb": round((int(h["total"]) - int(h["available"])) / 2**20, 1),
            "gpu_memory_pressure": round(dev_used / dev_total, 4) if dev_total else 0.0,
            "cpu_memory_pressure": round(host_pressure, 4),
            "tokens_per_sec": round(tokens_per_sec, 3),
            "avg_tokens_per_sec": round(avg, 3),
            "prefetch_pending": int(st.get("pending", 0)),
            "prefetch_completed": int(st.get("loads", 0)) - int(st.get("pending", 0)) - int(st.get("failed", 0)),
            "prefetch_failed": int(st.get("failed", 0)),
        }
        line.update(
            sequences_per_pass=round(float(st.get("sequences_per_pass", 0.0)), 3),
            tokens_per_pass=round(float(st.get("tokens_per_pass", 0.0)), 3),
            bytes_streamed_per_token=round(int(st.get("bytes_loaded", 0)) / max(self.generated_tokens, 1)),
        )
        if "budget" in st:  # the memory plan (superggml.runtime.plan.memory_plan)
            b = st["budget"]
            line.update(
                device_budget_mode=b["mode"],
                device_budget_mb=None if b["budget"] is None else round(b["budget"] / 2**20, 1),
            )
        if "expert_slots" in st:  # a mixture of experts with its experts paged (expert_cache)
            line.update({k: st[k] for k in EXPERT_FIELDS})
        if "state_bytes_per_sequence" in st:  # a hybrid model's recurrent states
            line.update(
                {
                    k: st[k]
                    for k in (
                        "state_bytes_per_sequence",
                        "state_sequences",
                        "state_checkpoints",
                        "state_replays",
                        "state_tier",
                    )
                }
            )
        if "draft_steps" in st:  # speculative decoding
            line.update(
                draft_tokens=int(st["draft_tokens"]),
                draft_accepted=int(st["draft_accepted"]),
                draft_tokens_per_pass=round(float(st["draft_tokens_per_pass"] or 0.0), 3),
                draft_k_mean=round(float(st["draft_k_mean"] or 0.0), 3),
            )
        return line
