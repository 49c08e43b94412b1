"""SUPERGGML_BUILD_LLAMA=ON: llama.cpp's libllama built over superggml's own ggml, as the reference.

A superggml built with CMAKE_ARGS="-DSUPERGGML_BUILD_LLAMA=ON" carries libllama.so (and bin/llama-bench) next to
its native module, built from the same llama-cpp-python 0.3.36 sdist as its ggml and linked against those very
ggml libraries. tests/support/llama_ref.py then runs llama-cpp-python's Python package from the source cache with
LLAMA_CPP_LIB_PATH at that libllama. Here: the reference child really maps that libllama and superggml's ggml (no
other copy), and its logits equal pip's llama-cpp-python's (its own libllama and ggml, compiled from the same
source for the same CPU) bit for bit on SmolLM2. And ggml/fetch.py's cache of those sources.
"""

from __future__ import annotations

import csv
import importlib.util
import io
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import llama_ref
from prompts import PROMPTS
from superggml import models

FETCH = Path(__file__).resolve().parents[2] / "ggml" / "fetch.py"
LIB = llama_ref.superggml_libllama()
needs_lib = pytest.mark.skipif(
    LIB is None,
    reason="the superggml under test carries no libllama.so (built without CMAKE_ARGS=-DSUPERGGML_BUILD_LLAMA=ON)",
)
N_POS = 64
N_ONE_BY_ONE = 2


def _pip_llama_cpp() -> Path | None:
    spec = importlib.util.find_spec("llama_cpp")
    return Path(spec.origin).parent if spec is not None and spec.origin else None


needs_pip = pytest.mark.skipif(
    _pip_llama_cpp() is None, reason="llama-cpp-python is not installed (pip install .[reference])"
)


@pytest.mark.skipif(not FETCH.is_file(), reason="not run from a source checkout")
def test_fetch_keeps_an_older_cache_for_ggml_and_refreshes_it_for_llama(tmp_path):
    root = tmp_path / "ggml-src" / "llama-cpp-python-0.3.36"
    (root / "ggml").mkdir(parents=True)
    (root / "ggml" / "CMakeLists.txt").write_text("# cached\n")
    (root / "SOURCE").write_text("llama_cpp_python-0.3.36.tar.gz sha256 832db0699007...\n")  # layout 1: ggml only
    env = dict(os.environ, SUPERGGML_CACHE=str(tmp_path), SUPERGGML_GGML_SDIST=str(tmp_path / "none.tar.gz"))
    for args, rc in (([], 0), (["--llama"], 1), (["--python"], 1)):
        r = subprocess.run([sys.executable, str(FETCH), *args], capture_output=True, text=True, env=env, timeout=60)
        assert r.returncode == rc, (args, r.stderr)
    assert r.stdout == "" and "none.tar.gz" in r.stderr  # --llama/--python went for the sdist (absent here)
    assert (root / "ggml" / "CMakeLists.txt").read_text() == "# cached\n"  # and left the old entry whole


@pytest.mark.skipif(not FETCH.is_file(), reason="not run from a source checkout")
def test_fetch_prints_the_llama_root_and_the_python_package_of_a_current_cache(tmp_path):
    spec = importlib.util.spec_from_file_location("superggml_fetch", FETCH)
    assert spec is not None and spec.loader is not None
    fetch = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fetch)
    root = tmp_path / "ggml-src" / "llama-cpp-python-0.3.36"
    for m in fetch.MARKERS:
        (root / m).parent.mkdir(parents=True, exist_ok=True)
        (root / m).write_text("")
    (root / "SOURCE").write_text(fetch.source_line())
    env = dict(os.environ, SUPERGGML_CACHE=str(tmp_path), SUPERGGML_GGML_SDIST=str(tmp_path / "none.tar.gz"))
    out = [
        subprocess.run(
            [sys.executable, str(FETCH), *a], capture_output=True, text=True, env=env, timeout=60
        ).stdout.strip()
        for a in ([], ["--llama"], ["--python"])
    ]
    assert out == [str(root / "ggml"), str(root), str(root / "python")]
    # what the cache keeps of the sdist: ggml, libllama's, common's and llama-bench's sources, llama_cpp
    top, v = "llama_cpp_python-0.3.36/", "llama_cpp_python-0.3.36/vendor/llama.cpp/"
    assert fetch.kept(v + "src/llama.cpp") == "src/llama.cpp"
    assert fetch.kept(v + "tools/llama-bench/llama-bench.cpp") == "tools/llama-bench/llama-bench.cpp"
    assert fetch.kept(top + "llama_cpp/llama_cpp.py") == "python/llama_cpp/llama_cpp.py"
    for left_out in (
        "models/ggml-vocab-llama-bpe.gguf",
        "docs/build.md",
        "tests/test-backend-ops.cpp",
        "tools/server/server.cpp",
        "examples/simple/simple.cpp",
        "gguf-py/gguf/gguf.py",
        "vendor/miniaudio/miniaudio.h",
    ):
        assert fetch.kept(v + left_out) is None, left_out


