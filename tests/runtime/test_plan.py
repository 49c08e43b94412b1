"""plan's allocator on synthetic device lists, against hand-computed splits; the plan and analyze commands."""

from __future__ import annotations

import json

import pytest

from superggml.commands.allocation import Device, allocate
from cli_runner import run_cli

GiB = 1 << 30
A = Device(0, "GPU-A 8G", free=8 * GiB, total=8 * GiB)
B = Device(1, "GPU-B 24G", free=24 * GiB, total=24 * GiB)
C = Device(2, "GPU-C 12G (8 in use)", free=4 * GiB, total=12 * GiB)
LAYERS = [GiB] * 40


def ranges(a):
    return [(p.device.index, p.first_layer, p.n_layers) for p in a.placements]


def test_three_mixed_gpus_by_free_memory():
    a = allocate([A, B, C], LAYERS, reserve=GiB, min_budget=GiB)
    # budgets after the 1 GiB reserve: B 23, A 7, C 3 -> layers 0-22, 23-29, 30-32; 33-39 stream
    assert ranges(a) == [(1, 0, 23), (0, 23, 7), (2, 30, 3)]
    assert a.streamed == tuple(range(33, 40))
    assert a.tensor_split == (23 / 40, 7 / 40, 3 / 40)
    assert a.device_of(25) == A and a.device_of(35) is None


def test_three_mixed_gpus_by_total_and_by_index():
    assert ranges(allocate([A, B, C], LAYERS, reserve=GiB, order="total_desc")) == [(1, 0, 23), (2, 23, 3), (0, 26, 7)]
    assert ranges(allocate([A, B, C], LAYERS, reserve=GiB, order="index")) == [(0, 0, 7), (1, 7, 23), (2, 30, 3)]
    assert ranges(allocate([A, B, C], LAYERS, reserve=GiB, select=[0, 2])) == [(0, 0, 7), (2, 7, 3)]


