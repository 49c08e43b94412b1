"""paged_kv: K/V in pages that spill to host memory and a file give the contiguous cache's logits."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import synth_gguf
from superggml import Model
from superggml.errors import SuperggmlError
from cli_runner import run_cli

PROMPT = [(i * 37) % 4000 + 300 for i in range(200)]  # crosses pages of 16 mid-batch (n_batch 48)
N_DECODE = 24


def _run(m: Model) -> np.ndarray:
    """Teacher-forced prompt (all logits) then greedy decoding, as one array."""
    out = [m.eval(PROMPT, logits_all=True).copy()]
    t = int(np.argmax(out[0][-1]))
    for _ in range(N_DECODE):
        logits = m.eval([t]).copy()
        out.append(logits)
        t = int(np.argmax(logits[-1]))
    return np.concatenate(out)


KW = dict(ctx_size=256, n_batch=48, n_threads=2, repack=False)


@pytest.fixture(scope="module")
def contiguous(model_path):
    with Model(model_path, **KW) as m:
        return _run(m), m.hparams.n_layer


# SmolLM2: every tier with every page size; Qwen (GQA 6:1, head 128): each tier and each page size once
CASES = [("smollm2", tier, size) for tier in ("device", "host", "disk") for size in (16, 256, 8192)]
CASES += [("qwen", "device", 16), ("qwen", "host", 256), ("qwen", "disk", 8192)]


@pytest.mark.parametrize("model_path, tier, page_size", CASES, indirect=["model_path"])
def test_paged_kv_is_bit_identical(model_path, contiguous, page_size, tier, tmp_path):
    ref, n_layer = contiguous
    kw: dict = dict(paged_kv=True, kv_page_size=page_size)
    if tier != "device":
        kw["kv_device_layers"] = 3  # the other layers' pages leave the device
        kw["async_prefetch"] = tier == "host"  # fills ahead of use on a worker
    if tier == "disk":
        kw.update(host_budget=0, kv_spill_dir=str(tmp_path))
    with Model(model_path, **KW, **kw) as m:
        out = _run(m)
        st = m.stats()
        if tier == "disk":
            assert len(os.listdir(tmp_path)) == 1  # the spill file, while open
    assert np.array_equal(out, ref)
    assert st["kv_tokens"] == n_layer * (len(PROMPT) + N_DECODE)
    if tier == "device":
        assert st["kv_pages_written_back"] == 0 and st["kv_pages_host"] == 0
    else:
        assert st["kv_pages_written_back"] > 0 and st["kv_pages_loaded"] > 0
    if tier == "host":
        assert st["kv_pages_host"] > 0 and st["kv_pages_disk"] == 0 and st["kv_pages_prefetched"] > 0
    if tier == "disk":
        assert st["kv_pages_disk"] > 0 and st["kv_pages_host"] == 0 and st["kv_pages_spilled"] > 0
        assert os.listdir(tmp_path) == []  # removed on close


def test_host_budget_spills_least_recently_used_pages(smollm2_path, tmp_path):
    with Model(smollm2_path, **KW) as m:
        ref = _run(m)
    with Model(
        smollm2_path,
        **KW,
        paged_kv=True,
        kv_page_size=16,
        kv_device_layers=2,
        host_budget="256KiB",
        kv_spill_dir=tmp_path,
    ) as m:
        out = _run(m)
        st = m.stats()
    assert np.array_equal(out, ref)
    assert 0 < st["kv_host_bytes"] <= 256 << 10
    assert st["kv_pages_evicted"] > 0 and st["kv_pages_disk"] > 0


def test_sequences_share_the_cache(smollm2_path):
    a, b = [1, 50, 60, 70, 80], [1, 900, 901, 902, 903, 904, 905]
    with Model(smollm2_path, ctx_size=128, n_threads=2, repack=False) as m:
        ra = m.eval(a).copy()
        m.reset()
        rb = m.eval(b).copy()
        rb2 = m.eval([42]).copy()
        m.reset()
        m.eval(a)
        ra2 = m.eval([42]).copy()
    with Model(
        smollm2_path, ctx_size=128, n_threads=2, repack=False, paged_kv=True, kv_page_size=16, kv_device_layers=5
    ) as m:
        m.use_sequence(1)
        assert np.array_equal(m.eval(a), ra)
        m.use_sequence(2)
        assert np.array_equal(m.eval(b), rb)
        m.use_sequence(1)
        assert np.array_equal(m.eval([42]), ra2)
        m.use_sequence(2)
        assert np.array_equal(m.eval([42]), rb2)
        assert m.stats()["n_sequences"] == 2 and m.tokens == b + [42]  # 0 was empty: forgotten
        pages = m.stats()["kv_token_slots"]
        m.drop_sequence(1)
        assert m.stats()["kv_token_slots"] < pages


def test_truncation_frees_pages_and_regenerates_identically(smollm2_path):
    with Model(smollm2_path, **KW, paged_kv=True, kv_page_size=16, kv_device_layers=4) as m:
        first = _run(m)
        slots = m.stats()["kv_token_slots"]
        m.truncate(40)
        assert m.n_tokens == 40
        assert m.stats()["kv_token_slots"] < slots
        m.reset()
        assert m.stats()["kv_token_slots"] == 0
        again = _run(m)
    assert np.array_equal(first, again)


def test_page_size_and_layers_are_checked(smollm2_path, tmp_path):
    with pytest.raises(ValueError, match="kv_page_size must be in 16..8192"):
        Model(smollm2_path, paged_kv=True, kv_page_size=8)
    with pytest.raises(ValueError, match="kv_page_size must be in 16..8192"):
        Model(smollm2_path, paged_kv=True, kv_page_size=16384)
    with pytest.raises(ValueError, match="kv_device_layers"):
        Model(smollm2_path, paged_kv=True, kv_device_layers=0)
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    with pytest.raises(OSError, match="cannot create a KV spill file"):
        Model(smollm2_path, paged_kv=True, kv_spill_dir=not_a_dir)
    with pytest.raises(OSError, match="cannot create a KV spill file"):
        Model(smollm2_path, paged_kv=True, kv_spill_dir=tmp_path / "missing")


def test_host_budget_without_spill_dir_is_a_clear_error(smollm2_path):
    with Model(
        smollm2_path, ctx_size=128, n_threads=2, paged_kv=True, kv_page_size=16, kv_device_layers=2, host_budget=0
    ) as m:
        with pytest.raises(SuperggmlError, match="host budget of 0 bytes: give it a spill directory"):
            for t in range(40):
                m.eval([t + 100])


FULL_DISK = r"""
import json, resource, signal, sys
import numpy as np
from superggml import Model
path, spill = sys.argv[1], sys.argv[2]
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)          # writes past the limit fail with EFBIG instead
m = Model(path, ctx_size=256, n_threads=2, repack=False, paged_kv=True, kv_page_size=16, kv_device_layers=2,
          host_budget=0, kv_spill_dir=spill)
