"""Chat templates from the GGUF (Jinja, rendered in a sandbox as llama.cpp's jinja engine would)."""

from __future__ import annotations

import datetime
import json
from typing import Any, Mapping, Sequence

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ..errors import SuperggmlError

# Used when a GGUF has no template: ChatML, what most small instruct models expect.
CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content']"
    " + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


class ChatTemplateError(SuperggmlError, ValueError):
    """The chat template failed to render these messages."""


def _raise(message: str) -> None:
    raise ChatTemplateError(message)


def _tojson(
    value: Any, indent: int | None = None, separators: Any = None, sort_keys: bool = False, ensure_ascii: bool = False
) -> str:
    """tojson as chat templates are written for (Hugging Face's and llama.cpp's): keys in their order, no HTML
    escaping (Jinja's own sorts keys and writes '<' as \\u003c)."""
    return json.dumps(value, indent=indent, separators=separators, sort_keys=sort_keys, ensure_ascii=ensure_ascii)


def text_content(messages: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The messages with OpenAI's content parts ([{"type": "text", "text": ...}, ...]) joined into their text."""
    out: list[Mapping[str, Any]] = []
    for m in messages:
        content = m.get("content") if isinstance(m, Mapping) else None
        if isinstance(content, list):
            m = {
                **m,
                "content": "".join(
                    p.get("text", "") for p in content if isinstance(p, Mapping) and p.get("type") == "text"
                ),
            }
        out.append(m)
    return out


class ChatTemplate:
    def __init__(self, source: str, *, bos_token: str = "", eos_token: str = ""):
        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
        )
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
        env.filters["tojson"] = _tojson
        try:
            self._template = env.from_string(source)
        except jinja2.TemplateError as e:
            raise ChatTemplateError(f"the GGUF's chat template does not parse: {e}") from e
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token

    def render(self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True, **extra: Any) -> str:
        for i, m in enumerate(messages):
            if not isinstance(m, Mapping) or "role" not in m:
                raise ChatTemplateError(f"message {i} needs a 'role'")
        try:
            return self._template.render(
                messages=list(messages),
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
                **extra,
            )
        except ChatTemplateError:
            raise
        except jinja2.TemplateError as e:
            raise ChatTemplateError(f"chat template failed: {e}") from e
