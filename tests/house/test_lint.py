"""The tree as ruff formats and checks it (pyproject.toml's [tool.ruff]; ruff is pinned in the test extra)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytest.importorskip("ruff")


def ruff(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ruff", *args], cwd=ROOT, capture_output=True, text=True)


def test_the_tree_is_formatted():
    r = ruff("format", "--check", "--diff", ".")
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]


def test_ruff_check_passes():
    r = ruff("check", "--output-format", "concise", ".")
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
