"""The automatic device budget (superggml.runtime.plan.memory_plan): the arithmetic, the options, and a model bigger than its memory
limit that generates with no options."""

from __future__ import annotations

import dataclasses
import json
import os
import sys

import numpy as np
import pytest

import memcg
from superggml import Model
from superggml.runtime.plan import memory_plan as budget
from superggml.arch import get_architecture
from superggml.settings import ContextSettings, Settings
from synth_gguf import dequantized_copy

MiB = 1 << 20
GiB = 1 << 30
CTX = ContextSettings(ctx_size=4096, n_batch=512, cache_type_k="f16", cache_type_v="f16", flash_attn=False)


@pytest.fixture(scope="module")
def hp(smollm2_path):
    from superggml import gguf as sg

    with sg.open(smollm2_path) as f:
        return get_architecture(f.metadata()).hp


def test_plan_resident_when_it_fits(hp):
    p = budget.plan_memory(hp, 100 * MiB, CTX, "auto", 8 * GiB)
    assert p.resident and p.mode == "auto" and p.budget is None
    assert p.kv == 2 * hp.n_layer * 4096 * hp.n_embd_gqa * 2  # F16 K and V of every layer
    assert p.needed == p.weights + p.kv + p.compute + p.tokenizer + p.headroom


def test_plan_streams_what_does_not_fit(hp):
    avail = 1 * GiB
    p = budget.plan_memory(hp, 4 * GiB, CTX, "auto", avail)
    assert not p.resident
    assert p.budget == avail - p.kv - p.compute - p.tokenizer - p.headroom
    # a draft model's memory comes out of the target's
    q = budget.plan_memory(hp, 4 * GiB, CTX, "auto", avail, reserve=100 * MiB)
    assert q.budget == p.budget - 100 * MiB
    # and its line says what the draft costs: the weights that stream with it and without it
    assert (
        f"0.1 GiB kept for the draft model, so {budget.gib(4 * GiB - q.budget)} of weights stream instead of "
        f"{budget.gib(4 * GiB - p.budget)})"
    ) in q.line()
    # a smaller context leaves more to the weights
    r = budget.plan_memory(hp, 4 * GiB, dataclasses.replace(CTX, ctx_size=512), "auto", avail)
    assert r.budget > p.budget


def test_plan_explicit_and_off(hp):
    p = budget.plan_memory(hp, 4 * GiB, CTX, 123 * MiB, 1 * GiB)
    assert p.mode == "explicit" and p.budget == 123 * MiB
    p = budget.plan_memory(hp, 4 * GiB, CTX, "off", 1 * GiB)
    assert p.mode == "off" and p.resident
    e = budget.off_error(p, "cannot allocate")
    assert "available" in str(e) and "device_budget='auto'" in str(e) and "--device-budget" in str(e)


def test_settings_values():
    assert Settings().paging.device_budget == "auto"
    assert Settings.from_options(dict(device_budget=None)).paging.device_budget == "auto"
    assert Settings.from_options(dict(device_budget="OFF")).paging.device_budget == "off"
    assert Settings.from_options(dict(device_budget="1GiB")).paging.budget_bytes == GiB
    assert Settings().paging.async_prefetch is None
    with pytest.raises(ValueError, match="not a size"):
        Settings.from_options(dict(device_budget="lots"))


def test_model_resolves_auto(smollm2_path):
    with Model(smollm2_path, ctx_size=256) as m:  # fits: resident, as before
        st = m.stats()
        assert st["budget"]["mode"] == "auto" and st["budget"]["resident"]
        assert "n_slots" not in st and m.settings.paging.async_prefetch is False
        # the read mode settled too: the file fits in the memory available, so buffered
        assert m.settings.paging.direct_io is False
    with Model(smollm2_path, ctx_size=256, device_budget="40MiB") as m:  # explicit wins; prefetch on
        st = m.stats()
        assert st["budget"]["mode"] == "explicit" and st["n_slots"] * st["slot_size"] <= 40 * MiB
        assert m.settings.paging.async_prefetch is True
    with Model(smollm2_path, ctx_size=256, device_budget="40MiB", async_prefetch=False) as m:
        assert m.settings.paging.async_prefetch is False