resource.setrlimit(resource.RLIMIT_FSIZE, (2 << 20, resource.RLIM_INFINITY))
toks, err = list(range(300, 340)), None
logits = m.eval(toks)
try:
    for t in range(1000, 1200):
        logits = m.eval([t])
        toks.append(t)
except OSError as e:
    err = str(e)
n_ok = m.n_tokens
resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
after = m.eval([7])[-1]                                  # the earlier state carries on
m.close()
import os
print(json.dumps({"err": err, "n_ok": n_ok, "tokens": toks, "after": after.tolist()[:64],
                  "left": os.listdir(spill)}))
"""


def test_full_spill_disk_raises_and_keeps_the_earlier_state(smollm2_path, tmp_path):
    r = subprocess.run(
        [sys.executable, "-c", FULL_DISK, smollm2_path, str(tmp_path)], capture_output=True, text=True, timeout=600
    )
    assert r.returncode == 0, r.stderr[-2000:]
    d = json.loads(r.stdout.splitlines()[-1])
    assert d["err"] and "cannot write the KV spill file" in d["err"] and "File too large" in d["err"]
    assert d["n_ok"] == len(d["tokens"]) < 240
    assert d["left"] == []
    with Model(smollm2_path, ctx_size=256, n_threads=2, repack=False) as m:
        m.eval(d["tokens"][:40])  # fed as the child fed them
        for t in d["tokens"][40:]:
            m.eval([t])
        ref = m.eval([7])[-1]
    assert np.array_equal(np.asarray(d["after"], dtype=np.float32), ref[:64])


def test_pages_of_256_cross_boundaries_mid_batch(smollm2_path, tmp_path):
    prompt = [(i * 53) % 5000 + 200 for i in range(700)]  # batches of 64 straddle pages at 256 and 512
    kw = dict(ctx_size=1024, n_batch=64, n_threads=2, repack=False)

    def run(m: Model) -> np.ndarray:
        out = [m.eval(prompt, logits_all=True).copy()]
        t = int(np.argmax(out[0][-1]))
        for _ in range(8):
            out.append(m.eval([t]).copy())
            t = int(np.argmax(out[-1][-1]))
        return np.concatenate(out)

    with Model(smollm2_path, **kw) as m:
        ref = run(m)
    with Model(
        smollm2_path,
        **kw,
        paged_kv=True,
        kv_page_size=256,
        kv_device_layers=3,
        host_budget="1MiB",
        kv_spill_dir=tmp_path,
        async_prefetch=True,
    ) as m:
        out = run(m)
        st = m.stats()
    assert st["kv_pages_disk"] > 0 and st["kv_pages_host"] > 0
    assert np.array_equal(out, ref)


N_CTX_8K = 8448  # so that pages of 8192 cross a boundary too
PROMPT_8K = [(i * 97) % 20000 + 100 for i in range(8300)]
KW_8K = dict(ctx_size=N_CTX_8K, n_batch=512, n_threads=2, repack=False)
N_LAYER_8K = 8


@pytest.fixture(scope="module")
def model_8k(smollm2_path, tmp_path_factory):
    """A llama of 8 layers of 128 channels with SmolLM2's vocabulary: the cache's traffic of a long context
    at a twentieth of SmolLM2's compute."""
    path = tmp_path_factory.mktemp("8k") / "llama-8k.gguf"
    synth_gguf.synth(
        path,
        synth_gguf.vocab_fields(smollm2_path),
        n_layer=N_LAYER_8K,
        n_embd=128,
        n_ff=256,
        n_ctx_train=N_CTX_8K,
        wtype="f16",
    )
    return str(path)


