"""The memory-pressure layer scheduler (``dynamic_layers``).

The static plan pins the first blocks that fit the budget and streams the
rest. While running, before every forward pass, the scheduler reads the
compute device's memory pressure (used / total; on the CPU the host as this
process sees it, cgroup limit included) and re-plans:

- above ``mem_pressure``: demote the least recently used pinned blocks (the
  earliest in the pass) until the bytes over the threshold are covered. A
  demoted block is unpinned and one pool slot's memory is freed, so the
  block streams from then on and the process holds one slot less;
- below ``mem_pressure - HYSTERESIS``, with room for a whole slot under
  that line: promote demoted blocks again (allocate a slot, pin, load),
  never beyond the static plan.

Every move is counted and recorded as an event.
"""

from __future__ import annotations

import time
from typing import Any

from ...errors import SuperggmlError
from ...telemetry import MemoryFn, host_memory

HYSTERESIS = 0.05  # promote only below mem_pressure - HYSTERESIS


class LayerScheduler:
    """Demotes and promotes pinned blocks of a LayerPager as memory pressure moves.

    ``planned`` are the keys the static plan pins, in pass order; ``stream_slots``
    the slots kept for streaming while any key is unpinned. The pool holds
    ``n_pinned + stream_slots`` slots (``n_pinned`` when every key is pinned),
    so it never exceeds the static plan's budget. ``mem_pressure`` comes checked
    from PagingSettings. ``memory`` is the reading it acts on (tests replace it).
    """

    def __init__(
        self,
        pager: Any,
        *,
        planned: list[int],
        n_keys: int,
        stream_slots: int,
        mem_pressure: float,
        memory: MemoryFn = host_memory,
    ):
        self.pager = pager
        self.mem_pressure = mem_pressure
        self.memory = memory
        self.planned = list(planned)
        self.n_keys = n_keys
        self.stream_slots = max(1, stream_slots)
        self.slot_bytes = int(pager.slot_size)
        self.demotions = 0
        self.promotions = 0
        self.events: list[dict[str, Any]] = []

    @property
    def n_pinned(self) -> int:
        return sum(1 for k in self.planned if self.pager.pinned(k))

    def _slots_for(self, n_pinned: int) -> int:
        return n_pinned if n_pinned >= self.n_keys else n_pinned + self.stream_slots

    def _event(self, kind: str, key: int, used: int, total: int) -> None:
        self.events.append(
            {
                "event": kind,
                "layer": key,
                "t": time.time(),
                "pressure": round(used / total, 4) if total else 0.0,
                "n_slots": self.pager.n_slots,
                "pinned": self.n_pinned,
            }
        )

    def step(self) -> None:
        """Reads the pressure once and moves as many blocks as it calls for.
        Call it between forward passes (no layer acquired)."""
        used, total = self.memory()
        if total <= 0:
            return
        high = self.mem_pressure * total
        if used > high:
            for key in [k for k in self.planned if self.pager.pinned(k)]:  # least recently used first
                if used <= high:
                    break
                self.pager.unpin(key)
                while self.pager.n_slots > self._slots_for(self.n_pinned) and self.pager.shrink():
                    used -= self.slot_bytes
                self.demotions += 1
                self._event("layer_demote", key, used, total)
            return
        low = (self.mem_pressure - HYSTERESIS) * total
        for key in self.planned:
            if self.pager.pinned(key):
                continue
            need = max(0, self._slots_for(self.n_pinned + 1) - self.pager.n_slots)
            if used + need * self.slot_bytes > low:
                break
            try:
                for _ in range(need):
                    self.pager.grow()
                    used += self.slot_bytes
            except SuperggmlError:
                break  # the device said no: the block stays streamed
            self.pager.pin(key)
            self.promotions += 1
            self._event("layer_promote", key, used, total)

    def stats(self) -> dict[str, int]:
        return {
            "layers_demoted": self.demotions,
            "layers_promoted": self.promotions,
            "layers_pinned": self.n_pinned,
            "n_slots": self.pager.n_slots,
        }
