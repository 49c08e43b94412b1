"""`superggml chat` in a real terminal: tmux runs it, send-keys types, capture-pane reads the screen. Greedy answers
on the bundled SmolLM2, compared with the API's own: the second turn's answer is the one that sees the first."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

import superggml
from superggml import Model

from prompts import greedy

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")
PACKAGE_DIR = str(Path(superggml.__file__).resolve().parents[1])  # the superggml under test
U1, U2 = "My name is Ada and I live in Paris.", "Where do I live?"


class Terminal:
    """A tmux session of its own (its own server socket) running one command."""

    def __init__(self, tmp: Path, name: str, argv: list[str]):
        self.sock, self.name = str(tmp / f"{name}.sock"), name
        env = {
            "PYTHONPATH": os.pathsep.join([PACKAGE_DIR, os.environ.get("PYTHONPATH", "")]),
            "SUPERGGML_CHAT_HISTORY": str(tmp / "history"),
        }
        cmd = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items()) + " " + shlex.join(argv)
        self.tmux("new-session", "-d", "-s", name, "-x", "220", "-y", "60", cmd)
        self.tmux("set-option", "-t", name, "remain-on-exit", "on")

    def tmux(self, *args: str) -> str:
        return subprocess.run(["tmux", "-S", self.sock, *args], check=True, capture_output=True, text=True).stdout

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p", "-J", "-S", "-2000", "-t", self.name)

    def type(self, text: str) -> None:
        self.tmux("send-keys", "-t", self.name, "-l", text)
        self.tmux("send-keys", "-t", self.name, "Enter")

    def wait(self, test, timeout: float = 120.0) -> str:
        end = time.time() + timeout
        while time.time() < end:
            s = self.screen()
            if test(s):
                return s
            time.sleep(0.1)
        raise AssertionError(f"the screen never got there:\n{self.screen()}")

    def prompts(self, n: int) -> str:
        """The screen once it shows n input prompts."""
        return self.wait(lambda s: s.count(">>> ") >= n)

    def dead(self) -> bool:
        return self.tmux("display-message", "-p", "-t", self.name, "#{pane_dead}").strip() == "1"

    def close(self) -> None:
        subprocess.run(["tmux", "-S", self.sock, "kill-server"], capture_output=True)


def chat(tmp: Path, name: str, *args: str) -> Terminal:
    return Terminal(tmp, name, [sys.executable, "-m", "superggml", "chat", "--temp", "0", "-c", "1024", *args])


def test_two_turns_save_clear_load_and_stats(tmp_path, smollm2_path):
    with Model(smollm2_path, ctx_size=1024, n_threads=2) as m:
        a1 = greedy(m, [{"role": "user", "content": U1}], 64)
        a2 = greedy(
            m,
            [{"role": "user", "content": U1}, {"role": "assistant", "content": a1}, {"role": "user", "content": U2}],
            64,
        )
        alone = greedy(m, [{"role": "user", "content": U2}], 64)
    assert a2 != alone  # the second answer depends on the first turn
    t = chat(tmp_path, "turns", "-n", "64")
    try:
        t.prompts(1)
        t.type(U1)
        s = t.prompts(2)
        assert a1.splitlines()[0] in s
        t.type(U2)
        s = t.prompts(3)
        assert a2.splitlines()[0] in s and alone.splitlines()[0] not in s
        t.type(f"/save {tmp_path / 'talk.seq'}")
        t.wait(lambda s: "(saved 4 messages" in s)
        t.type("/clear")
        t.wait(lambda s: "(conversation cleared)" in s)
        t.type(f"/load {tmp_path / 'talk.seq'}")
        t.wait(lambda s: "(loaded 4 messages" in s)
        t.type("/stats")
        t.wait(lambda s: "n_tokens" in s and "passes" in s)
        t.type("/exit")
        t.wait(lambda s: t.dead(), 30)
    finally:
        t.close()
    assert (tmp_path / "talk.seq").exists() and (tmp_path / "talk.seq.json").exists()


def test_ctrl_c_stops_an_answer_not_the_chat(tmp_path):
    t = chat(tmp_path, "stop", "-n", "2000")
    try:
        t.prompts(1)
        t.type("Count from 1 to 1000, one number per line.")
        t.wait(lambda s: len([x for x in s.split("one number per line.")[-1].splitlines() if x.strip()]) >= 5)
        t.tmux("send-keys", "-t", t.name, "C-c")
        s = t.prompts(2)
        assert "[stopped]" in s and not t.dead()
        t.type("/help")
        t.wait(lambda s: "/save FILE" in s)
        t.tmux("send-keys", "-t", t.name, "C-d")
        t.wait(lambda s: t.dead(), 30)
    finally:
        t.close()
