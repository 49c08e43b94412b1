"""The OpenAI-compatible server, driven by the official openai client over loopback."""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import openai
import pytest

from superggml import Model

from http_server import Server, free_port, openai_client
from prompts import CAPITAL as PROMPT  # noqa: E402


@pytest.fixture(scope="module")
def model(smollm2_path):
    with Model(smollm2_path, ctx_size=512, n_threads=2, paged_kv=True, kv_page_size=16, kv_device_layers=4 * 30) as m:
        yield m


@pytest.fixture(scope="module")
def server(model):
    s = Server(model, parallel=4, max_queue=64)
    yield s
    s.close()


@pytest.fixture(scope="module")
def client(server):
    with openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0) as c:
        yield c


@pytest.fixture(scope="module")
def reference(smollm2_path):
    """Greedy texts from a fresh model, as `superggml generate` gives them."""
    with Model(smollm2_path, ctx_size=512, n_threads=2) as m:
        text = m.create_completion(PROMPT, max_tokens=24, temperature=0)["choices"][0]["text"]
        m.reset()
        chat = m.create_chat_completion([{"role": "user", "content": "Name a color."}], max_tokens=24, temperature=0)[
            "choices"
        ][0]["message"]["content"]
    return text, chat


def test_completion_equals_generate(client, reference, server):
    r = client.completions.create(model="SmolLM2-135M-Instruct.Q4_1.gguf", prompt=PROMPT, max_tokens=24, temperature=0)
    assert r.choices[0].text == reference[0]
    assert r.usage.completion_tokens > 0 and r.usage.prompt_tokens > 0
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_any_model_name_an_alias_and_the_usage_chunk(model, reference):
    """--alias names the model in /v1/models and the replies; a request may name any model (llama-server serves
    its one model whatever the name); stream_options.include_usage ends the stream with a chunk of the usage."""
    for client in openai_client(model, model_id="smol"):
        assert [m.id for m in client.models.list().data] == ["smol"]
        r = client.completions.create(model="gpt-4", prompt=PROMPT, max_tokens=24, temperature=0)
        assert r.model == "smol" and r.choices[0].text == reference[0]
        with pytest.raises(openai.NotFoundError):
            client.models.retrieve("gpt-4")
        for kind in ("completions", "chat"):
            if kind == "completions":
                chunks = list(
                    client.completions.create(
                        model="x",
                        prompt=PROMPT,
                        max_tokens=8,
                        temperature=0,
                        stream=True,
                        stream_options={"include_usage": True},
                    )
                )
            else:
                chunks = list(
                    client.chat.completions.create(
                        model="x",
                        messages=[{"role": "user", "content": "Hi"}],
                        max_tokens=8,
                        temperature=0,
                        stream=True,
                        stream_options={"include_usage": True},
                    )
                )
            last = chunks[-1]
            assert last.choices == [] and last.usage.completion_tokens == 8, kind
            assert last.usage.total_tokens == last.usage.prompt_tokens + 8
            assert all(c.usage is None for c in chunks[:-1])
        plain = list(client.completions.create(model="x", prompt=PROMPT, max_tokens=4, temperature=0, stream=True))
        assert all(c.choices for c in plain)


def test_completion_stream(client, reference):
    parts = []
    for c in client.completions.create(
        prompt=PROMPT, max_tokens=24, temperature=0, stream=True, model="SmolLM2-135M-Instruct.Q4_1.gguf"
    ):
        parts.append(c.choices[0].text)
    assert "".join(parts) == reference[0]


def test_chat_and_chat_stream(client, reference):
    """The same chat plain, streamed and as content parts: the reference's text each time. cache_prompt is off
    after the first: a repeated prompt's cached prefix leaves its last token to a pass of its own, which rounds
    differently from the whole prompt's (llama.cpp's too: here it flips the first greedy token)."""
    msgs = [{"role": "user", "content": "Name a color."}]
    fresh = {"cache_prompt": False}
    r = client.chat.completions.create(
        model="SmolLM2-135M-Instruct.Q4_1.gguf", messages=msgs, max_tokens=24, temperature=0, extra_body=fresh
    )
    assert r.choices[0].message.content == reference[1] and r.choices[0].message.role == "assistant"
    text = "".join(
        c.choices[0].delta.content or ""
        for c in client.chat.completions.create(
            model="SmolLM2-135M-Instruct.Q4_1.gguf",
            messages=msgs,
            max_tokens=24,
            temperature=0,
            stream=True,
            extra_body=fresh,
        )
    )
    assert text == reference[1]
    parts = [{"role": "user", "content": [{"type": "text", "text": "Name a "}, {"type": "text", "text": "color."}]}]
    r = client.chat.completions.create(
        model="SmolLM2-135M-Instruct.Q4_1.gguf", messages=parts, max_tokens=24, temperature=0, extra_body=fresh
    )
    assert r.choices[0].message.content == reference[1]


