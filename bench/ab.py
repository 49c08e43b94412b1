"""One bench, two builds of superggml, in one run: before and after a change.

    python bench/ab.py --a /path/to/before/python --b /path/to/after/python [--rounds 2] -- compare.py --models qwen

Each round runs the bench script (a file of bench/, with its arguments) once with PYTHONPATH at each tree,
alternating which goes first, so a slow spell of the machine hits both. A tree is a directory holding an
importable `superggml` (a source tree's python/ with its native module beside the sources, or a
`pip install --target` folder). Prints each run's output under its label.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def run(tree: str, script: list[str], timeout: float) -> str:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [tree, os.environ.get("PYTHONPATH")])))
    r = subprocess.run(
        [sys.executable, os.path.join(HERE, script[0]), *script[1:]],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return r.stdout + (f"[exit {r.returncode}]\n{r.stderr[-2000:]}" if r.returncode else "")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--a", required=True, help="the tree before the change")
    ap.add_argument("--b", required=True, help="the tree after it")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=3600, help="seconds per run")
    ap.add_argument("script", nargs=argparse.REMAINDER, help="-- SCRIPT.py [its arguments]")
    a = ap.parse_args()
    script = a.script[1:] if a.script[:1] == ["--"] else a.script
    if not script:
        ap.error("name the bench script after --")
    for i in range(a.rounds):
        order = [("a", a.a), ("b", a.b)] if i % 2 == 0 else [("b", a.b), ("a", a.a)]
        for label, tree in order:
            print(f"=== round {i + 1}, {label}: {tree}", flush=True)
            print(run(tree, script, a.timeout), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
