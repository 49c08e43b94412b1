"""A short seeded run of the GGUF fuzzer (bench/fuzz.py runs 100,000+), and the inputs it once broke on."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from superggml import native
from superggml.errors import GGUFError

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # support/fuzz_gguf.py, fuzz_regressions/


def run_fuzzer(n: int, seed: int, out_dir: str, timeout: float) -> tuple[int, str]:
    """(exit code, last progress line) of a child fuzzing run; a crash or hang leaves current.gguf behind."""
    r = subprocess.run(
        [sys.executable, os.path.join(TESTS, "support", "fuzz_gguf.py"), str(n), str(seed), out_dir],
        capture_output=True,
        text=True,
        errors="replace",
        timeout=timeout,
    )
    lines = [x for x in r.stdout.splitlines() if x.startswith(("progress", "done"))]
    return r.returncode, (lines[-2] if len(lines) >= 2 else r.stderr[-2000:])


def test_seeded_fuzz_run(tmp_path):
    rc, summary = run_fuzzer(3000, 1234, str(tmp_path), timeout=300)
    assert rc == 0, f"the loader crashed or the harness failed; input kept in {tmp_path}: {summary}"
    assert not (tmp_path / "current.gguf").exists()
    assert "ok=" in summary and "GGUFError=" in summary  # both outcomes happen


REGRESSIONS = os.path.join(TESTS, "fuzz_regressions")


@pytest.mark.parametrize("name", sorted(os.listdir(REGRESSIONS)) if os.path.isdir(REGRESSIONS) else [])
def test_fuzz_regression_inputs(name):
    """Inputs the fuzzer found that once escaped as something other than a clean GGUFError."""
    with pytest.raises(GGUFError):
        f = native.GGUFFile(os.path.join(REGRESSIONS, name))
        f.close()
