"""Peers that page their own share: `superggml rpc-server --models DIR` processes, each in a network namespace of
its own behind a 1 Gbit/s veth link (netlab), in a memory cgroup, with its own copy of the model. The client
names the bytes of each block by content hash and the peer loads them from its copy: the text equals one
machine's, with shares resident and streamed, and what crosses the network per token is under 1% of what the
peers stream. A corrupted copy is refused (its bytes are sent instead), a peer without the file is sent its
bytes once into its cache, a plain ggml RPC server still works, and a killed peer is a DeviceError; the next
call on the same model, once the peer is back, reconnects and loads its share again."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator, Optional

import pytest

from superggml import DeviceError, Model, native
from superggml.commands.analyze import model_layout
from superggml.runtime.plan.devices import balance
from superggml.hashes import content_ranges

import netlab

pytestmark = pytest.mark.skipif(not netlab.available(), reason="needs network namespaces (root, iproute2)")

BASE = dict(ctx_size=128, n_batch=16, n_threads=1, repack=False)
from prompts import CAPITAL as PROMPT  # noqa: E402

PORT = 50052
PEER_MEMORY = 768 << 20  # each peer's cgroup
LIBS = Path(native.__file__).parent


class Peer:
    """A `superggml rpc-server` (or, with plain=True, ggml's own RPC server, as llama.cpp's rpc-server runs it)
    on a lab host; `models` and `cache` are its folders."""

    def __init__(
        self,
        host: netlab.Host,
        root: Path,
        *,
        model: Optional[str] = None,
        plain: bool = False,
        args: tuple[str, ...] = (),
    ):
        self.host, self.root, self.plain, self.args = host, root, plain, args
        self.models, self.cache = root / "models", root / "cache"
        self.models.mkdir(parents=True, exist_ok=True)
        if model:
            shutil.copy(model, self.models / os.path.basename(model))
        self.proc: Optional[subprocess.Popen] = None
        self.start()

    def start(self) -> None:
        if self.plain:
            argv = netlab.ggml_server(str(LIBS))
        else:
            argv = [
                sys.executable,
                "-m",
                "superggml",
                "rpc-server",
                "--host",
                "{host}",
                "-p",
                "{port}",
                "-t",
                "1",
                "--models",
                str(self.models),
                "-c",
                str(self.cache),
                *self.args,
            ]
        log = open(self.root / "server.log", "a")
        self.endpoint, self.proc = self.host.serve(PORT, argv, memory=PEER_MEMORY, stdout=log, stderr=log)
        log.close()
        deadline = time.time() + 60
        while True:
            try:
                native.rpc_probe(self.endpoint, connect_timeout=2.0)
                return
            except DeviceError:
                if time.time() > deadline or self.proc.poll() is not None:
                    raise
                time.sleep(0.2)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()

    def log(self) -> str:
        return (self.root / "server.log").read_text(errors="replace")

    @property
    def device(self) -> str:
        return f"RPC[{self.endpoint}]"


@pytest.fixture(scope="module")
def reference(smollm2_path: str) -> str:
    with Model(smollm2_path, **BASE) as m:
        return str(m.create_completion(PROMPT, max_tokens=12, temperature=0)["choices"][0]["text"])


@pytest.fixture(scope="module")
def peers(tmp_path_factory: pytest.TempPathFactory, smollm2_path: str) -> Iterator[list[Peer]]:
    with netlab.Lab(3, rate="1gbit") as lab:
        yield [Peer(h, tmp_path_factory.mktemp(f"peer{h.i}"), model=smollm2_path) for h in lab.hosts]


def counters(eps: list[str]) -> dict[str, int]:
    rs = native.rpc_stats()
    keys = ("bytes_sent", "loaded_by_peer", "addressed_misses")
    return {k: sum(int(rs[e][k]) for e in eps if e in rs) for k in keys}


def delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {k: after[k] - before[k] for k in before}


def complete(m: Model, n: int = 12) -> str:
    return str(m.create_completion(PROMPT, max_tokens=n, temperature=0)["choices"][0]["text"])


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("share", ["resident", "streamed"])
def test_peers_equal_one_machine(peers, reference, smollm2_path, share, n):
    use = peers[:n]
    eps = [p.endpoint for p in use]
    kw: dict[str, Any] = dict(devices=[p.device for p in use], tensor_split=[1] * n)
    if share == "streamed":  # two slots per peer: each peer streams its share from its own disk every pass
        kw["device_budget"] = ",".join([str(2 * model_layout(smollm2_path).slot_bytes)] * n)
    c0 = counters(eps)
    with Model(smollm2_path, **BASE, **kw) as m:
        assert all(native.rpc_stats()[e]["addressed"] for e in eps)
        c1 = counters(eps)
        text = complete(m, 16)
        c2 = counters(eps)
        st = m.stats()
    assert text.startswith(reference)  # 16 tokens: the reference's 12, then 4 more
    load, gen = delta(c0, c1), delta(c1, c2)
    assert load["addressed_misses"] == 0 and gen["addressed_misses"] == 0
    if share == "resident":
        assert load["loaded_by_peer"] >= 0.9 * sum(model_layout(smollm2_path).block_bytes)
        assert load["bytes_sent"] < 0.01 * load["loaded_by_peer"]
    else:
        assert st["loads"] > 0 and gen["loaded_by_peer"] > 0
        # only hashes, activations and graphs cross: under 1% of what the peers streamed themselves
        assert gen["bytes_sent"] < 0.01 * gen["loaded_by_peer"], gen


def corrupt(path: Path, name: str) -> None:
    """Flips bytes in the middle of tensor `name`, keeping the file's size and modification time (so its
    hash index, made before, still looks current: the peer's check on first use is what must catch it)."""
    off, nbytes = next((o, b) for n, _, _, o, b in native.GGUFFile(str(path)).tensors() if n == name)
    st = os.stat(path)
    with open(path, "r+b") as f:
        f.seek(off + nbytes // 2)
        b = f.read(64)
        f.seek(off + nbytes // 2)
        f.write(bytes(x ^ 0x5A for x in b))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_corrupted_copy_is_refused_and_the_bytes_sent(tmp_path, reference, smollm2_path):
    with netlab.Lab(1, rate="1gbit") as lab:
        root = tmp_path / "peer"
        (root / "models").mkdir(parents=True)
        copy = root / "models" / os.path.basename(smollm2_path)
        shutil.copy(smollm2_path, copy)
        content_ranges(copy)  # its index, made while the copy was good
        corrupt(copy, "blk.3.ffn_down.weight")
        p = Peer(lab.hosts[0], root)
        c0 = counters([p.endpoint])
        with Model(smollm2_path, **BASE, devices=[p.device]) as m:
            assert complete(m) == reference
        first = delta(c0, counters([p.endpoint]))
        assert first["addressed_misses"] == 1  # that one tensor, sent as bytes
        assert "refused" in p.log() and "do not hash" in p.log()
        c1 = counters([p.endpoint])
        with Model(smollm2_path, **BASE, devices=[p.device]) as m:  # the sent bytes are in its cache now
            assert complete(m) == reference
        assert delta(c1, counters([p.endpoint]))["addressed_misses"] == 0


def test_peer_without_the_file_gets_its_bytes_once(tmp_path, reference, smollm2_path):
    with netlab.Lab(1, rate="1gbit") as lab:
        p = Peer(lab.hosts[0], tmp_path / "peer")
        runs = []
        for _ in range(2):
            c0 = counters([p.endpoint])
            with Model(smollm2_path, **BASE, devices=[p.device]) as m:
                runs.append(delta(c0, counters([p.endpoint])))  # the load
                assert complete(m) == reference
        assert runs[0]["addressed_misses"] > 0
        assert runs[0]["bytes_sent"] > 0.9 * sum(model_layout(smollm2_path).block_bytes)
        assert runs[1]["addressed_misses"] == 0 and runs[1]["bytes_sent"] < 0.01 * runs[0]["bytes_sent"]
        assert runs[1]["loaded_by_peer"] == runs[0]["bytes_sent"] - runs[1]["bytes_sent"] or runs[1][
            "loaded_by_peer"
        ] > 0.9 * sum(model_layout(smollm2_path).block_bytes)
        assert len(os.listdir(p.cache)) == runs[0]["addressed_misses"]


def test_plain_ggml_server_still_works(tmp_path, reference, smollm2_path):
    with netlab.Lab(1, rate="1gbit") as lab:
        p = Peer(lab.hosts[0], tmp_path / "peer", plain=True)
        assert not any(d["addressed"] for d in native.rpc_add_server(p.endpoint))
        slot = model_layout(smollm2_path).slot_bytes
        for kw in (dict(devices=[p.device]), dict(devices=[p.device], device_budget=2 * slot)):
            with Model(smollm2_path, **BASE, **kw) as m:
                assert complete(m) == reference
        assert p.proc is not None and p.proc.poll() is None


def test_killed_peer_then_the_next_call_reconnects(tmp_path, reference, smollm2_path):
    with netlab.Lab(1, rate="1gbit") as lab:
        p = Peer(lab.hosts[0], tmp_path / "peer", model=smollm2_path)
        slot = model_layout(smollm2_path).slot_bytes
        m = Model(smollm2_path, **BASE, devices=[p.device], device_budget=2 * slot, rpc_timeout=3)
        try:
            m.eval(m.tokenize(PROMPT.encode()))
            with pytest.raises(DeviceError, match=p.endpoint):
                for i in range(100):
                    if i == 2:
                        p.kill()
                        t0 = time.time()
                    m.eval([int(m.scores[-1].argmax())])
            assert time.time() - t0 < 10
            with pytest.raises(DeviceError, match=p.endpoint):  # still down: the call says so
                complete(m)
            p.start()
            assert complete(m) == reference  # reconnected, its share loaded again
        finally:
            m.close()


def test_a_stopped_peer_is_a_device_error_within_the_timeout(tmp_path, smollm2_path):
    with netlab.Lab(1, rate="1gbit") as lab:
        p = Peer(lab.hosts[0], tmp_path / "peer", model=smollm2_path)
        with Model(smollm2_path, **BASE, devices=[p.device], rpc_timeout=3) as m:
            m.eval(m.tokenize(PROMPT.encode()))
            assert p.proc is not None
            p.proc.send_signal(signal.SIGSTOP)
            t0 = time.time()
            try:
                with pytest.raises(DeviceError, match="no answer within 3 s"):
                    for _ in range(50):
                        m.eval([int(m.scores[-1].argmax())])
                assert time.time() - t0 < 15
            finally:
                p.proc.send_signal(signal.SIGCONT)


def test_balance_follows_speed_and_memory():
    assert balance([100, 100, 100], [1, 2, 1], 200) == (50, 100, 50)  # by speed
    assert balance([30, 300, 300], [1, 1, 1], 300) == (30, 135, 135)  # none past its memory
    assert balance([10, 10], [1, 3], 100) == (1, 3)  # all stream: by speed


def test_split_over_peers_by_memory_and_measured_speed(tmp_path, reference, smollm2_path):
    """A peer behind a slow link (20 ms each way) measures slower and gets fewer blocks; a peer that
    advertises little memory gets no more blocks than it holds."""
    layout = model_layout(smollm2_path)
    with netlab.Lab(3, rate="1gbit", delay_ms=[0, 20, 0]) as lab:
        small = str(layout.file_bytes // 5)
        ps = [
            Peer(h, tmp_path / f"peer{h.i}", model=smollm2_path, args=("--mem", small) if h.i == 2 else ())
            for h in lab.hosts
        ]
        with Model(smollm2_path, **BASE, devices=[p.device for p in ps]) as m:
            assert complete(m) == reference
            per = m.stats()["blocks_per_device"]
        n = sum(per)
        assert per[1] < per[0], per  # slower: fewer blocks
        assert per[2] * max(layout.block_bytes) <= int(small), per  # within its memory
        assert per[0] >= n // 3
