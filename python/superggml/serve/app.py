"""create_app: the FastAPI app, its paths mapped to Routes; serve: the app under uvicorn."""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any, Sequence

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

from ..model import Model
from .engine import Engine
from .errors import add_error_handlers
from .keys import RequireKey, check_bind
from .routes import WEB, Routes


PATHS = (  # (method, path, the Routes method that answers it)
    ("get", "/health", "health"),
    ("get", "/v1/models", "models"),
    ("get", "/v1/models/{name}", "model_info"),
    ("get", "/metrics", "metrics"),
    ("get", "/v1/stats", "stats"),
    ("post", "/tokenize", "tokenize"),
    ("post", "/detokenize", "detokenize"),
    ("get", "/", "page"),
    ("get", "/v1/events", "live_stream"),
    ("get", "/slots", "slots"),
    ("post", "/slots/{id_slot}", "slot_action"),
    ("post", "/v1/completions", "completions"),
    ("post", "/v1/embeddings", "embeddings"),
    ("post", "/v1/chat/completions", "chat"),
)


class JsonBodies:
    """Reads every POST body as JSON, whatever its Content-Type says, as llama-server does: `curl -d '{...}'`
    sends form encoding's type with a JSON body."""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            headers = [(k, v) for k, v in scope["headers"] if k.lower() != b"content-type"]
            scope = {**scope, "headers": headers + [(b"content-type", b"application/json")]}
        await self.app(scope, receive, send)


def create_app(
    model: Model,
    *,
    model_id: str | None = None,
    parallel: int = 4,
    max_queue: int = 64,
    batch_tokens: int = 512,
    api_keys: Sequence[str] = (),
    slot_save_path: str | None = None,
) -> FastAPI:
    """The FastAPI app serving `model` (closed with the app); with api_keys, every route but /health needs one;
    slots are saved to and restored from files of slot_save_path."""
    engine = Engine(model, parallel=parallel, max_queue=max_queue, batch_tokens=batch_tokens)
    routes = Routes(model, engine, model_id or os.path.basename(model.path), slot_save_path)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> Any:
        yield
        engine.stop()

    app = FastAPI(title="superggml", version="0.1.0", lifespan=lifespan)
    app.state.engine = engine
    app.state.model = model
    add_error_handlers(app)
    for method, path, name in PATHS:
        getattr(app, method)(path)(getattr(routes, name))
    app.mount("/web", StaticFiles(directory=WEB), name="web")
    if api_keys:
        app.add_middleware(RequireKey, keys=list(api_keys))
    app.add_middleware(JsonBodies)
    return app


def serve(
    model: Model,
    *,
    host: str = "127.0.0.1",
    port: int = 8080,
    parallel: int = 4,
    max_queue: int = 64,
    batch_tokens: int = 512,
    log_level: str = "info",
    api_keys: Sequence[str] = (),
    insecure: bool = False,
    slot_save_path: str | None = None,
    model_id: str | None = None,
) -> None:
    import uvicorn

    check_bind(host, api_keys, insecure)
    if slot_save_path is not None and not os.path.isdir(slot_save_path):
        raise ValueError(f"--slot-save-path {slot_save_path!r} is not a directory")
    app = create_app(
        model,
        parallel=parallel,
        max_queue=max_queue,
        batch_tokens=batch_tokens,
        api_keys=api_keys,
        slot_save_path=slot_save_path,
        model_id=model_id,
    )
    print(startup_line(model, model_id or os.path.basename(model.path), host, port), file=sys.stderr, flush=True)
    uvicorn.run(app, host=host, port=port, log_level=log_level)


def startup_line(model: Model, model_id: str, host: str, port: int) -> str:
    """What the server serves: the model's name and file, its context, and the memory plan (resident, or the
    budget the blocks stream through)."""
    b = (model.stats().get("budget") or {}).get("budget")
    plan = "resident" if b is None else f"streaming through a {b / 2**20:.0f} MiB budget"
    return (
        f"superggml: serving {model_id!r} ({model.path}) on http://{host}:{port}: "
        f"ctx {model.n_ctx}, {model.hparams.n_layer} blocks, {plan}, on {model.device[1]}"
    )