def test_health_models_metrics(server):
    assert httpx.get(server.url + "/health").json()["status"] == "ok"
    models = httpx.get(server.url + "/v1/models").json()
    assert models["data"][0]["id"] == "SmolLM2-135M-Instruct.Q4_1.gguf"
    before = httpx.get(server.url + "/v1/stats").json()
    r = httpx.post(server.url + "/v1/completions", json={"prompt": PROMPT, "max_tokens": 2, "temperature": 0})
    assert r.status_code == 200
    m = httpx.get(server.url + "/v1/stats").json()
    assert m["requests_served"] == before["requests_served"] + 1
    assert m["requests_active"] == 0 and m["requests_waiting"] == 0 and m["tokens_per_sec"] >= 0


@pytest.mark.parametrize(
    "body, status, code",
    [
        ("{not json", 400, "invalid_json"),
        ({"prompt": 5}, 400, "invalid_value"),
        ({"prompt": "hi", "max_tokens": -1}, 400, "invalid_value"),
        ({"prompt": "hi", "bogus_field": 1}, 400, "invalid_value"),
        ({"prompt": "hi", "temperature": "hot"}, 400, "invalid_value"),
        ({"prompt": "word " * 600}, 400, "context_length_exceeded"),
        ({"prompt": [999999]}, 400, None),
        ({"prompt": []}, 400, None),
        ({"prompt": [[1, 2], []]}, 400, None),
        ({"prompt": ["hi", [5, -1]]}, 400, None),
    ],
)
def test_bad_requests_get_openai_errors(server, body, status, code):
    content = body if isinstance(body, str) else json.dumps(body)
    r = httpx.post(server.url + "/v1/completions", content=content, headers={"Content-Type": "application/json"})
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["message"] and err["type"]
    if code:
        assert err["code"] == code
    assert httpx.get(server.url + "/health").status_code == 200  # still serving


def test_unknown_route_and_method(server):
    r = httpx.get(server.url + "/v1/nothing")
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    r = httpx.get(server.url + "/v1/completions")
    assert r.status_code == 405 and "error" in r.json()


def test_client_errors_via_the_openai_client(client):
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="SmolLM2-135M-Instruct.Q4_1.gguf", prompt="hi", max_tokens=-5)
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("nope")


def assert_slots_erased(server: Server, model: Model) -> None:
    """Every slot erased: no K/V held, only the (empty) current sequence left."""
    for x in httpx.get(server.url + "/slots").json():
        assert httpx.post(server.url + f"/slots/{x['id']}?action=erase").status_code == 200
    st = model.stats()
    assert st["kv_token_slots"] == 0 and st["n_tokens"] == 0


def test_disconnect_mid_stream_frees_the_sequence(server, model):
    with httpx.stream(
        "POST",
        server.url + "/v1/completions",
        json={"prompt": "Once upon a time", "max_tokens": 400, "stream": True, "temperature": 0},
    ) as r:
        n = 0
        for line in r.iter_lines():
            if line.startswith("data:"):
                n += 1
            if n >= 3:
                break  # the client goes away
    engine = server.app.state.engine
    for _ in range(100):
        if not engine.active:
            break
        time.sleep(0.05)
    assert not engine.active
    assert not any(x["is_processing"] for x in httpx.get(server.url + "/slots").json())
    assert model.stats()["n_sequences"] <= 1 + 4  # the current one, and a slot's each at most
    assert_slots_erased(server, model)
    r = httpx.post(server.url + "/v1/completions", json={"prompt": PROMPT, "max_tokens": 4, "temperature": 0})
    assert r.status_code == 200  # still serving


