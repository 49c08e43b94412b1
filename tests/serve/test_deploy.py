"""The server for deployments: API keys, Prometheus metrics, /tokenize and /detokenize."""

from __future__ import annotations

import time

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

import synth_gguf
from superggml import Model
from superggml.serve import serve
from superggml.serve.keys import allows, check_bind, is_loopback, load_keys
from http_server import Server
from cli_runner import run_cli

KEYS = ["first-key", "second-key"]


@pytest.fixture(scope="module")
def model(smollm2_path):
    with Model(smollm2_path, ctx_size=256, n_threads=2) as m:
        yield m


@pytest.fixture(scope="module")
def keyed(model):
    s = Server(model, parallel=2, api_keys=KEYS)
    yield s
    s.close()


def test_the_right_key_works_and_others_get_401(keyed, model):
    want = model.create_completion("The capital of France is", max_tokens=6, temperature=0)["choices"][0]["text"]
    for key in KEYS:
        with openai.OpenAI(base_url=keyed.url + "/v1", api_key=key, max_retries=0) as c:
            r = c.completions.create(
                model=c.models.list().data[0].id, prompt="The capital of France is", max_tokens=6, temperature=0
            )
            assert r.choices[0].text == want
            pieces = [
                ch.choices[0].text
                for ch in c.completions.create(
                    model=r.model, prompt="The capital of France is", max_tokens=6, temperature=0, stream=True
                )
            ]
            assert "".join(pieces) == want
    for key in ("wrong-key", "first-ke", "first-key-and-more"):
        with openai.OpenAI(base_url=keyed.url + "/v1", api_key=key, max_retries=0) as c:
            with pytest.raises(openai.AuthenticationError):
                c.completions.create(model="m", prompt="hi", max_tokens=2)
            with pytest.raises(openai.AuthenticationError):  # a stream is refused before it starts
                list(
                    c.chat.completions.create(
                        model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=2, stream=True
                    )
                )
    r = httpx.post(keyed.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2})
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    assert r.headers["www-authenticate"] == "Bearer"
    assert httpx.get(keyed.url + "/metrics").status_code == 401
    assert httpx.get(keyed.url + "/health").json()["status"] == "ok"  # open, for load balancers


def test_key_sources_and_comparison(tmp_path, monkeypatch):
    f = tmp_path / "keys"
    f.write_text("# deploy keys\nalpha\n\n beta \n")
    monkeypatch.setenv("SUPERGGML_API_KEY", "gamma")
    assert load_keys(["delta", "alpha"], str(f)) == ["delta", "alpha", "beta", "gamma"]
    (tmp_path / "empty").write_text("# nothing\n")
    with pytest.raises(ValueError, match="holds no key"):
        load_keys([], str(tmp_path / "empty"))
    with pytest.raises(ValueError, match="cannot read"):
        load_keys([], str(tmp_path / "missing"))
    assert allows(["alpha", "beta"], b"Bearer beta") and allows(["alpha"], b"bearer alpha")
    assert not allows(["alpha"], b"Basic alpha") and not allows(["alpha"], b"Bearer ") and not allows([], b"")


def test_no_key_binds_loopback_only(model, capsys, monkeypatch):
    monkeypatch.delenv("SUPERGGML_API_KEY", raising=False)
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("::") and not is_loopback("example.org")
    check_bind("0.0.0.0", ["k"], False)
    check_bind("0.0.0.0", [], True)
    with pytest.raises(ValueError, match="refusing to listen on 0.0.0.0 with no API key"):
        serve(model, host="0.0.0.0", port=1)
    err = run_cli(capsys, "serve", "-m", "smollm2", "--host", "0.0.0.0", rc=1).err  # before the model loads
    assert "--insecure" in err


def test_prometheus_metrics_count_what_a_request_did(model):
    s = Server(model, parallel=2)
    try:

        def scrape() -> dict[str, float]:
            r = httpx.get(s.url + "/metrics")
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
            out = {}
            for fam in text_string_to_metric_families(r.text):
                assert fam.name.startswith("superggml:")
                for smp in fam.samples:
                    key = smp.name + "".join(f"{{{k}={v}}}" for k, v in sorted(smp.labels.items()))
                    out[key] = smp.value
            return out

        before = scrape()
        r = httpx.post(
            s.url + "/v1/completions",
            json={"prompt": "Once upon a time", "max_tokens": 7, "temperature": 0, "n": 2},
            timeout=120,
        ).json()
        after = scrape()
    finally:
        s.close()
    use = r["usage"]
    assert (
        after["superggml:tokens_predicted_total"] - before["superggml:tokens_predicted_total"]
        == use["completion_tokens"]
        == 14
    )
    assert after["superggml:prompt_tokens_total"] - before["superggml:prompt_tokens_total"] == 2 * use["prompt_tokens"]
    assert after["superggml:requests_total"] == before["superggml:requests_total"] + 1
    assert after["superggml:n_decode_total"] > before["superggml:n_decode_total"]
    assert after["superggml:requests_processing"] == 0 and after["superggml:requests_deferred"] == 0
    assert after["superggml:predicted_tokens_seconds"] > 0 and after["superggml:passes_total"] > 0
    assert after["superggml:prompt_tokens_seconds"] > 0  # a prompt's step counts as prompt processing
    assert {
        "superggml:kv_pages{tier=device}",
        "superggml:kv_pages{tier=host}",
        "superggml:kv_pages{tier=disk}",
        "superggml:memory_pressure{memory=host}",
    } <= set(after)


