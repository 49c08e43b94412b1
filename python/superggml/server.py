"""`superggml serve`: an OpenAI-compatible HTTP API over one Model (FastAPI + uvicorn).

Endpoints: GET /health, GET /v1/models, POST /v1/completions, POST
/v1/chat/completions (both with "stream": true as server-sent events ending
in "data: [DONE]"), GET /metrics (the current metrics snapshot).

One engine thread owns the model. Requests wait in a bounded queue (503
when it is full); up to `parallel` of them are in flight at once, each on
its own sequence of the paged KV cache, and the engine advances them a token
at a time in turn. A client that disconnects has its generation cancelled
and its pages freed. Errors use OpenAI's JSON shape with the right status.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Iterator, Literal, Optional, Union

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from .model import Model


# -- request bodies (unknown fields are refused, as types are) -------------------
class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: Optional[str] = None
    max_tokens: Optional[int] = Field(default=None, ge=0)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=40, ge=0)
    min_p: float = Field(default=0.0, ge=0.0, le=1.0)
    repeat_penalty: float = Field(default=1.0, gt=0.0)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    stop: Optional[Union[str, list[str]]] = None
    seed: Optional[int] = None
    stream: bool = False
    n: int = Field(default=1, ge=1, le=1)
    user: Optional[str] = None
    stream_options: Optional[dict[str, Any]] = None


class CompletionBody(_Body):
    prompt: Union[str, list[int]]
    max_tokens: Optional[int] = Field(default=16, ge=0)
    echo: bool = False


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: Optional[Union[str, list[dict[str, Any]]]] = None
    name: Optional[str] = None


class ChatBody(_Body):
    messages: list[ChatMessage] = Field(min_length=1)


class ApiError(Exception):
    def __init__(self, status: int, message: str, type_: str = "invalid_request_error", code: str | None = None,
                 param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.code, self.param = status, message, type_, code, param


def _error(status: int, message: str, type_: str = "invalid_request_error", code: str | None = None,
           param: str | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": type_, "param": param, "code": code}},
                        status_code=status)


# -- the engine: one thread, requests advanced a token at a time in turn ---------
@dataclass
class _Job:
    make: Any                         # () -> iterator of chunks (runs on the engine thread)
    out: "asyncio.Queue[Any]"
    loop: asyncio.AbstractEventLoop
    seq: int = -1
    cancelled: bool = False
    it: Iterator[Any] | None = None
    t_submit: float = field(default_factory=time.perf_counter)


_END = object()


class Engine:
    def __init__(self, model: Model, *, parallel: int = 4, max_queue: int = 64):
        self.model = model
        multi = model.settings.kv.paged_kv
        self.parallel = max(1, parallel if multi else 1)   # sequences need the paged KV cache
        self.waiting: "queue.Queue[_Job]" = queue.Queue(maxsize=max_queue)
        self.active: list[_Job] = []
        self._free_seqs = list(range(self.parallel))   # sequence ids (0 alone without the paged KV cache)
        self._stop = False
        self._wake = threading.Event()
        self.lock = threading.Lock()          # the model, for requests outside the engine (metrics)
        self.served = 0
        self.thread = threading.Thread(target=self._run, name="superggml-engine", daemon=True)
        self.thread.start()

    def submit(self, job: _Job) -> None:
        try:
            self.waiting.put_nowait(job)
        except queue.Full:
            raise ApiError(503, "the server is overloaded: too many requests are waiting; retry later",
                           "server_error", "overloaded") from None
        self._wake.set()

    def stop(self) -> None:
        self._stop = True
        self._wake.set()
        self.thread.join(timeout=30)

    def _send(self, job: _Job, item: Any) -> None:
        job.loop.call_soon_threadsafe(job.out.put_nowait, item)

    def _finish(self, job: _Job) -> None:
        self.active.remove(job)
        with self.lock:
            try:
                self.model.drop_sequence(job.seq)
            except Exception:  # noqa: BLE001 - freeing pages must not take the engine down
                pass
        self._free_seqs.append(job.seq)
        self.served += 1

    def _run(self) -> None:
        while not self._stop:
            while len(self.active) < self.parallel:
                try:
                    job = self.waiting.get_nowait()
                except queue.Empty:
                    break
                if job.cancelled:
                    continue
                job.seq = self._free_seqs.pop()
                self.active.append(job)
            if not self.active:
                self._wake.wait(0.5)
                self._wake.clear()
                continue
            for job in list(self.active):
                if job.cancelled:
                    self._finish(job)
                    continue
                with self.lock:
                    try:
                        self.model.use_sequence(job.seq)
                        if job.it is None:
                            job.it = iter(job.make())
                        item = next(job.it)
                    except StopIteration:
                        item = _END
                    except Exception as e:  # noqa: BLE001 - reaches the client as an error
                        item = e
                self._send(job, item)
                if item is _END or isinstance(item, Exception):
                    self._finish(job)


# -- the app ----------------------------------------------------------------------
def create_app(model: Model, *, model_id: str | None = None, parallel: int = 4, max_queue: int = 64) -> FastAPI:
    """The FastAPI app serving `model` (closed with the app)."""
    import os

    mid = model_id or os.path.basename(model.path)
    engine = Engine(model, parallel=parallel, max_queue=max_queue)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> Any:
        yield
        engine.stop()

    app = FastAPI(title="superggml", version="0.1.0", lifespan=lifespan)
    app.state.engine = engine
    app.state.model = model
    created = int(time.time())

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, e: ApiError) -> JSONResponse:
        return _error(e.status, e.message, e.type, e.code, e.param)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, e: RequestValidationError) -> JSONResponse:
        errs = e.errors()
        first = errs[0] if errs else {}
        loc = ".".join(str(x) for x in first.get("loc", ()) if x != "body")
        if first.get("type") == "json_invalid":
            return _error(400, "the request body is not valid JSON", code="invalid_json")
        msg = f"{loc}: {first.get('msg', 'invalid')}" if loc else str(first.get("msg", "invalid request"))
        return _error(400, msg, param=loc or None, code="invalid_value")

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, e: StarletteHTTPException) -> JSONResponse:
        if e.status_code == 404:
            return _error(404, f"unknown route {request.method} {request.url.path}", code="not_found")
        if e.status_code == 405:
            return _error(405, f"method {request.method} not allowed on {request.url.path}",
                          code="method_not_allowed")
        return _error(e.status_code, str(e.detail))

    @app.exception_handler(Exception)
    async def _internal(request: Request, e: Exception) -> JSONResponse:
        return _error(500, f"internal error: {e}", "server_error")

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "model": mid, "active": len(engine.active), "waiting": engine.waiting.qsize()}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": mid, "object": "model", "created": created,
                                            "owned_by": "superggml"}]}

    @app.get("/v1/models/{name}")
    async def model_info(name: str) -> dict[str, Any]:
        if name != mid:
            raise ApiError(404, f"the model {name!r} does not exist; this server has {mid!r}",
                           code="model_not_found", param="model")
        return {"id": mid, "object": "model", "created": created, "owned_by": "superggml"}

    @app.get("/metrics")
    async def metrics() -> dict[str, Any]:
        from .metrics import Metrics
        with engine.lock:
            snap = Metrics(model, None).snapshot()
        snap.update(requests_active=len(engine.active), requests_waiting=engine.waiting.qsize(),
                    requests_served=engine.served)
        return snap

    def check(body: _Body, n_prompt: int) -> None:
        if body.model is not None and body.model != mid:
            raise ApiError(404, f"the model {body.model!r} does not exist; this server has {mid!r}",
                           code="model_not_found", param="model")
        if n_prompt >= model.n_ctx:
            raise ApiError(400, f"the prompt has {n_prompt} tokens; this model's context is {model.n_ctx} tokens",
                           code="context_length_exceeded", param="prompt")
        if n_prompt == 0:
            raise ApiError(400, "the prompt is empty", param="prompt")

    def sampling(body: _Body) -> dict[str, Any]:
        return dict(max_tokens=body.max_tokens, temperature=body.temperature, top_p=body.top_p, top_k=body.top_k,
                    min_p=body.min_p, repeat_penalty=body.repeat_penalty,
                    frequency_penalty=body.frequency_penalty, presence_penalty=body.presence_penalty,
                    stop=body.stop, seed=body.seed)

    def chunks(create: Any, stream: bool, fix: Any = None) -> Any:
        """A job body (run on the engine thread): the response chunks, or the one response, named `mid`."""
        def make() -> Iterator[dict[str, Any]]:
            res = create()
            for c in (res if stream else [res]):
                c["model"] = mid
                yield fix(c) if fix else c
        return make

    async def run(request: Request, make: Any, stream: bool) -> Any:
        loop = asyncio.get_running_loop()
        job = _Job(make=make, out=asyncio.Queue(), loop=loop)
        engine.submit(job)
        if not stream:
            try:
                while True:
                    item = await job.out.get()
                    if isinstance(item, Exception):
                        raise item
                    if item is _END:
                        raise ApiError(500, "generation ended without a result", "server_error")
                    job.cancelled = True      # the single result came: nothing more to do
                    return item
            except asyncio.CancelledError:
                job.cancelled = True
                raise

        async def events() -> Any:
            try:
                while True:
                    item = await job.out.get()
                    if item is _END:
                        yield "data: [DONE]\n\n"
                        return
                    if isinstance(item, Exception):
                        err = {"error": {"message": str(item), "type": "server_error", "param": None, "code": None}}
                        yield f"data: {json.dumps(err)}\n\n"
                        return
                    yield f"data: {json.dumps(item, separators=(',', ':'))}\n\n"
            finally:
                job.cancelled = True          # done, failed or the client went away: free the sequence

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    @app.post("/v1/completions")
    async def completions(body: CompletionBody, request: Request) -> Any:
        if isinstance(body.prompt, str):
            tokens = model.tokenize(body.prompt, add_bos=True, special=True)
        else:
            if any(not 0 <= t < model.n_vocab for t in body.prompt):
                raise ApiError(400, f"prompt token ids must be in [0, {model.n_vocab})", param="prompt")
            tokens = list(body.prompt)
        check(body, len(tokens))
        kw = sampling(body)

        echo = body.prompt if body.echo and isinstance(body.prompt, str) and not body.stream else ""

        def fix(c: dict[str, Any]) -> dict[str, Any]:
            c["choices"][0]["text"] = echo + c["choices"][0]["text"]
            return c
        return await run(request, chunks(lambda: model.create_completion(tokens, stream=body.stream, **kw),
                                         body.stream, fix), body.stream)

    @app.post("/v1/chat/completions")
    async def chat(body: ChatBody, request: Request) -> Any:
        msgs = [m.model_dump(exclude_none=True) for m in body.messages]
        for m in msgs:   # content parts: keep the text ones
            if isinstance(m.get("content"), list):
                m["content"] = "".join(p.get("text", "") for p in m["content"] if p.get("type") == "text")
        try:
            prompt = model.apply_chat_template(msgs)
        except Exception as e:  # noqa: BLE001 - a template that rejects these messages is the client's input
            raise ApiError(400, f"the chat template rejected the messages: {e}", param="messages") from None
        tokens = model.tokenize(prompt, add_bos=True, special=True)
        check(body, len(tokens))
        kw = sampling(body)

        return await run(request, chunks(lambda: model.create_chat_completion(msgs, stream=body.stream, **kw),
                                         body.stream), body.stream)

    return app


def serve(model: Model, *, host: str = "127.0.0.1", port: int = 8080, parallel: int = 4, max_queue: int = 64,
          log_level: str = "info") -> None:
    import uvicorn

    app = create_app(model, parallel=parallel, max_queue=max_queue)
    uvicorn.run(app, host=host, port=port, log_level=log_level)
