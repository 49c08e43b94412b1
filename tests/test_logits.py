"""Teacher-forced logits against llama.cpp (llama-cpp-python 0.3.36, live, in a child process).

Both engines see the same token ids (tokenized by llama.cpp) and return the
logits of every position. What was found:
- SmolLM2 (Q4_1/Q8_0): with the pinned ggml built as llama.cpp builds its own
  (native ISA, llamafile sgemm, OpenMP: scripts/install.sh), superggml's
  logits are bit-identical to llama.cpp's, batched and token by token.
- Qwen2.5 (Q4_K/Q6_K): differences up to ~0.8, the size of llama.cpp's own
  batched-vs-token-by-token difference: the K-quant kernels changed between
  ggml 0.20.2 (pinned) and the 0.25.3 inside llama-cpp-python 0.3.36, and these
  small quantized models amplify rounding (a float64 forward pass of the same
  weights is ~12 logits from both engines at worst, with the same mean error).
So the general test holds superggml to llama.cpp's own consistency: within
1.5x llama.cpp's batched-vs-token-by-token distance, top-1 differing only
where llama.cpp's top-2 margin is inside that noise floor.
"""

from __future__ import annotations

import numpy as np
import pytest

import llama_ref
from prompts import PROMPTS
from superggml import Model

N_POS = 64


@pytest.fixture(scope="module")
def reference(model_path):
    tok = llama_ref.run({"kind": "tokenize", "model": model_path,
                         "items": [[p, True, True] for p in PROMPTS]})
    prompts = [[int(x) for x in tok[f"ids{i}"][:N_POS]] for i in range(len(PROMPTS))]
    assert all(len(p) == N_POS for p in prompts)
    batch = llama_ref.run({"kind": "logits", "model": model_path, "prompts": prompts})
    seq = llama_ref.run({"kind": "logits", "model": model_path, "prompts": prompts, "one_by_one": True})
    return prompts, [batch[f"logits{i}"] for i in range(len(prompts))], [seq[f"logits{i}"] for i in range(len(prompts))]


@pytest.fixture(scope="module")
def ours(model_path, reference):
    prompts = reference[0]
    with Model(model_path, ctx_size=256, n_threads=2) as m:
        out = []
        for p in prompts:
            m.reset()
            out.append(m.eval(p, logits_all=True).copy())
    return out


def test_teacher_forced_logits_match_llama_cpp(model_path, reference, ours, record_property):
    prompts, batch, seq = reference
    noise = max(float(np.abs(b - s).max()) for b, s in zip(batch, seq))
    diff = max(float(np.abs(o - b).max()) for o, b in zip(ours, batch))
    mean = float(np.mean([np.abs(o - b).mean() for o, b in zip(ours, batch)]))
    flips = []
    for o, b in zip(ours, batch):
        top2 = np.sort(b, axis=1)[:, -2:]
        margin = top2[:, 1] - top2[:, 0]
        for j in np.where(o.argmax(1) != b.argmax(1))[0]:
            flips.append(float(margin[j]))
    record_property("max_abs_logit_diff", diff)
    record_property("llama_cpp_self_noise", noise)
    print(f"\n{model_path}: max|dlogit| superggml vs llama.cpp = {diff:.4f} (mean {mean:.5f}); "
          f"llama.cpp batch vs one-by-one = {noise:.4f}; top-1 flips at margins {flips}")
    assert all(o.shape == (N_POS, b.shape[1]) for o, b in zip(ours, batch))
    assert diff <= max(0.05, 1.5 * noise)
    floor = max(0.05, noise)
    assert all(m < floor for m in flips), f"top-1 differs where llama.cpp is sure: margins {flips}"
    # and far more often agrees than not
    assert len(flips) <= 0.03 * N_POS * len(prompts)


