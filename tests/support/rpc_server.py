"""`superggml rpc-server` processes on loopback ports, as devices for the tests (`devices=[on(server)]`)."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time

from superggml import DeviceError, native


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """A `superggml rpc-server` process on a loopback port, up once its HELLO answers."""

    def __init__(self, *args: str):
        self.port = free_port()
        self.endpoint = f"127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "superggml", "rpc-server", "-p", str(self.port), "-t", "1", *args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        deadline = time.time() + 30
        while True:
            try:
                native.rpc_probe(self.endpoint, connect_timeout=2.0)
                break
            except DeviceError:
                if time.time() > deadline or self.proc.poll() is not None:
                    self.close()
                    raise
                time.sleep(0.1)

    def __enter__(self) -> "Server":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
        self.proc.wait()
        if self.proc.stderr:
            self.proc.stderr.close()


def on(s: Server) -> str:
    """The device of server s, by its endpoint (ggml numbers RPC devices per process: RPC0, RPC1, ...)."""
    return f"RPC[{s.endpoint}]"
