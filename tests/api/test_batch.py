"""Many sequences per forward pass: eval_batch, prompt lists and n in create_completion, the CLI's prompts file.
Every sequence's logits and greedy text are checked against the same sequence run alone."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from batching import alone
from superggml import Model

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village at the edge of a great forest, there lived an old woodcutter who",
    "1, 2, 3, 4,",
    "Q: What is the boiling point of water at sea level?\nA:",
]

CONFIGS = {
    "contiguous": {},
    "paged16": dict(paged_kv=True, kv_page_size=16, kv_device_layers=30 * 8),
    "paged256-budget": dict(
        paged_kv=True, kv_page_size=256, kv_device_layers=30 * 8, device_budget="24MiB", async_prefetch=True
    ),
}


@pytest.mark.parametrize("config", list(CONFIGS))
def test_eval_batch_matches_each_sequence_alone(smollm2_path, config):
    with Model(smollm2_path, ctx_size=512, n_threads=2, n_batch=64, **CONFIGS[config]) as m:
        toks = [m.tokenize(p) for p in PROMPTS]
        ref = alone(m, toks, 6)
        # prompts of different lengths in shared passes (n_batch 64 splits the longest), then 6 decode steps
        got = [[r[-1].copy()] for r in m.eval_batch([(10 + i, t) for i, t in enumerate(toks)])]
        for _ in range(6):
            nxt = [(10 + i, [int(g[-1].argmax())]) for i, g in enumerate(got)]
            for g, r in zip(got, m.eval_batch(nxt)):
                g.append(r[-1].copy())
        st = m.stats()
        assert st["sequences_per_pass"] > 1.5 and st["n_tokens"] == 0  # the current sequence untouched
        worst = 0.0
        for g, r in zip(got, ref):
            g = np.stack(g)
            worst = max(worst, float(np.abs(g - r).max()))
            assert (g.argmax(-1) == r.argmax(-1)).all()
        assert worst <= 0.01, worst
        print(f"{config}: max |dlogit| batch vs alone {worst:.2e}")


def test_sequences_on_consecutive_slots_attend_at_once(smollm2_path):
    """Decode steps of sequences on consecutive K/V slots run one attention (stream_passes), whatever the order
    they are given in; after a drop leaves a hole they run per sequence, until a new sequence fills it. Each
    way every sequence gets its logits alone."""
    with Model(smollm2_path, ctx_size=256, n_threads=2) as m:
        toks = [m.tokenize(p) for p in PROMPTS]
        ref = alone(m, toks, 5)
        got = {1: [m.eval_batch([(1, toks[0])])[0][-1].copy()]}
        for i, r in zip(range(2, 6), m.eval_batch([(i, t) for i, t in zip(range(2, 6), toks[1:])])):
            got[i] = [r[-1].copy()]

        def step(seqs):
            before = m.stats()["stream_passes"]
            for s, r in zip(seqs, m.eval_batch([(s, [int(got[s][-1].argmax())]) for s in seqs])):
                got[s].append(r[-1].copy())
            return m.stats()["stream_passes"] - before

        assert step([1, 2, 3, 4, 5]) == 1 and step([1, 2, 3, 4, 5]) == 1
        m.drop_sequence(3)
        assert step([1, 2, 4, 5]) == 0  # slots 1, 2, 4, 5: per sequence
        assert step([4, 5]) == 1
        got[6] = [m.eval_batch([(6, toks[2])])[0][-1].copy()]  # slot 3 again
        assert step([6, 1, 2, 4, 5]) == 1  # rows put in slot order
        ref.append(ref[2])
        for s in (1, 2, 3, 4, 5, 6):
            r = ref[s - 1][: len(got[s])]
            assert (np.stack(got[s]).argmax(-1) == r.argmax(-1)).all()
            assert float(np.abs(np.stack(got[s]) - r).max()) <= 0.01


def test_kv_pages_are_held_as_written_and_given_back_when_a_sequence_ends(smollm2_path):
    with Model(smollm2_path, ctx_size=4096, n_threads=2) as m:
        res = m.runtime.memory.reservation
        assert res.resident() == 0 and res.size >= 256 * m.runtime.kv_bytes  # reserved, not held
        m.create_completion(PROMPTS, max_tokens=8, temperature=0)
        assert res.resident() == 0  # the choices' sequences were dropped
        m.eval_batch([(1, m.tokenize(PROMPTS[2]))])
        held = res.resident()
        assert 0 < held < m.runtime.kv_bytes / 2  # 23 tokens, not ctx_size's 94 MB
        m.drop_sequence(1)
        assert res.resident() == 0


def test_completion_of_a_prompt_list_equals_each_alone(smollm2_path):
    """Greedy, 5 prompts of 5..23 tokens; EOS and the token limit end them at different steps."""
    with Model(smollm2_path, ctx_size=512, n_threads=2, paged_kv=True, kv_page_size=16, kv_device_layers=30 * 8) as m:
        alone = [m.create_completion(p, max_tokens=40, temperature=0)["choices"][0] for p in PROMPTS]
        res = m.create_completion(PROMPTS, max_tokens=40, temperature=0)
        assert [c["index"] for c in res["choices"]] == list(range(len(PROMPTS)))
        assert [c["text"] for c in res["choices"]] == [c["text"] for c in alone]
        assert [c["finish_reason"] for c in res["choices"]] == [c["finish_reason"] for c in alone]
        assert res["usage"]["completion_tokens"] > 0 and m.stats()["n_sequences"] == 1
        # streamed: chunks tagged with their index add up to the same texts
        parts = [""] * len(PROMPTS)
        finish = [None] * len(PROMPTS)
        for c in m.create_completion(PROMPTS, max_tokens=40, temperature=0, stream=True):
            ch = c["choices"][0]
            parts[ch["index"]] += ch["text"]
            finish[ch["index"]] = ch["finish_reason"] or finish[ch["index"]]
        assert parts == [c["text"] for c in alone] and all(finish)
        # token lists too
        toks = [m.tokenize(p) for p in PROMPTS[:2]]
        assert [c["text"] for c in m.create_completion(toks, max_tokens=40, temperature=0)["choices"]] == [
            c["text"] for c in alone[:2]
        ]


def test_n_samples_one_prompt_several_ways(smollm2_path):
    with Model(smollm2_path, ctx_size=256, n_threads=2) as m:
        res = m.create_completion(PROMPTS[0], n=3, max_tokens=12, temperature=1.0, seed=7)
        texts = [c["text"] for c in res["choices"]]
        assert [c["index"] for c in res["choices"]] == [0, 1, 2] and len(set(texts)) > 1
        # sample j is the one seed + j gives alone
        for j in range(3):
            assert (
                m.create_completion(PROMPTS[0], max_tokens=12, temperature=1.0, seed=7 + j)["choices"][0]["text"]
                == texts[j]
            )
        greedy = m.create_completion(PROMPTS[:2], n=2, max_tokens=8, temperature=0)["choices"]
        assert greedy[0]["text"] == greedy[1]["text"] and greedy[2]["text"] == greedy[3]["text"]
        with pytest.raises(ValueError, match="n must be >= 1"):
            m.create_completion(PROMPTS[0], n=0)


def test_eval_batch_errors_leave_sequences_as_they_were(smollm2_path):
    with Model(smollm2_path, ctx_size=64, n_threads=2) as m:
        m.eval_batch([(1, [1, 2, 3]), (2, [4, 5])])
        with pytest.raises(ValueError, match="each sequence may appear once"):
            m.eval_batch([(1, [1]), (1, [2])])
        with pytest.raises(ValueError, match="context overflow in sequence 2"):
            m.eval_batch([(1, [1]), (2, [7] * 63)])
        with pytest.raises(ValueError, match="out of range"):
            m.eval_batch([(1, [1]), (2, [10**9])])
        m.use_sequence(1)
        assert m.tokens == [1, 2, 3]
        m.use_sequence(2)
        assert m.tokens == [4, 5]


def test_prompts_file_writes_a_json_line_per_prompt(smollm2_path, tmp_path):
    f = tmp_path / "prompts.txt"
    f.write_text("\n".join(PROMPTS[:3]) + "\n")
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "superggml.commands.cli",
            "generate",
            "-m",
            smollm2_path,
            "--prompts-file",
            str(f),
            "-n",
            "12",
            "--temp",
            "0",
            "-t",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    lines = sorted((json.loads(x) for x in r.stdout.splitlines()), key=lambda d: d["index"])
    assert [d["prompt"] for d in lines] == PROMPTS[:3]
    with Model(smollm2_path, n_threads=2) as m:
        assert [d["text"] for d in lines] == [
            m.create_completion(p, max_tokens=12, temperature=0)["choices"][0]["text"] for p in PROMPTS[:3]
        ]
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "superggml.commands.cli",
            "generate",
            "-m",
            smollm2_path,
            "--prompts-file",
            "-",
            "-n",
            "4",
        ],
        input="",
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 1 and "no prompts" in r.stderr


@pytest.mark.slow
@pytest.mark.parametrize("budget", [None, "128MiB"])
@pytest.mark.parametrize("invariant", [True, False])
def test_qwen_batch_matches_each_sequence_alone(qwen_path, budget, invariant):
    """Qwen2.5-1.5B (Q4_K/Q6_K): 4 prompts decoded together, greedy, against each alone; resident and streamed
    through a 128 MiB budget. ggml-cpu computes K-quant matmuls of 8 rows or more with tiled kernels (and
    re-laid weights in tiles of 4 rows), which round differently from its row-by-row ones: llama.cpp's own
    logits move by 0.45 between a prompt evaluated in one batch and token by token. batch_invariant takes the
    row-by-row paths everywhere: then a sequence's logits in a batch equal its logits alone, bit for bit.
    Without it the greedy tokens still agree."""
    kw = dict(device_budget=budget, async_prefetch=True) if budget else {}
    with Model(qwen_path, ctx_size=256, n_threads=2, batch_invariant=invariant, **kw) as m:
        toks = [m.tokenize(p) for p in PROMPTS[:4]]
        ref = alone(m, toks, 8)
        got = [[r[-1].copy()] for r in m.eval_batch([(10 + i, t) for i, t in enumerate(toks)])]
        for _ in range(8):
            for g, r in zip(got, m.eval_batch([(10 + i, [int(g[-1].argmax())]) for i, g in enumerate(got)])):
                g.append(r[-1].copy())
        worst = max(float(np.abs(np.stack(g) - r).max()) for g, r in zip(got, ref))
        for g, r in zip(got, ref):
            assert (np.stack(g).argmax(-1) == r.argmax(-1)).all()
        if invariant:
            assert worst <= 0.01, worst
        print(f"qwen {budget or 'resident'}, batch_invariant={invariant}: max |dlogit| batch vs alone {worst:.3g}")
