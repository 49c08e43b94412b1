"""Routing traces, and the expert cache held against the optimum.

A trace is the expert cache's request stream: one entry per request (ExpertPager.map), the layer and the experts
its rows were routed to (k per row, row-major). Every distinct expert of a request is pinned at once, so a
cache of n_slots slots serves a request of at most n_slots of them.

`optimal_loads` counts what Belady's rule (evict what is used again farthest in the future) loads for the same
stream and the same number of slots: no policy, lookahead or prefetch included, loads fewer experts, since a
prefetch only moves a load earlier. The cache's own loads (its misses, and the lookahead's prefetches that
loaded) are counted per layer beside it.

`fixed_loads` is a reference for routing without locality: what keeping the best fixed set of experts (chosen in
hindsight by their counts) loads, the other slots serving the rest. When every token draws its experts afresh
from the same odds, no policy that does not see the future does much better than that set, and Belady, who sees
it, does much better than both: the gap between them is the price of not knowing the future, not the policy's.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any, Sequence

Request = tuple[int, tuple[int, ...]]  # (layer, the routed experts of its rows)


@dataclass
class RoutingTrace:
    """What an expert cache of n_slots slots was asked for while recording (requests), and what it loaded per
    layer (its misses and the prefetches the lookahead started)."""

    n_slots: int
    requests: list[Request] = field(default_factory=list)
    loads: dict[int, int] = field(default_factory=dict)

    def table(self, n_slots: int | None = None) -> dict[str, Any]:
        """Per layer and in total: the requests, the cache's loads and the optimum's for n_slots slots (default:
        the cache's), and their ratio."""
        n = self.n_slots if n_slots is None else n_slots
        best = optimal_loads(self.requests, n)
        fixed = fixed_loads(self.requests, n)
        layers = sorted({il for il, _ in self.requests} | set(self.loads))
        rows = {
            il: {
                "requests": sum(1 for j, _ in self.requests if j == il),
                "loads": self.loads.get(il, 0),
                "optimal": best.get(il, 0),
                "fixed": fixed.get(il, 0),
            }
            for il in layers
        }
        total = {k: sum(r[k] for r in rows.values()) for k in ("requests", "loads", "optimal", "fixed")}
        return {
            "n_slots": n,
            "layers": rows,
            "total": total,
            "ratio": total["loads"] / total["optimal"] if total["optimal"] else 1.0,
        }


def optimal_loads(requests: Sequence[Request], n_slots: int) -> dict[int, int]:
    """Loads per layer of Belady's rule over `requests` with n_slots slots: a request's missing experts are
    loaded, and when the slots are full the held expert (of any layer) that is requested again farthest ahead
    is evicted; the request's own experts stay. ValueError when one request needs more than n_slots experts."""
    keys = [[(il, e) for e in sorted(set(ids))] for il, ids in requests]
    uses: dict[tuple[int, int], list[int]] = {}
    for i, ks in enumerate(keys):
        for k in ks:
            uses.setdefault(k, []).append(i)

    def next_use(k: tuple[int, int], i: int) -> float:
        at = uses[k]
        j = bisect.bisect_right(at, i)
        return at[j] if j < len(at) else float("inf")

    held: set[tuple[int, int]] = set()
    loads: dict[int, int] = {}
    for i, ks in enumerate(keys):
        if len(ks) > n_slots:
            raise ValueError(
                f"request {i} routes layer {ks[0][0]} to {len(ks)} experts; {n_slots} slots cannot hold them"
            )
        missing = [k for k in ks if k not in held]
        over = len(held) + len(missing) - n_slots
        if over > 0:
            mine = set(ks)
            victims = sorted((k for k in held if k not in mine), key=lambda k: next_use(k, i), reverse=True)
            held.difference_update(victims[:over])
        for k in missing:
            held.add(k)
            loads[k[0]] = loads.get(k[0], 0) + 1
    return loads


def fixed_loads(requests: Sequence[Request], n_slots: int) -> dict[int, int]:
    """Loads per layer when the n_slots - m experts requested most often (m: the most one request routes to) stay
    held once loaded, and the m other slots take each request's other experts in turn."""
    keys = [{(il, e) for e in ids} for il, ids in requests]
    m = max((len(ks) for ks in keys), default=0)
    counts: dict[tuple[int, int], int] = {}
    for ks in keys:
        for k in ks:
            counts[k] = counts.get(k, 0) + 1
    kept = set(sorted(counts, key=lambda k: counts[k], reverse=True)[: max(n_slots - m, 0)])
    loads: dict[int, int] = {}
    for k, c in counts.items():
        loads[k[0]] = loads.get(k[0], 0) + (1 if k in kept else c)
    return loads
