"""Per-pass placement (runtime/exec/placement.py): blocks streamed to a device behind a link (a loopback `superggml
rpc-server`) compute there or on the host, pass by pass. Every placement gives the CPU's logits bit for bit (the
server runs the same ggml CPU kernels), the K/V follows the blocks between the two, and the cost model sends
decoded rows to the host on a slow link and long prompts to a fast device."""

from __future__ import annotations

from typing import Iterator

import numpy as np
import pytest

import synth_gguf
from superggml import Model, native
from superggml.commands.analyze import model_layout
from superggml.runtime.exec.placement import ExpertPlacer, PlaceRates, Placer, bucket, compact
from prompts import TOKENS_40 as PROMPT, run_prompt as run  # the prompt's logits, then six greedy tokens'
from synth_gguf import VARIANTS, synth
from rpc_server import Server, on

BASE = dict(ctx_size=128, n_batch=16, n_threads=1, repack=False)


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    with Server() as s:
        yield s


@pytest.fixture(scope="module")
def reference(smollm2_path: str) -> np.ndarray:
    with Model(smollm2_path, **BASE) as m:
        return run(m)


def streamed(server: Server, path: str, **kw) -> Model:
    """The model on the server's device, three slots of blocks there, the rest streamed."""
    return Model(path, **BASE, devices=[on(server)], device_budget=3 * model_layout(path).slot_bytes, **kw)


@pytest.mark.parametrize("mode", ["device", "host", "auto"])
def test_every_placement_gives_the_cpus_logits(server, reference, smollm2_path, mode):
    with streamed(server, smollm2_path, placement=mode) as m:
        out = run(m)
        st = m.stats()
        placer = m.runtime.placer
    assert np.array_equal(out, reference), float(np.abs(out - reference).max())
    if mode == "device":
        assert placer is None and st["loads"] > 0 and "placement" not in st
        return
    assert placer is not None and len(placer.blocks) == m.hparams.n_layer  # no block pinned in 3 slots
    one = [r for r in st["placement"] if r["rows"] == 1][0]
    assert one["passes"] == 6 and sorted(one["device"] + one["host"]) == placer.blocks
    if mode == "host":
        assert st["loads"] == 0  # nothing crossed the link but activations
        assert all(r["device"] == [] for r in st["placement"])


@pytest.mark.parametrize(
    "kw",
    [dict(flash_attn=True, kv_type="q8_0"), dict(moe="qwen3moe-8x2-q8_0"), dict(moe="gpt-oss-8x2-mxfp4")],
    ids=["flash_q8_0", "qwen3moe", "gpt_oss"],
)
def test_placed_runs_equal_the_cpu(server, smollm2_path, tmp_path, kw):
    """A quantized K/V read by flash attention, and mixture-of-experts blocks (on a device that is not host
    memory a MoE block streams whole, its experts with it): placed on the host, on the device, or switching."""
    kw, path = dict(kw), smollm2_path
    if "moe" in kw:
        variant = kw.pop("moe")
        fields = synth_gguf.vocab_fields(smollm2_path)
        path = str(synth(tmp_path / f"{variant}.gguf", fields, **{**VARIANTS[variant], "n_layer": 4}))
    feeds = [PROMPT[:20], [5], [6], PROMPT[20:36], [7]]
    with Model(path, **BASE, **kw) as m:
        ref = [m.eval(f, logits_all=True).copy() for f in feeds]
    slot = model_layout(path).slot_bytes
    for mode in ("host", "auto"):
        with Model(path, **BASE, **kw, devices=[on(server)], device_budget=2 * slot, placement=mode) as m:
            placer = m.runtime.placer
            assert placer is not None
            if mode == "auto":  # a device fast on many rows: prompts go there, decoded rows to the host
                placer.rates = PlaceRates(host_row=1e12, host_rows=1e6, dev_row=1e10, dev_rows=1e15, link=1e12)
            out = [m.eval(f, logits_all=True).copy() for f in feeds]
            st = m.stats()
        for a, b in zip(out, ref):
            assert np.array_equal(a, b), (mode, float(np.abs(a - b).max()))
        assert (st["kv_moved_bytes"] > 0) == (mode == "auto")


