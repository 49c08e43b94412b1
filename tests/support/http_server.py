"""`superggml serve`'s app (superggml.serve.create_app) on a loopback port, served by uvicorn in a thread of the
test's process, and the official openai client against it: for the server's tests and the tests that reach the
API through it."""

from __future__ import annotations

import socket
import threading
import time
from typing import Iterator

import openai
import uvicorn

from superggml import Model
from superggml.serve import create_app


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, model: Model, **kw):
        self.port = free_port()
        self.app = create_app(model, **kw)
        self.server = uvicorn.Server(
            uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="on")
        )
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        for _ in range(200):
            if self.server.started:
                break
            time.sleep(0.05)
        self.url = f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


def openai_client(model: Model, **kw) -> Iterator[openai.OpenAI]:
    """The official client against `model` served with create_app(**kw) (a fixture's body: yields, then stops
    the server); `client.server` is the Server."""
    s = Server(model, **kw)
    try:
        with openai.OpenAI(base_url=s.url + "/v1", api_key="none", max_retries=0, timeout=600) as c:
            c.server = s  # type: ignore[attr-defined]
            yield c
    finally:
        s.close()
