"""`superggml serve`: an OpenAI-compatible HTTP API over one Model (FastAPI + uvicorn).

Endpoints: GET /health, GET /v1/models, POST /v1/completions, POST
/v1/chat/completions (both with "stream": true as server-sent events ending
in "data: [DONE]"; logprobs, structured output, tools), POST /v1/embeddings,
POST /tokenize and /detokenize (llama-server's shapes), GET /metrics (Prometheus' text format) and GET
/v1/stats (the metrics snapshot as JSON). With API keys, every route but /health needs
`Authorization: Bearer <key>` (api/keys.py).

One engine thread owns the model and batches continuously: each step is one
eval (shared forward passes) over the next token of every running request
plus prompt chunks of new ones, up to `batch_tokens` tokens. Up to
`parallel` sequences run at once, each with its own K/V (pages of the paged
KV cache, or storage of its own); /v1/completions takes prompt lists and n.
Requests wait in a bounded queue (503 when it is full). A client that
disconnects has its generation cancelled and its sequences freed; the
others in the pass go on. Errors use OpenAI's JSON shape with the right
status.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Literal, Optional, Sequence, Union

import numpy as np

from .errors import ContextLengthError, SavedSequenceError, require_extra

require_extra("server", "superggml's server")
from fastapi import FastAPI, Request  # noqa: E402
from fastapi.exceptions import RequestValidationError  # noqa: E402
from fastapi.responses import FileResponse, JSONResponse, Response, StreamingResponse  # noqa: E402
from fastapi.staticfiles import StaticFiles  # noqa: E402
from pydantic import BaseModel, ConfigDict, Field  # noqa: E402
from starlette.exceptions import HTTPException as StarletteHTTPException  # noqa: E402

from .api.chat import ChatTemplateError
from .api.choices import MAX_LOGPROBS, sampling_options, stop_list
from .api.completions import echo_texts
from .api.keys import RequireKey, check_bind
from .api.live import LiveView, events as live_events
from .api.prometheus import CONTENT_TYPE, prometheus_text
from .api.reply import Reply
from .api.tools import ToolError, ToolRequest
from .generation.batch import BatchScheduler, Completion
from .generation.batch import Request as BatchRequest
from .generation.grammar import Grammar, GrammarError
from .model import Model
from .runtime.sequences import check_tokens


WEB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "web")     # the page's files


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
    n: int = Field(default=1, ge=1, le=128)
    user: Optional[str] = None
    stream_options: Optional[dict[str, Any]] = None
    # the one constraint on the text: OpenAI's response_format, or llama-server's grammar (GBNF; Lark too) and
    # json_schema, or a regex
    response_format: Optional[dict[str, Any]] = None
    grammar: Optional[str] = None
    json_schema: Optional[dict[str, Any]] = None
    regex: Optional[str] = None
    # llama-server's: start from the longest prefix a slot holds (the first logits then come from a pass of the
    # prompt's tail, which may differ from a whole prompt's in the last bits unless batch_invariant)
    cache_prompt: bool = True


class CompletionBody(_Body):
    prompt: Union[str, list[int], list[str], list[list[int]]]
    max_tokens: Optional[int] = Field(default=16, ge=0)
    echo: bool = False
    logprobs: Optional[int] = Field(default=None, ge=0, le=MAX_LOGPROBS)


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: Optional[Union[str, list[dict[str, Any]]]] = None
    name: Optional[str] = None
    tool_calls: Optional[list[dict[str, Any]]] = None     # an assistant's earlier calls
    tool_call_id: Optional[str] = None                     # a tool message: the call it answers


class ChatBody(_Body):
    messages: list[ChatMessage] = Field(min_length=1)
    logprobs: bool = False
    top_logprobs: Optional[int] = Field(default=None, ge=0, le=MAX_LOGPROBS)
    tools: Optional[list[dict[str, Any]]] = None
    tool_choice: Optional[Union[str, dict[str, Any]]] = None
    parallel_tool_calls: bool = True


class TokenizeBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    content: str
    add_special: bool = False
    parse_special: bool = True
    with_pieces: bool = False


class SlotBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    filename: str


class DetokenizeBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    tokens: list[int]


class EmbeddingBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: Optional[str] = None
    input: Union[str, list[str], list[int], list[list[int]]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Optional[int] = Field(default=None, ge=1)
    user: Optional[str] = None


class ApiError(Exception):
    def __init__(self, status: int, message: str, type_: str = "invalid_request_error", code: str | None = None,
                 param: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.code, self.param = status, message, type_, code, param
        self.headers = headers


def model_not_found(name: str, served: str) -> ApiError:
    return ApiError(404, f"the model {name!r} does not exist; this server has {served!r}", code="model_not_found",
                    param="model")


def _error(status: int, message: str, type_: str = "invalid_request_error", code: str | None = None,
           param: str | None = None, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": type_, "param": param, "code": code}},
                        status_code=status, headers=headers)


# -- the engine: one thread, every running request advanced in each forward pass ------
@dataclass(eq=False)
class Job:
    request: BatchRequest
    reply: Reply
    out: "asyncio.Queue[Any]"
    loop: asyncio.AbstractEventLoop
    echo_logprobs: bool = False                            # the echoed prompts' logprobs too
    running: list[Completion] = field(default_factory=list)
    unstarted: list[int] = field(default_factory=list)     # choices not started yet
    opened: bool = False
    cancelled: bool = False
    t_submit: float = field(default_factory=time.perf_counter)


END = object()


class Engine:
    """One thread owns the model and runs the batch scheduler (generation/batch.py): every step is one shared
    forward pass over the next token of each running choice plus prompt chunks of new ones, up to batch_tokens
    tokens. Up to `parallel` choices run at once (a request with several takes one each, and its choices beyond
    the free sequences start as others finish); the rest wait in a queue of at most max_queue choices (one
    request is taken whatever its size when nothing waits)."""

    def __init__(self, model: Model, *, parallel: int = 4, max_queue: int = 64, batch_tokens: int = 512):
        self.model = model
        self.scheduler = BatchScheduler(model, parallel=parallel, batch_tokens=max(1, batch_tokens), slots=True)
        self.parallel = self.scheduler.parallel
        self.waiting: "queue.Queue[Job]" = queue.Queue()
        self.max_queue, self.queued = max_queue, 0            # choices waiting to start
        self.active: list[Job] = []
        self.pending: Job | None = None     # taken from the queue, waiting for sequences to free
        self.stopping = False
        self.wake = threading.Event()
        self.lock = threading.Lock()          # the model, for requests outside the engine (metrics)
        self.lock_queue = threading.Lock()
        self.served = 0
        self.steps = 0
        self.prompt_tokens = self.generated_tokens = self.cached_tokens = 0
        self.prompt_seconds = self.generation_seconds = 0.0     # engine steps with prompt rows, and without
        self.thread = threading.Thread(target=self.run, name="superggml-engine", daemon=True)
        self.thread.start()

    def submit(self, job: Job) -> None:
        n = job.request.n_choices
        with self.lock_queue:
            if self.queued and self.queued + n > self.max_queue:
                raise ApiError(503, f"the server is overloaded: {self.queued} completions are waiting to start "
                               f"(--max-queue {self.max_queue}); retry later", "server_error", "overloaded",
                               headers={"Retry-After": "1"})
            self.queued += n
            job.unstarted = list(range(n))
            self.waiting.put_nowait(job)
        self.wake.set()

    def started(self, n: int) -> None:
        with self.lock_queue:
            self.queued -= n

    def stop(self) -> None:
        self.stopping = True
        self.wake.set()
        self.thread.join(timeout=30)
        with self.lock:
            self.scheduler.close()

    def send(self, job: Job, item: Any) -> None:
        job.loop.call_soon_threadsafe(job.out.put_nowait, item)

    def finish(self, job: Job, item: Any = END) -> None:
        """Ends a job: sends `item` (the end, or an error), frees its sequences."""
        if job in self.active:
            self.active.remove(job)
        self.drop_unstarted(job)
        self.send(job, item)
        with self.lock:
            try:
                self.scheduler.finish(job.running)
            except Exception:  # noqa: BLE001 - freeing pages must not take the engine down
                pass
        job.running = []
        self.served += 1

    def admit(self) -> None:
        """Starts waiting choices in order while sequences are free; a request's choices may start over several
        steps (it stays pending until its last one has started)."""
        while True:
            if self.pending is None:
                try:
                    self.pending = self.waiting.get_nowait()
                except queue.Empty:
                    return
            job = self.pending
            if job.cancelled:
                self.drop_unstarted(job)
                continue
            k = min(len(job.unstarted), self.scheduler.free)
            if not k:
                return
            take, job.unstarted = job.unstarted[:k], job.unstarted[k:]
            self.started(k)
            if not job.unstarted:
                self.pending = None
            if job not in self.active:
                self.active.append(job)
            self.start(job, take)

    def start(self, job: Job, take: list[int]) -> None:
        req = job.request
        try:
            with self.lock:
                if job.echo_logprobs and not job.opened:    # one pass over each prompt, on a scratch sequence
                    job.reply.prompt_lp = self.model.echo_logprobs(req.prompts, req.logprobs or 0, req.n)
                new = self.scheduler.add(req, take)
            job.running += new
            self.prompt_tokens += sum(len(c.pending) for c in new)      # fed: what their slots did not hold
            self.cached_tokens += sum(c.kept for c in new)
            if not job.opened:
                job.opened = True
                for c in job.reply.opening():    # the echoed prompts (with their logprobs): the first chunks
                    self.send(job, c)
        except Exception as e:  # noqa: BLE001 - reaches the client as an error
            self.finish(job, e)

    def drop_unstarted(self, job: Job) -> None:
        """The job's choices that have not started will not."""
        self.started(len(job.unstarted))
        job.unstarted = []
        if self.pending is job:
            self.pending = None

    def run(self) -> None:
        while not self.stopping:
            self.admit()
            for job in [j for j in self.active if j.cancelled]:
                self.finish(job)
            if not self.active:
                self.wake.wait(0.5)
                self.wake.clear()
                continue
            owner = {id(job.request): job for job in self.active}
            t0 = time.perf_counter()
            try:
                with self.lock:
                    done = self.scheduler.step()
            except Exception as e:  # noqa: BLE001 - a failed pass fails the requests in it
                for job in list(self.active):
                    self.finish(job, e)
                continue
            self.count_step(len(done), time.perf_counter() - t0)
            for c, piece in done:
                job = owner[id(c.request)]
                chunk = job.reply.chunk(*self.chunk_args(c, piece))
                if chunk is not None:
                    self.send(job, chunk)
                if c.finish:
                    job.running.remove(c)
            for job in {id(owner[id(c.request)]): owner[id(c.request)] for c, _ in done}.values():
                if not job.running and not job.unstarted and job in self.active:
                    if not job.reply.stream:
                        self.send(job, job.reply.final())
                    self.finish(job)

    def count_step(self, generated: int, seconds: float) -> None:
        """A step's tokens and time: a step that generated nothing only fed prompt rows."""
        self.steps += 1
        self.generated_tokens += generated
        if generated:
            self.generation_seconds += seconds
        else:
            self.prompt_seconds += seconds

    def counts(self) -> dict[str, Any]:
        return {"prompt_tokens": self.prompt_tokens, "generated_tokens": self.generated_tokens,
                "cached_tokens": self.cached_tokens,
                "decode_steps": self.steps, "requests": self.served, "processing": len(self.active),
                "deferred": self.waiting.qsize() + (self.pending is not None),
                "prompt_seconds": self.prompt_seconds, "generation_seconds": self.generation_seconds}

    @staticmethod
    def chunk_args(c: Completion, piece: str) -> tuple[Any, ...]:
        i, finish, n, lp = c.take()
        return i, piece, finish, n, lp