@pytest.mark.parametrize("variant", ["qwen3moe-8x2-q8_0", "gpt-oss-8x2-mxfp4", "qwen2moe-shared"])
def test_experts_the_device_cache_lacks_compute_on_the_host(server, smollm2_path, tmp_path, variant, monkeypatch):
    """An expert cache of a quarter of the experts on the server's device: the experts it holds compute there,
    the others on the host (host), or loaded where the cost model says loading costs less (auto: here the
    prompts' experts, routed many rows each, load; a decoded row's compute on the host). Each position's output
    is computed on one side alone, so the sums are the CPU's bits. The device's ids stay distinct in each row
    (ggml-cuda's mul_mat_id groups a row's ids by expert and leaves a repeated one's index unset): its positions
    computed on the host read the cache's zero slots."""
    fields = synth_gguf.vocab_fields(smollm2_path)
    path = str(synth(tmp_path / f"{variant}.gguf", fields, **{**VARIANTS[variant], "n_layer": 4}))
    cache = synth_gguf.expert_bytes(path) // 4
    prompt = [int(x) for x in np.random.default_rng(4).integers(0, 49152, 40)]
    slot_ids: list[np.ndarray] = []
    tensor_set = native.tensor_set

    def recording(t, a):
        if t.name.startswith("inp_expert_slots"):
            slot_ids.append(np.array(a, np.int32).reshape(-1, t.ne[0]))
        tensor_set(t, a)

    monkeypatch.setattr(native, "tensor_set", recording)

    def run(**kw):
        with Model(path, ctx_size=128, n_threads=2, n_batch=8, **kw) as m:
            hx = m.runtime.placement.host_experts
            if hx is not None and kw.get("placement") == "auto":
                hx.rates = PlaceRates(host_row=1e12, host_rows=1e6, dev_row=1e10, dev_rows=1e15, link=1e12)
            out = [m.eval(prompt, logits_all=True).copy()] + [m.eval([t]).copy() for t in (5, 6, 7, 8, 9)]
            pager = m.runtime.placement.experts
            zeros = (pager.core.n_slots, pager.zero_slots) if pager is not None else (0, 0)
            return np.concatenate(out), m.stats(), hx, zeros

    ref, _, _, _ = run()
    k = VARIANTS[variant]["n_expert_used"]
    for mode in ("device", "host", "auto"):
        slot_ids.clear()
        got, st, hx, (n_slots, zeros) = run(devices=[on(server)], expert_cache=cache, placement=mode)
        assert np.array_equal(got, ref), (mode, float(np.abs(got - ref).max()))
        assert (hx is None) == (mode == "device")
        assert zeros == (0 if mode == "device" else k)
        assert slot_ids and all(len(set(row)) == k for ids in slot_ids for row in ids.tolist()), mode
        used = np.concatenate([ids.reshape(-1) for ids in slot_ids])
        assert used.min() >= 0 and used.max() < n_slots + zeros
        assert (used >= n_slots).any() == (mode != "device")  # the host's positions read zero slots
        if mode == "device":
            assert st["expert_misses"] > 0 and st["expert_host_misses"] == 0
        elif mode == "host":
            assert st["expert_misses"] == 0 and st["expert_host_misses"] > 0 and hx.loaded == 0
        else:
            assert st["expert_host_misses"] > 0 and hx.loaded > 0 and hx.hosted > 0  # loads go as prefetches


def test_an_expert_cache_too_small_beside_its_zero_slots_is_a_clear_error(server, smollm2_path, tmp_path):
    """Where the experts the cache lacks may compute on the host, n_expert_used of the cache's bytes are zero slots:
    a cache that then holds fewer experts than a token is routed to says so, and how much it needs."""
    fields = synth_gguf.vocab_fields(smollm2_path)
    path = str(synth(tmp_path / "moe.gguf", fields, **{**VARIANTS["qwen3moe-8x2-q8_0"], "n_layer": 4}))
    kw = dict(ctx_size=128, n_threads=1, devices=[on(server)])
    with Model(path, **kw, expert_cache=1 << 20, placement="device") as m:
        slot = m.stats()["expert_slot_size"]
    with Model(path, **kw, expert_cache=3 * slot, placement="device") as m:
        assert m.stats()["expert_slots"] == 3 and m.stats()["expert_zero_slots"] == 0
    with pytest.raises(ValueError, match=f"besides 2 zero slots.*at least {4 * slot} bytes"):
        Model(path, **kw, expert_cache=3 * slot, placement="auto")


