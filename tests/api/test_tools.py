"""Tool calls through the official openai client against `superggml serve`: Qwen2.5-Coder-1.5B (its template's
Hermes <tool_call> format) with tool_choice required, a named function, streaming and a full round trip; SmolLM2
(a template without tools: the generic JSON format); the Llama 3 and Mistral formats' grammars and parsers on a
real vocabulary; 400s for bad tools."""

from __future__ import annotations

import json
from typing import Any, Iterator

import jsonschema
import openai
import pytest

from superggml import Model
from superggml.api.tools import Generic, Hermes, Llama3, Mistral, ToolRequest, parse_tools, tool_format
from http_server import openai_client

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    "required": ["city"],
}
TIME = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "Get the current weather in a city", "parameters": WEATHER},
    },
    {
        "type": "function",
        "function": {"name": "get_time", "description": "Get the local time in a city", "parameters": TIME},
    },
]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
ASK = [{"role": "user", "content": "What's the weather like in Paris? Answer in one sentence."}]


def valid_call(call: Any) -> dict[str, Any]:
    """The arguments of an OpenAI tool call, checked against its function's schema."""
    assert call.type == "function" and call.id
    assert call.function.name in SCHEMAS
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, SCHEMAS[call.function.name])
    return args


def serve(path: str) -> Iterator[openai.OpenAI]:
    with Model(path, ctx_size=2048, n_threads=2, paged_kv=True, kv_page_size=16, seed=3) as m:
        for c in openai_client(m, parallel=4, max_queue=8, model_id="m"):
            c.model = m  # type: ignore[attr-defined]
            yield c


@pytest.fixture(scope="module")
def qwen(qwen_path: str) -> Iterator[openai.OpenAI]:
    yield from serve(qwen_path)


@pytest.fixture(scope="module")
def smol(smollm2_path: str) -> Iterator[openai.OpenAI]:
    yield from serve(smollm2_path)


@pytest.mark.slow
def test_qwen_required_gives_a_valid_call(qwen):
    assert qwen.model.tool_format.name == "hermes"
    for temp in (0.0, 0.8):
        r = qwen.chat.completions.create(
            model="m", messages=ASK, tools=TOOLS, tool_choice="required", temperature=temp, max_tokens=120
        )
        c = r.choices[0]
        assert c.finish_reason == "tool_calls" and c.message.tool_calls
        for call in c.message.tool_calls:
            valid_call(call)


def test_qwen_named_function(qwen):
    r = qwen.chat.completions.create(
        model="m",
        messages=ASK,
        tools=TOOLS,
        max_tokens=60,
        temperature=0.8,
        tool_choice={"type": "function", "function": {"name": "get_time"}},
    )
    calls = r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason == "tool_calls" and len(calls) == 1
    assert calls[0].function.name == "get_time" and valid_call(calls[0])["city"]


def test_qwen_streamed_call(qwen):
    chunks = list(
        qwen.chat.completions.create(
            model="m",
            messages=ASK,
            tools=TOOLS,
            tool_choice="required",
            parallel_tool_calls=False,
            max_tokens=80,
            temperature=0,
            stream=True,
        )
    )
    calls = [tc for ch in chunks for tc in (ch.choices[0].delta.tool_calls or [])]
    assert len(calls) == 1 and valid_call(calls[0])
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert not "".join(ch.choices[0].delta.content or "" for ch in chunks)  # no call text leaks as content


@pytest.mark.slow
def test_qwen_round_trip(qwen):
    """The call, the tool's result as a role "tool" message, and the model's answer that uses it (tool_choice
    auto: the model chooses to answer)."""
    ask = [
        {
            "role": "system",
            "content": "You are a helpful assistant. Call a tool only when you need data you do "
            "not have yet; once a tool has answered, reply to the user in plain text.",
        }
    ] + ASK
    r = qwen.chat.completions.create(
        model="m",
        messages=ask,
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=80,
        temperature=0,
    )
    msg = r.choices[0].message
    call = msg.tool_calls[0]
    assert call.function.name == "get_weather" and valid_call(call)["city"] == "Paris"
    result = {"city": "Paris", "temperature_c": 18, "sky": "sunny", "rain": False}
    history = ask + [
        msg.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps(result)},
    ]
    prompt = qwen.model.apply_chat_template(history, tools=TOOLS)
    assert "<tool_response>\n" + json.dumps(result) in prompt  # the result goes back through the template
    assert '"arguments": {"city": "Paris"' in prompt  # and the call, arguments as an object
    r2 = qwen.chat.completions.create(model="m", messages=history, tools=TOOLS, max_tokens=60, temperature=0)
    c = r2.choices[0]
    assert c.finish_reason == "stop" and not c.message.tool_calls
    assert "18" in c.message.content and "sunny" in c.message.content.lower()


def test_qwen_auto_answers_in_text(qwen):
    r = qwen.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "Write a haiku about rain."}],
        tools=TOOLS,
        max_tokens=40,
        temperature=0,
    )
    assert r.choices[0].message.content and not r.choices[0].message.tool_calls


