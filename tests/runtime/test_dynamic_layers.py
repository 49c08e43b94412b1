"""dynamic_layers: pinned blocks are demoted under memory pressure and promoted after, logits unchanged."""

from __future__ import annotations

import hashlib
import json
import sys

import numpy as np
import pytest

from superggml import Model
from superggml.settings import PagingSettings

from prompts import TOKENS_40 as PROMPT  # noqa: E402
from cli_runner import run_cli

DECODE = [7, 11, 13, 17]
MiB = 1 << 20


class FakeMemory:
    """A device of `total` bytes: the pool's slots plus `other` bytes the test sets."""

    def __init__(self, total: int, m: Model):
        self.total, self.other, self.model = total, 0, m

    @property
    def used(self) -> int:
        st = self.model.stats()
        return self.other + st["n_slots"] * st["slot_size"]

    def __call__(self) -> tuple[int, int]:
        return self.used, self.total


@pytest.fixture(scope="module")
def resident(smollm2_path):
    with Model(smollm2_path, ctx_size=128, n_threads=2, repack=False) as m:
        out = [m.eval(PROMPT).copy()] + [m.eval([t]).copy() for t in DECODE]
    return np.concatenate(out)


@pytest.mark.parametrize("async_prefetch", [False, True])
def test_pressure_demotes_then_promotes_with_identical_logits(smollm2_path, resident, async_prefetch):
    with Model(smollm2_path, ctx_size=128, n_threads=2, dynamic_layers=True, async_prefetch=async_prefetch) as m:
        mem = m.scheduler.memory = FakeMemory(200 * MiB, m)
        st0 = m.stats()
        assert st0["layers_pinned"] == st0["n_slots"]  # no budget: the plan pins every block
        slot = st0["slot_size"]
        out = [m.eval(PROMPT).copy()]
        assert m.stats()["layers_demoted"] == 0
        mem.other = 170 * MiB - st0["n_slots"] * slot + 4 * slot + 1  # 4 slots + 1 byte over 0.85
        out.append(m.eval([DECODE[0]]).copy())
        st1 = m.stats()
        assert st1["n_slots"] == st0["n_slots"] - 5  # the memory really went
        assert st1["layers_demoted"] == 6  # the first frees no slot: it streams
        assert st1["layers_pinned"] == st0["layers_pinned"] - st1["layers_demoted"]
        out.append(m.eval([DECODE[1]]).copy())  # pressure unchanged: nothing moves
        assert m.stats()["layers_demoted"] == st1["layers_demoted"]
        mem.other = 0  # pressure gone: back to the plan
        out += [m.eval([t]).copy() for t in DECODE[2:]]
        st2 = m.stats()
        assert st2["layers_promoted"] == st1["layers_demoted"]
        assert st2["layers_pinned"] == st0["layers_pinned"] and st2["n_slots"] == st0["n_slots"]
        ev = m.layer_events()
        assert [e["event"] for e in ev].count("layer_demote") == st1["layers_demoted"]
        assert [e["event"] for e in ev].count("layer_promote") == st2["layers_promoted"]
        assert max(e["n_slots"] for e in ev) <= st0["n_slots"]  # never beyond the plan's budget
        assert [e["layer"] for e in ev if e["event"] == "layer_demote"] == sorted(
            e["layer"] for e in ev if e["event"] == "layer_demote"
        )  # earliest in the pass first
    assert np.array_equal(np.concatenate(out), resident)


def test_full_pressure_streams_everything_through_the_budget(smollm2_path, resident):
    with Model(
        smollm2_path,
        ctx_size=128,
        n_threads=2,
        device_budget="40MiB",
        async_prefetch=True,
        dynamic_layers=True,
        mem_pressure=0.5,
    ) as m:
        mem = m.scheduler.memory = FakeMemory(100 * MiB, m)
        n0 = m.stats()["n_slots"]
        mem.other = 100 * MiB
        out = [m.eval(PROMPT).copy()] + [m.eval([t]).copy() for t in DECODE]
        st = m.stats()
        assert st["layers_pinned"] == 0
        assert st["n_slots"] == n0 - st["layers_demoted"] >= 1
    assert np.array_equal(np.concatenate(out), resident)