# -- the app ----------------------------------------------------------------------
def add_error_handlers(app: FastAPI) -> None:
    """Every error in OpenAI's JSON shape: ours, a body that does not validate, an unknown route, a crash."""

    @app.exception_handler(ApiError)
    async def api_error(request: Request, e: ApiError) -> JSONResponse:
        return _error(e.status, e.message, e.type, e.code, e.param, e.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, e: RequestValidationError) -> JSONResponse:
        errs = e.errors()
        first = errs[0] if errs else {}
        loc = ".".join(str(x) for x in first.get("loc", ()) if x != "body")
        if first.get("type") == "json_invalid":
            return _error(400, "the request body is not valid JSON", code="invalid_json")
        msg = f"{loc}: {first.get('msg', 'invalid')}" if loc else str(first.get("msg", "invalid request"))
        return _error(400, msg, param=loc or None, code="invalid_value")

    @app.exception_handler(StarletteHTTPException)
    async def http(request: Request, e: StarletteHTTPException) -> JSONResponse:
        if e.status_code == 404:
            return _error(404, f"unknown route {request.method} {request.url.path}", code="not_found")
        if e.status_code == 405:
            return _error(405, f"method {request.method} not allowed on {request.url.path}",
                          code="method_not_allowed")
        return _error(e.status_code, str(e.detail))

    @app.exception_handler(Exception)
    async def internal(request: Request, e: Exception) -> JSONResponse:
        return _error(500, f"internal error: {e}", "server_error")


