"""`GET /metrics` in Prometheus' text format (prometheus_client writes it), under the `superggml:` prefix: the
serving counters with llama-server's names where it has them (prompt_tokens_total, tokens_predicted_total,
requests_processing, requests_deferred, n_decode_total, ..._seconds for tokens/s), then the pager's counters and
gauges from the model's stats()."""

from __future__ import annotations

from typing import Any, Iterator, Mapping

from ..errors import require_extra

require_extra("server", "superggml's Prometheus metrics")
from prometheus_client import CollectorRegistry, generate_latest  # noqa: E402
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric  # noqa: E402

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
P = "superggml:"

# (name, stats() key, help): counters of the model's runtime, present when the key is
STAT_COUNTERS = (
    ("bytes_streamed", "bytes_loaded", "bytes of weights read into device slots"),
    ("layers_loaded", "loads", "blocks loaded into a slot"),
    ("layers_evicted", "evictions", "blocks evicted from a slot"),
    ("expert_hits", "expert_hits", "routed experts found in the expert cache"),
    ("expert_misses", "expert_misses", "routed experts read from the file"),
    ("expert_bytes_loaded", "expert_bytes_loaded", "bytes of experts read"),
    ("kv_pages_evicted", "kv_pages_evicted", "K/V pages moved down a tier"),
    ("passes", "passes", "forward passes"),
)
STAT_GAUGES = (
    ("slots", "n_slots", "device slots of the blocks' pool"),
    ("layers_pinned", "layers_pinned", "blocks that stay in a slot"),
    ("expert_slots", "expert_slots", "slots of the expert cache"),
    ("state_sequences", "state_sequences", "sequences whose recurrent states are on the device"),
)


def families(stats: Mapping[str, Any], serving: Mapping[str, Any], snapshot: Mapping[str, Any]) -> Iterator[Metric]:
    """The metric families of one scrape: the model's stats(), the engine's counts (prompt_tokens,
    cached_tokens, generated_tokens, decode_steps, requests, processing, deferred, prompt_seconds,
    generation_seconds) and the metrics snapshot (K/V pages per tier, memory pressure)."""

    def counter(name: str, value: float, doc: str) -> Metric:
        c = CounterMetricFamily(P + name, doc)
        c.add_metric([], float(value))
        return c

    def gauge(name: str, value: float, doc: str) -> Metric:
        return GaugeMetricFamily(P + name, doc, value=float(value))

    s = serving
    yield counter("prompt_tokens", s["prompt_tokens"], "prompt tokens processed (fed to the model)")
    yield counter("prompt_tokens_cached", s["cached_tokens"], "prompt tokens found in a slot, not fed again")
    yield counter("tokens_predicted", s["generated_tokens"], "tokens generated")
    yield counter("n_decode", s["decode_steps"], "engine steps (shared forward passes)")
    yield counter("requests", s["requests"], "requests finished")
    yield gauge("requests_processing", s["processing"], "requests generating now")
    yield gauge("requests_deferred", s["deferred"], "requests waiting in the queue")
    yield gauge(
        "prompt_tokens_seconds",
        s["prompt_tokens"] / s["prompt_seconds"] if s["prompt_seconds"] else 0,
        "average prompt throughput, tokens/s",
    )
    yield gauge(
        "predicted_tokens_seconds",
        s["generated_tokens"] / s["generation_seconds"] if s["generation_seconds"] else 0,
        "average generation throughput, tokens/s",
    )
    for name, key, doc in STAT_COUNTERS:
        if key in stats:
            yield counter(name, stats[key], doc)
    for name, key, doc in STAT_GAUGES:
        if key in stats:
            yield gauge(name, stats[key], doc)
    pages = GaugeMetricFamily(P + "kv_pages", "K/V pages per tier", labels=["tier"])
    for tier, key in (("device", "kv_pages_gpu"), ("host", "kv_pages_cpu"), ("disk", "kv_pages_disk")):
        pages.add_metric([tier], float(snapshot.get(key, 0)))
    yield pages
    pressure = GaugeMetricFamily(P + "memory_pressure", "used share of memory", labels=["memory"])
    pressure.add_metric(["host"], float(snapshot.get("cpu_memory_pressure", 0.0)))
    pressure.add_metric(["device"], float(snapshot.get("gpu_memory_pressure", 0.0)))
    yield pressure
    budget = stats.get("budget") or {}
    if budget.get("budget") is not None:
        yield gauge("device_budget_bytes", budget["budget"], "the blocks' pool the memory plan gives")


class OneScrape:
    """A collector of precomputed families (a registry reads it once)."""

    def __init__(self, fams: list[Metric]):
        self.fams = fams

    def collect(self) -> Iterator[Metric]:
        yield from self.fams


def prometheus_text(stats: Mapping[str, Any], serving: Mapping[str, Any], snapshot: Mapping[str, Any]) -> bytes:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(OneScrape(list(families(stats, serving, snapshot))))
    return bytes(generate_latest(reg))
