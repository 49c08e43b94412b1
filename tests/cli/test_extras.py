"""A missing optional dependency is one line naming the extra to install, exit 2, no traceback."""

from __future__ import annotations

import subprocess
import sys

import pytest

BLOCKED = """
import sys
for name in sys.argv[1].split(","):
    sys.modules[name] = None          # import of it raises ImportError, as when it is not installed
from superggml.commands.cli import main
sys.exit(main(sys.argv[2:]))
"""


def run_without(modules: str, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", BLOCKED, modules, *argv], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("missing", ["fastapi", "uvicorn"])
def test_serve_without_server_extra(smollm2_path, missing):
    r = run_without(missing, "serve", "-m", smollm2_path, "--port", "0")
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines() == [
        f"superggml: superggml's server needs {missing}, which is not installed: pip install 'superggml[server]'"
    ]


def test_plot_without_plot_extra(tmp_path):
    metrics = tmp_path / "m.jsonl"
    metrics.write_text("")
    r = run_without("matplotlib", "plot", str(metrics), "-o", str(tmp_path / "t.png"))
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    assert r.stderr.strip() == (
        "superggml: superggml plot needs matplotlib, which is not installed: pip install 'superggml[plot]'"
    )


def test_library_import_names_the_extra():
    code = (
        "import sys; sys.modules['fastapi'] = None\n"
        "from superggml import MissingExtra\n"
        "try:\n    import superggml.serve\nexcept MissingExtra as e:\n"
        "    assert isinstance(e, ImportError); print(e)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "pip install 'superggml[server]'" in r.stdout