def test_same_kernels_give_llama_cpp_logits(model_path, smollm2_path, reference, record_property):
    """Where superggml's ggml was built with the same instruction sets and options as llama.cpp's
    (bash scripts/install.sh does that), SmolLM2's logits equal llama.cpp's: batched prefill to
    batched prefill, token-by-token to token-by-token."""
    from superggml import _core

    if model_path != smollm2_path:
        pytest.skip("Q4_K/Q6_K kernels changed between ggml 0.20.2 (pinned) and 0.25.3 (llama-cpp-python "
                    "0.3.36): Qwen2.5 is held to llama.cpp's noise floor above instead")
    ours_f, ref_f = _core.cpu_features(), llama_ref.cpu_features()
    differ = {k: (v, ref_f.get(k)) for k, v in ours_f.items() if ref_f.get(k) != v}
    if differ:
        pytest.skip(f"ggml builds differ (superggml, llama.cpp): {differ}; "
                    "build the pinned ggml as llama.cpp does: bash scripts/install.sh")
    prompts, batch, seq = reference
    d_batch = d_seq = 0.0
    with Model(smollm2_path, ctx_size=256, n_threads=2) as m:
        for p, b, s in zip(prompts, batch, seq):
            m.reset()
            d_batch = max(d_batch, float(np.abs(m.eval(p, logits_all=True) - b).max()))
            m.reset()
            one = np.concatenate([m.eval([t]) for t in p])
            d_seq = max(d_seq, float(np.abs(one - s).max()))
    record_property("max_abs_logit_diff_batched", d_batch)
    record_property("max_abs_logit_diff_token_by_token", d_seq)
    print(f"\nSmolLM2 max|dlogit| vs llama.cpp: batched {d_batch:.6f}, token by token {d_seq:.6f}")
    assert d_batch <= 0.05 and d_seq <= 0.05


def test_evaluation_is_deterministic_and_batching_is_consistent(smollm2_path):
    prompt = list(range(100, 164))
    with Model(smollm2_path, ctx_size=128, n_threads=2) as m:
        batch = m.eval(prompt, logits_all=True).copy()
        m.reset()
        again = m.eval(prompt, logits_all=True).copy()
        m.reset()
        one = np.concatenate([m.eval([t]) for t in prompt])
    with Model(smollm2_path, ctx_size=128, n_threads=2, n_batch=16) as m2:
        chunked = m2.eval(prompt, logits_all=True)
    assert np.array_equal(batch, again)
    # batched kernels (llamafile sgemm) sum in another order than the token-by-token ones
    for other in (one, chunked):
        assert (other.argmax(1) == batch.argmax(1)).mean() >= 0.95
        assert np.abs(other - batch).max() < 2.5


def test_flash_attention_and_f32_kv_agree_with_default(smollm2_path):
    prompt = list(range(200, 240))
    outs = []
    for kw in ({}, {"flash_attn": True}, {"kv_type": "f32"}):
        with Model(smollm2_path, ctx_size=64, n_threads=2, **kw) as m:
            outs.append(m.eval(prompt, logits_all=True).copy())
    for o in outs[1:]:
        assert (o.argmax(1) == outs[0].argmax(1)).mean() >= 0.9
        assert np.abs(o - outs[0]).max() < 3.0


def test_as_close_to_exact_as_llama_cpp(smollm2_path, record_property):
    """Against a float64 forward pass of the same quantized weights, superggml's error is no larger
    than llama.cpp's: the superggml/llama.cpp difference is rounding noise, not a modelling error."""
    from numpy_ref import Float64Reference

    tok = llama_ref.run({"kind": "tokenize", "model": smollm2_path, "items": [[p, True, True] for p in PROMPTS]})
    prompts = [[int(x) for x in tok[f"ids{i}"][:N_POS]] for i in range(len(PROMPTS))]
    ref = llama_ref.run({"kind": "logits", "model": smollm2_path, "prompts": prompts})
    exact = Float64Reference(smollm2_path)
    ours_err, llama_err, ours_top1, llama_top1 = [], [], [], []
    with Model(smollm2_path, ctx_size=128, n_threads=2) as m:
        for i, p in enumerate(prompts):
            m.reset()
            o = m.eval(p, logits_all=True)
            t = exact.logits(p)
            ll = ref[f"logits{i}"]
            ours_err.append(np.abs(o - t).mean())
            llama_err.append(np.abs(ll - t).mean())
            ours_top1.append((o.argmax(1) == t.argmax(1)).mean())
            llama_top1.append((ll.argmax(1) == t.argmax(1)).mean())
    record_property("mean_abs_err_superggml", float(np.mean(ours_err)))
    record_property("mean_abs_err_llama_cpp", float(np.mean(llama_err)))
    print(f"\nmean |logit - float64|: superggml {np.mean(ours_err):.4f}, llama.cpp {np.mean(llama_err):.4f}; "
          f"top-1 = float64's: superggml {np.mean(ours_top1):.3f}, llama.cpp {np.mean(llama_top1):.3f}")
    assert np.mean(ours_err) <= 1.1 * np.mean(llama_err)
    assert np.mean(ours_top1) >= np.mean(llama_top1) - 0.02
