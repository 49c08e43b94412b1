"""Fetches the pinned ggml source: vendor/llama.cpp/ggml from the llama-cpp-python sdist on PyPI.

Prints the path of the extracted ggml directory. The sdist is fetched with pip (or, where pip cannot run, from
PyPI's JSON API), checked against its sha256 and unpacked once into the cache
($SUPERGGML_CACHE, else $XDG_CACHE_HOME/superggml, else ~/.cache/superggml); later builds reuse it.
SUPERGGML_GGML_SDIST=path.tar.gz uses a local copy of the sdist (still hash-checked).
Exit status 1 with a message on stderr when the source cannot be had or its hash differs.
"""

from __future__ import annotations

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
MEMBER = f"llama_cpp_python-{VERSION}/vendor/llama.cpp/"
KEEP = ("ggml/", "LICENSE")


def cache_root() -> str:
    root = os.environ.get("SUPERGGML_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "superggml")
    return os.path.join(root, "ggml-src", f"{PACKAGE}-{VERSION}")


def sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def download(dest: str) -> str:
    """The sdist in `dest`: pip first (no build isolation: only its metadata is read), then PyPI's JSON API."""
    errors = []
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-build-isolation", "--no-binary", PACKAGE,
           "--disable-pip-version-check", "-q", "-d", dest, f"{PACKAGE}=={VERSION}"]
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
    """Unpacks vendor/llama.cpp/{ggml,LICENSE} of the sdist into `out` (atomically: all or nothing)."""
    parent = os.path.dirname(out)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".extract-", dir=parent)
    try:
        with tarfile.open(sdist, "r:gz") as tar:
            members = []
            for m in tar.getmembers():
                if not m.name.startswith(MEMBER):
                    continue
                rel = m.name[len(MEMBER):]
                if not rel.startswith(KEEP) or not (m.isfile() or m.isdir()) or ".." in rel.split("/"):
                    continue
                m.name = rel
                members.append(m)
            if hasattr(tarfile, "data_filter"):
                tar.extractall(tmp, members=members, filter="data")
            else:   # pragma: no cover - Python without extraction filters
                tar.extractall(tmp, members=members)
        with open(os.path.join(tmp, "SOURCE"), "w") as f:
            f.write(f"{SDIST} sha256 {SHA256}\n")
        try:
            os.rename(tmp, out)
        except OSError:
            if not os.path.isfile(os.path.join(out, "SOURCE")):   # not a concurrent build that won the race
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    out = cache_root()
    ggml = os.path.join(out, "ggml")
    if os.path.isfile(os.path.join(out, "SOURCE")) and os.path.isfile(os.path.join(ggml, "CMakeLists.txt")):
        print(ggml)
        return 0
    try:
        with tempfile.TemporaryDirectory() as d:
            sdist = os.environ.get("SUPERGGML_GGML_SDIST") or download(d)
            got = sha256(sdist)
            if got != SHA256:
                raise RuntimeError(f"{sdist}: sha256 {got}, expected {SHA256}")
            if os.path.isdir(out):
                shutil.rmtree(out)   # a partial or stale cache entry
            extract(sdist, out)
    except (RuntimeError, OSError, tarfile.TarError) as e:
        print(f"superggml: cannot get the ggml source: {e}", file=sys.stderr)
        return 1
    print(ggml)
    return 0


if __name__ == "__main__":
    sys.exit(main())