def test_the_kv_follows_the_blocks_both_ways(server, smollm2_path):
    """Prompts on the device, decoded tokens on the host, then a prompt on the device again: each switch moves
    the K/V of the streamed blocks, and the logits stay the CPU's."""
    feeds = [PROMPT[:24], [5], [6], PROMPT[24:40], [7], [8]]
    with Model(smollm2_path, **BASE) as m:
        ref = [m.eval(f, logits_all=True).copy() for f in feeds]
    with streamed(server, smollm2_path, placement="auto") as m:
        placer = m.runtime.placer
        assert placer is not None
        # a host that is fast on a row and slow on many, a link and device that are fast
        placer.rates = PlaceRates(host_row=1e12, host_rows=1e6, dev_row=1e10, dev_rows=1e15, link=1e12)
        moved = []
        out = []
        for f in feeds:
            out.append(m.eval(f, logits_all=True).copy())
            moved.append(m.stats()["kv_moved_bytes"])
        table = {r["rows"]: r for r in m.stats()["placement"]}
    for a, b in zip(out, ref):
        assert np.array_equal(a, b)
    assert table[1]["device"] == [] and table[16]["host"] == []
    assert moved[0] == 0 and moved[1] > moved[0] and moved[2] == moved[1]  # to the host once
    assert moved[3] > moved[2] and moved[4] > moved[3]  # back to the device, and to the host again


def test_sequences_in_one_pass_and_saved_ones_on_the_host(server, smollm2_path, tmp_path):
    prompts = [[300, 301, 302], [400, 401, 402, 403, 404], [500]]
    with Model(smollm2_path, **BASE) as m:
        alone = []
        for i, p in enumerate(prompts):
            m.runtime.sequences.use(10 + i)
            alone.append(m.runtime.eval(p).copy())
        m.runtime.sequences.use(0)
        m.eval(PROMPT[:12])
        want = m.eval([9]).copy()
    with streamed(server, smollm2_path, placement="host") as m:
        batch = m.runtime.eval_batch([(i + 1, p) for i, p in enumerate(prompts)])
        m.eval(PROMPT[:12])
        m.save_sequence(tmp_path / "seq")
        m.reset()
        m.eval([1, 2, 3])
        m.load_sequence(tmp_path / "seq")
        got = m.eval([9]).copy()
    for x, y in zip(batch, alone):
        assert np.array_equal(x, y)
    assert np.array_equal(got, want)


def test_no_placement_where_nothing_streams_to_a_device_behind_a_link(server, smollm2_path, capsys):
    slot = model_layout(smollm2_path).slot_bytes
    with Model(smollm2_path, **BASE, device_budget=3 * slot) as m:  # the CPU: the host itself
        assert m.runtime.placer is None
    with streamed(server, smollm2_path, paged_kv=True, kv_page_size=16, verbose=True) as m:
        assert m.runtime.placer is None
        assert "paged_kv" in m.runtime.placer_note
    with streamed(server, smollm2_path) as m:
        assert m.runtime.placer is not None
    err = capsys.readouterr().err
    assert "placement (auto) of 30 streamed blocks" in err and "\n      1 rows: " in err and "link " in err


def rates(**kw: float) -> PlaceRates:
    base = dict(host_row=20e9, host_rows=400e9, dev_row=1000e9, dev_rows=1e14, link=25e9)
    base.update(kw)
    return PlaceRates(**base)


def placer(r: PlaceRates, mode: str = "auto", n: int = 24) -> Placer:
    """A model of 32 blocks of 100 MB, the first 8 pinned on the device, a 400 MB head streamed."""
    return Placer(mode, list(range(8, 32)), [100_000_000] * 24, 400_000_000, 32, 4096, r)


def test_the_cost_model_splits_a_decoded_row_and_sends_prompts_to_the_device():
    """A GPU behind PCIe (25 GB/s), a host of 20 GB/s: a decoded row's blocks go both ways, so the link's copies
    overlap the host's compute; a prompt of 512 rows goes to the device."""
    p = placer(rates())
    one = p.choose(1, 1)
    assert 0 < len(one.hosted) < 24
    assert one.predicted < 0.8 * min(one.all_device, one.all_host)  # better than either pure placement
    many = p.choose(512, 1)
    assert many.hosted == () and not many.head_host
    assert p.choose(1, 1) is one and one.passes == 2
    # a link of 1 Gbit/s: a row never pays for a copy (0.8 s a block); a prompt's blocks mostly compute on the
    # host (0.13 s), a few copied while the host computes the others
    slow = placer(rates(link=0.125e9))
    assert len(slow.choose(1, 1).hosted) == 24 and slow.choose(1, 1).head_host
    assert 18 <= len(slow.choose(512, 1).hosted) <= 24
    # a device no faster than the host (an RPC server on the same cores): the host, for every pass
    same = placer(rates(link=0.125e9, dev_row=20e9, dev_rows=400e9))
    assert all(len(same.choose(n, 1).hosted) == 24 for n in (1, 16, 512))
    assert len(placer(rates(), mode="host").choose(512, 1).hosted) == 24


