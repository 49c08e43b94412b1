"""Run a command under a real RAM limit: a child of this process's own memory cgroup (v1 or v2).

As docs/design.md says: create the child, write its limit, put the child process in
it, remove the folder after; drop the model file's pages from the page cache
first so file-backed memory is charged to the limited process, not left over.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path


def own_memory_cgroup() -> tuple[Path, str] | None:
    """(folder of this process's memory cgroup, "v1" or "v2"), or None if it cannot be used."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            d = Path("/sys/fs/cgroup/memory") / path.lstrip("/")
            if (d / "memory.limit_in_bytes").exists():
                return d, "v1"
    for line in lines:
        if line.startswith("0::"):
            d = Path("/sys/fs/cgroup") / line[3:].lstrip("/")
            if (d / "memory.max").exists() or (d / "cgroup.controllers").exists():
                return d, "v2"
    return None


def drop_page_cache(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)  # dirty pages (a file just written) are not dropped, and stay charged elsewhere
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


@contextlib.contextmanager
def limited(limit_bytes: int) -> Iterator[Callable[[], None]]:
    """A new child memory cgroup limited to limit_bytes, removed on exit; yields a preexec_fn that puts the
    calling process in it (for subprocess). Raises PermissionError or FileNotFoundError when no child cgroup
    can be made here."""
    found = own_memory_cgroup()
    if found is None:
        raise FileNotFoundError("no memory cgroup found for this process")
    base, version = found
    child = base / f"superggml-test-{uuid.uuid4().hex[:8]}"
    child.mkdir()
    try:
        if version == "v1":
            (child / "memory.limit_in_bytes").write_text(str(limit_bytes))
        else:
            (child / "memory.max").write_text(str(limit_bytes))
            (child / "memory.swap.max").write_text("0")
        procs = str(child / "cgroup.procs")

        def enter() -> None:
            with open(procs, "w") as f:
                f.write(str(os.getpid()))

        yield enter
    finally:
        child.rmdir()


def run_limited(argv: list[str], limit_bytes: int, timeout: float) -> subprocess.CompletedProcess:
    """Runs argv in a new child memory cgroup limited to limit_bytes (see limited())."""
    with limited(limit_bytes) as enter:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, preexec_fn=enter)


def run_maybe_limited(
    argv: list[str], model: str, limit_bytes: int | None, timeout: float
) -> subprocess.CompletedProcess:
    """Runs argv (output captured): in a new cgroup of limit_bytes with `model`'s pages dropped from the page
    cache first, or plainly when limit_bytes is None."""
    if limit_bytes:
        drop_page_cache(model)
        return run_limited(argv, limit_bytes, timeout)
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
