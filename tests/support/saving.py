"""A saved sequence restored into another Model continues with the logits of never having stopped."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from superggml import Model


def assert_restored_continues(path: str, tmp_path: Path, prompt: list[int], **kw: Any) -> None:
    more = [7, 8, 9, 10]
    with Model(path, ctx_size=128, n_threads=2, **kw) as m:
        m.eval(prompt)
        m.save_sequence(tmp_path / "s.seq")
        ref = m.eval(more, logits_all=True).copy()
    with Model(path, ctx_size=128, n_threads=2, **kw) as m:
        m.eval([1, 2, 3])
        assert m.load_sequence(tmp_path / "s.seq") == len(prompt)
        assert np.array_equal(m.eval(more, logits_all=True), ref)
