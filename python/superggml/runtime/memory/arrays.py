"""Tensors read back as numpy arrays."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from ... import native


def tensor_array(t: native.Tensor) -> npt.NDArray[Any]:
    """The contents of an F32, I32 or F16 tensor (native.tensor_get's numpy array, row-major); a tensor of another
    type reads back as bytes, which this refuses."""
    a = native.tensor_get(t)
    assert isinstance(a, np.ndarray), "tensor_array reads F32, I32 and F16 tensors"
    return a
