"""Multi-head latent attention (deepseek2: DeepSeek-V2/V3, Kimi-K2, GLM-4.7-Flash) beyond the logits parity that
test_arch checks for every variant: the latent K/V's size, streamed blocks and the expert cache, batches and
speculative rollback over the latent memory."""

from __future__ import annotations

import numpy as np
import pytest

from batching import batch_gap, batch_prompts
from superggml import Model
from synth_gguf import VARIANTS, expert_bytes, metadata_value, synth
from prompts import greedy
from cli_runner import run_cli

MLA = [v for v in VARIANTS if VARIANTS[v]["arch"] == "deepseek2" and not VARIANTS[v].get("legacy")]


def field(path, key):
    return metadata_value(path, f"deepseek2.{key}")


@pytest.mark.parametrize("variant", MLA)
def test_latent_cache_holds_one_row_of_kv_lora_rank_plus_rope_per_token_and_layer(tmp_path, vocab_fields, variant):
    """As llama.cpp's: (kv_lora_rank + n_rot) F16 values per token and layer, no V."""
    path = synth(tmp_path / f"{variant}.gguf", vocab_fields, **VARIANTS[variant])
    row = field(path, "attention.kv_lora_rank") + field(path, "rope.dimension_count")
    with Model(path, ctx_size=256, n_threads=2) as m:
        assert m.kv_bytes == 256 * m.hparams.n_layer * row * 2  # the MTP block, if any, has a memory of its own
        m.eval([1, 2, 3])


