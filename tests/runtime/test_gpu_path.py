"""The GPU code path through the CPU: segments (consecutive blocks that stay, one graph), staged loads through a
host tier, one read of each streamed block per pass, and the plan of a device that is not host memory."""

from __future__ import annotations

import numpy as np
import pytest

from prompts import FEED_PROMPT, feed_logits
from superggml import Model, native
from superggml.runtime.plan.devices import transfer_rate
from superggml.runtime.plan.memory_plan import plan_memory, with_host_tier
from superggml.settings import ContextSettings
from cli_runner import run_cli


@pytest.fixture(scope="module")
def resident(smollm2_path):
    with Model(smollm2_path, ctx_size=128, n_threads=2, repack=False) as m:
        return feed_logits(m), m.store.slot_bytes(m.arch.block_tensors(0)), m.hparams.n_layer


@pytest.mark.parametrize("staged", [False, True])
def test_pinned_blocks_run_as_one_graph(smollm2_path, resident, staged):
    """n_gpu_layers=k: the k pinned blocks are one graph (a segment), the others one each: the resident logits."""
    ref, _, n_layer = resident
    k = n_layer // 2
    with Model(smollm2_path, ctx_size=128, n_threads=2, n_gpu_layers=k, staged_io=staged) as m:
        out = feed_logits(m)
        merged = m.stats()["graphs_per_pass"]
        m.record_timings = True  # timed block by block: a graph per block
        m.eval([23])
        apart = m.stats()["graphs_per_pass"]
        assert m.stats()["layers_pinned"] == k
    assert np.array_equal(out, ref)
    assert apart - merged == k - 1


def test_split_runs_a_segment_per_device(smollm2_path, resident):
    """Two devices, each resident: one graph per device's blocks (the head joins the last), the same logits."""
    ref, _, n_layer = resident
    with Model(smollm2_path, ctx_size=128, n_threads=2, repack=False, devices=["CPU", "CPU"]) as m:
        out = feed_logits(m)
        assert m.stats()["graphs_per_pass"] == 3  # embed, device 0's blocks, device 1's blocks + head
    assert np.array_equal(out, ref)


@pytest.mark.parametrize("async_prefetch", [False, True])
def test_host_tier_reads_the_file_once(smollm2_path, resident, async_prefetch):
    """staged_io with a host tier that holds every streamed block: the first pass reads them from the file, the
    later ones copy them from host memory; the logits are the resident ones."""
    ref, slot, n_layer = resident
    with Model(
        smollm2_path,
        ctx_size=128,
        n_threads=2,
        device_budget=int(4 * slot * 1.05),
        staged_io=True,
        host_cache="512MiB",
        async_prefetch=async_prefetch,
    ) as m:
        m.eval(FEED_PROMPT[:4])
        first = m.stats()
        m.reset()
        out = feed_logits(m)
        st = m.stats()
    assert np.array_equal(out, ref)
    assert st["staged_io"] and st["host_slots"] > 0 and st["failed"] == 0
    assert st["file_bytes"] == first["file_bytes"]  # nothing read from the file again
    assert st["host_bytes"] > 0 and st["host_hits"] > 0
    assert st["bytes_loaded"] == st["file_bytes"] + st["host_bytes"]


@pytest.mark.parametrize("depth", [1, 3])
def test_host_tier_reads_the_file_with_o_direct(smollm2_path, resident, depth):
    """direct_io with a host tier: the tier's slots take the file's layout, each block is read into one with
    O_DIRECT in chunks several at once, then copied tensor by tensor to its device slot; the file is read once,
    none of it through the page cache, and the logits are the resident ones."""
    ref, slot, _ = resident
    kw = dict(ctx_size=128, n_threads=2, device_budget=int(4 * slot * 1.05), staged_io=True, async_prefetch=True)
    with Model(smollm2_path, host_cache="512MiB", direct_io=True, prefetch_depth=depth, **kw) as m:
        m.eval(FEED_PROMPT[:4])
        first = m.stats()
        m.reset()
        out = feed_logits(m)
        st = m.stats()
    assert np.array_equal(out, ref)
    assert st["host_slots"] > 0 and st["failed"] == 0 and st["host_hits"] > 0
    assert st["file_bytes"] == first["file_bytes"] > 0
    if st["direct_io"]:  # the file system took O_DIRECT (tmpfs does not)
        assert st["direct_bytes"] >= st["file_bytes"]  # the reads are widened to the O_DIRECT alignment


