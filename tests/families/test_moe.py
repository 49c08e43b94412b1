"""Mixture-of-experts models with their experts paged one by one through the expert cache (expert_cache):
logits bit-identical to all-resident runs, on synthetic GGUFs of each MoE family (synth_gguf.py)."""

from __future__ import annotations

import numpy as np
import pytest

from superggml import Model, native
from synth_gguf import VARIANTS, expert_bytes, synth, tensor_names


def run(path, prompt, **kw):
    with Model(path, ctx_size=128, n_threads=2, n_batch=8, **kw) as m:
        out = [m.eval(prompt, logits_all=True).copy()] + [m.eval([t]).copy() for t in (5, 6, 7, 8, 9)]
        return np.concatenate(out), m.stats()


@pytest.mark.parametrize(
    "variant",
    [
        "qwen3moe-8x2-q8_0",
        "qwen2moe-shared",
        "olmoe-8x2-f16",
        "mixtral-8x1",
        "gpt-oss-8x2-mxfp4",
        "glm4moe-bias-mtp",
        "mistral3-moe-8x2",
        "ernie4_5-moe-lead-shared",
        "minimax-m2-8x2",
        "llama4-8x1-step2",
        "mistral4-fused-yarn-temp",
        "granitehybrid-8x2-shared",
        "step35-4",
        "nemotron_h_moe-8x2",
        "gemma4-8x2-kv",
        "gemma4-8x2-fused-pl",
        "deepseek32-dsa",
        "glm-dsa-shared",
        "mimo2-swa-sinks",
        "minimax-m3-dense1",
        "hy_v3-mtp",
        "hy_v4-hc4",
        "dots3note-sparse-swa",
        "glm5-next-kpool-shared",
        "qwen4exp-qsa-ple",
    ],
)
def test_expert_cache_of_a_quarter_is_bit_identical_to_resident(tmp_path, small_vocab, variant):
    """4 layers x 8 experts (less any leading dense blocks); a cache of 25% of the expert bytes (2 slots per MoE
    block) evicts all the time."""
    path = synth(tmp_path / f"{variant}.gguf", small_vocab, **{**VARIANTS[variant], "n_layer": 4})
    prompt = [int(x) for x in np.random.default_rng(4).integers(0, 1024, 40)]
    ref, st_ref = run(path, prompt)
    assert not any(k.startswith("expert_") for k in st_ref)
    got, st = run(path, prompt, expert_cache=expert_bytes(path) // 4)
    assert np.array_equal(got, ref)
    moe_blocks = sum(n.endswith("ffn_down_exps.weight") for n in tensor_names(path))
    assert st["expert_slots"] == 2 * moe_blocks and st["expert_misses"] > 0 and st["expert_evictions"] > 0
    assert st["expert_bytes_loaded"] >= st["expert_misses"] * st["expert_slot_size"] * 0.9


@pytest.mark.parametrize("variant", ["qwen3moe-8x2-q8_0", "qwen2moe-shared", "gpt-oss-8x2-mxfp4"])
def test_expert_cache_smaller_than_a_batch_runs_its_experts_in_row_chunks(tmp_path, vocab_fields, variant):
    """3 slots of 2-of-8 routing: a batch of 8 rows may route to all 8 experts of a block, more than the cache
    pins at once, so the experts graphs run over one row at a time. Still bit-identical to resident."""
    path = synth(tmp_path / f"{variant}.gguf", vocab_fields, **{**VARIANTS[variant], "n_layer": 4})
    prompt = [int(x) for x in np.random.default_rng(8).integers(0, 49152, 40)]
    ref, _ = run(path, prompt)
    slot = expert_bytes(path) // 32
    got, st = run(path, prompt, expert_cache=3 * slot + slot // 2)
    assert np.array_equal(got, ref)
    assert st["expert_slots"] == 3 and st["expert_evictions"] > 0


def test_expert_cache_with_streamed_blocks_and_paged_kv(tmp_path, vocab_fields):
    path = synth(tmp_path / "moe.gguf", vocab_fields, **{**VARIANTS["qwen3moe-8x2-q8_0"], "n_layer": 4})
    prompt = [int(x) for x in np.random.default_rng(5).integers(0, 49152, 40)]
    ref, _ = run(path, prompt)
    got, st = run(
        path,
        prompt,
        expert_cache=expert_bytes(path) // 4,
        n_gpu_layers=0,
        async_prefetch=True,
        paged_kv=True,
        kv_page_size=16,
        kv_device_layers=1,
    )
    assert np.array_equal(got, ref)
    assert st["loads"] > 0 and st["kv_pages_loaded"] > 0 and st["expert_misses"] > 0


def test_expert_cache_errors(tmp_path, vocab_fields):
    path = synth(tmp_path / "moe.gguf", vocab_fields, **VARIANTS["qwen3moe-8x2-q8_0"])
    with pytest.raises(ValueError, match="expert_cache of .* holds 1 experts"):
        Model(path, expert_cache=expert_bytes(path) // 16)
    dense = synth(tmp_path / "dense.gguf", vocab_fields, **VARIANTS["llama-tied"])
    with pytest.raises(ValueError, match="expert_cache applies to mixture-of-experts models"):
        Model(dense, expert_cache="1MiB")
    with pytest.raises(ValueError, match="expert_cache must be a positive size"):
        Model(path, expert_cache=0)


def test_router_lookahead_prefetches_the_next_blocks_experts(tmp_path, vocab_fields):
    """The next block's router applied to this block's FFN input predicts its experts; they load while this
    block computes. Results are unchanged, the loads a step waits for fall, and the guesses are measured."""
    path = synth(tmp_path / "moe.gguf", vocab_fields, **{**VARIANTS["qwen3moe-8x2-q8_0"], "n_layer": 4})
    prompt = [int(x) for x in np.random.default_rng(6).integers(0, 49152, 40)]
    ref, _ = run(path, prompt)
    off, st_off = run(path, prompt, expert_cache=expert_bytes(path) // 2, expert_lookahead=False)
    on, st_on = run(path, prompt, expert_cache=expert_bytes(path) // 2, expert_lookahead=True)
    assert np.array_equal(off, ref) and np.array_equal(on, ref)
    assert st_off["expert_prefetches"] == 0 and st_off["expert_lookahead_recall"] == 0.0
    assert st_on["expert_prefetch_hits"] > 0 and st_on["expert_misses"] < st_off["expert_misses"]
    assert 0 < st_on["expert_lookahead_precision"] <= 1 and 0 < st_on["expert_lookahead_recall"] <= 1


def test_metrics_report_the_expert_cache(tmp_path, vocab_fields):
    from metrics_lines import valid_lines

    path = synth(tmp_path / "moe.gguf", vocab_fields, **{**VARIANTS["qwen3moe-8x2-q8_0"], "n_layer": 4})
    out = tmp_path / "m.jsonl"
    with Model(
        path, ctx_size=128, n_threads=2, n_batch=8, expert_cache=expert_bytes(path) // 4, metrics_file=str(out)
    ) as m:
        m.create_completion("Once upon a time", max_tokens=6, temperature=0)
    lines = valid_lines(out)
    snaps = [x for x in lines if "tokens_per_sec" in x]
    assert snaps and snaps[-1]["expert_slots"] == 8 and snaps[-1]["expert_misses"] > 0
    assert any(x.get("kind") == "experts" for x in lines)


def test_device_budget_plans_the_dense_part_first_then_the_expert_cache(tmp_path, vocab_fields):
    """No expert_cache given: a MoE model under a device_budget pins its blocks without their experts and gives
    the rest of the budget to the expert cache."""
    path = synth(tmp_path / "moe.gguf", vocab_fields, **{**VARIANTS["qwen3moe-8x2-q8_0"], "n_layer": 4})
    prompt = [int(x) for x in np.random.default_rng(7).integers(0, 49152, 40)]
    ref, _ = run(path, prompt)
    with Model(path, ctx_size=128, n_batch=8, expert_cache=expert_bytes(path)) as m:
        slot = m.stats()["expert_slot_size"]
    with Model(path, ctx_size=128, n_batch=8, device_budget="64MiB", async_prefetch=True) as m:
        # host slots: what the pinned blocks hold counts, not their slots (a slot's untouched rest costs nothing)
        dense = m.stats()["pinned_bytes"]
        assert dense < m.stats()["n_slots"] * m.stats()["slot_size"]
    got, st = run(path, prompt, device_budget=dense + 8 * slot, async_prefetch=True)
    assert np.array_equal(got, ref)
    assert st["layers_pinned"] == st["n_slots"] and st["expert_slots"] == 8 and st["expert_misses"] > 0
    assert st["expert_prefetches"] > 0  # every block pinned: the router lookahead runs
    # less than the dense part and one batch's experts: the dense part streams through the fewest slots, the
    # cache gets the rest and a batch runs its experts in row chunks
    got, st = run(path, prompt, device_budget=8 * slot, async_prefetch=True)
    assert np.array_equal(got, ref)
    assert st["layers_pinned"] < 4 and st["loads"] > 0 and 2 <= st["expert_slots"] < 8
    with pytest.raises(ValueError, match="cannot hold .* blocks without their experts"):
        Model(path, ctx_size=128, n_batch=8, device_budget=slot)


def test_an_automatic_plan_lends_its_untouched_kv_and_compute_to_the_expert_cache(tmp_path, vocab_fields, monkeypatch):
    """The automatic plan counts a full context's K/V and a full batch's compute, which a short decode never
    touches: the expert cache holds that much more, in slots past its budget (never more than the experts),
    and gives them back before a pass may touch the memory (here a 63-row prompt's compute). Logits stay
    bit-identical to resident."""
    from superggml.runtime.plan import memory_plan as mp

    path = synth(
        tmp_path / "moe.gguf", vocab_fields, **{**VARIANTS["qwen3moe-8x2-q8_0"], "n_layer": 4, "n_ff_exp": 256}
    )
    prompt = [int(x) for x in np.random.default_rng(7).integers(0, 49152, 64)]
    kw = dict(ctx_size=1024, n_batch=32, n_threads=2)

    def go(m):
        out, lent = [m.eval(prompt[:1]).copy()], [m.stats().get("expert_slots_lent")]
        out.append(m.eval(prompt[1:]).copy())
        lent.append(m.stats().get("expert_slots_lent"))
        out += [m.eval([t]).copy() for t in range(5, 12)]
        return np.concatenate(out), lent

    with Model(path, device_budget="off", **kw) as m:
        p = m.memory_plan
        ref, _ = go(m)
    # half the weights fit
    avail = int((p.weights // 2 + p.kv + p.compute + p.tokenizer + mp.HEADROOM_MIN) / (1 - mp.HEADROOM_SHARE))
    real = native.host_memory
    monkeypatch.setattr(native, "host_memory", lambda: {**real(), "available": avail})
    with Model(path, **kw) as m:
        plan, st = m.memory_plan, m.stats()
        assert plan.mode == "auto" and not plan.resident
        n, slot, lent = st["expert_slots"], st["expert_slot_size"], st["expert_slots_lent"]
        assert n == 4 * 8 and 0 < lent <= (mp.kv_bytes(m.hparams, 1024, "f16", "f16") + plan.compute) // slot
        got, lents = go(m)
        st = m.stats()
        m.save_sequence(tmp_path / "seq.bin")
        nxt = m.eval([12]).copy()
    assert np.array_equal(got, ref)
    assert lents[0] == lent and 0 <= lents[1] < lent  # the prompt's compute was owed back
    assert st["expert_slots_active"] == n - lent + lents[1] and st["expert_slots_used"] <= st["expert_slots_active"]
    with Model(path, **kw) as m:  # a saved sequence's K/V is owed back before it is written
        assert m.stats()["expert_slots_lent"] == lent
        m.load_sequence(tmp_path / "seq.bin")
        assert m.stats()["expert_slots_lent"] <= lent
        assert np.array_equal(m.eval([12]), nxt)


def test_the_loan_owes_what_a_pass_may_touch():
    """Each sequence's farthest position times the K/V per token, a begun page per layer, and the compute bound of
    the most rows so far; never more than the loan, and once all of it is owed, all of it stays owed."""
    from types import SimpleNamespace

    from superggml.runtime.plan import memory_plan as mp
    from superggml.settings import ContextSettings

    hp = SimpleNamespace(
        n_layer=2,
        n_layer_kv=0,
        n_embd=64,
        n_embd_gqa=32,
        n_embd_v_gqa=32,
        n_ff=128,
        n_expert_used=2,
        n_expert=8,
        n_head=4,
        n_vocab=100,
        state_bytes=0,
    )
    c = ContextSettings(ctx_size=1024, n_batch=64, cache_type_k="f16", cache_type_v="f16", flash_attn=False)
    plan = mp.plan_memory(hp, 1 << 30, c, "auto", 1 << 30)  # type: ignore[arg-type]
    loan = mp.ExpertLoan.of(plan, hp, c, None)  # type: ignore[arg-type]
    assert loan is not None and loan.size == mp.kv_bytes(hp, 1024, "f16", "f16") + plan.compute
    per_token, page = 2 * 2 * 32 * 2, 2 * 2 * 4096
    assert loan.owed({0: 10}, 1) == 10 * per_token + page + mp.compute_bytes(hp, 1, 1024, False)
    assert loan.owed({0: 5, 1: 20}, 1) == 30 * per_token + 2 * page + mp.compute_bytes(hp, 1, 1024, False)
    assert loan.owed({1: 20}, 64) == 30 * per_token + 2 * page + plan.compute
    assert loan.owed({0: 100_000}, 1) == loan.size and loan.owed({}, 1) == loan.size
    assert mp.ExpertLoan.of(mp.plan_memory(hp, 1 << 20, c, "auto", 1 << 30), hp, c, None) is None  # resident


LIMITED_MOE = r"""
import resource, sys
import numpy as np
from superggml import Model, native
path, budget, out = sys.argv[1], sys.argv[2], sys.argv[3]
kw = dict(ctx_size=256, n_threads=2, n_batch=32)
if budget != "none":
    kw.update(device_budget=budget, async_prefetch=True, direct_io=False)
toks = [(i * 97) % 20000 + 100 for i in range(16)]
with Model(path, **kw) as m:
    logits = [m.eval(toks)[-1].copy()]
    for _ in range(16):
        logits.append(m.eval([int(np.argmax(logits[-1]))])[-1].copy())
    misses = m.stats().get("expert_misses", 0)
np.save(out, np.stack(logits))
anon = next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("RssAnon:"))
print("maxrss", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "anon", anon, "misses", misses)
"""


@pytest.mark.slow
def test_peak_rss_in_a_cgroup_stays_under_budget_plus_128_mib(tmp_path, vocab_fields):
    """A 334 MiB MoE GGUF (204 MiB of experts) decodes with a 64 MiB device budget inside a memory cgroup of
    64 + 128 MiB without being OOM-killed, and its logits equal an unlimited resident run's. Everything the
    process allocates is charged to that cgroup, so its memory stays under budget + 128 MiB; ru_maxrss is printed
    too, but it also counts file pages other processes brought into the page cache (154 MiB when the file's pages
    were dropped first; more when they were not)."""
    import subprocess
    import sys

    import memcg

    path = synth(
        tmp_path / "moe-big.gguf",
        vocab_fields,
        arch="qwen3moe",
        tied=False,
        n_layer=8,
        n_embd=512,
        n_ff=512,
        n_ff_exp=512,
        n_expert=32,
        n_expert_used=4,
        wtype="q8_0",
        n_head=8,
        n_head_kv=4,
    )
    ref = subprocess.run(
        [sys.executable, "-c", LIMITED_MOE, path, "none", str(tmp_path / "ref.npy")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert ref.returncode == 0, ref.stderr[-2000:]
    limit = (64 + 128) << 20
    memcg.drop_page_cache(path)
    try:
        r = memcg.run_limited(
            [sys.executable, "-c", LIMITED_MOE, path, "64MiB", str(tmp_path / "lim.npy")], limit, timeout=600
        )
    except (OSError, PermissionError) as e:
        pytest.skip(f"cannot make a child memory cgroup here: {e}")
    assert r.returncode == 0, r.stderr[-2000:]
    words = r.stdout.split()
    maxrss, anon, misses = (int(words[words.index(k) + 1]) for k in ("maxrss", "anon", "misses"))
    print(
        f"\npeak RSS {maxrss / 2**20:.0f} MiB, anonymous {anon / 2**20:.0f} MiB in a {limit >> 20} MiB cgroup, "
        f"{misses} expert misses"
    )
    assert anon < limit and misses > 0
    assert np.array_equal(np.load(tmp_path / "lim.npy"), np.load(tmp_path / "ref.npy"))


@pytest.mark.parametrize("variant", ["qwen3moe-8x2", "olmoe-8x2-f16"])
def test_expert_cache_reads_with_o_direct(tmp_path, vocab_fields, variant):
    """direct_io: the experts of layers whose strides are whole O_DIRECT blocks (F32 [256, 64]: 64 KiB) read
    with O_DIRECT into slots laid out in the file's alignment; still bit-identical."""
    path = synth(
        tmp_path / "moe.gguf",
        vocab_fields,
        **{**VARIANTS[variant], "n_layer": 4, "n_embd": 256, "n_ff": 64, "n_ff_exp": 64},
    )
    prompt = [int(x) for x in np.random.default_rng(9).integers(0, 49152, 20)]
    ref, _ = run(path, prompt)
    got, st = run(path, prompt, expert_cache=expert_bytes(path) // 4, direct_io=True)
    assert np.array_equal(got, ref)
    assert st["expert_misses"] > 0 and st["expert_direct_loads"] == st["expert_misses"] + st["expert_prefetches"]
    assert st["expert_slot_size"] % 4096 == 0


@pytest.mark.parametrize("direct_io", [False, True])
@pytest.mark.parametrize("variant", ["qwen3moe-8x2", "olmoe-8x2-f16"])
def test_expert_cache_fed_from_the_host_tier(tmp_path, vocab_fields, variant, direct_io):
    """staged_io (the device path on the CPU) with a host tier that holds every expert: the experts are read from
    the file once, into the tier (O_DIRECT where the layout allows), and copied from there on every later miss;
    bit-identical to resident. The second run of the prompt reads nothing from the file."""
    path = synth(
        tmp_path / "moe.gguf",
        vocab_fields,
        **{**VARIANTS[variant], "n_layer": 4, "n_embd": 256, "n_ff": 64, "n_ff_exp": 64},
    )
    prompt = [int(x) for x in np.random.default_rng(9).integers(0, 49152, 20)]
    ref, _ = run(path, prompt)
    kw = dict(expert_cache=expert_bytes(path) // 4, staged_io=True, host_cache="256MiB", direct_io=direct_io)
    with Model(path, ctx_size=128, n_threads=2, n_batch=8, **kw) as m:
        first = [m.eval(prompt, logits_all=True).copy()] + [m.eval([t]).copy() for t in (5, 6, 7, 8, 9)]
        st1 = m.stats()
        m.reset()
        again = [m.eval(prompt, logits_all=True).copy()] + [m.eval([t]).copy() for t in (5, 6, 7, 8, 9)]
        st = m.stats()
    assert np.array_equal(np.concatenate(first), ref) and np.array_equal(np.concatenate(again), ref)
    assert st["expert_tier_slots"] == 8 * 4  # every expert of the 4 MoE blocks
    assert st["expert_misses"] > st1["expert_misses"] and st["expert_tier_hits"] > 0
    assert st["expert_file_bytes"] == st1["expert_file_bytes"] > 0  # nothing read from the file again
    assert st["expert_bytes_loaded"] == st["expert_file_bytes"] + st["expert_tier_bytes"]
    if direct_io:
        assert st["expert_direct_loads"] > 0
    # ggml-cuda reads the expert stride (the slot) in whole blocks of each matrix's type: staged slots, as a GPU's
    f = native.GGUFFile(path)
    types = {t[1] for t in f.tensors() if "_exps." in t[0]}
    assert all(st["expert_slot_size"] % native.type_size(getattr(native.GGMLType, t.upper())) == 0 for t in types), (
        types
    )


def test_analyze_predicts_a_moe_budget_as_the_executor_splits_it(tmp_path, vocab_fields):
    """analyze's MoE plan: the expert cache and pinned blocks the executor gives a device_budget, and the bytes
    per token at a hit rate (uniform routing's by default: the cache's share of the experts)."""
    from superggml.commands.analyze import analyze, format_analysis, model_layout, plan_moe_budget

    path = synth(tmp_path / "moe.gguf", vocab_fields, **{**VARIANTS["qwen3moe-8x2-q8_0"], "n_layer": 4})
    lay = model_layout(path)
    es = lay.expert_bytes
    for budget in (lay.file_bytes, 8 * es + 3 * lay.dense_slot_bytes):
        with Model(path, ctx_size=128, n_batch=8, device_budget=budget, async_prefetch=True) as m:
            st = m.stats()
        plan = plan_moe_budget(lay, budget, n_batch=8)
        assert plan.pinned_blocks == min(st["layers_pinned"], lay.n_layer)
        assert plan.expert_cache_bytes // es == st["expert_slots"]
        assert plan.expert_hit_rate == pytest.approx(min(1.0, st["expert_slots"] / (4 * 8)))
    half, full = (plan_moe_budget(lay, lay.file_bytes, hit_rate=h) for h in (0.5, 1.0))
    assert half.streamed_bytes - full.streamed_bytes == lay.expert_stream_bytes(0.5) == 4 * 2 * es // 2
    text = format_analysis(analyze(path, [lay.file_bytes // 2], n_threads=1, measure=False, hit_rate=0.9))
    assert "expert cache MiB" in text and " 90%" in text


def test_lookahead_auto_times_both_and_keeps_the_faster(tmp_path, vocab_fields, monkeypatch):
    """expert_lookahead "auto" (the default): the first decoded tokens run in phases with the lookahead on and off,
    timed; then the faster stays. The logits never change."""
    from superggml.runtime.weights import pagers as layers

    monkeypatch.setattr(layers, "LOOKAHEAD_WARMUP", 2)
    monkeypatch.setattr(layers, "LOOKAHEAD_PHASE", 3)
    path = synth(tmp_path / "moe.gguf", vocab_fields, **{**VARIANTS["qwen3moe-8x2-q8_0"], "n_layer": 4})
    toks = [int(x) for x in np.random.default_rng(10).integers(0, 49152, 24)]
    outs, states = [], []
    for kw in ({}, dict(expert_cache=expert_bytes(path) // 2)):
        with Model(path, ctx_size=64, n_threads=2, n_batch=8, **kw) as m:
            out = [m.eval(toks[:4]).copy()]
            for t in toks[4:]:
                out.append(m.eval([t]).copy())
                states.append(m.stats().get("expert_lookahead"))
            outs.append(np.concatenate(out))
            st = m.stats()
    assert np.array_equal(outs[0], outs[1])
    assert states[20:33] == ["trial"] * 13 and states[33] in ("on", "off")  # 2 + 4 x 3 decoded tokens
    assert states[-1] == states[33]
    assert st["expert_lookahead_trial_ms_on"] > 0 and st["expert_lookahead_trial_ms_off"] > 0
    assert (states[-1] == "on") == (st["expert_lookahead_trial_ms_on"] < 0.95 * st["expert_lookahead_trial_ms_off"])