@needs_lib
def test_built_reference_maps_superggmls_libllama_and_ggml():
    assert LIB is not None
    r = llama_ref.run({"kind": "libs"}, which="built")
    libs = [Path(str(p)) for p in r["libs"]]
    here = LIB.resolve().parent
    assert [p.resolve() for p in libs if p.name.startswith("libllama")] == [LIB.resolve()]
    ggml = [p for p in libs if p.name.startswith("libggml")]
    # ggml, ggml-base, ggml-cpu (and ggml-rpc, ggml links its backends): superggml's own, no second ggml
    assert {"libggml", "libggml-base", "libggml-cpu"} <= {p.name.split(".so")[0] for p in ggml}, ggml
    assert all(p.resolve().parent == here for p in ggml), ggml
    assert Path(str(r["llama_cpp"])).parent.parent == llama_ref.cached_llama_cpp()


@needs_lib
def test_llama_bench_runs_on_the_same_libraries(smollm2_path):
    bench = LIB.parent / "bin" / "llama-bench"
    if not bench.exists():
        pytest.skip("built with -DSUPERGGML_BUILD_LLAMA_BENCH=OFF: libllama without llama-bench")
    assert os.access(bench, os.X_OK)
    ldd = subprocess.run(["ldd", str(bench)], capture_output=True, text=True, timeout=60).stdout
    for lib in ("libllama.so", "libggml.so.0", "libggml-base.so.0"):
        line = next(x for x in ldd.splitlines() if x.strip().startswith(lib))
        assert str(LIB.resolve().parent) in line, line
    r = subprocess.run(
        [str(bench), "-m", smollm2_path, "-p", "8", "-n", "2", "-r", "1", "-t", "2", "-o", "csv"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    rows = list(csv.DictReader(io.StringIO(r.stdout)))
    assert [(row["n_prompt"], row["n_gen"]) for row in rows] == [("8", "0"), ("0", "2")], r.stdout
    assert all(row["backends"] == "CPU" and float(row["avg_ts"]) > 0 for row in rows), r.stdout


@needs_lib
@needs_pip
def test_pip_reference_is_another_build():
    r = llama_ref.run({"kind": "libs"}, which="pip")
    libs = [Path(str(p)) for p in r["libs"]]
    lib_dir = _pip_llama_cpp() / "lib"
    assert [p for p in libs if p.name.startswith("libllama")] and all(p.parent == lib_dir.resolve() for p in libs)


@needs_lib
@needs_pip
def test_built_logits_equal_pips_bit_for_bit(record_property):
    path = str(models.smollm2_path())
    tok = llama_ref.run({"kind": "tokenize", "model": path, "items": [[p, True, True] for p in PROMPTS]}, which="pip")
    prompts = [[int(x) for x in tok[f"ids{i}"][:N_POS]] for i in range(len(PROMPTS))]
    out = {}
    for which in ("built", "pip"):
        batch = llama_ref.run({"kind": "logits", "model": path, "prompts": prompts}, which=which)
        seq = llama_ref.run(
            {"kind": "logits", "model": path, "prompts": prompts[:N_ONE_BY_ONE], "one_by_one": True}, which=which
        )
        out[which] = (
            [batch[f"logits{i}"] for i in range(len(prompts))],
            [seq[f"logits{i}"] for i in range(N_ONE_BY_ONE)],
        )
    for k, name in enumerate(("batched", "token_by_token")):
        built, pip = out["built"][k], out["pip"][k]
        d = max(float(np.abs(b - p).max()) for b, p in zip(built, pip))
        record_property(f"max_abs_logit_diff_{name}", d)
        print(f"\nbuilt vs pip libllama, {name}: max|dlogit| {d}")
        for b, p in zip(built, pip):
            assert b.shape == p.shape == (N_POS, p.shape[1])
            assert np.array_equal(b, p), f"{name}: max|dlogit| {d}"
