"""`superggml chat`: a conversation in the terminal, as llama-cli, `ollama run` and mlx_lm.chat hold one.

Each turn goes through the GGUF's chat template with the whole conversation; the prompt it shares with the turn
before is not computed again (the model's prompt reuse), so a turn costs its own tokens. Answers stream as they
are sampled; Ctrl-C stops an answer (what was said stays in the conversation), Ctrl-D or /exit ends the chat."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, TextIO

from ..runtime.exec.profile import speed

HELP = """commands:
  /system TEXT   set the system prompt (and start over)
  /clear         forget the conversation
  /save FILE     save the conversation (FILE: the model's memory of it, FILE.json: its messages)
  /load FILE     go back to a saved conversation
  /stats         the model's figures (pager, K/V cache, tokens)
  /help          this
  /exit          leave (or Ctrl-D)
a line ending in \\ goes on on the next line; \"\"\" starts and ends a block of several lines"""


@dataclass
class Chat:
    """One conversation with a model (superggml.Model), its messages in the chat template's roles."""

    model: Any
    sampling: dict[str, Any]
    system: str | None = None
    messages: list[dict[str, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        self.messages = [{"role": "system", "content": self.system}] if self.system else []

    def reply(self, text: str, write: Callable[[str], None]) -> str:
        """The model's answer to `text`, written piece by piece as it is sampled; Ctrl-C ends it early."""
        self.messages.append({"role": "user", "content": text})
        pieces: list[str] = []
        prof = self.model.runtime.profile
        start = first = prof.mark()
        chunks = self.model.create_chat_completion(list(self.messages), stream=True, **self.sampling)
        try:
            for i, c in enumerate(chunks):
                first = prof.mark() if i == 0 else first
                piece = c["choices"][0]["delta"].get("content") or ""
                pieces.append(piece)
                write(piece)
        except KeyboardInterrupt:
            write(" [stopped]")
        finally:
            chunks.close()
        write(f"\n[{format_speed(speed(start, first, prof.mark()))}]")
        answer = "".join(pieces)
        self.messages.append({"role": "assistant", "content": answer})
        return answer

    def save(self, path: str) -> None:
        self.model.save_sequence(path)
        with open(path + ".json", "w", encoding="utf-8") as f:
            json.dump({"system": self.system, "messages": self.messages}, f, ensure_ascii=False)

    def load(self, path: str) -> int:
        with open(path + ".json", encoding="utf-8") as f:
            saved = json.load(f)
        n = self.model.load_sequence(path)
        self.system, self.messages = saved["system"], saved["messages"]
        return int(n)


def read_turn(ask: Callable[[str], str]) -> str:
    """One input: a line, lines joined by a trailing backslash, or a \"\"\" block."""
    line = ask(">>> ")
    if line.strip().startswith('"""'):
        rest = line.strip()[3:]
        lines = [] if not rest else [rest]
        while not (lines and lines[-1].endswith('"""')):
            lines.append(ask("... "))
        lines[-1] = lines[-1][:-3]
        return "\n".join(lines).strip()
    lines = [line]
    while lines[-1].endswith("\\"):
        lines[-1] = lines[-1][:-1]
        lines.append(ask("... "))
    return "\n".join(lines).strip()


def format_stats(st: dict[str, Any]) -> str:
    """A model's stats() as a short table: a line per figure (lists and tables left out), the pass profile's
    decode and prefill as a line each."""

    def num(v: Any) -> str:
        return f"{v:.3g}" if isinstance(v, float) else str(v)

    rows = [(k, num(v)) for k, v in st.items() if not isinstance(v, (dict, list, tuple))]
    for kind, p in st.get("pass_profile", {}).items():
        rows.append((f"{kind} pass", f"{p['wall_ms']:.2f} ms ({p['host_ms']:.2f} host), {p['passes']} passes"))
    width = max((len(k) for k, _ in rows), default=0)
    return "\n".join(f"  {k:<{width}}  {v}" for k, v in rows)


def format_speed(speed: dict[str, float]) -> str:
    """Prompt and generation tokens and tokens/s (PassProfile.speed) on one line, as llama-cli ends a run."""
    return (
        f"prompt {speed['prompt_tokens']:.0f} tokens, {speed['prompt_tok_s']:.1f} tok/s; "
        f"generation {speed['generation_tokens']:.0f} tokens, {speed['generation_tok_s']:.1f} tok/s"
    )


def history_file() -> str:
    return os.environ.get("SUPERGGML_CHAT_HISTORY") or os.path.expanduser("~/.superggml_chat_history")


def run(chat: Chat, *, ask: Callable[[str], str] = input, out: TextIO = sys.stdout) -> int:
    """The conversation loop: commands and turns until /exit or end of input."""

    def write(s: str) -> None:
        out.write(s)
        out.flush()

    write("superggml chat: /help for commands, Ctrl-C stops an answer, Ctrl-D leaves\n")
    while True:
        try:
            text = read_turn(ask)
        except KeyboardInterrupt:
            write("\n")
            continue
        except EOFError:
            write("\n")
            return 0
        if not text:
            continue
        cmd, _, arg = text.partition(" ")
        arg = arg.strip()
        try:
            if cmd in ("/exit", "/quit", "/bye"):
                return 0
            elif cmd == "/help":
                write(HELP + "\n")
            elif cmd == "/clear":
                chat.clear()
                write("(conversation cleared)\n")
            elif cmd == "/system":
                chat.system = arg or None
                chat.clear()
                write("(system prompt set; conversation cleared)\n")
            elif cmd in ("/save", "/load") and not arg:
                write(f"{cmd} needs a file name\n")
            elif cmd == "/save":
                chat.save(arg)
                write(f"(saved {len(chat.messages)} messages, {chat.model.n_tokens} tokens, to {arg})\n")
            elif cmd == "/load":
                n = chat.load(arg)
                write(f"(loaded {len(chat.messages)} messages, {n} tokens, from {arg})\n")
            elif cmd == "/stats":
                write(format_stats(chat.model.stats()) + "\n")
            elif cmd.startswith("/") and " " not in cmd and cmd[1:].isalpha():
                write(f"unknown command {cmd}: /help lists them\n")
            else:
                chat.reply(text, write)
                write("\n")
        except (OSError, ValueError) as e:  # a file that is not there, a saved sequence of another model, ...
            write(f"error: {e}\n")


def main(m: Any, a: Any, sampling: dict[str, Any]) -> int:
    """`superggml chat` over an open model: readline's line editing and a history file where the terminal has
    them."""
    try:
        import readline
    except ImportError:  # not on every platform
        readline = None  # type: ignore[assignment]
    path = history_file()
    if readline is not None:
        try:
            readline.read_history_file(path)
        except OSError:
            pass
    try:
        return run(Chat(m, sampling, system=a.system))
    finally:
        if readline is not None:
            try:
                readline.write_history_file(path)
            except OSError:
                pass
