"""Structured output (llguidance masks over the GGUF's vocabulary): JSON schema, JSON mode, regex and GBNF/Lark
grammars, through the official openai client against `superggml serve` and through Model, on SmolLM2 and
Qwen2.5-Coder-1.5B. Sampled outputs (temperature 0.8) must satisfy their constraint every time; bad constraints
are 400s."""

from __future__ import annotations

import json
import re
import threading
from typing import Any, Iterator

import jsonschema
import numpy as np
import openai
import pytest

from superggml import Model
from superggml.generation.grammar import Grammar, GrammarError
from http_server import openai_client

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "role": {"type": "string", "enum": ["admin", "editor", "viewer"]},
        "skills": {"type": "array", "items": {"type": "string", "maxLength": 16}, "minItems": 1, "maxItems": 3},
        "address": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 20},
                "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
            },
            "required": ["city", "zip"],
            "additionalProperties": False,
        },
        "active": {"type": "boolean"},
    },
    "required": ["name", "age", "role", "skills", "address", "active"],
    "additionalProperties": False,
}
DATE = r"(19|20)[0-9]{2}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"


@pytest.fixture(scope="module")
def model(model_path: str) -> Iterator[Model]:
    with Model(model_path, ctx_size=512, n_threads=2, paged_kv=True, kv_page_size=16, seed=7) as m:
        yield m


@pytest.fixture(scope="module")
def client(model: Model) -> Iterator[openai.OpenAI]:
    yield from openai_client(model, parallel=8, max_queue=16, model_id="m")


def test_json_schema_samples_valid(client, model_path):
    """Nested objects, enums, arrays, a pattern: 20 samples at temperature 0.8 (8 on the slower Qwen; requests
    of n=4, each choice its own constraint state in the shared passes), every one valid against the schema."""
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    msgs = [{"role": "user", "content": "Invent a user of a web site and describe them as JSON."}]
    outs = []
    n_requests = 2 if "qwen" in model_path else 5
    for i in range(n_requests):
        r = client.chat.completions.create(
            model="m", messages=msgs, max_tokens=160, temperature=0.8, n=4, seed=100 + i, response_format=fmt
        )
        outs += [(c.message.content, c.finish_reason) for c in r.choices]
    assert len(outs) == 4 * n_requests
    for text, finish in outs:
        assert finish == "stop", text
        jsonschema.validate(json.loads(text), PERSON)
    assert len({t for t, _ in outs}) > 1  # sampled, not one answer repeated


def test_regex_20_samples(client):
    texts = []
    for i, prompt in enumerate(["The date of the event was ", "Born on ", "Date: ", "It happened on ", "Deadline: "]):
        r = client.completions.create(
            model="m", prompt=prompt, n=4, max_tokens=24, temperature=0.8, seed=i, extra_body={"regex": DATE}
        )
        assert all(c.finish_reason == "stop" for c in r.choices)
        texts += [c.text for c in r.choices]
    assert len(texts) == 20
    for t in texts:
        assert re.fullmatch(DATE, t), t


def test_regex_streamed(client):
    chunks = list(
        client.completions.create(
            model="m",
            prompt="Call me at ",
            max_tokens=30,
            temperature=0.8,
            stream=True,
            extra_body={"regex": r"\(\d{3}\) \d{3}-\d{4}"},
        )
    )
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert re.fullmatch(r"\(\d{3}\) \d{3}-\d{4}", text), text
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_json_mode(client):
    r = client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "A JSON object about cats."}],
        max_tokens=200,
        temperature=0.8,
        response_format={"type": "json_object"},
    )
    c = r.choices[0]
    if c.finish_reason == "stop":
        assert isinstance(json.loads(c.message.content), dict)
    else:  # cut by max_tokens: still a prefix of an object
        assert c.message.content.startswith("{")


def test_gbnf_and_lark_grammars(client, model):
    gbnf = 'root ::= answer "." \nanswer ::= "yes" | "no" | "maybe"'
    r = client.completions.create(
        model="m", prompt="Is the sky blue? Answer:", n=4, max_tokens=10, temperature=0.8, extra_body={"grammar": gbnf}
    )
    assert all(c.text in ("yes.", "no.", "maybe.") and c.finish_reason == "stop" for c in r.choices)
    lark = 'start: "[" num ("," num)* "]"\nnum: /[0-9]{1,3}/'
    out = model.create_completion("Some numbers:", grammar=lark, max_tokens=40, temperature=0.8, seed=1)
    text = out["choices"][0]["text"]
    if out["choices"][0]["finish_reason"] == "stop":
        assert re.fullmatch(r"\[[0-9]{1,3}(,[0-9]{1,3})*\]", text), text