def test_auto_streams_when_memory_is_short(smollm2_path, monkeypatch, capfd):
    """With less memory available than the model needs, auto streams through the largest pool that fits, says
    so on stderr, and gives the resident model's logits bit for bit (resident with its weights laid as in the file,
    repack=False, as streamed blocks are)."""
    from superggml import native

    with Model(smollm2_path, ctx_size=256, device_budget="off", repack=False) as m:
        want = m.eval(m.tokenize("The capital of France is"))
        p = m.memory_plan
    # what leaves the weights 40 MiB less than they need (the headroom grows with what is available)
    avail = int(
        (p.weights - 40 * MiB + p.kv + p.compute + p.tokenizer + budget.HEADROOM_MIN) / (1 - budget.HEADROOM_SHARE)
    )
    real = native.host_memory

    def short() -> dict:
        h = dict(real())
        h["available"] = avail
        return h

    monkeypatch.setattr(native, "host_memory", short)
    with Model(smollm2_path, ctx_size=256) as m:
        plan = m.memory_plan
        assert plan.mode == "auto" and not plan.resident
        assert plan.budget == plan.available - plan.beside
        st = m.stats()
        assert st["n_slots"] * st["slot_size"] <= plan.budget
        got = m.eval(m.tokenize("The capital of France is"))
    assert np.array_equal(got, want)  # streamed and pinned blocks as resident ones laid as in the file
    err = capfd.readouterr().err
    assert "device budget auto: blocks stream" in err and "blocks pinned" in err


def test_auto_too_little_memory_is_a_clear_error(smollm2_path, monkeypatch):
    from superggml import native

    real = native.host_memory
    monkeypatch.setattr(native, "host_memory", lambda: {**real(), "available": 64 * MiB})
    with pytest.raises(ValueError, match=r"not enough memory for this model: .* which leaves .* lower ctx_size"):
        Model(smollm2_path)


def test_draft_memory_is_reserved(smollm2_path):
    with Model(smollm2_path, ctx_size=256, draft_model=smollm2_path, draft_max=2) as m:
        plan = m.memory_plan
        assert plan.reserve > plan.weights  # the draft's weights, K/V, compute and tokenizer
        assert m.create_completion("Hello", max_tokens=4, temperature=0)["choices"][0]["text"]


