"""Hosts on one machine, joined by a real network: each host is a network namespace of its own, joined to this
one by a veth pair, its link shaped with `tc tbf` (rate) and, as this kernel has no sch_netem, a delaying
forwarder in the host's namespace (latency, each way). Each process a host runs may get its own memory cgroup
(memcg.limited). Traffic stays on the 10.x addresses of these veth pairs. Needs root (CAP_NET_ADMIN) and
iproute2; `available()` says whether this machine allows it.

    with Lab(2, rate="1gbit", delay_ms=1) as lab:
        proc = lab.hosts[0].popen([...], memory=1 << 30)
        lab.hosts[0].address       # where this namespace reaches it

`python tests/support/netlab.py delay ADDR PORT TARGET_PORT MS` is the forwarder: it listens on ADDR:PORT and
forwards to 127.0.0.1:TARGET_PORT, each chunk delivered MS milliseconds after it arrived, both ways.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from typing import Any, Optional, Sequence, Union

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import memcg  # noqa: E402


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def available() -> bool:
    """Whether network namespaces and veth pairs, and child memory cgroups, can be made here."""
    if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("tc") or memcg.own_memory_cgroup() is None:
        return False
    name = f"sgprobe{secrets.token_hex(3)}"
    if ip("netns", "add", name, check=False).returncode != 0:
        return False
    ip("netns", "del", name, check=False)
    return True


def shape(ns: Optional[str], dev: str, rate: str) -> None:
    """A token bucket of `rate` (tc's units: 1gbit, 100mbit) on dev's egress; the bucket holds 10 ms of it."""
    bits = int(float(rate[:-4]) * {"g": 1e9, "m": 1e6, "k": 1e3}[rate[-4].lower()])
    burst = max(64 * 1024, bits // 8 // 100)
    pre = ["ip", "netns", "exec", ns] if ns else []
    subprocess.run(
        [*pre, "tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", rate, "burst", str(burst), "latency", "100ms"],
        check=True,
        capture_output=True,
        text=True,
    )


class Host:
    """One namespace: `address` is its end of the veth pair, `gateway` this namespace's."""

    def __init__(self, lab: "Lab", i: int):
        self.lab, self.i = lab, i
        self.ns = f"sg{lab.token}{i}"
        self.address = f"10.{lab.net}.{i}.2"
        self.gateway = f"10.{lab.net}.{i}.1"
        self.procs: list[subprocess.Popen] = []
        d = lab.delay_ms
        self.delay_ms = float(d[i] if isinstance(d, (list, tuple)) else d)

    def popen(self, argv: list[str], *, memory: Optional[int] = None, **kw: Any) -> subprocess.Popen:
        """Runs argv in this namespace (and in a new memory cgroup of `memory` bytes, if given)."""
        enter = self.lab.stack.enter_context(memcg.limited(memory)) if memory else None
        p = subprocess.Popen(["ip", "netns", "exec", self.ns, *argv], preexec_fn=enter, **kw)
        self.procs.append(p)
        return p

    def serve(
        self, port: int, argv: list[str], *, memory: Optional[int] = None, **kw: Any
    ) -> tuple[str, subprocess.Popen]:
        """Starts a server (argv, listening on `listen`:`port`, both filled in by the caller's argv through
        {host} and {port}); returns the endpoint this namespace reaches it at, through the link's delay."""
        if not self.delay_ms:
            return f"{self.address}:{port}", self.popen(
                [a.format(host=self.address, port=port) for a in argv], memory=memory, **kw
            )
        inner = port + 1
        p = self.popen([a.format(host="127.0.0.1", port=inner) for a in argv], memory=memory, **kw)
        self.popen(
            [
                sys.executable,
                os.path.join(HERE, "netlab.py"),
                "delay",
                self.address,
                str(port),
                str(inner),
                str(self.delay_ms),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        return f"{self.address}:{port}", p


class Lab:
    """`n` hosts, each on its own link of `rate` and `delay_ms` (each way; one per host, or one for all) to this
    namespace."""

    LOCK = "/tmp/superggml-netlab.lock"  # labs of several processes (the suite's workers) choose subnets in turn
    taken: set[int] = set()  # this process's subnets so far: never reused (its RPC registry remembers endpoints)

    def __init__(self, n: int, *, rate: Optional[str] = "1gbit", delay_ms: Union[float, Sequence[float]] = 0):
        self.token = secrets.token_hex(3)
        self.net = 0  # 10.net.0.0/16, one no other lab uses: chosen on entry
        self.rate, self.delay_ms = rate, delay_ms
        self.n = n
        self.hosts: list[Host] = []
        self.stack = contextlib.ExitStack()

    def __enter__(self) -> "Lab":
        with open(self.LOCK, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released with the file, once the subnet's addresses exist
            used = {int(a.split(".")[1]) for a in ip("-o", "-4", "addr").stdout.split() if a.startswith("10.")}
            self.net = next(k for k in range(100, 250) if k not in used | Lab.taken)
            Lab.taken.add(self.net)
            self.hosts = [Host(self, i) for i in range(self.n)]
            self.build()
        return self

    def build(self) -> None:
        try:
            for h in self.hosts:
                outer, inner = f"sgh{self.token}{h.i}", f"sgp{self.token}{h.i}"
                ip("netns", "add", h.ns)
                ip("link", "add", outer, "type", "veth", "peer", "name", inner)
                ip("link", "set", inner, "netns", h.ns)
                ip("addr", "add", f"{h.gateway}/24", "dev", outer)
                ip("-n", h.ns, "addr", "add", f"{h.address}/24", "dev", inner)
                ip("link", "set", outer, "up")
                ip("-n", h.ns, "link", "set", inner, "up")
                ip("-n", h.ns, "link", "set", "lo", "up")
                if self.rate:
                    shape(None, outer, self.rate)
                    shape(h.ns, inner, self.rate)
        except BaseException:
            self.__exit__()
            raise

    def __exit__(self, *exc: Any) -> None:
        for h in self.hosts:
            for p in h.procs:
                if p.poll() is None:
                    p.kill()
                p.wait()
        self.stack.close()  # the cgroups, once their processes are gone
        for h in self.hosts:
            ip("netns", "del", h.ns, check=False)  # its veth pair goes with it


GGML_SERVER = """
import ctypes, sys
lib = sys.argv[1]
ggml = ctypes.CDLL(lib + "/libggml.so.0", mode=ctypes.RTLD_GLOBAL)
rpc = ctypes.CDLL(lib + "/libggml-rpc.so.0")
ggml.ggml_backend_dev_by_type.restype = ctypes.c_void_p
dev = ctypes.c_void_p(ggml.ggml_backend_dev_by_type(0))
rpc.ggml_backend_rpc_start_server(sys.argv[2].encode(), None, ctypes.c_size_t(int(sys.argv[3])), ctypes.c_size_t(1),
                                  ctypes.byref(dev))
"""


def ggml_server(lib: str, threads: int = 1) -> list[str]:
    """argv of ggml's own RPC server (what llama.cpp's rpc-server runs) on this CPU, from the ggml libraries in
    `lib` (superggml's, or llama-cpp-python's), for Host.serve: it listens on {host}:{port}."""
    return [sys.executable, "-c", GGML_SERVER, lib, "{host}:{port}", str(threads)]


def wait_port(host: Host, port: int, timeout: float = 30) -> None:
    """Until something listens on host.address:port, as seen from this namespace."""
    deadline = time.time() + timeout
    while True:
        with socket.socket() as s:
            s.settimeout(1)
            if s.connect_ex((host.address, port)) == 0:
                return
        if time.time() > deadline:
            raise TimeoutError(f"nothing listens on {host.address}:{port}")
        time.sleep(0.1)


# -- the delaying forwarder ------------------------------------------------------


def _pump(src: socket.socket, dst: socket.socket, delay: float) -> None:
    q: deque[tuple[float, bytes]] = deque()
    cv = threading.Condition()
    done = [False]

    def writer() -> None:
        while True:
            with cv:
                while not q and not done[0]:
                    cv.wait()
                if not q:
                    break
                t, data = q.popleft()
            wait = t + delay - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            try:
                dst.sendall(data)
            except OSError:
                break
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    w = threading.Thread(target=writer, daemon=True)
    w.start()
    while True:
        try:
            data = src.recv(1 << 18)
        except OSError:
            data = b""
        with cv:
            if data:
                q.append((time.monotonic(), data))
            else:
                done[0] = True
            cv.notify()
        if not data:
            break
    w.join()


def delay_main(addr: str, port: int, target: int, ms: float) -> None:
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind((addr, port))
    ls.listen(16)
    while True:
        c, _ = ls.accept()
        try:
            u = socket.create_connection(("127.0.0.1", target))
        except OSError:
            c.close()
            continue
        for s in (c, u):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=_pump, args=(c, u, ms / 1e3), daemon=True).start()
        threading.Thread(target=_pump, args=(u, c, ms / 1e3), daemon=True).start()


if __name__ == "__main__" and len(sys.argv) == 6 and sys.argv[1] == "delay":
    delay_main(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]))
