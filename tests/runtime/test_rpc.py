"""ggml RPC servers as devices, over loopback: `superggml rpc-server` processes started here hold the blocks
(resident, streamed through a device budget, with the paged KV cache, split with the CPU or with each other),
and every run is bit-identical to the CPU's (the same ggml and CPU kernels behind the server). A server that
cannot be reached, or dies or stops mid-run, is a DeviceError within seconds: no abort, no hang."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from typing import Any, Iterator

import numpy as np
import pytest

from superggml import DeviceError, Model, native
from superggml.commands import cli
from superggml.commands.analyze import model_layout
from prompts import TOKENS_40 as PROMPT, run_prompt as run  # the prompt's logits, then six greedy tokens'
from rpc_server import Server, free_port, on

BASE = dict(ctx_size=128, n_batch=16, n_threads=1, repack=False)


@pytest.fixture(scope="module")
def servers() -> Iterator[list[Server]]:
    s = [Server(), Server("--mem", "1GiB")]
    try:
        yield s
    finally:
        for x in s:
            x.close()


@pytest.fixture
def lone_server() -> Iterator[Server]:
    with Server() as s:
        yield s


@pytest.fixture(scope="module")
def reference(smollm2_path: str) -> tuple[np.ndarray, str]:
    with Model(smollm2_path, **BASE) as m:
        return run(m), m.create_completion("The capital of France is", max_tokens=12, temperature=0)["choices"][0][
            "text"
        ]


def _configs(servers: list[Server], slot: int) -> dict[str, dict[str, Any]]:
    a, b = on(servers[0]), on(servers[1])
    return {
        "resident": dict(devices=[a]),
        "budget_2_blocks": dict(devices=[a], device_budget=2 * slot, placement="device"),
        "paged_kv": dict(devices=[a], paged_kv=True, kv_page_size=16, device_budget=4 * slot),
        "cpu_rpc_split": dict(devices=["CPU", a], device_budget=f"{3 * slot},{2 * slot}", paged_kv=True),
        "rpc_rpc_split": dict(
            devices=[a, b], tensor_split=[2, 1], device_budget=f"{2 * slot},{3 * slot}", paged_kv=True, kv_page_size=32
        ),
        "rpc_default_split": dict(rpc=[servers[0].endpoint]),
        "dynamic_layers": dict(devices=[a], dynamic_layers=True, mem_pressure=0.01),  # always "under pressure"
    }


@pytest.mark.parametrize(
    "config",
    [
        "resident",
        "budget_2_blocks",
        "paged_kv",
        "cpu_rpc_split",
        "rpc_rpc_split",
        "rpc_default_split",
        "dynamic_layers",
    ],
)
def test_rpc_equals_cpu(servers, reference, smollm2_path, config):
    slot = model_layout(smollm2_path).slot_bytes
    kw = _configs(servers, slot)[config]
    before = native.rpc_stats()
    with Model(smollm2_path, **BASE, **kw) as m:
        out = run(m)
        text = m.create_completion("The capital of France is", max_tokens=12, temperature=0)["choices"][0]["text"]
        st = m.stats()
    ref, ref_text = reference
    assert text == ref_text
    assert np.array_equal(out, ref), float(np.abs(out - ref).max())
    assert any(d.startswith("RPC") and "[127.0.0.1:" in d for d in st["devices"])
    sent = sum(v["bytes_sent"] - before.get(k, {}).get("bytes_sent", 0) for k, v in native.rpc_stats().items())
    assert st["rpc_bytes_sent"] > 0 and st["rpc_bytes_received"] > 0
    if config == "resident":
        assert st["remote_bytes"] >= sum(model_layout(smollm2_path).block_bytes)  # the blocks, copied over
    if "budget" in config or "split" in config and "device_budget" in kw:
        assert st["loads"] > 0  # blocks streamed onto the servers' slots
    if config == "budget_2_blocks":
        assert st["n_slots"] == 2 and st["staged_io"]  # a device pool: loads go through staging buffers
        assert sent > 2 * model_layout(smollm2_path).file_bytes // 2  # the blocks went over the wire, again
    if config == "dynamic_layers":  # the server's memory reading (what it has available) demotes blocks
        dev = [d for d in native.devices() if d["description"] == servers[0].endpoint][0]
        if 1 - dev["memory_free"] / dev["memory_total"] > 0.01:
            assert st["layers_demoted"] > 0 and st["loads"] > 0
    if config == "rpc_default_split":  # CPU and the server, by free memory
        assert len(st["devices"]) == 2 and min(st["blocks_per_device"]) > 0


def test_rpc_batched_sequences_equal_alone(servers, smollm2_path):
    """Several sequences in shared passes on a server, each as it runs alone."""
    kw = dict(BASE, devices=[on(servers[0])], paged_kv=True, kv_page_size=16)
    prompts = [[300, 301, 302], [400, 401, 402, 403, 404], [500]]
    with Model(smollm2_path, **kw) as m:
        batch = m.runtime.eval_batch([(i + 1, p) for i, p in enumerate(prompts)])
        alone = []
        for i, p in enumerate(prompts):
            m.runtime.sequences.use(10 + i)
            alone.append(m.runtime.eval(p).copy())
    for x, y in zip(batch, alone):
        assert np.array_equal(x, y)


@pytest.mark.slow
def test_qwen_split_cpu_rpc_equals_cpu(servers, qwen_path):
    kw = dict(ctx_size=64, n_batch=16, n_threads=2, repack=False)
    with Model(qwen_path, **kw) as m:
        ref = m.eval(PROMPT[:8], logits_all=True).copy()
    with Model(qwen_path, **kw, devices=["CPU", on(servers[0])], tensor_split=[1, 3]) as m:
        out = m.eval(PROMPT[:8], logits_all=True).copy()
    assert np.array_equal(out, ref)


def test_unreachable_and_closed_ports_are_device_errors(smollm2_path):
    t0 = time.time()
    with pytest.raises(DeviceError, match=r"10\.255\.255\.1:50052"):
        Model(smollm2_path, **BASE, rpc=["10.255.255.1:50052"], rpc_timeout=2)
    port = free_port()  # nothing listens there
    with pytest.raises(DeviceError, match=f"127.0.0.1:{port}.*(refused|cannot connect)"):
        Model(smollm2_path, **BASE, rpc=[f"127.0.0.1:{port}"])
    with pytest.raises(DeviceError, match="not HOST:PORT"):
        Model(smollm2_path, **BASE, rpc=["no-port-here"])
    assert time.time() - t0 < 30


def test_not_a_ggml_server_is_a_device_error(smollm2_path):
    """A port that answers with something else: the HELLO check refuses it (ggml would abort)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port = srv.getsockname()[1]

    import threading

    def answer() -> None:
        c, _ = srv.accept()
        c.recv(64)
        c.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")
        c.close()

    th = threading.Thread(target=answer, daemon=True)
    th.start()
    with pytest.raises(DeviceError, match="not a ggml RPC server"):
        Model(smollm2_path, **BASE, rpc=[f"127.0.0.1:{port}"])
    th.join(5)
    srv.close()


