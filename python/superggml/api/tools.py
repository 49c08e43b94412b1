"""Tool calls (OpenAI's `tools` / `tool_choice`): the tools go to the GGUF's chat template, the model's calls are
parsed from its output in the format its template teaches, and `required` or a named function constrains the
output to a valid call (a grammar over the tools' parameter schemas; superggml.generation.grammar).

Formats, told apart by the template's source as llama.cpp does:
- hermes: `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`, one block per call (Qwen2.5, Hermes);
- llama3: the reply is `{"name": ..., "parameters": {...}}` (Llama 3.1-3.3 with `ipython`);
- mistral: `[TOOL_CALLS][{"name": ..., "arguments": {...}, "id": ...}]`;
- generic: any other template. As llama.cpp's generic format, the tools are described in a system message and
  the reply is always JSON: {"tool_call": {"name": ..., "arguments": ...}} or {"response": "..."}.
"""

from __future__ import annotations

import json
import re
from abc import ABC, abstractmethod
import secrets
import string
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from ..errors import SuperggmlError
from ..generation.grammar import JSON_OPTIONS, Grammar
from ..tokenizer import Tokenizer


class ToolError(SuperggmlError, ValueError):
    """Malformed `tools`, or a `tool_choice` that names no given tool; `param` is the request field at fault."""

    def __init__(self, message: str, param: str = "tools"):
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class Tool:
    """One function the model may call: its name, its parameters' JSON schema and the definition as given (what
    the chat template renders)."""

    name: str
    parameters: Mapping[str, Any]
    spec: Mapping[str, Any]


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # JSON text, as OpenAI gives it
    id: str

    def openai(self, index: int | None = None) -> dict[str, Any]:
        d: dict[str, Any] = {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }
        return d if index is None else {"index": index, **d}


def parse_tools(tools: Any) -> list[Tool]:
    """OpenAI's tools list ([{"type": "function", "function": {"name", "description", "parameters"}}]) checked;
    ToolError naming what is wrong."""
    if not isinstance(tools, Sequence) or isinstance(tools, (str, bytes)):
        raise ToolError("tools must be a list")
    out: list[Tool] = []
    for i, t in enumerate(tools):
        if (
            not isinstance(t, Mapping)
            or t.get("type", "function") != "function"
            or not isinstance(t.get("function"), Mapping)
        ):
            raise ToolError(f"tools[{i}] must be {{\"type\": \"function\", \"function\": {{...}}}}")
        fn = t["function"]
        name = fn.get("name")
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.\-]{1,64}", name):
            raise ToolError(f"tools[{i}].function.name must be 1-64 letters, digits, '_', '.' or '-'")
        if any(x.name == name for x in out):
            raise ToolError(f"tools[{i}]: the function {name!r} is given twice")
        params = fn.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(params, Mapping):
            raise ToolError(f"tools[{i}].function.parameters must be a JSON schema object")
        out.append(Tool(name, dict(params), {"type": "function", "function": dict(fn)}))
    return out


def resolve_tool_choice(choice: Any, tools: Sequence[Tool]) -> "str | Tool":
    """ "none", "auto", "required" or the named Tool, from OpenAI's tool_choice (default: auto with tools)."""
    if choice is None:
        return "auto" if tools else "none"
    if isinstance(choice, str):
        if choice not in ("none", "auto", "required"):
            raise ToolError(f"tool_choice must be none, auto, required or a function, not {choice!r}", "tool_choice")
        if choice == "required" and not tools:
            raise ToolError("tool_choice required needs tools", "tool_choice")
        return choice
    if isinstance(choice, Mapping) and choice.get("type") == "function" and isinstance(choice.get("function"), Mapping):
        name = choice["function"].get("name")
        for t in tools:
            if t.name == name:
                return t
        raise ToolError(
            f"tool_choice names the function {name!r}, which is not among the tools "
            f"({', '.join(t.name for t in tools) or 'none given'})",
            "tool_choice",
        )
    raise ToolError(
        "tool_choice must be none, auto, required or {\"type\": \"function\", \"function\": {\"name\": ...}}",
        "tool_choice",
    )


def _call_schema(tools: Sequence[Tool], args_key: str = "arguments") -> dict[str, Any]:
    """JSON schema of one call of any of `tools`: {"name": <const>, args_key: <its parameters>}."""
    one = [
        {
            "type": "object",
            "properties": {"name": {"const": t.name}, args_key: dict(t.parameters)},
            "required": ["name", args_key],
            "additionalProperties": False,
        }
        for t in tools
    ]
    return one[0] if len(one) == 1 else {"anyOf": one}


def _json_term(schema: Mapping[str, Any]) -> str:
    """A Lark %json terminal for `schema`, written as superggml.generation.grammar writes JSON."""
    return "%json" + json.dumps({**schema, "x-guidance": JSON_OPTIONS})