def test_smollm2_generic_format(smol):
    """SmolLM2's template does not take tools: they are described in a system message and the reply is JSON."""
    assert smol.model.tool_format.name == "generic"
    r = smol.chat.completions.create(
        model="m", messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=80, temperature=0.8, n=3
    )
    for c in r.choices:
        assert c.finish_reason == "tool_calls"
        for call in c.message.tool_calls:
            valid_call(call)
    r = smol.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Hi! How are you?"}], tools=TOOLS, max_tokens=60, temperature=0
    )
    c = r.choices[0]
    if not c.message.tool_calls:  # auto: an answer, given as plain text (not the JSON around it)
        assert c.message.content and not c.message.content.lstrip().startswith("{")


@pytest.mark.parametrize("fmt", [Hermes, Llama3, Mistral, Generic])
def test_each_format_constrains_and_parses(smol, fmt):
    """Each format's grammar on a real vocabulary (SmolLM2's: its markers are not tokens, so they are spelt) gives
    text its own parser reads back as valid calls."""
    m = smol.model
    f = fmt(m.tokenizer)
    req = ToolRequest(f, parse_tools(TOOLS), "required", parallel=True)
    prompt = m.tokenize("<|im_start|>user\nWeather in Oslo?<|im_end|>\n<|im_start|>assistant\n", special=True)
    out = []
    for t in m.generate(prompt, temp=0.8, seed=1, grammar=req.grammar):
        if m.tokenizer.is_eog(t) or len(out) > 200:
            break
        out.append(t)
    text = m.detokenize(out, special=True).decode()
    content, calls = f.parse(text, req.tools)
    assert calls, text
    for c in calls:
        jsonschema.validate(json.loads(c.arguments), SCHEMAS[c.name])


def test_parsers_on_written_replies():
    tools = parse_tools(TOOLS)
    h = Hermes.__new__(Hermes)
    content, calls = h.parse(
        'Let me check.\n<tool_call>\n{"name": "get_time", "arguments": {"city": "Rome"}}\n</tool_call>', tools
    )
    assert (
        content == "Let me check."
        and calls[0].name == "get_time"
        and json.loads(calls[0].arguments) == {"city": "Rome"}
    )
    assert h.parse('```json\n{"name": "get_time", "arguments": {"city": "Rome"}}\n```', tools)[1][0].name == "get_time"
    assert h.parse('{"name": "unknown", "arguments": {}}', tools) == ('{"name": "unknown", "arguments": {}}', [])
    l3 = Llama3.__new__(Llama3)
    _, calls = l3.parse('<|python_tag|>{"name": "get_weather", "parameters": {"city": "Oslo"}}', tools)
    assert calls[0].name == "get_weather" and json.loads(calls[0].arguments) == {"city": "Oslo"}
    mi = Mistral.__new__(Mistral)
    _, calls = mi.parse('[TOOL_CALLS][{"name": "get_time", "arguments": {"city": "Oslo"}, "id": "abcDEF123"}]', tools)
    assert calls[0].id == "abcDEF123" and calls[0].name == "get_time"
    g = Generic.__new__(Generic)
    assert g.parse('{"response": "Hello"}', tools) == ("Hello", [])
    assert g.parse('{"response": "Hel', tools) == ("Hel", [])  # cut short by max_tokens
    assert g.parse('{"tool_calls": [{"name": "get_time", "arguments": {"city": "A"}}]}', tools)[1][0].name == "get_time"
    assert g.visible('{"response": "a\\nb\\u00e') == "a\nb"  # a half-written escape waits
    assert tool_format("{{ '<tool_call>' }}", None).name == "hermes"  # type: ignore[arg-type]
    assert tool_format("[TOOL_CALLS]", None).name == "mistral"  # type: ignore[arg-type]
    assert tool_format("<|python_tag|>", None).name == "llama3"  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "kw, param, words",
    [
        (
            dict(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "launch_rocket"}}),
            "tool_choice",
            "launch_rocket",
        ),
        (dict(tools=[{"type": "function", "function": {"name": "bad name!"}}]), "tools", "name"),
        (
            dict(
                tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "objectt"}}}],
                tool_choice="required",
            ),
            "tools",
            "Invalid type",
        ),
        (dict(tool_choice="required"), "tool_choice", "needs tools"),
        (dict(tools=TOOLS, tool_choice="sometimes"), "tool_choice", "tool_choice must be"),
        (
            dict(tools=TOOLS, tool_choice="required", response_format={"type": "json_object"}),
            "response_format",
            "one constraint",
        ),
    ],
)
def test_bad_tools_are_400(smol, kw, param, words):
    with pytest.raises(openai.BadRequestError) as e:
        smol.chat.completions.create(model="m", messages=ASK, max_tokens=4, **kw)
    err = e.value.body
    assert words in err["message"] and err["param"] == param