@pytest.mark.parametrize("how", ["kill", "kill_streaming", "stop"])
def test_server_failing_mid_generation(lone_server, smollm2_path, how):
    """Killed (the connection drops) or stopped (it goes silent: the timeout): a DeviceError naming the server
    within 30 s; the model closes without hanging; the endpoint is refused until it serves again."""
    kw = dict(BASE, devices=[on(lone_server)], rpc_timeout=3)
    if how == "kill_streaming":
        kw["device_budget"] = 2 * model_layout(smollm2_path).slot_bytes
    m = Model(smollm2_path, **kw)
    m.eval(PROMPT)
    t0 = time.time()
    with pytest.raises(DeviceError, match=lone_server.endpoint) as e:
        for i in range(100):
            if i == 2:
                if how == "stop":
                    lone_server.proc.send_signal(signal.SIGSTOP)
                else:
                    lone_server.proc.kill()
                t0 = time.time()
            m.eval([int(np.argmax(m.scores[-1]))])
    assert time.time() - t0 < 30
    assert ("no answer within 3 s" in str(e.value)) == (how == "stop")
    t1 = time.time()
    m.close()
    assert time.time() - t1 < 10
    with pytest.raises(DeviceError, match=lone_server.endpoint):
        Model(smollm2_path, **kw)


def test_rpc_budget_per_device_counts_the_servers_devices(servers, smollm2_path):
    """rpc without devices: a size per device is checked once the servers answer (CPU and one server: 2)."""
    with pytest.raises(ValueError, match=r"device_budget gives 3 sizes for 2 devices \(CPU, RPC"):
        Model(smollm2_path, **BASE, rpc=[servers[0].endpoint], device_budget="8MiB,8MiB,16MiB")


def test_cli_generate_and_plan_with_rpc(servers, smollm2_path, capsys):
    a, b = servers[0].endpoint, servers[1].endpoint
    assert (
        cli.main(
            [
                "generate",
                "-m",
                smollm2_path,
                "-p",
                "Hello",
                "-n",
                "4",
                "--temp",
                "0",
                "-c",
                "64",
                "--rpc",
                a,
                "--device-budget",
                "8MiB,16MiB",
            ]
        )
        == 0
    )
    assert cli.main(["plan", "--rpc", b]) == 0
    out = capsys.readouterr()
    line = [x for x in out.out.splitlines() if b in x]
    assert line and line[0].split()[-3:-1] == ["1024", "1024"]  # free and total: what --mem advertises
    assert b in out.err
    assert cli.main(["plan", "-m", smollm2_path, "--rpc", b]) == 0  # and the split a model would get
    out = capsys.readouterr().out
    split = out[out.index("split over this machine") :].splitlines()[1:]
    assert len(split) == 2 and split[0].split()[0] == "CPU" and split[1].startswith("  RPC")
    assert sum(int(x.split()[-2]) for x in split) == 30  # SmolLM2's blocks, all placed
    measured = [x for x in out.splitlines() if x.startswith("measured: disk")]  # the cost model's rates
    assert measured and "link to RPC" in measured[0]