def _new_id(mistral: bool = False) -> str:
    if mistral:  # Mistral's templates take 9 letters and digits
        return "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(9))
    return "call_" + secrets.token_hex(12)


def _args_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _objects(text: str) -> list[Any]:
    """The JSON values written one after another in `text` (whitespace, ';' or ',' between); [] unless all of it
    is JSON."""
    dec = json.JSONDecoder()
    out: list[Any] = []
    i = 0
    while True:
        while i < len(text) and text[i] in " \t\r\n;,":
            i += 1
        if i >= len(text):
            return out
        try:
            v, i = dec.raw_decode(text, i)
        except json.JSONDecodeError:
            return []
        out.append(v)


def _unfence(text: str) -> str:
    m = re.fullmatch(r"\s*```(?:json)?\s*\n?(.*?)\n?```\s*", text, re.S)
    return m.group(1) if m else text


class ToolFormat(ABC):
    """How one template family asks for tools and writes calls (see the module's doc)."""

    name: str
    markers: tuple[str, ...] = ()  # special tokens the calls are written with (kept in the text)

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer

    # -- the prompt ------------------------------------------------------------
    def messages(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Tool]) -> list[dict[str, Any]]:
        """The conversation as the template takes it: earlier calls' arguments as objects (templates write
        them with tojson), as llama.cpp passes them."""
        out = []
        for m in messages:
            m = dict(m)
            if m.get("tool_calls"):
                calls = []
                for c in m["tool_calls"]:
                    c = dict(c)
                    fn = dict(c.get("function") or {})
                    if isinstance(fn.get("arguments"), str):
                        try:
                            fn["arguments"] = json.loads(fn["arguments"])
                        except json.JSONDecodeError:
                            pass
                    c["function"] = fn
                    calls.append(c)
                m["tool_calls"] = calls
            out.append(m)
        return out

    def template_tools(self, tools: Sequence[Tool]) -> list[dict[str, Any]] | None:
        """What the template's `tools` variable gets."""
        return [dict(t.spec) for t in tools]

    # -- the constraint ----------------------------------------------------------
    def token(self, text: str) -> str:
        """A Lark item for a marker: its special token by id if the vocabulary has one, else the literal text."""
        tid = self.tokenizer.token_id(text)
        return f"<[{tid}]>" if tid is not None and tid in set(self.tokenizer.special_ids) else json.dumps(text)

    @abstractmethod
    def grammar(self, tools: Sequence[Tool], parallel: bool) -> Grammar:
        """Output that is one call (or several, with `parallel`) of `tools`."""

    def auto_grammar(self, tools: Sequence[Tool], parallel: bool) -> Grammar | None:
        """The constraint with tool_choice auto (None: free text)."""
        return None

    # -- the reply -------------------------------------------------------------
    def content_end(self, text: str) -> int:
        """How much of `text` (the reply so far) is surely content, not the start of a call: it may be sent."""
        return len(text)

    def visible(self, text: str) -> str:
        """The content of the reply so far that may be sent (it only grows as the reply does)."""
        return text[: self.content_end(text)]

    def parse(self, text: str, tools: Sequence[Tool]) -> tuple[str | None, list[ToolCall]]:
        """(content, calls) of a whole reply; no calls: the text is all content."""
        return text, []

    def _calls_of(self, values: Sequence[Any], tools: Sequence[Tool], args_keys: Sequence[str]) -> list[ToolCall]:
        names = {t.name for t in tools}
        calls = []
        for v in values:
            if not isinstance(v, Mapping) or v.get("name") not in names:
                return []
            key = next((k for k in args_keys if k in v), None)
            if key is None:
                return []
            calls.append(
                ToolCall(
                    v["name"],
                    _args_text(v[key]),
                    str(v["id"]) if isinstance(v.get("id"), str) else _new_id(self.name == "mistral"),
                )
            )
        return calls


def _held(text: str, marker: str) -> int:
    """Where content must stop in `text` so that no part of `marker` is sent: at the marker, or at a tail of
    `text` that may be its beginning."""
    i = text.find(marker)
    if i >= 0:
        return i
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:k]):
            return len(text) - k
    return len(text)