def test_without_paged_kv_requests_share_passes(smollm2_path, reference):
    """No paged KV cache: each request's sequence has K/V storage of its own; they still run together."""
    with Model(smollm2_path, ctx_size=512, n_threads=2) as m:
        s = Server(m, parallel=4)
        try:

            def req(_: int) -> str:
                r = httpx.post(
                    s.url + "/v1/completions", json={"prompt": PROMPT, "max_tokens": 24, "temperature": 0}, timeout=120
                )
                assert r.status_code == 200, r.text
                return r.json()["choices"][0]["text"]

            with ThreadPoolExecutor(4) as ex:
                assert list(ex.map(req, range(4))) == [reference[0]] * 4
            assert m.stats()["sequences_per_pass"] > 1
        finally:
            s.close()


PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a land far away, there lived a",
    "1, 2, 3, 4,",
]


@pytest.fixture(scope="module")
def alone(smollm2_path):
    with Model(smollm2_path, ctx_size=512, n_threads=2) as m:
        return [m.create_completion(p, max_tokens=32, temperature=0)["choices"][0]["text"] for p in PROMPTS]


def test_prompt_lists_and_n(server, alone):
    r = httpx.post(
        server.url + "/v1/completions", json={"prompt": PROMPTS, "max_tokens": 32, "temperature": 0}, timeout=120
    )
    assert r.status_code == 200, r.text
    ch = r.json()["choices"]
    assert [c["index"] for c in ch] == [0, 1, 2, 3] and [c["text"] for c in ch] == alone
    r = httpx.post(
        server.url + "/v1/completions",
        json={"prompt": PROMPTS[0], "max_tokens": 8, "n": 3, "temperature": 1.0, "seed": 3},
        timeout=120,
    )
    assert r.status_code == 200 and len(r.json()["choices"]) == 3
    r = httpx.post(
        server.url + "/v1/completions",
        json={"prompt": PROMPTS[0], "max_tokens": 8, "n": 9, "temperature": 0},
        timeout=120,
    )
    assert r.status_code == 200  # more than --parallel 4: the rest start as others finish
    ch = r.json()["choices"]
    assert sorted(c["index"] for c in ch) == list(range(9)) and len({c["text"] for c in ch}) == 1