def test_rpc_server_warns_off_loopback():
    port = free_port()
    p = subprocess.Popen(
        [sys.executable, "-m", "superggml", "rpc-server", "--host", "0.0.0.0", "-p", str(port), "-t", "1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.time() + 20
        while time.time() < deadline:
            try:
                native.rpc_probe(f"127.0.0.1:{port}", connect_timeout=1.0)
                break
            except DeviceError:
                time.sleep(0.1)
    finally:
        p.kill()
        _, err = p.communicate()
    assert "no authentication" in err


def test_rpc_server_port_in_use():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        r = subprocess.run(
            [sys.executable, "-m", "superggml", "rpc-server", "-p", str(port)],
            capture_output=True,
            text=True,
            timeout=60,
            env=dict(os.environ),
        )
    assert r.returncode == 1 and "cannot listen" in r.stderr


def test_cli_bench_and_analyze_with_rpc(servers, smollm2_path, capsys):
    ep = servers[0].endpoint
    assert (
        cli.main(
            [
                "bench",
                "-m",
                smollm2_path,
                "-p",
                "8",
                "-n",
                "4",
                "-r",
                "1",
                "-c",
                "64",
                "--rpc",
                ep,
                "--devices",
                f"RPC[{ep}]",
                "--json",
            ]
        )
        == 0
    )
    assert cli.main(["analyze", "-m", smollm2_path, "--no-measure", "--rpc", ep]) == 0
    out = capsys.readouterr()
    assert '"decode_tok_s"' in out.out and ep in out.err


def test_openai_server_on_rpc(servers, smollm2_path):
    """`serve` with the blocks and the paged K/V on a server: 4 concurrent requests in shared passes, each
    answered as the CPU answers it alone."""
    import httpx
    from concurrent.futures import ThreadPoolExecutor

    from http_server import Server as HTTPServer

    prompts = [f"List {k} fruits:" for k in range(2, 6)]
    kw = dict(ctx_size=256, n_threads=1, repack=False)
    with Model(smollm2_path, **kw) as m:
        want = [m.create_completion(p, max_tokens=12, temperature=0)["choices"][0]["text"] for p in prompts]
    with Model(
        smollm2_path, **kw, devices=[on(servers[0])], paged_kv=True, kv_page_size=16, kv_device_layers=4 * 30
    ) as m:
        http = HTTPServer(m, parallel=4, max_queue=16)
        try:

            def ask(p: str) -> str:
                r = httpx.post(
                    http.url + "/v1/completions", json={"prompt": p, "max_tokens": 12, "temperature": 0}, timeout=120
                )
                assert r.status_code == 200
                return str(r.json()["choices"][0]["text"])

            with ThreadPoolExecutor(4) as ex:
                got = list(ex.map(ask, prompts))
        finally:
            http.close()
    assert got == want


@pytest.mark.parametrize("where", ["server", "cpu_server_split", "server_budget"])
def test_hybrid_states_on_a_server(servers, tmp_path, smollm2_path, where):
    """A Qwen3.5-shaped hybrid model with its blocks on a server (all, or the second half; resident, or streamed
    through 2 slots): the recurrent states of the server's layers live in its memory, and the logits, greedy
    steps and a truncation back to the prompt's end are the CPU's, bit for bit."""
    import synth_gguf

    path = synth_gguf.synth(
        tmp_path / "h.gguf", synth_gguf.vocab_fields(smollm2_path), **synth_gguf.VARIANTS["qwen35-interval2"]
    )
    a = on(servers[0])
    kw = {
        "server": dict(devices=[a]),
        "cpu_server_split": dict(devices=["CPU", a], tensor_split=[1, 1]),
        "server_budget": dict(devices=[a], device_budget=2 * model_layout(path).slot_bytes),
    }[where]

    def go(**more: Any) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
        with Model(path, **BASE, **more) as m:
            rows = run(m)
            m.runtime.sequences.truncate(len(PROMPT))
            again = m.eval([7, 8]).copy()
            return rows, again, m.stats()

    ref, ref_again, _ = go()
    rows, again, st = go(**kw)
    assert np.array_equal(rows, ref) and np.array_equal(again, ref_again)
    assert "RPC" in st["state_tier"] and st["state_sequences"] == 1