class Hermes(ToolFormat):
    name = "hermes"
    OPEN, CLOSE = "<tool_call>", "</tool_call>"

    def grammar(self, tools: Sequence[Tool], parallel: bool) -> Grammar:
        call = f'{self.token(self.OPEN)} "\\n" {_json_term(_call_schema(tools))} "\\n" {self.token(self.CLOSE)}'
        more = ' ("\\n" call)*' if parallel else ""
        return Grammar.from_grammar(f"start: call{more}\ncall: {call}\n")

    def content_end(self, text: str) -> int:
        lead = text.lstrip()
        if lead.startswith("```") or lead.startswith("{") or not lead:  # may be a bare call (below)
            return 0
        return _held(text, self.OPEN)

    def parse(self, text: str, tools: Sequence[Tool]) -> tuple[str | None, list[ToolCall]]:
        i = text.find(self.OPEN)
        if i >= 0:
            blocks = re.findall(re.escape(self.OPEN) + r"(.*?)(?:" + re.escape(self.CLOSE) + r"|$)", text[i:], re.S)
            calls = self._calls_of([v for b in blocks for v in _objects(b.strip())], tools, ("arguments",))
            if calls:
                return text[:i].strip() or None, calls
        # small models often write the call bare or in a ```json fence
        calls = self._calls_of(_objects(_unfence(text)), tools, ("arguments", "parameters"))
        return (None, calls) if calls else (text, [])


class Llama3(ToolFormat):
    name = "llama3"
    markers = ("<|python_tag|>",)

    def grammar(self, tools: Sequence[Tool], parallel: bool) -> Grammar:
        one = _json_term(_call_schema(tools, "parameters"))
        more = ' ("; " call)*' if parallel else ""
        return Grammar.from_grammar(f"start: call{more}\ncall: {one}\n")

    def content_end(self, text: str) -> int:
        lead = text.lstrip()
        return 0 if not lead or lead.startswith(("{", "<|python_tag|>")) else len(text)

    def parse(self, text: str, tools: Sequence[Tool]) -> tuple[str | None, list[ToolCall]]:
        body = text.strip()
        if body.startswith("<|python_tag|>"):
            body = body[len("<|python_tag|>") :]
        calls = self._calls_of(_objects(body), tools, ("parameters", "arguments"))
        return (None, calls) if calls else (text, [])


class Mistral(ToolFormat):
    name = "mistral"
    MARK = "[TOOL_CALLS]"
    markers = (MARK,)

    def grammar(self, tools: Sequence[Tool], parallel: bool) -> Grammar:
        schema = {"type": "array", "items": _call_schema(tools), "minItems": 1}
        if not parallel:
            schema["maxItems"] = 1
        return Grammar.from_grammar(f"start: {self.token(self.MARK)} {_json_term(schema)}\n")

    def content_end(self, text: str) -> int:
        return _held(text, self.MARK)

    def parse(self, text: str, tools: Sequence[Tool]) -> tuple[str | None, list[ToolCall]]:
        i = text.find(self.MARK)
        if i < 0:
            return text, []
        vals = _objects(text[i + len(self.MARK) :].strip())
        calls = self._calls_of(
            vals[0] if len(vals) == 1 and isinstance(vals[0], list) else vals, tools, ("arguments", "parameters")
        )
        return (text[:i].strip() or None, calls) if calls else (text, [])