def test_tokenize_and_detokenize(keyed, model):
    h = {"Authorization": f"Bearer {KEYS[0]}"}
    text = "Hello <|im_start|> wörld"
    r = httpx.post(keyed.url + "/tokenize", json={"content": text}, headers=h).json()
    assert r["tokens"] == model.tokenize(text, add_bos=False, special=True)
    plain = httpx.post(keyed.url + "/tokenize", json={"content": text, "parse_special": False}, headers=h).json()
    assert plain["tokens"] == model.tokenize(text, add_bos=False, special=False) != r["tokens"]
    pieces = httpx.post(keyed.url + "/tokenize", json={"content": text, "with_pieces": True}, headers=h).json()
    assert [p["id"] for p in pieces["tokens"]] == r["tokens"]
    raw = [p["piece"].encode() if isinstance(p["piece"], str) else bytes(p["piece"]) for p in pieces["tokens"]]
    assert b"".join(raw) == text.encode()
    back = httpx.post(keyed.url + "/detokenize", json={"tokens": plain["tokens"]}, headers=h).json()
    assert back["content"] == text
    bad = httpx.post(keyed.url + "/detokenize", json={"tokens": [1, 10**9]}, headers=h)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens"


@pytest.mark.slow
def test_a_prompt_list_beyond_parallel_is_queued_choice_by_choice(smollm2_path):
    """100 prompts against --parallel 4 (batch_invariant): 100 choices, each its prompt's completion alone; a
    second request while they wait gets 503 with Retry-After (--max-queue bounds the waiting choices)."""
    prompts = [f"{i} + {i % 7} =" for i in range(100)]
    with Model(smollm2_path, ctx_size=128, n_threads=2, batch_invariant=True) as m:
        alone = [m.create_completion(p, max_tokens=3, temperature=0)["choices"][0]["text"] for p in prompts]
        s = Server(m, parallel=4, max_queue=64)
        try:
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(1) as ex:
                big = ex.submit(
                    httpx.post,
                    s.url + "/v1/completions",
                    timeout=600,
                    json={"prompt": prompts, "max_tokens": 3, "temperature": 0},
                )
                for _ in range(200):  # until the big request's first choices run (the rest wait to start)
                    h = httpx.get(s.url + "/health").json()
                    if h["active"] and h["waiting"] == 0:
                        break
                    time.sleep(0.05)
                late = httpx.post(s.url + "/v1/completions", timeout=60, json={"prompt": prompts[:65], "max_tokens": 1})
                r = big.result()
        finally:
            s.close()
    assert late.status_code == 503 and late.headers["retry-after"] == "1"
    assert late.json()["error"]["code"] == "overloaded"
    assert r.status_code == 200
    ch = sorted(r.json()["choices"], key=lambda c: c["index"])
    assert [c["index"] for c in ch] == list(range(100))
    assert [c["text"] for c in ch] == alone


