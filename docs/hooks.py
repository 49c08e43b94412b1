"""MkDocs hook: the pages that are generated, so they cannot drift from the code. A marker line in a page,
<!-- generated: NAME -->, is replaced by what NAME gives."""

from __future__ import annotations

import os
from typing import Any


def commands() -> str:
    from superggml.commands.cli import command_helps

    os.environ["COLUMNS"] = "110"  # argparse wraps its help to the terminal's width
    out = []
    for name, text in command_helps().items():
        out += [f"### `superggml {name}`", "", "```text", text.rstrip(), "```", ""]
    return "\n".join(out)


def options() -> str:
    from superggml.settings import options_markdown

    return options_markdown()


def families() -> str:
    """superggml's families beside the reference's list (gguf-py's: llama.cpp's own package)."""
    import gguf

    from superggml.arch import ARCHITECTURES

    ours, theirs = set(ARCHITECTURES), set(gguf.MODEL_ARCH_NAMES.values())
    rows = ["| `general.architecture` | superggml |", "|---|---|"]
    for a in sorted(ours | theirs):
        note = " (newer than this gguf-py's list)" if a not in theirs else ""
        rows.append(f"| `{a}` | {'runs' if a in ours else 'not yet'}{note} |")
    head = (
        f"superggml runs {len(ours)} architectures; gguf-py (llama.cpp's Python package, the version installed "
        f"here) names {len(theirs)}. A GGUF of a family marked *not yet* is refused with `UnsupportedModelError`."
    )
    return head + "\n\n" + "\n".join(rows)


GENERATED = {"commands": commands, "options": options, "families": families}


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    for name, make in GENERATED.items():
        marker = f"<!-- generated: {name} -->"
        if marker in markdown:
            markdown = markdown.replace(marker, make())
    return markdown
