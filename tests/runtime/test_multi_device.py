"""Blocks split over two backends (two CPU backend instances standing in for two devices)."""

from __future__ import annotations

import numpy as np
import pytest

from superggml import Model
from superggml.runtime.plan.devices import layer_split
from superggml.settings import DeviceSettings

from prompts import run_prompt  # noqa: E402
from cli_runner import run_cli


@pytest.mark.parametrize("split", [None, [1, 3], [1, 0]])
def test_two_backends_give_the_logits_of_one(model_path, split):
    with Model(model_path, ctx_size=128, n_batch=16, n_threads=2, repack=False) as m:
        ref = run_prompt(m)
    with Model(
        model_path, ctx_size=128, n_batch=16, n_threads=2, repack=False, devices=["CPU", "CPU"], tensor_split=split
    ) as m:
        out = run_prompt(m)
        st = m.stats()
        assert st["devices"] == ["CPU", "CPU"]
        n = m.hparams.n_layer
        want = layer_split(n, 2, tuple(split or ()))
        assert st["blocks_per_device"] == list(want) and sum(want) == n
        if split is None:
            assert want == (n - n // 2, n // 2)
    assert np.array_equal(out, ref)


def test_layer_split_rounding_and_errors(smollm2_path):
    assert layer_split(30, 2, (3, 1)) == (22, 8)
    assert layer_split(30, 3, (1, 1, 1)) == (10, 10, 10)
    assert layer_split(31, 2) == (16, 15)
    with pytest.raises(ValueError, match="tensor_split needs 2"):
        DeviceSettings(("A", "B"), (1,))
    with pytest.raises(ValueError, match="device_budget per device"):
        Model(smollm2_path, devices=["CPU", "CPU"], dynamic_layers=True)
    with pytest.raises(ValueError, match="device_budget gives 3 sizes for 2 devices"):
        Model(smollm2_path, devices=["CPU", "CPU"], device_budget="64MiB,64MiB,1GiB")
    with pytest.raises(Exception, match="(?i)device"):
        Model(smollm2_path, devices=["CPU", "NoSuchDevice"])


def test_cli_devices(smollm2_path, capsys):
    run_cli(
        capsys,
        "generate",
        "-m",
        smollm2_path,
        "-p",
        "Hello",
        "-n",
        "3",
        "--temp",
        "0",
        "-c",
        "64",
        "--devices",
        "CPU,CPU",
        "--tensor-split",
        "2,1",
    )