def test_hysteresis_keeps_it_from_flapping(smollm2_path):
    with Model(smollm2_path, ctx_size=64, n_threads=2, dynamic_layers=True) as m:
        sch = m.scheduler
        mem = sch.memory = FakeMemory(1000 * MiB, m)
        base = mem.used
        mem.other = 850 * MiB - base + 1  # one byte over
        sch.step()
        assert sch.demotions == 2 and m.stats()["n_slots"] * sch.slot_bytes == base - sch.slot_bytes
        for used in (849, 820, 805, 845):  # inside the band: no moves
            mem.other = used * MiB - base
            sch.step()
        assert (sch.demotions, sch.promotions) == (2, 0)
        mem.other = 700 * MiB - base
        sch.step()
        assert sch.promotions == 2 and mem.used == 700 * MiB


def test_mem_pressure_is_checked(smollm2_path):
    with pytest.raises(ValueError, match="mem_pressure"):
        Model(smollm2_path, dynamic_layers=True, mem_pressure=1.5)
    with pytest.raises(ValueError, match="mem_pressure"):
        PagingSettings(mem_pressure=0)


def test_cli_flags_and_environment(monkeypatch, model_kwargs, smollm2_path, capsys):
    seen = model_kwargs
    monkeypatch.setenv("SUPERGGML_DYNAMIC_LAYERS", "1")
    monkeypatch.setenv("SUPERGGML_MEM_PRESSURE", "0.7")
    err = run_cli(capsys, "generate", "-m", smollm2_path, "-p", "Hi", "-n", "2", "--temp", "0", "-c", "64", "-v").err
    assert seen["dynamic_layers"] is True and seen["mem_pressure"] == 0.7
    assert "layers_demoted" in err
    run_cli(
        capsys,
        "generate",
        "-m",
        smollm2_path,
        "-p",
        "Hi",
        "-n",
        "1",
        "-c",
        "64",
        "--mem-pressure",
        "0.6",
        "--direct-io",
        "on",
    )
    assert seen["mem_pressure"] == 0.6 and seen["direct_io"] is True


BALLAST_RUN = r"""
import hashlib, json, sys
import numpy as np
from superggml import Model
path, dynamic = sys.argv[1], sys.argv[2] == "1"
with Model(path, ctx_size=256, n_threads=2, repack=False, device_budget="384MiB", dynamic_layers=dynamic) as m:
    logits = m.eval(m.tokenize("def quicksort(xs):\n    "))[-1]
    out, ballast, pinned = [], [], []
    for i in range(12):
        if i < 6:
            ballast.append(np.ones(30 << 20, np.uint8))   # another 30 MiB of real pages per token
        else:
            ballast.clear()
        out.append(int(np.argmax(logits)))
        logits = m.eval([out[-1]])[-1]
        pinned.append(m.stats()["layers_pinned"])
    hwm = next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmHWM"))
    print(json.dumps({"tokens": out, "logits": hashlib.sha256(logits.tobytes()).hexdigest(),
                      "stats": m.stats(), "pinned": pinned, "hwm": hwm}))
"""


@pytest.mark.slow
def test_qwen_survives_a_growing_ballast_in_a_640mib_cgroup(qwen_path):
    """A 384 MiB plan plus 180 MiB of other allocations exceeds 640 MiB (the static plan is
    OOM-killed there); with dynamic_layers the blocks step down to streaming and come back."""
    import memcg

    memcg.drop_page_cache(qwen_path)
    try:
        r = memcg.run_limited([sys.executable, "-c", BALLAST_RUN, qwen_path, "1"], 640 * MiB, timeout=900)
    except (OSError, PermissionError) as e:
        pytest.skip(f"cannot make a child memory cgroup here: {e}")
    assert r.returncode == 0, r.stderr[-2000:]
    d = json.loads(r.stdout.splitlines()[-1])
    print(f"\ndynamic layers in 640 MiB: pinned per token {d['pinned']}, VmHWM {d['hwm'] / MiB:.0f} MiB, {d['stats']}")
    st = d["stats"]
    assert st["layers_demoted"] > 0 and st["layers_promoted"] == st["layers_demoted"]
    assert min(d["pinned"]) < d["pinned"][-1]
    assert d["hwm"] <= 640 * MiB
    with Model(qwen_path, ctx_size=256, n_threads=2, repack=False) as m:
        logits = m.eval(m.tokenize("def quicksort(xs):\n    "))[-1]
        ref = []
        for _ in range(12):
            ref.append(int(np.argmax(logits)))
            logits = m.eval([ref[-1]])[-1]
    assert d["tokens"] == ref
    assert d["logits"] == hashlib.sha256(logits.tobytes()).hexdigest()