@pytest.mark.parametrize("variant", MLA)
def test_streamed_blocks_and_expert_cache_are_bit_identical_to_resident(tmp_path, vocab_fields, variant):
    """4 blocks, the first with a dense FFN: streamed through 2 slots, with a quarter of the experts cached, and
    both at once under a small device budget."""
    path = synth(tmp_path / f"{variant}.gguf", vocab_fields, **{**VARIANTS[variant], "n_layer": 4})
    prompt = [int(x) for x in np.random.default_rng(2).integers(0, 49152, 40)]
    experts = expert_bytes(path)

    def run(**kw):
        with Model(path, ctx_size=128, n_threads=2, n_batch=8, repack=False, **kw) as m:
            out = [m.eval(prompt, logits_all=True).copy()] + [m.eval([t]).copy() for t in (5, 6, 7)]
            return np.concatenate(out), m.stats()

    ref, _ = run()
    streamed, st = run(n_gpu_layers=0, async_prefetch=True, prefetch_depth=1)
    assert st["n_slots"] == 2 and st["loads"] > 0
    assert np.array_equal(streamed, ref)
    cached, st = run(expert_cache=experts // 4)
    assert st["expert_misses"] > 0 and st["expert_evictions"] > 0
    assert np.array_equal(cached, ref)
    both, st = run(n_gpu_layers=0, expert_cache=experts // 4, prefetch_depth=1)
    assert st["loads"] > 0 and st["expert_misses"] > 0
    assert np.array_equal(both, ref)


@pytest.mark.parametrize("variant", ["deepseek2-lite"])
def test_a_batch_equals_each_sequence_alone(tmp_path, vocab_fields, variant):
    """batch_invariant: prompts of different lengths in shared passes, then decode steps that attend at once
    (consecutive slots), as each sequence alone: the same greedy tokens, and the logits as close to each alone as
    llama.cpp's batch is to its own (BatchGap.check). The 17-token prompt is cut 16 + 1 alone and 7 + 10 in the
    shared passes, and ggml-cpu's kernels round by the shape of a pass: 6.5e-4 at its last token with AVX2
    kernels (1.9e-6 with n_batch=64, where both cuts are whole)."""
    path = synth(tmp_path / f"{variant}.gguf", vocab_fields, **VARIANTS[variant])
    prompts = batch_prompts()
    with Model(path, ctx_size=128, n_threads=2, n_batch=16, batch_invariant=True) as m:
        gap = batch_gap(m, path, prompts, 4)
        assert m.stats()["stream_passes"] > 0
    gap.check(variant)


def test_speculative_rollback_over_the_latent_memory_is_exact(tmp_path, vocab_fields):
    """Prompt lookup drafts 4 tokens a step; rejected ones are truncated from the latent K/V and written again:
    the greedy text equals plain decoding."""
    path = synth(tmp_path / "mla.gguf", vocab_fields, **VARIANTS["deepseek2-v3-groups-yarn"])
    prompt = "a b c d e f g a b c d e f g a b c d"
    kw = dict(ctx_size=256, n_threads=2, batch_invariant=True)

    with Model(path, **kw) as m:
        plain = greedy(m, prompt, 32)
    with Model(path, lookup_ngram=2, draft_k=4, **kw) as m:
        assert greedy(m, prompt, 32) == plain
        st = m.stats()
        assert st["draft_tokens"] > 0 and st["draft_accepted"] < st["draft_tokens"]  # rollbacks happened


@pytest.mark.parametrize("variant", ["deepseek2-lite", "deepseek2-glm47flash"])
def test_paged_latent_kv_is_bit_identical_to_contiguous(tmp_path, vocab_fields, variant, tmp_path_factory):
    """Pages of 16 tokens of K only, one layer's frame on the device, a host budget of a few pages and a spill
    file; with batches over several sequences too."""
    path = synth(tmp_path / f"{variant}.gguf", vocab_fields, **VARIANTS[variant])
    prompt = [int(x) for x in np.random.default_rng(5).integers(0, 49152, 40)]
    spill = tmp_path_factory.mktemp("spill")

    def run(**kw):
        with Model(path, ctx_size=128, n_threads=2, n_batch=16, **kw) as m:
            out = [m.eval(prompt, logits_all=True).copy()] + [m.eval([t]).copy() for t in (5, 6, 7)]
            two = m.eval_batch([(1, prompt[:9]), (2, prompt[:23])])
            return np.concatenate(out + [r[-1:] for r in two]), m.stats()

    ref, st = run()
    row = field(path, "attention.kv_lora_rank") + field(path, "rope.dimension_count")
    paged, st = run(
        paged_kv=True, kv_page_size=16, kv_device_layers=1, host_budget=6 * 16 * row * 2, kv_spill_dir=str(spill)
    )
    assert st["kv_pages_loaded"] > 0 and st["kv_pages_spilled"] > 0
    assert st["kv_frame_bytes"] == 128 * row * 2  # K only
    assert np.array_equal(paged, ref)


def test_the_legacy_layout_caches_every_heads_k_and_v(tmp_path, vocab_fields):
    """attn_kv_b (no key_length_mla): llama.cpp's plain path, K heads of 48 and V heads of 32 per token and layer
    (logits, streaming and paged K/V: test_arch); a V narrower than K, paged with a host tier and a spill file."""
    path = synth(tmp_path / "legacy.gguf", vocab_fields, **VARIANTS["deepseek2-lite-legacy"])
    prompt = [int(x) for x in np.random.default_rng(7).integers(0, 49152, 40)]
    with Model(path, ctx_size=256, n_threads=2, n_batch=16) as m:
        assert m.kv_bytes == 256 * 3 * 4 * (48 + 32) * 2
        ref = m.eval(prompt, logits_all=True).copy()
    with Model(
        path,
        ctx_size=256,
        n_threads=2,
        n_batch=16,
        paged_kv=True,
        kv_page_size=16,
        kv_device_layers=1,
        host_budget=4 * 16 * 4 * (48 + 32) * 2,
        kv_spill_dir=str(tmp_path),
    ) as m:
        assert np.array_equal(m.eval(prompt, logits_all=True), ref)
        st = m.stats()
        assert st["kv_frame_bytes"] == 256 * 4 * (48 + 32) * 2 and st["kv_pages_spilled"] > 0


def test_analyze_shows_the_latent_layout_the_groups_and_the_cache_per_token(tmp_path, vocab_fields, capsys):
    import json

    path = synth(tmp_path / "v3.gguf", vocab_fields, **VARIANTS["deepseek2-v3-groups-yarn"])
    out = run_cli(capsys, "analyze", "-m", path, "--json", "--no-measure", "--device-budget", "1MiB").out
    lay = json.loads(out)["layout"]
    assert lay["kv_bytes_per_token"] == 3 * (32 + 16) * 2 and lay["n_moe_layers"] == 2
    out = run_cli(capsys, "analyze", "-m", path, "--no-measure", "--device-budget", "1MiB").out
    assert "multi-head latent attention: 4 heads of 48 (K) and 32 (V)" in out and "kv_lora_rank 32 + rope 16" in out
    assert "sigmoid gating with exp_probs_b, chosen within 2 of 4 expert groups" in out


@pytest.mark.parametrize("flash_attn", [True])
def test_a_q8_0_latent_cache_matches_llama_cpp(tmp_path, vocab_fields, flash_attn):
    """-ctk q8_0 -ctv q8_0, as llama.cpp takes it for MLA (one type for the one cache, flash attention, no
    rotations): the prompt's logits and 3 decoded tokens', bit for bit."""
    import llama_ref

    path = synth(
        tmp_path / "q8kv.gguf", vocab_fields, **{**VARIANTS["deepseek2-lite"], "kv_lora_rank": 64, "qk_rope": 32}
    )  # 64 and 96: blocks of 32
    prompt = [int(x) for x in np.random.default_rng(1).integers(0, 49152, 40)]
    q8 = 8  # GGML_TYPE_Q8_0
    ref = llama_ref.run(
        {"kind": "kv_types", "model": path, "prompt": prompt, "n_decode": 3, "configs": [(q8, q8, flash_attn)]}
    )["logits0"]
    with Model(path, ctx_size=512, n_threads=2, flash_attn=flash_attn, kv_type="q8_0") as m:
        assert m.kv_bytes == 512 * 3 * 96 // 32 * 34
        rows = [m.eval(prompt, logits_all=True).copy()]
        for _ in range(3):
            rows.append(m.eval([int(rows[-1][-1].argmax())])[-1:].copy())
    assert np.array_equal(np.concatenate(rows), ref)


def test_latent_cache_types_are_checked_as_llama_cpp_checks_them(tmp_path, vocab_fields):
    path = synth(tmp_path / "mla.gguf", vocab_fields, **VARIANTS["deepseek2-lite"])
    with pytest.raises(ValueError, match=r"cache_type_k \(q8_0\) and cache_type_v \(f16\) must be the same"):
        Model(path, ctx_size=128, cache_type_k="q8_0")
    path = synth(tmp_path / "mla48.gguf", vocab_fields, **{**VARIANTS["deepseek2-lite"], "kv_lora_rank": 48})
    with pytest.raises(ValueError, match="latent V of 48 does not divide"):  # K: 48 + 16 would
        Model(path, ctx_size=128, kv_type="q8_0", flash_attn=True)