def test_a_draft_beside_streamed_blocks_reads_them_direct(smollm2_path, monkeypatch):
    """direct_io left to the plan: with a draft model's weights beside streamed blocks, the blocks read with
    O_DIRECT once the file outgrows what the plan leaves the page cache (buffered reads would evict the draft's
    mapped weights); without the draft, or with room for both, buffered, as before."""
    from superggml import native

    size = os.path.getsize(smollm2_path)
    kw = dict(ctx_size=256, device_budget="40MiB", draft_model=smollm2_path, draft_k=2)  # draft_k: kept
    with Model(smollm2_path, **kw) as m:  # this machine's memory: room for everything
        assert m.settings.paging.direct_io is False
        p = m.memory_plan
    # what leaves the page cache half the file beside the plan (the headroom grows with what is available)
    rest = p.kv + p.compute + p.tokenizer + p.reserve + budget.HEADROOM_MIN
    avail = int((size // 2 + p.budget + rest) / (1 - budget.HEADROOM_SHARE))
    real = native.host_memory
    monkeypatch.setattr(native, "host_memory", lambda: {**real(), "available": avail})
    with Model(smollm2_path, **kw) as m:
        assert size < m.memory_plan.available and m.settings.paging.direct_io is True
        assert m.create_completion("Hello", max_tokens=3, temperature=0)["choices"][0]["text"]
    with Model(smollm2_path, ctx_size=256, device_budget="40MiB") as m:
        assert m.settings.paging.direct_io is False


def test_a_draft_that_cannot_pay_for_its_memory_is_not_used(smollm2_path, monkeypatch, capfd):
    """Where the draft's memory is what pushes the streamed blocks out of the page cache, the cost model weighs
    plain decoding against drafting at best: a draft as large as its model never pays, so it is not loaded,
    the plan says why, and the model decodes plainly with buffered reads."""
    from superggml import native

    size = os.path.getsize(smollm2_path)
    kw = dict(ctx_size=256, device_budget="40MiB", draft_model=smollm2_path)
    with Model(smollm2_path, **kw, draft_k=2) as m:
        p = m.memory_plan
    rest = p.kv + p.compute + p.tokenizer + p.reserve + budget.HEADROOM_MIN
    avail = int((size // 2 + p.budget + rest) / (1 - budget.HEADROOM_SHARE))
    real = native.host_memory
    monkeypatch.setattr(native, "host_memory", lambda: {**real(), "available": avail})
    capfd.readouterr()
    with Model(smollm2_path, **kw) as m:
        plan = m.memory_plan
        assert plan.draft_dropped.startswith("superggml: the draft model is not used") and plan.reserve == 0
        assert m.settings.paging.direct_io is False and not m.settings.speculative.enabled
        assert m.stats()["budget"]["draft_dropped"] == plan.draft_dropped
        assert "draft_tokens" not in m.stats()
        assert m.create_completion("Hello", max_tokens=3, temperature=0)["choices"][0]["text"]
    assert "the draft model is not used" in capfd.readouterr().err


def test_the_draft_verdict_weighs_the_disk_against_the_draft():
    from superggml.runtime.plan.costs import Rates, draft_verdict

    gb = 10**9
    fast, slow = Rates(disk=20 * gb, compute=10 * gb), Rates(disk=0.5 * gb, compute=10 * gb)
    v = draft_verdict(fast, weights=1 * gb, streamed=gb // 2, draft_weights=gb // 10)
    assert v.plain == pytest.approx(10.0) and v.pays  # the reads hide behind the check's compute
    v = draft_verdict(slow, weights=1 * gb, streamed=gb // 2, draft_weights=gb // 10)
    assert not v.pays and "0.50 GB/s" in v.line()  # a second of reads per check: 5 tokens at best
    assert not draft_verdict(fast, weights=gb, streamed=0, draft_weights=gb).pays  # as large as the model


def test_disk_rate_reads_the_file(smollm2_path, tmp_path):
    from superggml.runtime.plan.costs import disk_rate

    assert disk_rate(smollm2_path, 1 << 20) > 1e6
    shm = "/dev/shm"  # tmpfs refuses O_DIRECT: the read goes buffered
    if os.path.isdir(shm) and os.access(shm, os.W_OK):
        p = os.path.join(shm, f"superggml-disk-rate-{os.getpid()}")
        try:
            with open(p, "wb") as f:
                f.write(os.urandom(1 << 20))
            assert disk_rate(p, 1 << 20) > 1e6
        finally:
            os.remove(p)


@pytest.fixture(scope="module")
def smollm2_f32(smollm2_path, tmp_path_factory):
    return str(dequantized_copy(smollm2_path, tmp_path_factory.mktemp("f32") / "smollm2-f32.gguf"))


def test_bigger_than_memory_with_no_options(smollm2_f32):
    """The 515 MiB F32 SmolLM2 in a 448 MiB cgroup (page cache dropped): `superggml generate` with no options
    streams its blocks within the limit and writes text."""
    limit = 448 * MiB
    assert os.path.getsize(smollm2_f32) > limit
    argv = [
        sys.executable,
        "-m",
        "superggml",
        "generate",
        "-m",
        smollm2_f32,
        "-p",
        "The capital of France is",
        "-n",
        "8",
        "--temp",
        "0",
        "--metrics-file",
        "/dev/stdout",
    ]
    try:
        r = memcg.run_maybe_limited(argv, smollm2_f32, limit, timeout=300)
    except (PermissionError, FileNotFoundError, OSError) as e:
        pytest.skip(f"no child memory cgroup here: {e}")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "device budget auto: blocks stream" in r.stderr
    snap = [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]
    assert snap and snap[-1]["device_budget_mode"] == "auto" and snap[-1]["device_budget_mb"] < limit / MiB


@pytest.mark.parametrize("variant", ["qwen2-bias", "qwen2moe-shared", "deepseek2-lite", "gpt-oss-8x2-q8_0"])
def test_the_compute_bound_covers_a_full_batch(tmp_path, smollm2_path, variant):
    """The plan's compute share (compute_bytes with the architecture's ffn_width: a MoE block's routed and shared
    experts, not n_ff per expert) is at least what a pass of n_batch rows over the whole context allocates."""
    import synth_gguf

    path = synth_gguf.synth(tmp_path / "m.gguf", synth_gguf.vocab_fields(smollm2_path), **synth_gguf.VARIANTS[variant])
    with Model(str(path), ctx_size=128, n_batch=64, n_threads=2) as m:
        m.eval([int(x) for x in np.random.default_rng(0).integers(0, 49152, 128)])
        used = m.runtime.backend.compute_buffer_size
        plan = m.memory_plan
        arch = m.runtime.arch
    assert plan is not None and 0 < used <= plan.compute, (used, plan.compute)
    if arch.hp.n_expert:  # the old bound, n_ff per expert used, was looser
        old = budget.compute_bytes(arch.hp, 64, 128, False)
        assert plan.compute < old or arch.hp.n_ff * arch.hp.n_expert_used <= arch.ffn_width
