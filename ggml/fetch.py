"""Fetches the pinned ggml source: vendor/llama.cpp/ggml from the llama-cpp-python sdist on PyPI.

Prints the path of the extracted ggml directory (CMake reads it). The sdist is fetched with pip (or, where pip
cannot run, from PyPI's JSON API), checked against its sha256 and unpacked once into the cache
($SUPERGGML_CACHE, else $XDG_CACHE_HOME/superggml, else ~/.cache/superggml); later builds reuse it.
SUPERGGML_GGML_SDIST=path.tar.gz uses a local copy of the sdist (still hash-checked).
Exit status 1 with a message on stderr when the source cannot be had or its hash differs.

The cache entry is a trimmed llama.cpp tree: ggml/, plus what libllama, llama-common and llama-bench build
from (CMakeLists.txt, cmake/, include/, src/, common/, tools/llama-bench/ and the vendor/ libraries common
uses), for SUPERGGML_BUILD_LLAMA=ON; and llama-cpp-python's own pure-Python package under python/llama_cpp
(the reference's bindings, pointed at that libllama with LLAMA_CPP_LIB_PATH).
  --llama    prints the llama.cpp root instead of the ggml directory
  --python   prints the directory holding the llama_cpp package (for PYTHONPATH)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.request

PACKAGE = "llama-cpp-python"
VERSION = "0.3.36"
SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
SDIST = f"llama_cpp_python-{VERSION}.tar.gz"
TOP = f"llama_cpp_python-{VERSION}/"
MEMBER = f"{TOP}vendor/llama.cpp/"
# what the cache keeps of vendor/llama.cpp/: ggml; libllama (src, include; the top CMakeLists.txt and cmake/
# add it); llama-common and llama-bench, and the vendor/ libraries llama.cpp's CMake adds (miniaudio and stb are
# header-only interface targets nothing here includes: their CMakeLists.txt only). No models, docs, tests,
# examples, gguf-py or other tools.
KEEP = (
    "ggml/",
    "LICENSE",
    "CMakeLists.txt",
    "cmake/",
    "include/",
    "src/",
    "common/",
    "tools/llama-bench/",
    "vendor/CMakeLists.txt",
    "vendor/cpp-httplib/",
    "vendor/hash/",
    "vendor/nlohmann/",
    "vendor/sheredom/",
    "vendor/miniaudio/CMakeLists.txt",
    "vendor/stb/CMakeLists.txt",
)
# and of the sdist's top: llama-cpp-python's Python package (no compiled parts in it), under python/
PY_KEEP = ("llama_cpp/", "LICENSE.md")
# 2: + the llama.cpp pieces and python/llama_cpp (1 was ggml/ and LICENSE only). The ggml directory of an older
# entry still serves (a plain build, even offline, keeps its cache); --llama and --python re-extract it.
LAYOUT = 2
# files whose presence marks a complete entry of this layout
MARKERS = (
    "ggml/CMakeLists.txt",
    "CMakeLists.txt",
    "src/CMakeLists.txt",
    "common/CMakeLists.txt",
    "tools/llama-bench/CMakeLists.txt",
    "python/llama_cpp/llama_cpp.py",
)


def cache_root() -> str:
    root = os.environ.get("SUPERGGML_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "superggml"
    )
    return os.path.join(root, "ggml-src", f"{PACKAGE}-{VERSION}")


def source_line() -> str:
    return f"{SDIST} sha256 {SHA256} layout {LAYOUT}\n"


def complete(out: str, ggml_only: bool = False) -> bool:
    """Whether `out` is a whole cache entry of this layout (with `ggml_only`: of any layout, with its ggml)."""
    try:
        with open(os.path.join(out, "SOURCE")) as f:
            if not ggml_only and f.read() != source_line():
                return False
    except OSError:
        return False
    return all(os.path.isfile(os.path.join(out, m)) for m in (MARKERS[:1] if ggml_only else MARKERS))


def kept(name: str) -> str | None:
    """The path in the cache entry of the sdist member `name`, or None where the cache leaves it out."""
    if name.startswith(MEMBER):
        rel = name[len(MEMBER) :]
        return rel if rel.startswith(KEEP) else None
    if name.startswith(TOP):
        rel = name[len(TOP) :]
        return "python/" + rel if rel.startswith(PY_KEEP) else None
    return None


def sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def download(dest: str) -> str:
    """The sdist in `dest`: pip first (no build isolation: only its metadata is read), then PyPI's JSON API."""
    errors = []
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--no-build-isolation",
        "--no-binary",
        PACKAGE,
        "--disable-pip-version-check",
        "-q",
        "-d",
        dest,
        f"{PACKAGE}=={VERSION}",
    ]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        if proc.returncode == 0 and os.path.isfile(os.path.join(dest, SDIST)):
            return os.path.join(dest, SDIST)
        errors.append(f"pip download: {proc.stderr.strip()[-2000:]}")
    except (OSError, subprocess.TimeoutExpired) as e:
        errors.append(f"pip download: {e}")
    try:
        with urllib.request.urlopen(f"https://pypi.org/pypi/{PACKAGE}/{VERSION}/json", timeout=60) as r:
            urls = [u for u in json.load(r)["urls"] if u["filename"] == SDIST]
        if urls:
            out = os.path.join(dest, SDIST)
            with urllib.request.urlopen(urls[0]["url"], timeout=600) as r, open(out, "wb") as f:
                shutil.copyfileobj(r, f, 1 << 20)
            return out
        errors.append(f"PyPI lists no {SDIST}")
    except OSError as e:
        errors.append(f"PyPI: {e}")
    raise RuntimeError("cannot fetch " + SDIST + ":\n  " + "\n  ".join(errors))


