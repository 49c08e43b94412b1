"""Types of the public paging API: python/superggml/native.pyi against the built module (mypy.stubtest), and
superggml.paging, superggml.gguf and a stack using them under mypy --strict; the whole package under
pyproject.toml's [tool.mypy] (strict, loosened per module there)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("mypy")

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "pyproject.toml"
ALLOWLIST = ROOT / "tests" / "stubtest-allowlist.txt"

# Another stack streaming its own weights through the paging API, as a user would write it. Type-checked, never
# run: assert_type pins the precise types (an Any would fail it), and under --strict an unused "type: ignore"
# fails too, so the ignored line checks that a wrong argument is an error.
STACK = '''
from __future__ import annotations

import sys
from typing import Any, Optional

import numpy as np
import numpy.typing as npt
from typing_extensions import CapsuleType, assert_type

from superggml import native, gguf, paging


def stream(path: str, layers: list[list[str]]) -> float:
    total = 0.0
    with paging.BufferPool(1 << 20, 2) as pool, paging.Prefetcher(path, n_workers=2) as io:
        slot = pool.acquire(7)
        assert_type(slot, paging.Slot)
        assert_type(slot.hit, bool)
        assert_type(slot.evicted, int)
        fut = io.submit(slot, [(0, paging.DIRECT_ALIGN, 0)], priority=1)
        assert_type(fut, paging.LoadFuture)
        fut.result(timeout=5.0)
        assert_type(fut.done(), bool)
        arr = np.asarray(slot)
        assert_type(arr, npt.NDArray[np.uint8])
        mv = memoryview(slot)
        assert_type(mv.nbytes, int)
        if sys.version_info >= (3, 12):  # numpy's stubs take any Buffer from 3.12 on, a fixed list of types before
            f32 = np.frombuffer(slot, dtype=np.float32, count=16)
        else:
            f32 = np.frombuffer(mv, dtype=np.float32, count=16)
        assert_type(f32, npt.NDArray[np.float32])
        from_dlpack = np.from_dlpack(slot)   # as torch.from_dlpack(slot)
        assert_type(slot.__dlpack__(), CapsuleType)
        assert_type(slot.__dlpack_device__(), tuple[int, int])
        t = slot.tensor(paging.ggml_type("f32"), [16])
        assert_type(t, native.Tensor)
        assert_type(t.ne, list[int])
        total += float(f32.sum())
        del arr, mv, f32, from_dlpack
        slot.release()
        pool.acquire("7")  # type: ignore[arg-type]
        assert_type(pool.stats(), dict[str, int])

        with gguf.open(path) as reader:
            info = reader.info("blk.0.ffn_down.weight")
            assert_type(info.shape, tuple[int, ...])
            raw = reader.read(info.name, rows=(0, 4))
            w = gguf.dequantize(raw, info.type, (info.shape[0], raw.shape[0]), dtype=np.float16)
            assert_type(w, np.ndarray)
            acts = gguf.quantize_activations(np.ones((2, info.shape[0]), np.float32), info.type)
            assert_type(acts, gguf.Activations)
            total += float((acts.values @ w.T.astype(np.float32)).sum() + acts.sums.sum())
            with pool.acquire(8) as dst:
                assert_type(dst, paging.Slot)
                done = reader.read_into(info.name, dst, io, rows=(0, 1))
                assert_type(done, paging.LoadFuture)
                done.result()
                assert_type(gguf.dequantize(dst, info.type, (info.shape[0], 1)), np.ndarray)
            assert_type(gguf.vec_dot_type(info.type), str)
            assert_type(reader.metadata(), dict[str, Any])

    with paging.LayerPager(path, layers, n_slots=2) as pager:
        assert_type(pager.prefetch(0), bool)
        with pager.acquire(0) as layer:
            assert_type(layer, paging.Layer)
            for name in layer.names():
                view = paging.layer_array(layer, name)
                total += float(view.astype(np.float32).sum())
                tensor = layer.get(name)
                assert_type(tensor.type, native.GGMLType)
                assert_type(native.row_size(tensor.type, tensor.ne[0]), int)
                assert_type(layer.offset(name), int)
                del view

    with paging.KVCache(2, 64, 128, page_size=64) as kv:
        frame = kv.acquire(seq=0, layer=1, n_valid=0)
        assert_type(frame, paging.KVFrame)
        kv.k_array(frame)[:4] = 0
        frame.written(4)
        assert_type(frame.v_offset, int)
        frame.release()

    assert_type(paging.memory(nvml=False).host_available, int)
    kind, rows = native.to_vec_dot(native.GGMLType.Q4_K, np.zeros((1, 256), np.float32))
    assert_type(kind, native.GGMLType)
    assert_type(rows, npt.NDArray[np.uint8])
    last: Optional[tuple[float, float]] = native.LayerPager(
        native.WeightStore(native.GGUFFile(path)), layers, 2).last_load(0)
    return total + (last[1] if last else 0.0)
'''


@pytest.fixture(scope="module")
def mypy_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Fresh per run: a cache left by a run before the stub existed hides it.
    return tmp_path_factory.mktemp("mypy_cache")


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=900)


def _mypy_strict(cache: Path, *files: str) -> subprocess.CompletedProcess[str]:
    return _run("mypy", "--strict", "--config-file", str(CONFIG), "--cache-dir", str(cache), *files)


def test_stub_matches_the_built_module():
    # The allowlist's entries must all be used: a run that did not check the stub fails on them.
    r = _run("mypy.stubtest", "superggml.native", "--mypy-config-file", str(CONFIG), "--allowlist", str(ALLOWLIST))
    assert r.returncode == 0 and "Success" in r.stdout, r.stdout + r.stderr


def test_paging_and_gguf_pass_mypy_strict(mypy_cache):
    r = _mypy_strict(
        mypy_cache,
        "python/superggml/native.pyi",
        "python/superggml/paging.py",
        "python/superggml/gguf.py",
        "python/superggml/hashes.py",
    )
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.slow
def test_the_package_passes_mypy(mypy_cache):
    # No files named: the config's (the package's every module, counted to show that they were checked)
    r = _run("mypy", "--config-file", str(CONFIG), "--cache-dir", str(mypy_cache))
    assert r.returncode == 0, r.stdout + r.stderr
    assert int(r.stdout.split(" in ")[1].split()[0]) > 60, r.stdout


@pytest.mark.parametrize("python_version", ["3.11", "3.12"])
def test_a_stack_using_the_paging_api_passes_mypy_strict(mypy_cache, tmp_path, python_version):
    stack = tmp_path / "user_stack.py"
    stack.write_text(textwrap.dedent(STACK))
    r = _mypy_strict(mypy_cache, "--python-version", python_version, str(stack))
    assert r.returncode == 0, r.stdout + r.stderr


def test_a_type_error_in_the_stack_is_reported(mypy_cache, tmp_path):
    stack = tmp_path / "wrong_stack.py"
    stack.write_text(
        textwrap.dedent('''
        from superggml import paging

        def first_byte(pool: paging.BufferPool) -> str:
            slot = pool.acquire(0)
            return slot.nbytes
    ''')
    )
    r = _mypy_strict(mypy_cache, str(stack))
    assert r.returncode == 1 and 'Incompatible return value type (got "int", expected "str")' in r.stdout, r.stdout
