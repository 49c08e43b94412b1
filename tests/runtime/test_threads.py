"""The decode thread count: the cores other programs keep busy are left out, and timed trials keep the faster
count (runtime/exec/threads.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import numpy as np

from superggml import Model
from superggml.runtime.exec.threads import PHASE, RECHECK, WARMUP, CpuSample, ThreadTuner


def run(tuner: ThreadTuner, seconds_at: dict[int, float], tokens: int) -> list[int]:
    """The counts `tuner` picks over `tokens` decoded tokens that take seconds_at[count] each."""
    used = []
    for _ in range(tokens):
        n = tuner.threads()
        used.append(n)
        tuner.observe(seconds_at[n])
    return used


def test_a_trial_keeps_the_faster_count_and_checks_again():
    t = ThreadTuner(4, since=None)
    used = run(t, {4: 0.10, 3: 0.06, 2: 0.07, 1: 0.2}, WARMUP + 2 * PHASE)
    assert used == [4] * (WARMUP + PHASE) + [3] * PHASE and t.current == 3 and t.changes == 1
    run(t, {4: 0.10, 3: 0.06, 2: 0.07, 1: 0.2}, RECHECK + 2 * PHASE)
    assert t.current == 3 and t.trials == 2  # 2 was tried next and was not faster
    run(t, {4: 0.03, 3: 0.06, 2: 0.07, 1: 0.2}, RECHECK + 2 * PHASE)
    assert t.current == 4  # the load went away: one more pays again


def test_a_count_is_kept_unless_clearly_faster():
    t = ThreadTuner(2, since=None)
    run(t, {2: 0.10, 1: 0.095}, WARMUP + 2 * PHASE)
    assert t.current == 2 and t.trials == 1 and t.changes == 0
    assert ThreadTuner(1, since=None).stats()["decode_threads"] == 1


def test_others_busy_cores_are_left_out_from_the_start(smollm2_path):
    """A process spinning on one of the CPUs while the prompt computes: the first decoded token computes with
    one thread fewer than the cores."""
    cpus = sorted(os.sched_getaffinity(0))
    hog = subprocess.Popen([sys.executable, "-c", f"import os; os.sched_setaffinity(0, {{{cpus[-1]}}})\nwhile 1: pass"])
    try:
        with Model(smollm2_path, ctx_size=64) as m:
            top = m.runtime.tuner.top
            time.sleep(0.3)
            m.eval([1, 2, 3, 4])
            m.eval([5])
            assert m.stats()["decode_threads"] <= max(1, top - 1)  # fewer still where others are busy too
    finally:
        hog.kill()
        hog.wait()
    a = CpuSample.take()
    assert a is not None and a.busy > 0 and a.own > 0


def test_no_tuner_where_threads_are_given_or_batch_invariant(smollm2_path):
    for kw in (dict(n_threads=2), dict(batch_invariant=True)):
        with Model(smollm2_path, ctx_size=64, **kw) as m:
            assert m.runtime.tuner is None
            assert np.isfinite(m.eval([1, 2])).all()