def test_host_tier_smaller_than_the_streamed_blocks(smollm2_path, resident):
    """A tier of 3 blocks: some loads come from it, the rest from the file; still the resident logits. A full
    tier keeps its blocks: each later pass copies those 3 from it (an LRU tier, read in a cycle longer than it
    is, would evict every block before its reuse and hit none)."""
    ref, slot, _ = resident
    with Model(
        smollm2_path,
        ctx_size=128,
        n_threads=2,
        device_budget=int(3 * slot * 1.05),
        staged_io=True,
        host_cache=str(3 * slot + 4096),
        async_prefetch=True,
    ) as m:
        out = feed_logits(m)
        st = m.stats()
        m.eval([42])
        hits = m.stats()["host_hits"] - st["host_hits"]
    assert np.array_equal(out, ref)
    assert st["host_slots"] == 3 and hits == 3
    assert st["file_bytes"] > 0 and st["bytes_loaded"] == st["file_bytes"] + st["host_bytes"]


def test_host_tier_off_and_on_a_host_pool(smollm2_path, resident):
    """No tier for a pool in host memory (it would copy host memory to host memory) unless a size asks for one
    with staged_io, and none with off."""
    _, slot, _ = resident
    for kw in (dict(), dict(host_cache="64MiB"), dict(staged_io=True), dict(staged_io=True, host_cache="off")):
        with Model(smollm2_path, ctx_size=64, n_threads=2, device_budget=int(3 * slot * 1.05), **kw) as m:
            m.eval([1, 2])
            assert m.stats()["host_slots"] == 0, kw


def test_prefill_reads_each_streamed_block_once(smollm2_path, resident):
    """A pass of many rows loads each streamed block (and head chunk) once: loads per pass = streamed keys."""
    _, slot, n_layer = resident
    with Model(
        smollm2_path,
        ctx_size=256,
        n_threads=2,
        n_batch=256,
        device_budget=int(3 * slot * 1.05),
        staged_io=True,
        async_prefetch=True,
    ) as m:
        m.eval([1])
        before = m.stats()["loads"]
        m.eval(list(range(100, 300)))  # one pass of 200 rows
        per_prefill = m.stats()["loads"] - before
        before = m.stats()["loads"]
        m.eval([5])
        per_decode = m.stats()["loads"] - before
    assert per_prefill == per_decode >= n_layer - 3


def test_transfer_rate_on_the_cpu():
    assert transfer_rate("CPU", 8 << 20, 2) > 0
    with pytest.raises(Exception):
        native.host_to_device_rate(native.Backend("CPU", 1), 0)


def test_plan_of_a_device_with_a_host_tier(smollm2_path):
    """A GPU's plan: the budget from its free memory, the host tier from the host's."""
    with Model(smollm2_path, ctx_size=64, n_threads=2) as m:
        hp = m.hparams
    c = ContextSettings(ctx_size=4096, n_batch=512, cache_type_k="f16", cache_type_v="f16", flash_attn=False)
    weights = 8 << 30
    p = plan_memory(hp, weights, c, "auto", 4 << 30)
    assert p.budget is not None and p.budget < weights
    t = with_host_tier(p, "auto", 64 << 30)
    assert t.host_cache == weights  # every streamed block fits the host, in whole slots
    assert "host tier" in t.line()
    small = with_host_tier(p, "auto", 2 << 30)
    assert 0 < small.host_cache < 2 << 30
    # blocks placed on the host mirror their K/V there: the host tier leaves it room
    copied = with_host_tier(p, "auto", 2 << 30, placed=False)
    assert small.host_kv == p.kv and copied.host_kv == 0 and copied.host_cache - small.host_cache == p.kv
    assert with_host_tier(p, "off", 64 << 30).host_cache == 0
    assert with_host_tier(p, 1 << 30, 64 << 30).host_cache == 1 << 30
    resident = plan_memory(hp, 1 << 20, c, "auto", 4 << 30)
    assert with_host_tier(resident, "auto", 64 << 30).host_cache == 0


def test_plan_and_analyze_show_the_auto_plan(smollm2_path, capsys):
    import json

    out = run_cli(capsys, "plan", "-m", smollm2_path).out
    assert "device_budget auto" in out and "all weights resident" in out
    d = json.loads(run_cli(capsys, "plan", "-m", smollm2_path, "--json").out)
    assert d["memory_plan"]["resident"] and d["memory_plan"]["weights"] > 0


@pytest.mark.parametrize("kw", [dict(n_gpu_layers=10, staged_io=True), dict(devices=["CPU", "CPU"], repack=False)])
def test_queued_graphs_path(smollm2_path, resident, monkeypatch, kw):
    """The executor as it drives a GPU (graphs queued, waited for before a streamed slot is released, before
    activations move and at the end of a pass), run on the CPU, where queueing computes at once: the same logits,
    and nothing left queued after a pass."""
    from superggml.runtime.exec.streams import DeviceStreams

    monkeypatch.setattr(DeviceStreams, "queues", lambda self, dev: True)
    ref, _, _ = resident
    with Model(smollm2_path, ctx_size=128, n_threads=2, **kw) as m:
        out = feed_logits(m)
        assert not m.runtime.streams.queued
    assert np.array_equal(out, ref)
