from __future__ import annotations

import pytest

from superggml import models


@pytest.fixture(scope="session")
def smollm2_path():
    return str(models.smollm2_path())


@pytest.fixture(scope="session")
def qwen_path():
    return str(models.qwen_path())


@pytest.fixture(scope="session", params=["smollm2", "qwen"])
def model_path(request):
    """Both real models, one after the other."""
    return str(models.smollm2_path() if request.param == "smollm2" else models.qwen_path())