class Routes:
    """What each endpoint does, over one model and the engine that owns it; create_app maps the paths here."""

    def __init__(self, model: Model, engine: Engine, model_id: str, slot_save_path: str | None = None):
        self.model, self.engine, self.mid = model, engine, model_id
        self.created = int(time.time())
        self.save_dir = slot_save_path
        self.live = LiveView(model)
        self.last_stats: dict[str, Any] = {}

    async def health(self) -> dict[str, Any]:
        return {"status": "ok", "model": self.mid, "active": len(self.engine.active),
                "waiting": self.engine.waiting.qsize()}

    async def models(self) -> dict[str, Any]:
        return {"object": "list", "data": [self.card()]}

    async def model_info(self, name: str) -> dict[str, Any]:
        self.check_model(name)
        return self.card()

    def card(self) -> dict[str, Any]:
        return {"id": self.mid, "object": "model", "created": self.created, "owned_by": "superggml"}

    def snapshot(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """The model's stats() and the metrics snapshot, taken between the engine's passes."""
        from .metrics import Metrics
        with self.engine.lock:
            st = self.model.stats()
            return st, Metrics(self.model, None).snapshot(stats=st)

    async def stats(self) -> dict[str, Any]:
        engine = self.engine
        _, snap = await asyncio.to_thread(self.snapshot)
        snap.update(requests_active=len(engine.active), requests_waiting=engine.waiting.qsize(),
                    requests_served=engine.served, engine_steps=engine.steps,
                    prompt_tokens_processed=engine.prompt_tokens, prompt_tokens_cached=engine.cached_tokens)
        return snap

    async def metrics(self) -> Response:
        st, snap = await asyncio.to_thread(self.snapshot)
        return Response(prometheus_text(st, self.engine.counts(), snap), media_type=CONTENT_TYPE)

    async def page(self) -> FileResponse:
        return FileResponse(os.path.join(WEB, "index.html"))

    async def live_stream(self, request: Request) -> StreamingResponse:
        """The live view's snapshots as server-sent events (api/live.py)."""
        async def take() -> tuple[dict[str, Any], dict[str, Any]]:
            return await asyncio.to_thread(self.live_stats)
        return StreamingResponse(live_events(self.live, take, request.is_disconnected),
                                 media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    def live_stats(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """The model's stats() between passes; during a long pass, the last ones (the page still ticks)."""
        if self.engine.lock.acquire(timeout=0.2):
            try:
                self.last_stats = self.model.stats()
            finally:
                self.engine.lock.release()
        return self.last_stats, self.engine.counts()

    async def tokenize(self, body: TokenizeBody) -> dict[str, Any]:
        ids = self.model.tokenize(body.content, add_bos=body.add_special, special=body.parse_special)
        if not body.with_pieces:
            return {"tokens": ids}
        out = []
        for t in ids:
            raw = self.model.token_bytes(t)
            try:
                piece: Any = raw.decode("utf-8")
            except UnicodeDecodeError:
                piece = list(raw)          # not UTF-8 on its own: its bytes, as llama-server gives them
            out.append({"id": t, "piece": piece})
        return {"tokens": out}

    async def detokenize(self, body: DetokenizeBody) -> dict[str, Any]:
        try:
            check_tokens(body.tokens, self.model.n_vocab)
        except ValueError as e:
            raise ApiError(400, str(e), param="tokens") from None
        return {"content": self.model.detokenize(body.tokens).decode("utf-8", errors="replace")}

    async def slots(self) -> list[dict[str, Any]]:
        sl = self.engine.scheduler.slots
        assert sl is not None
        with self.engine.lock:
            return [{"id": i, "n_tokens": len(sl.tokens(i)), "is_processing": sl.busy[i]} for i in range(len(sl))]

    async def slot_action(self, id_slot: int, action: str, body: Optional[SlotBody] = None) -> dict[str, Any]:
        """llama-server's /slots/{id}?action=save|restore|erase: a slot's sequence to a file of --slot-save-path
        and back (a later prompt that extends it prefills only the rest), or emptied."""
        sl = self.engine.scheduler.slots
        assert sl is not None
        if not 0 <= id_slot < len(sl):
            raise ApiError(400, f"slot ids are 0..{len(sl) - 1}", param="id_slot")
        if action == "erase":
            with self.engine.lock:
                n = len(sl.tokens(id_slot))
                self.slot_sequence(sl, id_slot, empty=True)
            return {"id_slot": id_slot, "n_erased": n}
        if action not in ("save", "restore"):
            raise ApiError(400, f"action must be save, restore or erase, not {action!r}", param="action")
        if body is None:
            raise ApiError(400, f"action={action} needs a JSON body with a filename", param="filename")
        path = self.slot_file(body.filename)
        t0 = time.perf_counter()
        n = await asyncio.to_thread(self.save_slot if action == "save" else self.restore_slot, sl, id_slot, path)
        ms = round(1000 * (time.perf_counter() - t0), 3)
        size = os.path.getsize(path)
        if action == "save":
            return {"id_slot": id_slot, "filename": body.filename, "n_saved": n, "n_written": size,
                    "timings": {"save_ms": ms}}
        return {"id_slot": id_slot, "filename": body.filename, "n_restored": n, "n_read": size,
                "timings": {"restore_ms": ms}}

    def slot_file(self, name: str) -> str:
        if self.save_dir is None:
            raise ApiError(501, "saving and restoring slots needs --slot-save-path", code="not_supported")
        if (not name or name.startswith(".") or os.path.basename(name) != name or "\\" in name or "\0" in name):
            raise ApiError(400, f"filename {name!r} is not a plain file name (it must stay in --slot-save-path)",
                           param="filename")
        return os.path.join(self.save_dir, name)

    def slot_sequence(self, sl: Any, id_slot: int, empty: bool = False) -> int:
        if sl.busy[id_slot]:
            raise ApiError(409, f"slot {id_slot} is busy", code="slot_busy")
        if empty:
            return int(sl.place(id_slot))
        seq = sl.seq[id_slot]
        if seq is None or not sl.tokens(id_slot):
            raise ApiError(400, f"slot {id_slot} holds nothing to save", param="id_slot")
        return int(seq)

    def save_slot(self, sl: Any, id_slot: int, path: str) -> int:
        with self.engine.lock:
            seq = self.slot_sequence(sl, id_slot)
            self.on_sequence(seq, lambda: self.model.save_sequence(path))
            return len(sl.tokens(id_slot))

    def restore_slot(self, sl: Any, id_slot: int, path: str) -> int:
        with self.engine.lock:
            seq = self.slot_sequence(sl, id_slot, empty=True)
            try:
                return self.on_sequence(seq, lambda: self.model.load_sequence(path))
            except SavedSequenceError as e:
                raise ApiError(400, str(e), param="filename", code="invalid_saved_sequence") from None

    def on_sequence(self, seq: int, work: Any) -> Any:
        """work() with `seq` as the model's current sequence (the engine's lock held)."""
        prev = self.model.sequence
        self.model.use_sequence(seq)
        try:
            return work()
        finally:
            self.model.use_sequence(prev)

    def check_model(self, name: str | None) -> None:
        if name is not None and name != self.mid:
            raise model_not_found(name, self.mid)

    def check_prompt(self, tokens: list[int]) -> None:
        """400 for an empty prompt or one that leaves no room in the context (the model's own checks)."""
        try:
            self.model.completion_limit(tokens, None)
        except ContextLengthError as e:
            raise ApiError(400, str(e), code="context_length_exceeded", param="prompt") from None
        except ValueError as e:
            raise ApiError(400, str(e), param="prompt") from None

    async def constraint(self, body: _Body, tools: ToolRequest | None = None) -> Grammar | None:
        """The request's constraint (its tool_choice's, or the one it gives), compiled and checked off the event
        loop (400 if it is bad)."""
        given = {k: getattr(body, k) for k in ("grammar", "json_schema", "regex", "response_format")}
        if all(v is None for v in given.values()) and tools is None:
            return None
        try:
            return await asyncio.to_thread(lambda: self.model.chat_constraint(tools, **given))
        except GrammarError as e:
            param = next((k for k, v in given.items() if v is not None), "tools")
            raise ApiError(400, str(e), param=param, code="invalid_constraint") from None

    async def run(self, body: _Body, prompts: list[list[int]], chat: bool, echo: list[str] | None = None,
                  logprobs: int | None = None, echo_logprobs: bool = False, tools: ToolRequest | None = None) -> Any:
        """Hands the request to the engine; the reply, or its stream of events."""
        model = self.model
        grammar = await self.constraint(body, tools)
        reply = Reply(chat=chat, stream=body.stream, model=self.mid, n_choices=len(prompts) * body.n,
                      n_prompt=sum(len(p) for p in prompts), echo=echo,
                      token_bytes=model.token_bytes if logprobs is not None else None, tools=tools)
        sampling = sampling_options(temperature=body.temperature, top_p=body.top_p, top_k=body.top_k,
                                    min_p=body.min_p, repeat_penalty=body.repeat_penalty,
                                    frequency_penalty=body.frequency_penalty,
                                    presence_penalty=body.presence_penalty, seed=body.seed)
        req = BatchRequest(prompts, body.n, body.max_tokens, stop_list(body.stop), sampling, logprobs, grammar,
                           model.marker_ids(tools), reuse=body.cache_prompt)
        job = Job(req, reply, asyncio.Queue(), asyncio.get_running_loop(), echo_logprobs=echo_logprobs)
        self.engine.submit(job)
        if body.stream:
            return StreamingResponse(self.events(job), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        try:
            item = await job.out.get()
        finally:
            job.cancelled = True      # the single result came (or the client left): nothing more to do
        if isinstance(item, Exception):
            raise item
        if item is END:
            raise ApiError(500, "generation ended without a result", "server_error")
        return item

    async def events(self, job: Job) -> Any:
        """The job's chunks as server-sent events, ending in [DONE] (or an error event)."""
        try:
            while True:
                item = await job.out.get()
                if item is END:
                    yield "data: [DONE]\n\n"
                    return
                if isinstance(item, Exception):
                    err = {"error": {"message": str(item), "type": "server_error", "param": None, "code": None}}
                    yield f"data: {json.dumps(err)}\n\n"
                    return
                yield f"data: {json.dumps(item, separators=(',', ':'))}\n\n"
        finally:
            job.cancelled = True          # done, failed or the client went away: free the sequences
            self.engine.wake.set()

    async def completions(self, body: CompletionBody) -> Any:
        self.check_model(body.model)
        try:
            _, token_lists = self.model.input_tokens(body.prompt, "prompt", add_bos=True, special=True)
        except ValueError as e:
            raise ApiError(400, str(e), param="prompt") from None
        for tokens in token_lists:
            self.check_prompt(tokens)
        return await self.run(body, token_lists, chat=False, echo=echo_texts(body.prompt, body.echo, body.n),
                              logprobs=body.logprobs,
                              echo_logprobs=body.echo and body.logprobs is not None)

    async def embeddings(self, body: EmbeddingBody) -> Any:
        model = self.model
        self.check_model(body.model)
        if body.dimensions is not None and body.dimensions != model.hparams.n_embd:
            raise ApiError(400, f"this model's embeddings have {model.hparams.n_embd} dimensions, not "
                           f"{body.dimensions}", param="dimensions")

        def embed() -> dict[str, Any]:
            with self.engine.lock:         # between the engine's passes, on scratch sequences of its own
                return model.create_embedding(body.input)
        try:
            out = await asyncio.to_thread(embed)
        except ValueError as e:
            raise ApiError(400, str(e), param="input") from None
        out["model"] = self.mid
        if body.encoding_format == "base64":
            for d in out["data"]:
                d["embedding"] = base64.b64encode(np.asarray(d["embedding"], dtype="<f4").tobytes()).decode()
        return out

    async def chat(self, body: ChatBody) -> Any:
        model = self.model
        self.check_model(body.model)
        if body.top_logprobs is not None and not body.logprobs:
            raise ApiError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
        try:
            tools = await asyncio.to_thread(model.tool_request, body.tools, body.tool_choice, body.parallel_tool_calls)
        except ToolError as e:
            raise ApiError(400, str(e), param=e.param, code="invalid_tools") from None
        except GrammarError as e:
            raise ApiError(400, f"a tool's parameters: {e}", param="tools", code="invalid_tools") from None
        try:
            tokens = model.chat_tokens([m.model_dump(exclude_none=True) for m in body.messages], tools)
        except ChatTemplateError as e:
            raise ApiError(400, f"the chat template rejected the messages: {e}", param="messages") from None
        self.check_prompt(tokens)
        return await self.run(body, [tokens], chat=True, tools=tools,
                              logprobs=(body.top_logprobs or 0) if body.logprobs else None)


def create_app(model: Model, *, model_id: str | None = None, parallel: int = 4, max_queue: int = 64,
               batch_tokens: int = 512, api_keys: Sequence[str] = (), slot_save_path: str | None = None) -> FastAPI:
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
    app.get("/health")(routes.health)
    app.get("/v1/models")(routes.models)
    app.get("/v1/models/{name}")(routes.model_info)
    app.get("/metrics")(routes.metrics)
    app.get("/v1/stats")(routes.stats)
    app.post("/tokenize")(routes.tokenize)
    app.post("/detokenize")(routes.detokenize)
    app.get("/")(routes.page)
    app.mount("/web", StaticFiles(directory=WEB), name="web")
    app.get("/v1/events")(routes.live_stream)
    app.get("/slots")(routes.slots)
    app.post("/slots/{id_slot}")(routes.slot_action)
    app.post("/v1/completions")(routes.completions)
    app.post("/v1/embeddings")(routes.embeddings)
    app.post("/v1/chat/completions")(routes.chat)
    if api_keys:
        app.add_middleware(RequireKey, keys=list(api_keys))
    return app


def serve(model: Model, *, host: str = "127.0.0.1", port: int = 8080, parallel: int = 4, max_queue: int = 64,
          batch_tokens: int = 512, log_level: str = "info", api_keys: Sequence[str] = (),
          insecure: bool = False, slot_save_path: str | None = None) -> None:
    import uvicorn

    check_bind(host, api_keys, insecure)
    if slot_save_path is not None and not os.path.isdir(slot_save_path):
        raise ValueError(f"--slot-save-path {slot_save_path!r} is not a directory")
    app = create_app(model, parallel=parallel, max_queue=max_queue, batch_tokens=batch_tokens, api_keys=api_keys,
                     slot_save_path=slot_save_path)
    uvicorn.run(app, host=host, port=port, log_level=log_level)