def test_concurrent_requests_keep_their_own_constraints(client):
    """Two requests in the same passes, each with its own constraint."""
    res: dict[str, Any] = {}

    def ask(key: str, **kw: Any) -> None:
        res[key] = client.completions.create(model="m", max_tokens=30, temperature=0.8, n=2, **kw)

    ts = [
        threading.Thread(target=ask, args=("digits",), kwargs=dict(prompt="Code:", extra_body={"regex": "[0-9]{6}"})),
        threading.Thread(target=ask, args=("word",), kwargs=dict(prompt="Word:", extra_body={"regex": "[a-z]{3,8}!"})),
    ]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert all(re.fullmatch("[0-9]{6}", c.text) for c in res["digits"].choices)
    assert all(re.fullmatch("[a-z]{3,8}!", c.text) for c in res["word"].choices)


def test_python_api_json_schema_and_logprobs(model):
    schema = {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}, "n": {"enum": [1, 2, 3]}},
        "required": ["ok", "n"],
        "additionalProperties": False,
    }
    r = model.create_completion("JSON:", json_schema=schema, max_tokens=30, temperature=0.8, seed=5, logprobs=2)
    c = r["choices"][0]
    jsonschema.validate(json.loads(c["text"]), schema)
    assert all(np.isfinite(x) for x in c["logprobs"]["token_logprobs"])  # the model's own, before the mask
    gen = model.generate(model.tokenize("x=", add_bos=True), temp=0.8, seed=2, grammar=Grammar.from_regex("[0-9]{4}"))
    out = []
    for t in gen:
        if model.tokenizer.is_eog(t):
            break
        out.append(t)
    assert re.fullmatch("[0-9]{4}", model.detokenize(out).decode())


@pytest.mark.parametrize(
    "extra, param, words",
    [
        ({"json_schema": {"type": "objectt"}}, "json_schema", "Invalid type"),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "object", "properties": 3}},
                }
            },
            "response_format",
            "properties must be an object",
        ),
        ({"regex": "[a-"}, "regex", "invalid regex"),
        ({"regex": r"a[^\s\S]"}, "regex", "no text satisfies"),
        ({"grammar": "root ::= missing"}, "grammar", "invalid grammar"),
        ({"response_format": {"type": "xml"}}, "response_format", "response_format type"),
        ({"response_format": {"type": "json_schema"}}, "response_format", "needs a json_schema"),
        ({"regex": "a", "grammar": 'root ::= "a"'}, "grammar", "one constraint"),
    ],
)
def test_bad_constraints_are_400(client, extra, param, words):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="m", prompt="x", max_tokens=4, extra_body=extra)
    err = e.value.body
    assert words in err["message"] and err["param"] == param and err["code"] == "invalid_constraint"
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "x"}], max_tokens=4, extra_body=extra
        )


def test_bad_constraints_in_python(model):
    with pytest.raises(GrammarError, match="no text satisfies"):
        model.create_completion("x", regex="[^\\s\\S]")
    with pytest.raises(ValueError, match="invalid JSON schema: type must be"):
        model.create_chat_completion([{"role": "user", "content": "x"}], json_schema={"type": 5})


def test_cli_generate_constraints(smollm2_path, tmp_path):
    """generate --regex / --json-schema / --grammar-file, and a bad constraint's error."""
    import subprocess
    import sys

    def gen(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "superggml",
                "generate",
                "-m",
                smollm2_path,
                "-n",
                "40",
                "--temp",
                "0.8",
                "--seed",
                "2",
                *args,
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )

    r = gen("-p", "Call me at ", "--regex", r"\(\d{3}\) \d{3}-\d{4}")
    assert r.returncode == 0 and re.fullmatch(r"\(\d{3}\) \d{3}-\d{4}", r.stdout.strip()), r.stderr
    r = gen(
        "-p",
        "JSON:",
        "-j",
        json.dumps(
            {
                "type": "object",
                "properties": {"ok": {"type": "boolean"}},
                "required": ["ok"],
                "additionalProperties": False,
            }
        ),
    )
    assert r.returncode == 0 and json.loads(r.stdout) in ({"ok": True}, {"ok": False}), r.stdout
    (tmp_path / "yn.gbnf").write_text('root ::= "yes" | "no"\n')
    r = gen("-p", "Is water wet?", "--grammar-file", str(tmp_path / "yn.gbnf"))
    assert r.returncode == 0 and r.stdout.strip() in ("yes", "no")
    r = gen("-p", "x", "--regex", "[a")
    assert r.returncode == 1 and "invalid regex" in r.stderr and "Traceback" not in r.stderr