def extract(sdist: str, out: str) -> None:
    """Unpacks the kept parts of the sdist (`kept`) into `out` (atomically: all or nothing); an older or partial
    entry there is replaced."""
    parent = os.path.dirname(out)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".extract-", dir=parent)
    try:
        with tarfile.open(sdist, "r:gz") as tar:
            members = []
            for m in tar.getmembers():
                rel = kept(m.name)
                if rel is None or not (m.isfile() or m.isdir()) or ".." in rel.split("/"):
                    continue
                m.name = rel
                members.append(m)
            if hasattr(tarfile, "data_filter"):
                tar.extractall(tmp, members=members, filter="data")
            else:  # pragma: no cover - Python without extraction filters
                tar.extractall(tmp, members=members)
        with open(os.path.join(tmp, "SOURCE"), "w") as f:
            f.write(source_line())
        if os.path.lexists(out) and not complete(out):  # an older layout or a partial entry: moved aside
            old = tempfile.mkdtemp(prefix=".stale-", dir=parent)
            try:
                os.rename(out, os.path.join(old, "entry"))
            except OSError:
                pass  # a concurrent build moved it first
            shutil.rmtree(old, ignore_errors=True)
        try:
            os.rename(tmp, out)
        except OSError:
            if not complete(out):  # not a concurrent build that won the race
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Fetches and caches the pinned llama.cpp/ggml source.")
    what = ap.add_mutually_exclusive_group()
    what.add_argument("--llama", action="store_true", help="print the llama.cpp root (not the ggml directory)")
    what.add_argument("--python", action="store_true", help="print the directory holding the llama_cpp package")
    args = ap.parse_args(argv)
    out = cache_root()
    path = out if args.llama else os.path.join(out, "python") if args.python else os.path.join(out, "ggml")
    if complete(out, ggml_only=not (args.llama or args.python)):
        print(path)
        return 0
    try:
        with tempfile.TemporaryDirectory() as d:
            sdist = os.environ.get("SUPERGGML_GGML_SDIST") or download(d)
            got = sha256(sdist)
            if got != SHA256:
                raise RuntimeError(f"{sdist}: sha256 {got}, expected {SHA256}")
            extract(sdist, out)
    except (RuntimeError, OSError, tarfile.TarError) as e:
        print(f"superggml: cannot get the ggml source: {e}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
