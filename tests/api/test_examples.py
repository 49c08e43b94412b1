"""The examples/ programs: a NumPy (and a PyTorch) forward pass of SmolLM2 streaming its layers through
superggml.paging, checked against Model.eval."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import superggml
from synth_gguf import dequantized_copy

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TOKENS = [1, 504, 3458, 282, 4649, 314, 2114, 30]


@pytest.fixture(scope="session")
def smollm2_f32(smollm2_path, tmp_path_factory):
    """SmolLM2 with every tensor dequantized to F32 (the Q4_1 file's own numbers): no quantized activations."""
    return str(dequantized_copy(smollm2_path, tmp_path_factory.mktemp("f32") / "smollm2-f32.gguf"))


def run_example(name: str, path: str, kv_type: str, out: Path, *extra: str) -> tuple[np.ndarray, dict[str, str]]:
    r = subprocess.run(
        [
            sys.executable,
            str(EXAMPLES / name),
            path,
            "--tokens",
            ",".join(map(str, TOKENS)),
            "--kv-type",
            kv_type,
            "--save",
            str(out),
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr
    report = dict(re.findall(r"^([a-zA-Z ]+): (.*)$", r.stdout, re.M))
    return np.load(out), report


def reference(path: str, kv_type: str) -> np.ndarray:
    with superggml.Model(path, kv_type=kv_type) as m:
        return m.eval(TOKENS, logits_all=True).reshape(len(TOKENS), -1)


def mib(report: dict[str, str], key: str) -> float:
    return float(report[key].split()[0])


EXAMPLE = [pytest.param("numpy_forward.py", id="numpy"), pytest.param("torch_forward.py", id="torch")]


@pytest.fixture(params=EXAMPLE)
def example(request):
    if request.param == "torch_forward.py":
        pytest.importorskip("torch")
    return request.param


def test_example_equals_model_on_f32_weights(example, smollm2_f32, tmp_path):
    """F32 weights and an F32 K/V cache: nothing is rounded to a coarser type, so NumPy's (or torch's) float32
    arithmetic and ggml's differ only in summation order. Two layers' weights in memory, the next prefetched."""
    logits, report = run_example(example, smollm2_f32, "f32", tmp_path / "l.npy")
    ref = reference(smollm2_f32, "f32")
    diff = float(np.abs(logits - ref).max())
    size = Path(smollm2_f32).stat().st_size / 2**20
    grew = mib(report, "peak RSS") - mib(report, "RSS at start")
    print(
        f"\n{example}, SmolLM2 F32: max |diff| {diff:.3g}; {report['weights in memory']}; peak RSS "
        f"{report['peak RSS']} ({grew:.0f} MiB over the imports) for a {size:.0f} MiB file"
    )
    assert diff < 1e-3
    assert (logits.argmax(1) == ref.argmax(1)).all()
    assert grew < size / 2  # the model is never all in memory


def test_example_on_the_quantized_file(example, smollm2_path, tmp_path):
    """The shipped Q4_1 file, activations rounded as ggml-cpu rounds them. Q8_1 blocks store their sums in F16,
    so a float rounding difference can move a product by ~0.1: the logits agree to about 1, not to float
    tolerance, and so do the next tokens wherever the reference's top two are further apart than that."""
    logits, report = run_example(example, smollm2_path, "f16", tmp_path / "l.npy")
    ref = reference(smollm2_path, "f16")
    diff = np.abs(logits - ref).max()
    print(f"\n{example}, SmolLM2 Q4_1: max |diff| {diff:.3g} of max |logit| {np.abs(ref).max():.3g}")
    assert diff < 2.0
    top2 = np.sort(ref, 1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > 2 * np.abs(logits - ref).max(1)  # a row's argmax cannot move by less
    assert clear.any()
    assert (logits.argmax(1) == ref.argmax(1))[clear].all()
    assert min(np.corrcoef(a, b)[0, 1] for a, b in zip(logits, ref)) > 0.99


@pytest.mark.slow
def test_examples_pass_mypy_strict():
    """Both examples type-check under --strict against superggml's stubs (python/superggml/native.pyi); without
    torch installed, torch is Any (pyproject's [tool.mypy])."""
    pytest.importorskip("mypy")
    root = EXAMPLES.parent
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--no-incremental",
            "--config-file",
            str(root / "pyproject.toml"),
            str(EXAMPLES / "numpy_forward.py"),
            str(EXAMPLES / "torch_forward.py"),
        ],
        capture_output=True,
        text=True,
        cwd=root,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout + r.stderr
