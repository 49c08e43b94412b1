"""Models by name, offline: a Hugging Face cache made in the test by huggingface_hub's own downloads from a loopback
hub (tests/support/fake_hub.py), then read with HF_HUB_OFFLINE=1 by Model.from_pretrained, `-hf` and
`superggml models`."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from fake_hub import FakeHub
import superggml
from superggml import Model

hf = pytest.importorskip("huggingface_hub")
PACKAGE_DIR = str(Path(superggml.__file__).resolve().parents[1])  # the superggml under test
REPO = "someone/SmolLM2-135M-GGUF"
FILE = "SmolLM2-135M-Q4_1.gguf"


@pytest.fixture(scope="module")
def cache(tmp_path_factory, smollm2_path):
    """A hub cache holding REPO's FILE (the bundled SmolLM2) and its README, downloaded through the library."""
    d = tmp_path_factory.mktemp("hf-cache")
    readme = d.parent / "README.md"
    readme.write_text("a model card\n")
    server = FakeHub({REPO: {FILE: Path(smollm2_path), "README.md": readme}})
    try:
        for name in (FILE, "README.md"):
            hf.hf_hub_download(REPO, name, cache_dir=str(d), endpoint=server.url)
    finally:
        server.close()
    return str(d)


def cli(cache: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HF_HUB_CACHE": cache, "HF_HUB_OFFLINE": "1"}
    env["PYTHONPATH"] = os.pathsep.join([PACKAGE_DIR, env.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, "-m", "superggml", *args], env=env, capture_output=True, text=True, timeout=300
    )


def test_from_pretrained_opens_a_cached_file_offline(cache, smollm2_path):
    prompt = [1, 450, 4937, 17, 2210]
    with Model(smollm2_path, ctx_size=128, n_threads=2) as m:
        ref = m.eval(prompt, logits_all=True).copy()
    for pattern in ("*Q4_1.gguf", None):  # a glob; none: the repo's first GGUF (it has no Q4_K_M)
        with Model.from_pretrained(
            REPO, pattern, local_files_only=True, cache_dir=cache, ctx_size=128, n_threads=2
        ) as m:
            assert m.path.startswith(cache) and m.path.endswith(FILE)
            assert np.array_equal(m.eval(prompt, logits_all=True), ref)


def test_what_is_not_in_the_cache_is_one_clear_error(cache):
    with pytest.raises(FileNotFoundError, match=r"someone/SmolLM2-135M-GGUF.*'\*Q8_0\*' .*SmolLM2-135M-Q4_1.gguf"):
        Model.from_pretrained(REPO, "*Q8_0*", local_files_only=True, cache_dir=cache)
    with pytest.raises(FileNotFoundError, match="'nobody/none'.*cache .offline."):
        Model.from_pretrained("nobody/none", local_files_only=True, cache_dir=cache)


def test_hf_flag_and_models_command(cache, smollm2_path):
    by_name = cli(cache, "generate", "-hf", f"{REPO}:Q4_1", "-p", "Once upon a time", "-n", "8", "--temp", "0")
    assert by_name.returncode == 0, by_name.stderr
    by_path = cli(cache, "generate", "-m", smollm2_path, "-p", "Once upon a time", "-n", "8", "--temp", "0")
    assert by_name.stdout == by_path.stdout and len(by_name.stdout) > 8
    missing = cli(cache, "generate", "-hf", f"{REPO}:IQ2_XS", "-p", "x")
    assert missing.returncode == 1
    assert f"'{REPO}' has no file matching '*IQ2_XS*.gguf' (it has: {FILE})" in missing.stderr
    listed = cli(cache, "models", "--json")
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)
    assert rows == [
        {"repo": REPO, "file": FILE, "bytes": os.path.getsize(smollm2_path), "arch": "llama", "here": "fits"}
    ]


def test_an_unreachable_hub_fails_fast_with_the_reason(cache, monkeypatch):
    """-hf without a network: under 2 s, saying the Hub is unreachable and the file is not in the cache; a file the
    cache holds still opens."""
    with socket.socket() as s:  # a loopback port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", f"http://127.0.0.1:{port}")
    t0 = time.monotonic()
    with pytest.raises(FileNotFoundError, match=r"'nobody/none'.*the Hub \(http://127\.0\.0\.1:\d+\) is unreachable"):
        Model.from_pretrained("nobody/none", cache_dir=cache)
    assert time.monotonic() - t0 < 2
    with Model.from_pretrained(REPO, "*Q4_1.gguf", cache_dir=cache, ctx_size=64, n_threads=1) as m:
        assert m.path.endswith(FILE)
