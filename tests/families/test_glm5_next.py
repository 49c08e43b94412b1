"""glm5-next (GLM-5.3-Flash) on synthetic GGUFs (tests/support/synth_glm5_next.py) against llama.cpp: KDA blocks
beside nope-only MLA blocks made sparse by a k-pool indexer (top_k 16 over pools of 4: from position 19 on a query
sees fewer pools than it could), 4 hyper-connection streams, clamped experts."""

from __future__ import annotations

import numpy as np
import pytest

import llama_ref
from saving import assert_restored_continues
from superggml import Model
from synth_gguf import expert_bytes
from synth_glm5_next import synth_glm5_next


@pytest.fixture(scope="module")
def g5(tmp_path_factory, small_vocab):
    return synth_glm5_next(str(tmp_path_factory.mktemp("g5") / "g5.gguf"), small_vocab)


def prompt_of(n: int, seed: int = 1) -> list[int]:
    return [int(x) for x in np.random.default_rng(seed).integers(3, 1000, n)]


def greedy(m: Model, prompt: list[int], n_decode: int) -> np.ndarray:
    rows = [m.eval(prompt, logits_all=True).copy()]
    for _ in range(n_decode):
        rows.append(m.eval([int(np.argmax(rows[-1][-1]))]).copy())
    return np.concatenate(rows)


@pytest.mark.parametrize("n_batch", [16, 512])
def test_logits_and_48_greedy_tokens_equal_llama_cpp(g5, n_batch):
    """A 100-token prompt in passes of n_batch (16: the indexer's gather path, 512: its mask), then 48 greedy
    tokens (gathered), flash attention off and on: every row."""
    prompt = prompt_of(100)
    configs = [(1, 1, False), (1, 1, True)]
    req = {"kind": "kv_types", "model": g5, "prompt": prompt, "configs": configs, "n_decode": 48, "n_ctx": 256}
    ref = llama_ref.start({**req, "n_batch": n_batch})
    ours = []
    for fa in (False, True):
        with Model(g5, ctx_size=256, n_batch=n_batch, n_threads=2, flash_attn=fa) as m:
            ours.append(greedy(m, prompt, 48))
    refs = ref.result()
    for i in range(2):
        assert np.array_equal(ours[i], refs[f"logits{i}"]), f"flash_attn={bool(i)}"


def test_streamed_cached_paged_and_split_equal_resident(g5):
    """Blocks streamed through 2 slots (40% of the bytes), a quarter of the experts cached, the MLA blocks' rows
    paged, the blocks over two devices: the same bits as resident."""
    prompt = prompt_of(40, 2)
    experts = expert_bytes(g5)

    def run(**kw):
        with Model(g5, ctx_size=256, n_threads=2, n_batch=8, repack=False, **kw) as m:
            out = [m.eval(prompt, logits_all=True).copy()] + [m.eval([t]).copy() for t in (5, 6, 7)]
            return np.concatenate(out)

    ref = run()
    for kw in (
        dict(n_gpu_layers=0, async_prefetch=True, prefetch_depth=1),
        dict(expert_cache=experts // 4),
        dict(paged_kv=True, kv_page_size=16, kv_device_layers=1),
        dict(devices=["CPU", "CPU"], tensor_split=[1, 1]),
    ):
        assert np.array_equal(run(**kw), ref), kw


def test_a_restored_sequence_continues_bit_identically(g5, tmp_path):
    """The MLA blocks' latent and indexer rows (with the pooled keys) and the KDA blocks' windows and states."""
    assert_restored_continues(g5, tmp_path, prompt_of(30, 3))
