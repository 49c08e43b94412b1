"""`superggml ARGS` run in the test's own process (superggml.commands.cli.main), its output read through pytest's
capsys: for the tests of a command's flags and printed results. (The tests that need a process of its own run
`python -m superggml` themselves; a usage error's SystemExit is pytest.raises' to catch.)"""

from __future__ import annotations

from typing import NamedTuple

import pytest


class Printed(NamedTuple):
    out: str
    err: str


def run_cli(capsys: pytest.CaptureFixture[str], *args: str, rc: int = 0) -> Printed:
    """cli.main(args), which must return rc (0, or 1 for an error it reported); what was printed to stdout and
    stderr since capsys was last read (read here, so that the next run's output is its own)."""
    from superggml.commands import cli

    got = cli.main(list(args))
    printed = capsys.readouterr()
    assert got == rc, f"superggml {' '.join(args)} returned {got}, not {rc}; stderr:\n{printed.err}"
    return Printed(printed.out, printed.err)