def _run_8k(m: Model) -> tuple[list[int], np.ndarray]:
    logits = m.eval(PROMPT_8K)[-1]
    toks = []
    for _ in range(16):
        toks.append(int(np.argmax(logits)))
        logits = m.eval([toks[-1]])[-1]
    return toks, logits


@pytest.fixture(scope="module")
def contiguous_8k(model_8k):
    with Model(model_8k, **KW_8K) as m:
        return _run_8k(m), m.kv_bytes


@pytest.mark.slow
@pytest.mark.parametrize("page_size", [16, 8192])
def test_8k_context_with_a_quarter_of_the_kv_in_host_memory(model_8k, contiguous_8k, tmp_path, page_size):
    """8k tokens of context; 2 of 8 layers keep K/V on the device, the rest page through a host budget of a
    quarter of the KV size and a spill file. Same tokens and last logits as the contiguous cache."""
    (ref_toks, ref_logits), kv_bytes = contiguous_8k
    with Model(
        model_8k,
        **KW_8K,
        paged_kv=True,
        kv_page_size=page_size,
        kv_device_layers=2,
        host_budget=kv_bytes // 4,
        kv_spill_dir=tmp_path,
    ) as m:
        toks, logits = _run_8k(m)
        st = m.stats()
    print(f"\n8k context, pages of {page_size}: {st}")
    assert toks == ref_toks and np.array_equal(logits, ref_logits)
    assert len(set(toks)) > 1
    assert st["kv_host_bytes"] <= kv_bytes // 4 and st["kv_pages_disk"] > 0
    if page_size == 16:
        assert st["kv_page_waste"] < 0.04


# -- the KV cache on its own: random traffic against a shadow copy ----------------------------


