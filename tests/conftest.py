"""The suite's fixtures and the quick loop's marks. The helper modules the tests import by name (synth_gguf,
llama_ref, prompts, ...) live in tests/support/, put on sys.path here for every test folder (and for the benches,
which do the same in their own files)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "support"))

import synth_gguf  # noqa: E402

from superggml import models  # noqa: E402
from superggml.settings import default_threads  # noqa: E402

synth_gguf.enable_cache()  # the families' synthetic files are written once per run, then copied

MAX_WORKERS = 4  # each worker holds its own references, models and llama.cpp process


def openmp() -> bool:
    """Whether ggml's CPU threads here are OpenMP's (the library mapped): only then does OMP_THREAD_LIMIT share
    the cores among workers; ggml's own thread pool would not heed it."""
    try:
        with open("/proc/self/maps") as f:
            return any("libgomp" in line or "libomp" in line for line in f)
    except OSError:
        return False


def pytest_xdist_auto_num_workers(config):
    """-n auto (the suite's default, pyproject's addopts): a worker per core, at most MAX_WORKERS; one without
    OpenMP."""
    return max(1, min(MAX_WORKERS, default_threads())) if openmp() else 1


def pytest_configure(config):
    """With workers, ggml's compute threads (OpenMP's, in superggml and in the llama.cpp reference alike) are the
    cores shared out among them: two workers of two threads on two cores would spin at ggml's barriers waiting
    for each other. Set here, before the workers start, so that they and every process they run inherit it."""
    n = int(getattr(config.option, "numprocesses", 0) or 0)
    if n > 1 and "PYTEST_XDIST_WORKER" not in os.environ and "OMP_THREAD_LIMIT" not in os.environ:
        os.environ["OMP_THREAD_LIMIT"] = str(max(1, default_threads() // n))


def pytest_collection_modifyitems(config, items):
    """The quick loop, `pytest -m "not slow"`: the first case of each parametrized test stands for its matrix;
    the other cases, like the tests marked slow, run in the full suite only."""
    seen = set()
    for item in items:
        name = item.nodeid.split("[")[0]
        if name in seen:
            item.add_marker(pytest.mark.slow)
        seen.add(name)


@pytest.fixture(scope="session")
def smollm2_path():
    return str(models.smollm2_path())


@pytest.fixture(scope="session")
def vocab_fields(smollm2_path):
    """SmolLM2's tokenizer keys, for the synthetic models of tests/support/synth_gguf.py."""
    return synth_gguf.vocab_fields(smollm2_path)


@pytest.fixture(scope="session")
def small_vocab(vocab_fields):
    """SmolLM2's first 1024 tokens, for the tests of a family's numbers rather than its text."""
    return synth_gguf.small_vocab_fields(vocab_fields, 1024)


@pytest.fixture(scope="session")
def qwen_path():
    return str(models.qwen_path())


@pytest.fixture(scope="session", params=["smollm2", "qwen"])
def model_path(request):
    """Both real models, one after the other."""
    return str(models.smollm2_path() if request.param == "smollm2" else models.qwen_path())


@pytest.fixture
def model_kwargs(monkeypatch):
    """The keyword arguments the next Model(...) gets (the CLI's flags as they reach the library)."""
    from superggml import Model

    seen: dict = {}
    real = Model.__init__

    def spy(self, path, **kw):
        seen.update(kw)
        real(self, path, **kw)

    monkeypatch.setattr(Model, "__init__", spy)
    return seen
