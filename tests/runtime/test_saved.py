"""Saved sequences: Model.save_sequence / load_sequence. A conversation saved and restored (in another Model
object) continues with the logits of never having stopped, bit for bit, whatever holds its K/V; a file that is
not this model's, or is damaged, is refused with SavedSequenceError and the model goes on."""

from __future__ import annotations

import numpy as np
import pytest

import synth_gguf
from superggml import Model, SavedSequenceError
from synth_gguf import VARIANTS, synth

from prompts import TOKENS_40 as PROMPT  # noqa: E402

MORE = [7, 8, 9, 10]

LAYOUTS = {
    "contiguous": {},
    "flash": dict(flash_attn=True),
    "q8_0": dict(flash_attn=True, cache_type_k="q8_0", cache_type_v="q8_0"),
    "paged_spilled": dict(paged_kv=True, kv_page_size=16, kv_device_layers=8, host_budget=0),
}


def continued(path: str, kw: dict, saved: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The prompt's last logits and the continuation's, fed at once; or, with `saved`, after a restore."""
    with Model(path, ctx_size=128, n_threads=2, **kw) as m:
        if saved is None:
            last = m.eval(PROMPT)[-1].copy()
        else:
            m.eval([1, 2, 3])  # something to replace
            assert m.load_sequence(saved) == len(PROMPT) and m.tokens == PROMPT
            last = m.scores[-1].copy()
        return last, m.eval(MORE, logits_all=True).copy()


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_a_restored_sequence_continues_bit_identically(smollm2_path, tmp_path, layout):
    kw = dict(LAYOUTS[layout])
    if "host_budget" in kw:
        kw["kv_spill_dir"] = str(tmp_path)
    ref = continued(smollm2_path, kw)
    with Model(smollm2_path, ctx_size=128, n_threads=2, **kw) as m:
        m.eval(PROMPT)
        if "host_budget" in kw:
            assert m.stats()["kv_pages_disk"] > 0  # the K/V was spilled to disk
        m.save_sequence(tmp_path / "s.seq")
    got = continued(smollm2_path, kw, str(tmp_path / "s.seq"))
    assert np.array_equal(got[0], ref[0]) and np.array_equal(got[1], ref[1])


def test_the_file_holds_rows_not_a_layout(smollm2_path, tmp_path):
    """Saved with V transposed (no flash attention), restored into flash attention's layout and saved again:
    the same file, byte for byte."""
    with Model(smollm2_path, ctx_size=128, n_threads=2) as m:
        m.eval(PROMPT)
        m.save_sequence(tmp_path / "s.seq")
    with Model(smollm2_path, ctx_size=128, n_threads=2, flash_attn=True) as m:
        m.load_sequence(tmp_path / "s.seq")
        m.save_sequence(tmp_path / "again.seq")
    assert (tmp_path / "again.seq").read_bytes() == (tmp_path / "s.seq").read_bytes()


def test_a_hybrid_models_states_are_saved(smollm2_path, tmp_path):
    path = synth(tmp_path / "h.gguf", synth_gguf.vocab_fields(smollm2_path), **VARIANTS["qwen35-interval2"])
    ref = continued(path, {})
    with Model(path, ctx_size=128, n_threads=2) as m:
        m.eval(PROMPT)
        m.save_sequence(tmp_path / "s.seq")
    got = continued(path, {}, str(tmp_path / "s.seq"))
    assert np.array_equal(got[0], ref[0]) and np.array_equal(got[1], ref[1])


def test_files_it_cannot_take_are_refused(smollm2_path, tmp_path):
    other = synth(tmp_path / "other.gguf", synth_gguf.vocab_fields(smollm2_path), "llama")
    with Model(smollm2_path, ctx_size=128, n_threads=2) as m:
        with pytest.raises(ValueError, match="empty"):
            m.save_sequence(tmp_path / "none.seq")
        m.eval(PROMPT)
        m.save_sequence(tmp_path / "s.seq")
    with Model(other, ctx_size=128, n_threads=2) as m:
        m.eval(PROMPT)
        m.save_sequence(tmp_path / "other.seq")
    good = (tmp_path / "s.seq").read_bytes()
    (tmp_path / "short.seq").write_bytes(good[: len(good) // 2])
    flipped = bytearray(good)
    flipped[len(good) // 2] ^= 1
    (tmp_path / "flipped.seq").write_bytes(bytes(flipped))
    (tmp_path / "text.seq").write_text("hello")
    with Model(smollm2_path, ctx_size=128, n_threads=2) as m:
        cases = {
            "other.seq": "another model",
            "short.seq": "damaged or truncated",
            "flipped.seq": "damaged or truncated",
            "text.seq": "not a saved sequence",
            "missing.seq": "cannot read",
        }
        for name, why in cases.items():
            m.eval([1, 2, 3])
            with pytest.raises(SavedSequenceError, match=why):
                m.load_sequence(tmp_path / name)
        assert m.load_sequence(tmp_path / "s.seq") == len(PROMPT)  # and it goes on
    with Model(smollm2_path, ctx_size=128, n_threads=2, flash_attn=True, cache_type_k="q8_0") as m:
        with pytest.raises(SavedSequenceError, match="cache_type_k of f16"):
            m.load_sequence(tmp_path / "s.seq")
    with Model(smollm2_path, ctx_size=32, n_threads=2) as m:
        with pytest.raises(SavedSequenceError, match="ctx_size is 32"):
            m.load_sequence(tmp_path / "s.seq")