def test_kv_cache_random_traffic_matches_a_shadow(tmp_path):
    """Sequences grow, get truncated and dropped in random order through 3 frames, a host budget of a few
    pages and a spill file; every acquire must show exactly the rows written before (K rows and transposed V)."""
    from superggml import native

    n_layer, g, n_ctx, P = 4, 8, 96, 16
    ctx = native.Context(max_tensors=2 * n_layer)
    k = [ctx.new_tensor(native.GGMLType.F32, [g, n_ctx]) for _ in range(n_layer)]
    v = [ctx.new_tensor(native.GGMLType.F32, [g, n_ctx]) for _ in range(n_layer)]
    kv = native.KVCache(k, v, page_size=P, n_frames=3, host_budget=5 * 2 * P * g * 4, spill_dir=str(tmp_path))
    rng = np.random.default_rng(0)
    shadow: dict[tuple[int, int], np.ndarray] = {}  # (seq, layer) -> [n, 2, g]
    n_past = {s: 0 for s in range(3)}
    for step in range(600):
        seq = int(rng.integers(3))
        if rng.random() < 0.08:  # truncate (sometimes to 0)
            n = int(rng.integers(0, n_past[seq] + 1))
            kv.seq_truncate(seq, n)
            n_past[seq] = n
            for layer in range(n_layer):
                if (seq, layer) in shadow:
                    shadow[seq, layer] = shadow[seq, layer][:n]
            continue
        p0 = n_past[seq]
        n = int(rng.integers(1, 24))
        if p0 + n > n_ctx:
            continue
        for layer in range(n_layer):
            kv.acquire(seq, layer, p0)
            if rng.random() < 0.5 and layer + 1 < n_layer:
                kv.prefetch(seq, layer + 1, p0)
            kt = native.tensor_get(k[layer]).reshape(n_ctx, g)
            vt = native.tensor_get(v[layer]).reshape(g, n_ctx)  # transposed: [channel, position]
            old = shadow.get((seq, layer), np.zeros((0, 2, g), np.float32))[:p0]
            assert np.array_equal(kt[:p0], old[:, 0]), (step, seq, layer)
            assert np.array_equal(vt[:, :p0].T, old[:, 1]), (step, seq, layer)
            new = rng.standard_normal((n, 2, g)).astype(np.float32)
            native.tensor_set(k[layer], np.ascontiguousarray(new[:, 0]), p0 * g * 4)
            for c in range(g):
                native.tensor_set(v[layer], np.ascontiguousarray(new[:, 1, c]), (c * n_ctx + p0) * 4)
            kv.release(seq, layer, p0 + n)
            shadow[seq, layer] = np.concatenate([old, new])
        n_past[seq] = p0 + n
    st = kv.stats()
    assert st["kv_pages_spilled"] > 0 and st["kv_pages_evicted"] > 0 and st["kv_pages_prefetched"] > 0
    assert st["kv_host_bytes"] <= 5 * kv.page_bytes
    del kv
    assert os.listdir(tmp_path) == []


def test_cli_paged_kv_flags(monkeypatch, model_kwargs, smollm2_path, tmp_path, capsys):

    seen = model_kwargs
    monkeypatch.setenv("SUPERGGML_KV_PAGE_SIZE", "32")
    err = run_cli(
        capsys,
        "generate",
        "-m",
        smollm2_path,
        "-p",
        "Hello",
        "-n",
        "4",
        "--temp",
        "0",
        "-c",
        "128",
        "--paged-kv",
        "--kv-device-layers",
        "2",
        "--host-budget",
        "64KiB",
        "--kv-spill-dir",
        str(tmp_path),
        "-v",
    ).err
    assert seen["paged_kv"] is True and seen["kv_page_size"] == 32 and seen["kv_device_layers"] == 2
    assert seen["host_budget"] == "64KiB" and seen["kv_spill_dir"] == str(tmp_path)
    assert "kv_pages_disk" in err
    err = run_cli(
        capsys, "generate", "-m", smollm2_path, "-p", "Hi", "-n", "1", "--paged-kv", "--kv-page-size", "8", rc=1
    ).err
    assert "kv_page_size must be in 16..8192" in err


def test_paged_kv_with_streamed_weights(smollm2_path, tmp_path):
    """Blocks stream through a 3-slot pool while their K/V page through 4 frames and host memory."""
    with Model(smollm2_path, **KW) as m:
        ref = _run(m)
    with Model(
        smollm2_path,
        **KW,
        device_budget="8MiB",
        async_prefetch=True,
        paged_kv=True,
        kv_page_size=16,
        kv_device_layers=4,
        host_budget="128KiB",
        kv_spill_dir=tmp_path,
    ) as m:
        out = _run(m)
        st = m.stats()
    assert st["evictions"] > 0 and st["kv_pages_written_back"] > 0 and st["kv_pages_disk"] > 0
    assert np.array_equal(out, ref)
