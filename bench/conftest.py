from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "support"))

from superggml import models  # noqa: E402


@pytest.fixture(scope="session", params=["smollm2", "qwen"])
def bench_model(request):
    return request.param, str(models.smollm2_path() if request.param == "smollm2" else models.qwen_path())