def test_measured_steps_refine_the_choice():
    p = placer(rates(link=0.25e9))
    assert len(p.choose(1, 1).hosted) == 24  # a block's copy (0.4 s) is more than the host's whole pass (0.12 s)
    for _ in range(20):  # the host measures 20 times slower than its probe on a decoded row
        p.observe(1, 100_000_000, 20 * 100_000_000 / 20e9)
    p.settle(1)
    assert p.factor[1] == pytest.approx(20, rel=0.01)
    assert len(p.choose(1, 1).hosted) < 24  # now copies overlap the host's compute of the others (2.0 s, not 2.4)


def test_a_missed_expert_loads_where_that_costs_less_than_the_host():
    """A 2 MB expert over a 10 GB/s link (200 us) against a host of 20 GB/s a row and 400 GB x rows/s: one or two
    rows compute on the host (100 and 105 us), 64 rows load (the host would take 415 us)."""
    x = ExpertPlacer("auto", rates(link=10e9), 2_000_000, 1)
    assert x.loads({3: 1, 5: 64, 7: 2}) == [5] and (x.loaded, x.hosted) == (1, 2)
    assert ExpertPlacer("host", rates(), 2_000_000, 1).loads({5: 64}) == []


def test_size_classes_and_compact_ranges():
    assert [bucket(n) for n in (1, 2, 3, 16, 17, 512)] == [1, 2, 4, 16, 32, 512]
    assert compact([3, 4, 5, 7, 9, 10]) == "[3-5, 7, 9-10]"
    lines = placer(rates()).lines((1, 512))
    assert "link 25.000 GB/s" in lines[0] and lines[2].strip().startswith("512 rows: 24 on the device [8-31]")


def test_the_placement_settles_rather_than_swings():
    """A host that measures a little off its probe, pass after pass, moves the factor but not the blocks: a new
    placement only when it is predicted HYSTERESIS faster than the blocks where they are. Each class keeps its
    passes' measured time beside the prediction."""
    p = placer(rates())
    first = p.choose(1, 1)
    for i in range(40):  # the host's steps measure 1.15x and 0.87x of the model in turn
        f = 1.15 if i % 2 else 0.87
        for _ in range(3):
            p.observe(1, 100_000_000, f * 100_000_000 / 20e9)
        p.settle(1, 0.05)
        assert p.choose(1, 1).hosted == first.hosted
    c = p.choose(1, 1)
    assert c.changes == 0 and c.timed == 40 and c.measured == pytest.approx(0.05)
    assert p.table()[0]["measured_s"] == pytest.approx(0.05)
    assert "measured 50.0 ms a pass" in p.lines()[1]
    # the host 3x slower than its probe: fewer blocks there, once
    for _ in range(20):
        p.observe(1, 100_000_000, 3 * 100_000_000 / 20e9)
    p.settle(1, 0.05)
    moved = p.choose(1, 1)
    assert len(moved.hosted) < len(first.hosted) and moved.changes == 1


def test_hosted_blocks_compute_from_re_laid_copies(server, smollm2_path, tmp_path):
    """repack (the default): the host's copies of the streamed blocks are re-laid for its faster kernels where
    its memory holds them, as a resident model's weights on the CPU are; placed on the host, the logits are that
    model's, bit for bit."""
    fields = synth_gguf.vocab_fields(smollm2_path)
    path = str(synth(tmp_path / "q4_k.gguf", fields, arch="llama", n_layer=4, n_embd=256, n_ff=512, wtype="q4_k"))
    kw = {**BASE, "repack": True}
    with Model(path, **kw) as m:
        ref, resident_relaid = run(m), m.repacked_bytes
    slot = model_layout(path).slot_bytes
    with Model(path, **kw, devices=[on(server)], device_budget=2 * slot, placement="host") as m:
        out, relaid = run(m), m.repacked_bytes
    assert resident_relaid > 0 and relaid > 0
    assert np.array_equal(out, ref), float(np.abs(out - ref).max())
