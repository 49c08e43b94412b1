"""The build: llama.cpp's own ggml, fetched and checked by ggml/fetch.py, shipped next to native."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

import pytest

import superggml
from superggml import native

FETCH = Path(__file__).resolve().parents[2] / "ggml" / "fetch.py"


def test_ggml_is_llama_cpps_and_ships_next_to_core():
    assert native.GGML_VERSION == "0.25.3"  # vendor/llama.cpp/ggml of llama-cpp-python 0.3.36
    here = Path(superggml.__file__).parent
    for lib in ("libggml.so.0", "libggml-base.so.0", "libggml-cpu.so.0", "libggml-rpc.so.0"):
        assert (here / lib).is_file(), lib
    with pytest.raises(importlib.metadata.PackageNotFoundError):
        importlib.metadata.version("libggml-python")


@pytest.mark.skipif(not FETCH.is_file(), reason="not run from a source checkout")
def test_fetch_refuses_a_source_with_the_wrong_hash(tmp_path):
    bogus = tmp_path / "llama_cpp_python-0.3.36.tar.gz"
    bogus.write_bytes(b"not the sdist")
    env = dict(os.environ, SUPERGGML_CACHE=str(tmp_path / "cache"), SUPERGGML_GGML_SDIST=str(bogus))
    r = subprocess.run([sys.executable, str(FETCH)], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 1
    assert "sha256" in r.stderr and "expected 832db0699007" in r.stderr
    assert not (tmp_path / "cache" / "ggml-src" / "llama-cpp-python-0.3.36" / "ggml").exists()


@pytest.mark.skipif(not FETCH.is_file(), reason="not run from a source checkout")
def test_fetch_reuses_the_cached_source(tmp_path):
    root = tmp_path / "ggml-src" / "llama-cpp-python-0.3.36"
    (root / "ggml").mkdir(parents=True)
    (root / "ggml" / "CMakeLists.txt").write_text("# cached\n")
    (root / "SOURCE").write_text("cached\n")
    env = dict(os.environ, SUPERGGML_CACHE=str(tmp_path), SUPERGGML_GGML_SDIST="/nonexistent")
    r = subprocess.run([sys.executable, str(FETCH)], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == str(root / "ggml")