def stream_text(url: str, prompt: str, max_tokens: int, stop_after: int | None = None) -> tuple[str, bool]:
    text, done, n = "", False, 0
    with httpx.stream(
        "POST",
        url + "/v1/completions",
        timeout=300,
        json={"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True},
    ) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: "):
                text += json.loads(line[6:])["choices"][0]["text"]
                n += 1
                if stop_after is not None and n >= stop_after:
                    break  # the client goes away
    return text, done


def test_a_client_leaving_mid_batch_leaves_the_others_unchanged(server, model, alone):
    """Four streams share every pass; one disconnects after 3 chunks: its sequence is freed, the other three
    complete with their texts alone."""
    with ThreadPoolExecutor(4) as ex:
        futs = [ex.submit(stream_text, server.url, p, 32, 3 if i == 2 else None) for i, p in enumerate(PROMPTS)]
        res = [f.result() for f in futs]
    for i, (text, done) in enumerate(res):
        if i != 2:
            assert done and text == alone[i]
    engine = server.app.state.engine
    for _ in range(100):
        if not engine.active:
            break
        time.sleep(0.05)
    assert not engine.active and model.stats()["sequences_per_pass"] > 1
    assert_slots_erased(server, model)


def test_overload_gets_503(model):
    s = Server(model, parallel=1, max_queue=1)
    try:

        def req(_: int) -> int:
            return httpx.post(
                s.url + "/v1/completions", json={"prompt": PROMPT, "max_tokens": 60}, timeout=120
            ).status_code

        with ThreadPoolExecutor(8) as ex:
            codes = list(ex.map(req, range(8)))
        assert 503 in codes and 200 in codes and set(codes) <= {200, 503}
    finally:
        s.close()


def test_32_concurrent_streaming_clients(server, reference):
    """Every response complete and correct (greedy, so all equal the reference); latency reported."""

    def one(_: int) -> tuple[str, float]:
        t0 = time.perf_counter()
        text = ""
        with httpx.stream(
            "POST",
            server.url + "/v1/completions",
            timeout=300,
            json={"prompt": PROMPT, "max_tokens": 24, "temperature": 0, "stream": True},
        ) as r:
            assert r.status_code == 200
            done = False
            for line in r.iter_lines():
                if line == "data: [DONE]":
                    done = True
                elif line.startswith("data: "):
                    text += json.loads(line[6:])["choices"][0]["text"]
            assert done
        return text, time.perf_counter() - t0

    t0 = time.perf_counter()
    with ThreadPoolExecutor(32) as ex:
        res = list(ex.map(one, range(32)))
    wall = time.perf_counter() - t0
    lat = sorted(x[1] for x in res)
    print(
        f"\n32 streaming clients: {32 / wall:.2f} requests/s, p50 {statistics.median(lat):.2f} s, "
        f"p99 {np.percentile(lat, 99):.2f} s"
    )
    assert all(t == reference[0] for t, _ in res)


def test_serve_command_starts_and_answers(smollm2_path):
    import subprocess
    import sys

    port = free_port()
    p = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "superggml.commands.cli",
            "serve",
            "-m",
            smollm2_path,
            "--port",
            str(port),
            "-c",
            "256",
            "-t",
            "2",
            "--log-level",
            "warning",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        for _ in range(300):
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        r = httpx.post(
            f"http://127.0.0.1:{port}/v1/completions",
            json={"prompt": PROMPT, "max_tokens": 24, "temperature": 0},
            timeout=60,
        )
        assert r.status_code == 200
    finally:
        p.terminate()
        p.communicate(timeout=30)


def test_echo(server):
    r = httpx.post(
        server.url + "/v1/completions", json={"prompt": PROMPT, "max_tokens": 3, "temperature": 0, "echo": True}
    )
    assert r.status_code == 200 and r.json()["choices"][0]["text"].startswith(PROMPT)


def test_echo_prompt_list_and_stream(server):
    """echo puts each prompt before its choices' text, in a prompt list and when streaming (first chunks)."""
    prompts = [PROMPT, "The capital of France is"]
    body = {"prompt": prompts, "max_tokens": 3, "temperature": 0, "echo": True, "n": 2}
    r = httpx.post(server.url + "/v1/completions", json=body, timeout=60)
    assert r.status_code == 200
    whole = {c["index"]: c["text"] for c in r.json()["choices"]}
    assert sorted(whole) == [0, 1, 2, 3] and all(whole[i].startswith(prompts[i // 2]) for i in whole)
    texts = dict.fromkeys(whole, "")
    with httpx.stream("POST", server.url + "/v1/completions", json={**body, "stream": True}, timeout=60) as s:
        for line in s.iter_lines():
            if line.startswith("data: {"):
                ch = json.loads(line[6:])["choices"][0]
                texts[ch["index"]] += ch["text"]
    assert texts == whole


def test_the_old_module_path_is_gone():
    """superggml.server (a deprecated alias of superggml.serve, whose re-exports included internals) is gone."""
    import importlib

    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("superggml.server")


def test_the_readmes_curl_runs_as_written(server, reference):
    """`curl -d '{...}'` sends its JSON body as application/x-www-form-urlencoded; the server reads every POST
    body as JSON, as llama-server does."""
    body = {"prompt": PROMPT, "max_tokens": 24, "temperature": 0}
    for ctype in ("application/x-www-form-urlencoded", None):
        headers = {"Content-Type": ctype} if ctype else {}
        r = httpx.post(server.url + "/v1/completions", content=json.dumps(body), headers=headers)
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["text"] == reference[0]
    if shutil.which("curl"):
        out = subprocess.run(
            ["curl", "-s", server.url + "/v1/completions", "-d", json.dumps(body)],
            capture_output=True,
            text=True,
            timeout=120,
        ).stdout
        assert json.loads(out)["choices"][0]["text"] == reference[0]


def test_the_startup_line_names_the_model_the_context_and_the_plan(model):
    from superggml.serve.app import startup_line

    line = startup_line(model, "smol", "127.0.0.1", 8080)
    assert "'smol'" in line and "ctx 512" in line and "30 blocks" in line and "resident" in line
    assert "http://127.0.0.1:8080" in line and "CPU" in line