def test_slots_reuse_prefixes_and_save_and_restore(smollm2_path, tmp_path):
    """A second request that extends the first's prompt prefills only the new tokens, with the output it has
    without reuse; a slot saved, erased and restored is reused the same way; files that are not this model's
    sequence, or names that leave --slot-save-path, get 400, and the server stays up."""
    first = "The history of the city begins in the year 1200, when"
    second = first + " a small group of monks"
    body = dict(max_tokens=8, temperature=0)
    with Model(smollm2_path, ctx_size=256, n_threads=2, batch_invariant=True) as m:
        want = m.create_completion(second, **body)["choices"][0]["text"]
        n_first = len(m.tokenize(first))
        s = Server(m, parallel=2, slot_save_path=str(tmp_path))
        try:

            def ask(prompt: str) -> tuple[str, dict]:
                r = httpx.post(s.url + "/v1/completions", json={"prompt": prompt, **body}, timeout=120).json()
                return r["choices"][0]["text"], httpx.get(s.url + "/v1/stats").json()

            _, st0 = ask(first)
            text, st1 = ask(second)
            assert text == want
            assert st1["prompt_tokens_cached"] - st0["prompt_tokens_cached"] == n_first
            slots = httpx.get(s.url + "/slots").json()
            busy = [x for x in slots if x["n_tokens"]]
            sid = busy[0]["id"]
            r = httpx.post(s.url + f"/slots/{sid}?action=save", json={"filename": "conv.bin"}).json()
            assert r["n_saved"] == busy[0]["n_tokens"] and r["n_written"] == (tmp_path / "conv.bin").stat().st_size
            for x in slots:
                assert httpx.post(s.url + f"/slots/{x['id']}?action=erase").json()["id_slot"] == x["id"]
            assert all(x["n_tokens"] == 0 for x in httpx.get(s.url + "/slots").json())
            r = httpx.post(s.url + f"/slots/{sid}?action=restore", json={"filename": "conv.bin"}).json()
            assert r["n_restored"] == busy[0]["n_tokens"]
            text, st2 = ask(second)
            assert text == want and st2["prompt_tokens_cached"] - st1["prompt_tokens_cached"] >= n_first

            (tmp_path / "short.bin").write_bytes((tmp_path / "conv.bin").read_bytes()[:1000])
            other = synth_gguf.synth(tmp_path / "o.gguf", synth_gguf.vocab_fields(smollm2_path), "llama")
            with Model(other, ctx_size=256, n_threads=2) as o:
                o.eval([1, 2, 3])
                o.save_sequence(tmp_path / "other.bin")
            for name, status in (
                ("short.bin", 400),
                ("other.bin", 400),
                ("../conv.bin", 400),
                ("/etc/passwd", 400),
                (".hidden", 400),
                ("missing.bin", 400),
            ):
                r = httpx.post(s.url + f"/slots/{sid}?action=restore", json={"filename": name})
                assert r.status_code == status, (name, r.text)
                assert r.json()["error"]["param"] == "filename"
            assert httpx.post(s.url + "/slots/9?action=save", json={"filename": "x"}).status_code == 400
            assert httpx.get(s.url + "/health").json()["status"] == "ok"
            text, st3 = ask(second)
            assert text == want
            r = httpx.post(
                s.url + "/v1/completions", timeout=120, json={"prompt": second, **body, "cache_prompt": False}
            ).json()
            st4 = httpx.get(s.url + "/v1/stats").json()
            assert r["choices"][0]["text"] == want and st4["prompt_tokens_cached"] == st3["prompt_tokens_cached"]
        finally:
            s.close()


def test_which_slot_a_prompt_takes():
    """The longest shared prefix wins; a slight one (under half the slot's tokens) leaves that slot's context
    alone while an empty slot is free; otherwise the least recently used free slot is emptied."""
    from superggml.generation.slots import Slots

    class Seqs:  # the part of runtime.sequences that Slots uses
        def __init__(self):
            self.held, self.next = {}, 1

        def reserve(self, n):
            ids = list(range(self.next, self.next + n))
            self.next += n
            return ids

        def tokens(self, s):
            return list(self.held.get(s, []))

        def truncate(self, n, s):
            self.held[s] = self.held.get(s, [])[:n]
            return n

        def release(self, ids):
            for s in ids:
                self.held.pop(s, None)

    seqs = Seqs()
    sl = Slots(lambda: seqs, 3)
    a, sa, _ = sl.take([1, 2, 3, 4])
    seqs.held[sa] = [1, 2, 3, 4, 9, 9]
    sl.give_back(a)
    assert sl.take([1, 2, 3, 4, 5])[::2] == (a, 4)  # extends slot a: 4 tokens kept
    sl.give_back(a)
    seqs.held[sa] = [1, 2, 3, 4, 9, 9]
    b, sb, kept = sl.take([1, 7, 7, 7])  # 1 shared of 6: an empty slot instead
    assert b != a and kept == 0 and seqs.held[sa] == [1, 2, 3, 4, 9, 9]
    seqs.held[sb] = [1, 7, 7, 7, 8]
    c, _, _ = sl.take([5, 5])
    assert c not in (a, b)
    sl.give_back(b)
    sl.give_back(c)
    sl.give_back(a)  # a used last: b is the least recently used
    seqs.held[sl.seq[c]] = [5, 5, 6]
    assert sl.take([6, 6, 6])[0] == b and sl.cached_tokens == 4
    sl.close()
    assert seqs.held == {}
