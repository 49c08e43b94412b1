"""Bad input fails with a clear Python exception, never a crash."""

from __future__ import annotations

import os
import shutil

import gguf
import numpy as np
import pytest

import superggml
from superggml import GGUFError, Model, UnsupportedModelError, native


def _write_gguf(path, arch: str, *, tensors: dict[str, np.ndarray] | None = None, kv: dict | None = None) -> str:
    w = gguf.GGUFWriter(str(path), arch)
    for k, v in (kv or {}).items():
        if isinstance(v, int):
            w.add_uint32(k, v)
        elif isinstance(v, float):
            w.add_float32(k, v)
        else:
            w.add_string(k, v)
    for name, arr in (tensors or {"x.weight": np.zeros((4, 4), np.float32)}).items():
        w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="cannot open"):
        Model(tmp_path / "nope.gguf")


def test_directory_is_not_a_model(tmp_path):
    with pytest.raises(OSError):
        Model(tmp_path)


def test_empty_file(tmp_path):
    p = tmp_path / "empty.gguf"
    p.write_bytes(b"")
    with pytest.raises(GGUFError, match="not a GGUF"):
        Model(p)


def test_bad_magic(tmp_path, smollm2_path):
    p = tmp_path / "bad.gguf"
    with open(smollm2_path, "rb") as f:
        p.write_bytes(b"GGUX" + f.read(4096)[4:])
    with pytest.raises(GGUFError, match="bad magic"):
        Model(p)


@pytest.mark.parametrize(
    "payload",
    [
        b"GGUF" + bytes(range(256)) * 8,  # garbage header
        b"GGUF" + (3).to_bytes(4, "little") + (2**40).to_bytes(8, "little") * 2,  # absurd counts
        b"GGUF" + (99).to_bytes(4, "little") + bytes(64),  # unknown version
    ],
)
def test_malformed_header(tmp_path, payload):
    p = tmp_path / "broken.gguf"
    p.write_bytes(payload)
    with pytest.raises(GGUFError, match="malformed or truncated"):
        Model(p)


@pytest.mark.parametrize("keep", [1000, 4_000_000, 60_000_000])
def test_truncated_file(tmp_path, smollm2_path, keep):
    p = tmp_path / "trunc.gguf"
    with open(smollm2_path, "rb") as f:
        p.write_bytes(f.read(keep))
    with pytest.raises(GGUFError, match="truncated"):
        Model(p)


def test_unknown_architecture(tmp_path):
    p = _write_gguf(tmp_path / "mamba.gguf", "mamba")
    with pytest.raises(UnsupportedModelError, match="'mamba'"):
        Model(p)


def test_missing_tensor(tmp_path):
    kv = {
        "llama.block_count": 1,
        "llama.embedding_length": 8,
        "llama.attention.head_count": 2,
        "llama.feed_forward_length": 16,
        "llama.context_length": 64,
        "llama.attention.layer_norm_rms_epsilon": 1e-5,
        "llama.vocab_size": 32,
    }
    p = _write_gguf(
        tmp_path / "tiny.gguf", "llama", kv=kv, tensors={"token_embd.weight": np.zeros((32, 8), np.float32)}
    )
    with pytest.raises(GGUFError, match="lacks tensor"):
        Model(p)


def test_missing_hparam(tmp_path):
    p = _write_gguf(tmp_path / "nohp.gguf", "llama", kv={"llama.block_count": 1})
    with pytest.raises(GGUFError, match="lacks 'llama.embedding_length'"):
        Model(p)


def test_errors_are_one_family():
    assert issubclass(GGUFError, superggml.SuperggmlError)
    assert issubclass(GGUFError, ValueError)
    assert issubclass(UnsupportedModelError, superggml.SuperggmlError)


def test_gguf_file_reads_real_model(smollm2_path):
    f = native.GGUFFile(smollm2_path)
    meta = f.metadata()
    assert meta["general.architecture"] == "llama"
    assert meta["llama.block_count"] == 30
    table = {t[0]: t for t in f.tensors()}
    assert len(table) == 272
    name, typ, shape, offset, nbytes = table["blk.0.attn_q.weight"]
    assert typ == "q4_1" and shape == [576, 576]
    assert offset + nbytes <= os.path.getsize(smollm2_path)
    f.close()
    assert f.closed
    with pytest.raises(superggml.SuperggmlError, match="closed"):
        f.metadata()


def test_closed_model_refuses_work(smollm2_path):
    m = Model(smollm2_path, ctx_size=64, n_threads=1)
    m.close()
    m.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        m.eval([1])


def test_context_overflow_and_bad_tokens(smollm2_path):
    with Model(smollm2_path, ctx_size=16, n_threads=1) as m:
        with pytest.raises(ValueError, match="out of range"):
            m.eval([10**6])
        with pytest.raises(ValueError, match="context overflow"):
            m.eval(list(range(17)))
        with pytest.raises(ValueError, match="at least one token"):
            m.eval([])
        m.eval([1, 2, 3])  # still usable after the errors
        assert m.n_tokens == 3


def test_truncate_keeps_a_prefix_and_regenerates_identically(smollm2_path):
    with Model(smollm2_path, ctx_size=64, n_threads=2, repack=False) as m:
        toks = list(range(300, 320))
        full = m.eval(toks, logits_all=True).copy()
        assert m.tokens == toks and m.stats()["n_tokens"] == 20
        m.truncate(12)
        assert m.tokens == toks[:12] and m.scores is None
        assert np.array_equal(m.eval(toks[12:], logits_all=True), full[12:])
        with pytest.raises(ValueError, match="truncate"):
            m.truncate(21)
        m.use_sequence(1)  # without paged_kv, a sequence of its own K/V storage
        assert m.n_tokens == 0
        assert np.array_equal(m.eval(toks, logits_all=True), full)
        m.use_sequence(0)  # its K/V untouched by sequence 1's
        assert m.tokens == toks
        m.truncate(12)
        assert np.array_equal(m.eval(toks[12:], logits_all=True), full[12:])
        m.drop_sequence(1)
        m.reset()
        assert m.n_tokens == 0 and m.stats()["n_sequences"] == 1


def test_model_copy_survives_source_removal(tmp_path, smollm2_path):
    """The mapping keeps the data even when the path goes away."""
    p = tmp_path / "copy.gguf"
    shutil.copy(smollm2_path, p)
    with Model(p, ctx_size=32, n_threads=1) as m:
        os.unlink(p)
        assert m.eval(m.tokenize("Hello"))[-1].shape == (m.n_vocab,)


def _rss_file_mib() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("RssFile")) // 1024


def test_background_load_maps_only_the_bytes_in_use(qwen_path):
    """A resident model's weights load in the background; the file pages of re-laid weights leave the
    process once their copy is made (as llama.cpp unmaps them), so the mapping holds only what is used."""
    before = _rss_file_mib()
    with Model(qwen_path, ctx_size=256, n_threads=2) as m:
        assert m.repacked_bytes > 500 << 20  # Qwen2.5-1.5B's Q4_K weights
        m.eval([1, 2, 3])
        assert not m.stats()["weights_loading"]  # loaded: the first pass waited for every block
        grown = _rss_file_mib() - before
        in_mapping = (os.path.getsize(qwen_path) - m.repacked_bytes) >> 20
        assert grown <= in_mapping, (grown, in_mapping)  # without the unmap: about the whole file