def test_reserve_larger_than_a_device():
    small = Device(3, "GPU-D", free=GiB // 2, total=2 * GiB)
    a = allocate([A, small], [GiB // 2] * 10, reserve=GiB, min_budget=GiB)
    assert ranges(a) == [(0, 0, 10)]
    ((dev, why),) = a.skipped
    assert dev == small and "reserve 1024 MiB is more than its free 512 MiB" in why


def test_one_device_too_small():
    tight = Device(4, "GPU-E", free=GiB * 5 // 2, total=4 * GiB)  # 1.5 GiB after the reserve
    a = allocate([tight, C], LAYERS[:4], reserve=GiB, min_budget=2 * GiB)
    assert ranges(a) == [(2, 0, 3)] and a.streamed == (3,)
    assert any(d == tight and "below the minimum of 2048 MiB" in w for d, w in a.skipped)
    big_layers = allocate([C], [4 * GiB], reserve=GiB, min_budget=GiB)  # a layer bigger than the budget
    assert big_layers.placements == () and big_layers.streamed == (0,)
    assert "does not fit" in big_layers.skipped[0][1]


def test_no_devices():
    a = allocate([], LAYERS[:5])
    assert a.placements == () and a.streamed == (0, 1, 2, 3, 4) and a.tensor_split == ()
    assert a.notes == ("5 layers fit no device: they stream from the host",)


def test_bad_arguments():
    with pytest.raises(ValueError, match="device order"):
        allocate([A], LAYERS, order="random")
    with pytest.raises(ValueError, match="no device with index 7"):
        allocate([A], LAYERS, select=[7])


def test_plan_command(smollm2_path, capsys):
    out = run_cli(capsys, "plan", "-m", smollm2_path, "--reserve-mib", "64", "--min-budget-mib", "64", "--json").out
    d = json.loads(out)
    assert d["devices"] and d["devices"][0]["type"] == "cpu"
    assert sum(p["n_layers"] for p in d["placements"]) + len(d["streamed"]) == 30
    assert d["rates"]["disk"] > 0 and d["rates"]["compute"] > 0 and d["rates"]["links"] == {}  # measured
    err = run_cli(capsys, "plan", "--devices", "GPU9", rc=1).err  # devices by name, as everywhere
    assert "no device GPU9" in err
    out = run_cli(
        capsys, "plan", "-m", smollm2_path, "--devices", "CPU", "--reserve-mib", "0", "--min-budget-mib", "0", "--json"
    ).out
    assert [p["device"] for p in json.loads(out)["placements"]] == ["CPU"]


def test_analyze_command(smollm2_path, capsys):
    d = json.loads(run_cli(capsys, "analyze", "-m", smollm2_path, "--json", "-t", "2").out)
    lay = d["layout"]
    assert lay["n_layer"] == 30 and len(lay["block_bytes"]) == 30
    assert lay["kv_bytes_per_token"] == 2 * 30 * 192 * 2
    assert d["t_compute_s"] > 0 and d["bandwidth_buffered"] > 0
    plans = d["plans"]
    assert plans[0]["streamed_bytes"] == 0 and plans[0]["predicted_s"] == pytest.approx(d["t_compute_s"])
    assert plans[1]["streamed_bytes"] > 0 and plans[-1]["n_slots"] == 1
    out = run_cli(capsys, "analyze", "-m", smollm2_path, "--no-measure", "--device-budget", "8MiB").out
    assert "KV cache (F16): 22.5 KiB per token" in out and "blocks: min" in out


def test_analyze_samples_blocks_by_shape(smollm2_path, capsys):
    """By default analyze times one or two blocks of each shape (SmolLM2's 30 blocks have one), reading only
    those; its compute time is the full measurement's, within what a busy 2-core machine allows."""
    from superggml.commands.analyze import analyze, model_layout

    lay = model_layout(smollm2_path)
    assert lay.block_shapes == (tuple(range(30)),)
    a = analyze(smollm2_path, [lay.slot_bytes], n_threads=2, progress=True)
    assert a.method == "sampled" and a.sampled_blocks == (0, 15)
    assert "analyze: timing 1-2 blocks of each of 1 block shape" in capsys.readouterr().err
    full = analyze(smollm2_path, [lay.slot_bytes], n_threads=2, full=True)
    assert full.method == "full" and full.sampled_blocks == ()
    assert 0.33 < a.t_compute_s / full.t_compute_s < 3
    assert a.bandwidth_buffered > 0 and a.bandwidth_direct > 0


def test_time_blocks_reads_those_blocks_and_changes_no_result(smollm2_path):
    from superggml import Model

    kw = dict(ctx_size=64, n_threads=2, device_budget=3 << 20, async_prefetch=False)
    with Model(smollm2_path, **kw) as m, Model(smollm2_path, **kw) as ref:
        toks = m.tokenize("def f(x):")
        m.eval(toks)
        ref.eval(toks)
        before = m.stats()["bytes_loaded"]
        t = m.time_blocks([3, 7], repeats=2)
        assert set(t) == {3, 7, "head"} and all(v > 0 for v in t.values())
        loaded = m.stats()["bytes_loaded"] - before
        head = m.tensor_info["token_embd.weight"][3]  # SmolLM2's head is its tied embedding
        # the two blocks once (not the 30); the head's 14 chunks go through the 1-slot pool on each of the 3 runs
        assert loaded <= 2 * m.stats()["slot_size"] + 3 * head
        assert m.n_tokens == len(toks)
        assert (m.eval([42])[-1] == ref.eval([42])[-1]).all()
        with pytest.raises(ValueError, match="blocks are in"):
            m.time_blocks([30])


def test_analyze_plan_matches_the_executor(smollm2_path):
    from superggml import Model
    from superggml.commands.analyze import model_layout, plan_budget

    lay = model_layout(smollm2_path)
    for budget in (6 << 20, 20 << 20):
        n_slots, pinned, _ = plan_budget(lay, budget)
        with Model(smollm2_path, ctx_size=64, n_threads=2, device_budget=budget, async_prefetch=True) as m:
            st = m.stats()
            assert (st["n_slots"], st["slot_size"]) == (n_slots, lay.slot_bytes)
            assert m.stats()["layers_pinned"] == pinned


def test_bench_command(smollm2_path, capsys):
    out = run_cli(
        capsys,
        "bench",
        "-m",
        smollm2_path,
        "-p",
        "32",
        "-n",
        "4",
        "-r",
        "1",
        "-c",
        "64",
        "--json",
        "--device-budget",
        "8MiB",
        "--async-prefetch",
    ).out
    d = json.loads(out)
    assert d["prefill_tok_s"] > 0 and d["decode_tok_s"] > 0 and d["stats"]["loads"] > 0
    err = run_cli(capsys, "bench", "-m", smollm2_path, "-p", "100", "-n", "4", "-c", "64", rc=1).err
    assert "do not fit ctx_size" in err
