"""Injected I/O faults (a test hook in csrc/io): transient ones are retried, hard ones reach the caller as
exceptions, nothing hangs, and once the fault is gone the same model carries on with the right logits."""

from __future__ import annotations

import errno
import os
import shutil

import numpy as np
import pytest

from superggml import Model, native

PROMPT = [1, 300, 301, 302, 303, 304]


@pytest.fixture(autouse=True)
def _no_faults_after():
    yield
    native.clear_io_faults()


@pytest.fixture(scope="module")
def reference(smollm2_path):
    with Model(smollm2_path, ctx_size=128, n_threads=2, repack=False) as m:
        out = [m.eval(PROMPT).copy()]
        for t in (7, 8, 9):
            out.append(m.eval([t]).copy())
    return out


STREAMED = {
    "pread": dict(device_budget="6MiB"),
    "prefetch": dict(device_budget="10MiB", async_prefetch=True),
    "o_direct": dict(device_budget="6MiB", direct_io=True),
    "staged": dict(device_budget="6MiB", staged_io=True),
    # a host tier of 4 blocks in the file's layout, read with O_DIRECT in chunks several at once
    "tier_direct": dict(device_budget="6MiB", staged_io=True, host_cache="14MiB", direct_io=True),
}


@pytest.mark.parametrize("mode", sorted(STREAMED))
@pytest.mark.parametrize("kind", ["short_read", "eintr"])
def test_transient_faults_are_retried(smollm2_path, reference, mode, kind):
    with Model(smollm2_path, ctx_size=128, n_threads=2, **STREAMED[mode]) as m:
        native.inject_io_fault(kind, skip=3, count=25)
        out = [m.eval(PROMPT).copy()] + [m.eval([t]).copy() for t in (7, 8, 9)]
        assert native.io_fault_hits() > 0
    for a, b in zip(out, reference):
        assert np.array_equal(a, b)


@pytest.mark.parametrize("mode", sorted(STREAMED))
def test_eio_reaches_the_caller_and_the_model_carries_on(smollm2_path, reference, mode):
    with Model(smollm2_path, ctx_size=128, n_threads=2, **STREAMED[mode]) as m:
        assert np.array_equal(m.eval(PROMPT), reference[0])
        native.inject_io_fault("eio", skip=2, count=-1)
        with pytest.raises(OSError, match="Input/output error"):
            m.eval([7])
        assert m.n_tokens == len(PROMPT)  # the failed step left no trace
        native.clear_io_faults()
        for t, ref in zip((7, 8, 9), reference[1:]):
            assert np.array_equal(m.eval([t]), ref)


@pytest.mark.parametrize("kind", ["enospc", "eio"])
def test_kv_spill_write_faults(smollm2_path, reference, tmp_path, kind):
    with Model(
        smollm2_path,
        ctx_size=128,
        n_threads=2,
        repack=False,
        paged_kv=True,
        kv_page_size=16,
        kv_device_layers=2,
        host_budget=0,
        kv_spill_dir=tmp_path,
    ) as m:
        assert np.array_equal(m.eval(PROMPT), reference[0])
        native.inject_io_fault(kind, count=-1)
        with pytest.raises(OSError, match="cannot write the KV spill file"):
            m.eval([7])
        native.clear_io_faults()
        for t, ref in zip((7, 8, 9), reference[1:]):
            assert np.array_equal(m.eval([t]), ref)


def test_kv_spill_read_fault(smollm2_path, reference, tmp_path):
    with Model(
        smollm2_path,
        ctx_size=128,
        n_threads=2,
        repack=False,
        paged_kv=True,
        kv_page_size=16,
        kv_device_layers=2,
        host_budget=0,
        kv_spill_dir=tmp_path,
        async_prefetch=True,
    ) as m:
        assert np.array_equal(m.eval(PROMPT), reference[0])
        assert np.array_equal(m.eval([7]), reference[1])
        native.inject_io_fault("eio", count=-1)
        with pytest.raises(OSError, match="cannot (read|write) the KV spill file"):
            m.eval([8])
        native.clear_io_faults()
        assert np.array_equal(m.eval([8]), reference[2])
        assert np.array_equal(m.eval([9]), reference[3])


def test_file_replaced_mid_run_keeps_reading_the_open_file(smollm2_path, reference, tmp_path):
    """Replacing the path (as a package upgrade does) leaves the open file as it was: same logits."""
    p = tmp_path / "m.gguf"
    shutil.copy(smollm2_path, p)
    with Model(p, ctx_size=128, n_threads=2, device_budget="6MiB", async_prefetch=True) as m:
        assert np.array_equal(m.eval(PROMPT), reference[0])
        other = tmp_path / "other.gguf"
        other.write_bytes(b"\0" * 4096)
        os.replace(other, p)
        for t, ref in zip((7, 8, 9), reference[1:]):
            assert np.array_equal(m.eval([t]), ref)


def test_unknown_fault_kind():
    with pytest.raises(
        native.SuperggmlError if hasattr(native, "SuperggmlError") else Exception, match="unknown I/O fault"
    ):
        native.inject_io_fault("gremlins")


# resident weights: the background load (csrc/weight-loader) populates the mapping through the same hook
@pytest.mark.parametrize("kind", ["short_read", "eintr"])
def test_background_load_retries_transient_faults(smollm2_path, reference, kind):
    native.inject_io_fault(kind, count=25)
    with Model(smollm2_path, ctx_size=128, n_threads=2, repack=False) as m:
        out = [m.eval(PROMPT).copy()] + [m.eval([t]).copy() for t in (7, 8, 9)]
        assert native.io_fault_hits() > 0
    for a, b in zip(out, reference):
        assert np.array_equal(a, b)


def test_background_load_eio_reaches_the_first_pass_and_the_model_carries_on(smollm2_path, reference):
    native.inject_io_fault("eio", count=-1)
    with Model(smollm2_path, ctx_size=128, n_threads=2, repack=False) as m:
        with pytest.raises(OSError, match="Input/output error") as err:
            m.eval(PROMPT)
        assert err.value.errno == errno.EIO
        assert m.n_tokens == 0
        native.clear_io_faults()
        assert np.array_equal(m.eval(PROMPT), reference[0])
        for t, ref in zip((7, 8, 9), reference[1:]):
            assert np.array_equal(m.eval([t]), ref)


def test_close_while_loading(smollm2_path):
    for _ in range(5):
        Model(smollm2_path, ctx_size=64, n_threads=2).close()