class Generic(ToolFormat):
    """A template that does not take tools: they are described in a system message, and the reply is JSON."""

    name = "generic"

    PROMPT = (
        "You can call these tools:\n\n{tools}\n\nRespond in JSON: either {{\"tool_call\": {{\"name\": ..., "
        "\"arguments\": {{...}}}}}} to call a tool{many}, or {{\"response\": \"...\"}} to answer the user."
    )

    def messages(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Tool]) -> list[dict[str, Any]]:
        """Earlier calls and results as the JSON replies the system message asks for (the template knows
        neither); with tools offered, that system message and the assistant's answers as {"response": ...}."""
        out = []
        for m in super().messages(messages, tools):
            if m.get("role") == "assistant" and m.get("tool_calls"):
                calls = [
                    {"name": c["function"].get("name"), "arguments": c["function"].get("arguments")}
                    for c in m["tool_calls"]
                ]
                body = {"tool_call": calls[0]} if len(calls) == 1 else {"tool_calls": calls}
                m = {"role": "assistant", "content": json.dumps(body, ensure_ascii=False)}
            elif m.get("role") == "tool":
                m = {
                    "role": "user",
                    "content": json.dumps(
                        {"tool_response": {"tool_call_id": m.get("tool_call_id"), "content": m.get("content")}},
                        ensure_ascii=False,
                    ),
                }
            elif m.get("role") == "assistant" and m.get("content") is not None and tools:
                m = {**m, "content": json.dumps({"response": m["content"]}, ensure_ascii=False)}
            out.append(m)
        if not tools:
            return out
        text = self.PROMPT.format(
            tools="\n".join(json.dumps(t.spec["function"], ensure_ascii=False) for t in tools),
            many=" ({\"tool_calls\": [...]} for several)",
        )
        if out and out[0].get("role") == "system":
            out[0] = {**out[0], "content": f"{out[0].get('content') or ''}\n\n{text}".strip()}
        else:
            out.insert(0, {"role": "system", "content": text})
        return out

    def template_tools(self, tools: Sequence[Tool]) -> list[dict[str, Any]] | None:
        return None

    def _schema(self, tools: Sequence[Tool], parallel: bool, response: bool) -> dict[str, Any]:
        call = _call_schema(tools)
        forms = [
            {
                "type": "object",
                "properties": {"tool_call": call},
                "required": ["tool_call"],
                "additionalProperties": False,
            }
        ]
        if parallel:
            forms.append(
                {
                    "type": "object",
                    "properties": {"tool_calls": {"type": "array", "items": call, "minItems": 1}},
                    "required": ["tool_calls"],
                    "additionalProperties": False,
                }
            )
        if response:
            forms.append(
                {
                    "type": "object",
                    "properties": {"response": {"type": "string"}},
                    "required": ["response"],
                    "additionalProperties": False,
                }
            )
        return forms[0] if len(forms) == 1 else {"anyOf": forms}

    def grammar(self, tools: Sequence[Tool], parallel: bool) -> Grammar:
        return Grammar.from_json_schema(self._schema(tools, parallel, response=False))

    def auto_grammar(self, tools: Sequence[Tool], parallel: bool) -> Grammar | None:
        return Grammar.from_json_schema(self._schema(tools, parallel, response=True))

    RESPONSE = re.compile(r'\s*\{\s*"response"\s*:\s*"((?:[^"\\]|\\.)*)', re.S)

    def visible(self, text: str) -> str:
        """The answer's text as far as it has come: the JSON string after {"response": "."""
        m = self.RESPONSE.match(text)
        if not m:
            return ""
        body = re.sub(r"\\(u[0-9a-fA-F]{0,3})?$", "", m.group(1))  # an escape not complete yet
        try:
            return json.loads(f'"{body}"')
        except json.JSONDecodeError:
            return ""

    def parse(self, text: str, tools: Sequence[Tool]) -> tuple[str | None, list[ToolCall]]:
        vals = _objects(text)
        v = vals[0] if len(vals) == 1 and isinstance(vals[0], Mapping) else None
        if v is None:
            part = self.visible(text)  # cut short (max_tokens): the answer so far
            return (part, []) if self.RESPONSE.match(text) else (text, [])
        if isinstance(v.get("response"), str):
            return v["response"], []
        raw = [v["tool_call"]] if "tool_call" in v else v.get("tool_calls")
        calls = self._calls_of(raw, tools, ("arguments",)) if isinstance(raw, list) else []
        return (None, calls) if calls else (text, [])


def tool_format(template: str, tokenizer: Tokenizer) -> ToolFormat:
    """The format a chat template's source teaches (see the module's doc)."""
    if "<tool_call>" in template:
        return Hermes(tokenizer)
    if "[TOOL_CALLS]" in template:
        return Mistral(tokenizer)
    if "<|python_tag|>" in template or "ipython" in template:
        return Llama3(tokenizer)
    return Generic(tokenizer)


@dataclass
class ToolRequest:
    """A chat request's tools, as a Model or the server runs it: what the template gets and the constraint."""

    format: ToolFormat
    tools: list[Tool]
    choice: "str | Tool"
    parallel: bool = True
    grammar: Grammar | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        if self.choice == "required":
            self.grammar = self.format.grammar(self.tools, self.parallel)
        elif isinstance(self.choice, Tool):
            self.grammar = self.format.grammar([self.choice], False)
        elif self.choice == "auto":
            self.grammar = self.format.auto_grammar(self.tools, self.parallel)

    @property
    def active(self) -> bool:
        """Tools are offered (tool_choice is not none)."""
        return self.choice != "none" and bool(self.tools)

    def stream(self) -> "ToolStream":
        return ToolStream(self)


class ToolStream:
    """One choice's reply as it arrives: content is sent while it cannot be the start of a call; at the end the
    calls are parsed from what was held."""

    def __init__(self, req: ToolRequest):
        self.req = req
        self.text = ""
        self.shown = ""  # content sent so far

    def feed(self, piece: str) -> str:
        """The content of `piece` that can be sent now."""
        self.text += piece
        shown = self.req.format.visible(self.text)
        if not shown.startswith(self.shown):
            return ""
        out, self.shown = shown[len(self.shown) :], shown
        return out

    def end(self) -> tuple[str, list[ToolCall], str | None]:
        """(content not sent yet, the calls, the whole content: None when there is none beside calls)."""
        content, calls = self.req.format.parse(self.text, self.req.tools)
        body = content or ""
        rest = body[len(self.shown) :] if body.startswith(self.shown) else ""
        return rest, calls, content
