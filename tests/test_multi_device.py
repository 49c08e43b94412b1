"""Blocks split over two backends (two CPU backend instances standing in for two devices)."""

from __future__ import annotations

import numpy as np
import pytest

from superggml import Model, cli
from superggml.settings import DeviceSettings

PROMPT = list(range(300, 340))


def _run(m: Model) -> np.ndarray:
    out = [m.eval(PROMPT, logits_all=True).copy()]
    t = int(np.argmax(out[0][-1]))
    for _ in range(6):
        out.append(m.eval([t]).copy())
        t = int(np.argmax(out[-1][-1]))
    return np.concatenate(out)


@pytest.mark.parametrize("split", [None, [1, 3], [1, 0]])
def test_two_backends_give_the_logits_of_one(model_path, split):
    with Model(model_path, ctx_size=128, n_batch=16, n_threads=2, repack=False) as m:
        ref = _run(m)
    with Model(model_path, ctx_size=128, n_batch=16, n_threads=2, repack=False, devices=["CPU", "CPU"],
               tensor_split=split) as m:
        out = _run(m)
        st = m.stats()
        assert st["devices"] == ["CPU", "CPU"]
        n = m.hparams.n_layer
        want = DeviceSettings(("CPU", "CPU"), tuple(split or ())).layer_split(n)
        assert st["blocks_per_device"] == list(want) and sum(want) == n
        if split is None:
            assert want == (n - n // 2, n // 2)
    assert np.array_equal(out, ref)


def test_layer_split_rounding_and_errors(smollm2_path):
    assert DeviceSettings(("A", "B"), (3, 1)).layer_split(30) == (22, 8)
    assert DeviceSettings(("A", "B", "C"), (1, 1, 1)).layer_split(30) == (10, 10, 10)
    assert DeviceSettings(("A", "B")).layer_split(31) == (16, 15)
    with pytest.raises(ValueError, match="tensor_split needs 2"):
        DeviceSettings(("A", "B"), (1,))
    with pytest.raises(ValueError, match="does not combine with paging"):
        Model(smollm2_path, devices=["CPU", "CPU"], device_budget="64MiB")
    with pytest.raises(Exception, match="(?i)device"):
        Model(smollm2_path, devices=["CPU", "NoSuchDevice"])


def test_cli_devices(smollm2_path, capsys):
    assert cli.main(["generate", "-m", smollm2_path, "-p", "Hello", "-n", "3", "--temp", "0", "-c", "64",
                     "--devices", "CPU,CPU", "--tensor-split", "2,1"]) == 0
