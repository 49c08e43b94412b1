"""The live view of a running server (the page's, over GET /v1/events): where each block's weights are, the
expert cache's hit rate, K/V pages per tier, read GB/s, tokens/s and memory against the budget, as one JSON
snapshot a tick."""

from __future__ import annotations

import time
from typing import Any, Callable, Mapping

from .. import native

TICK_SECONDS = 0.5
STREAM_SECONDS = 20.0  # a stream ends after this; the page reconnects (no stream outlives a shutdown long)


class LiveView:
    """Snapshots of one model; rates are over the time since the previous snapshot."""

    def __init__(self, model: Any):
        self.model = model
        self.last: tuple[float, int, int] | None = None  # time, bytes read, tokens generated

    def snapshot(self, stats: Mapping[str, Any], counts: Mapping[str, Any]) -> dict[str, Any]:
        """`stats`: the model's stats() (taken between passes); `counts`: the engine's."""
        now = time.monotonic()
        read = int(stats.get("bytes_loaded", 0)) + int(stats.get("expert_bytes_loaded", 0))
        made = int(counts.get("generated_tokens", 0))
        gbps = tps = 0.0
        if self.last is not None and now > self.last[0]:
            dt = now - self.last[0]
            gbps, tps = (read - self.last[1]) / dt / 1e9, (made - self.last[2]) / dt
        self.last = (now, read, made)
        hits, misses = int(stats.get("expert_hits", 0)), int(stats.get("expert_misses", 0))
        h = native.host_memory()
        budget = (stats.get("budget") or {}).get("budget")
        return {
            "blocks": self.model.runtime.placement.block_places(),
            "expert_hit_rate": hits / (hits + misses) if hits + misses else None,
            "kv_pages": {
                "device": int(stats.get("kv_pages_device", 0)),
                "host": int(stats.get("kv_pages_host", 0)),
                "disk": int(stats.get("kv_pages_disk", 0)),
            },
            "read_gb_s": round(gbps, 4),
            "tokens_per_s": round(tps, 3),
            "memory_used": int(h["total"]) - int(h["available"]),
            "memory_total": int(h["total"]),
            "budget": budget,
            "slots": stats.get("n_slots"),
            "layers_pinned": stats.get("layers_pinned"),
            "requests_processing": counts.get("processing", 0),
            "requests_deferred": counts.get("deferred", 0),
            "generated_tokens": made,
        }

    async def events(self, take: Callable[[], Any], disconnected: Callable[[], Any]) -> Any:
        """Server-sent events: a snapshot every TICK_SECONDS (`take`: awaitable of (stats, counts)), until the
        client goes away or STREAM_SECONDS pass."""
        import asyncio
        import json

        yield "retry: 500\n\n"
        end = time.monotonic() + STREAM_SECONDS
        while time.monotonic() < end and not await disconnected():
            stats, counts = await take()
            yield f"data: {json.dumps(self.snapshot(stats, counts), separators=(',', ':'))}\n\n"
            await asyncio.sleep(TICK_SECONDS)
