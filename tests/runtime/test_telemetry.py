"""Memory telemetry sees the cgroup limit, not just /proc/meminfo."""

from __future__ import annotations

import json
import sys

import pytest

from superggml import telemetry

SNAPSHOT = r"""
import json
from superggml import telemetry
s = telemetry.snapshot()
print(json.dumps({"total": s.host_total, "available": s.host_available, "limit": s.cgroup_limit,
                  "pressure": s.host_pressure, "rss": s.process_rss}))
"""


def test_snapshot_here():
    s = telemetry.snapshot()
    assert 0 < s.host_available <= s.host_total
    assert 0 <= s.host_pressure <= 1
    assert 0 < s.process_rss <= s.process_peak
    assert any(d.type == "cpu" and d.total > 0 for d in s.devices)


def test_snapshot_inside_a_memory_cgroup():
    import memcg

    limit = 300 << 20
    try:
        r = memcg.run_limited([sys.executable, "-c", SNAPSHOT], limit, timeout=120)
    except OSError as e:
        pytest.skip(f"cannot make a child memory cgroup here: {e}")
    assert r.returncode == 0, r.stderr[-2000:]
    d = json.loads(r.stdout.splitlines()[-1])
    assert d["limit"] == limit
    assert d["total"] == limit
    assert 0 < d["available"] < limit
    assert 0 < d["pressure"] < 1
