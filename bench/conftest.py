from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "support"))

from superggml import models  # noqa: E402


def pytest_xdist_auto_num_workers(config):
    """The benches time one thing at a time: no workers (pyproject's -n auto is for the tests)."""
    return 0


@pytest.fixture(scope="session", params=["smollm2", "qwen"])
def bench_model(request):
    return request.param, str(models.smollm2_path() if request.param == "smollm2" else models.qwen_path())
