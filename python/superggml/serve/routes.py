"""What each endpoint does, over one model and the engine that owns it."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import time
from typing import Any, Optional

import numpy as np
from fastapi import Request
from fastapi.responses import FileResponse, Response, StreamingResponse

from ..api.chat import ChatTemplateError
from ..api.completions import echo_texts
from ..api.fields import stop_list
from ..generation.sampling import SamplingParams
from ..api.reply import Reply
from ..api.tools import ToolError, ToolRequest
from ..errors import ContextLengthError, SavedSequenceError
from ..generation.batch import Request as BatchRequest
from ..generation.grammar import Grammar, GrammarError
from ..model import Model
from ..runtime.memory.sequences import check_tokens
from .bodies import Body, ChatBody, CompletionBody, DetokenizeBody, EmbeddingBody, SlotBody, TokenizeBody
from .engine import END, Engine, Job
from .errors import ApiError, model_not_found
from .live import LiveView
from .prometheus import CONTENT_TYPE, prometheus_text

WEB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "web")  # the page's files


class Routes:
    """What each endpoint does, over one model and the engine that owns it; create_app maps the paths here."""

    def __init__(self, model: Model, engine: Engine, model_id: str, slot_save_path: str | None = None):
        self.model, self.engine, self.mid = model, engine, model_id
        self.created = int(time.time())
        self.save_dir = slot_save_path
        self.live = LiveView(model)
        self.last_stats: dict[str, Any] = {}

    async def health(self) -> dict[str, Any]:
        return {
            "status": "ok",
            "model": self.mid,
            "active": len(self.engine.active),
            "waiting": self.engine.waiting.qsize(),
        }

    async def models(self) -> dict[str, Any]:
        return {"object": "list", "data": [self.card()]}

    async def model_info(self, name: str) -> dict[str, Any]:
        if name != self.mid:
            raise model_not_found(name, self.mid)
        return self.card()

    def card(self) -> dict[str, Any]:
        return {"id": self.mid, "object": "model", "created": self.created, "owned_by": "superggml"}

    def snapshot(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """The model's stats() and the metrics snapshot, taken between the engine's passes."""
        from ..metrics import Metrics

        with self.engine.lock:
            st = self.model.stats()
            return st, Metrics(self.model, None).snapshot(stats=st)

    async def stats(self) -> dict[str, Any]:
        engine = self.engine
        _, snap = await asyncio.to_thread(self.snapshot)
        snap.update(
            requests_active=len(engine.active),
            requests_waiting=engine.waiting.qsize(),
            requests_served=engine.served,
            engine_steps=engine.steps,
            prompt_tokens_processed=engine.prompt_tokens,
            prompt_tokens_cached=engine.cached_tokens,
        )
        return snap

    async def metrics(self) -> Response:
        st, snap = await asyncio.to_thread(self.snapshot)
        return Response(prometheus_text(st, self.engine.counts(), snap), media_type=CONTENT_TYPE)

    async def page(self) -> FileResponse:
        return FileResponse(os.path.join(WEB, "index.html"))

    async def live_stream(self, request: Request) -> StreamingResponse:
        """The live view's snapshots as server-sent events (serve/live.py)."""

        async def take() -> tuple[dict[str, Any], dict[str, Any]]:
            return await asyncio.to_thread(self.live_stats)

        return StreamingResponse(
            self.live.events(take, request.is_disconnected),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache"},
        )

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
                piece = list(raw)  # not UTF-8 on its own: its bytes, as llama-server gives them
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
        done, moved = ("saved", "written") if action == "save" else ("restored", "read")  # llama-server's names
        return {
            "id_slot": id_slot,
            "filename": body.filename,
            f"n_{done}": n,
            f"n_{moved}": size,
            "timings": {f"{action}_ms": ms},
        }

    def slot_file(self, name: str) -> str:
        if self.save_dir is None:
            raise ApiError(501, "saving and restoring slots needs --slot-save-path", code="not_supported")
        if not name or name.startswith(".") or os.path.basename(name) != name or "\\" in name or "\0" in name:
            raise ApiError(
                400, f"filename {name!r} is not a plain file name (it must stay in --slot-save-path)", param="filename"
            )
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

    def check_prompt(self, tokens: list[int]) -> None:
        """400 for an empty prompt or one that leaves no room in the context (the model's own checks)."""
        try:
            self.model.completion_limit(tokens, None)
        except ContextLengthError as e:
            raise ApiError(400, str(e), code="context_length_exceeded", param="prompt") from None
        except ValueError as e:
            raise ApiError(400, str(e), param="prompt") from None

    async def constraint(self, body: Body, tools: ToolRequest | None = None) -> Grammar | None:
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

    async def run(
        self,
        body: Body,
        prompts: list[list[int]],
        chat: bool,
        echo: list[str] | None = None,
        logprobs: int | None = None,
        echo_logprobs: bool = False,
        tools: ToolRequest | None = None,
    ) -> Any:
        """Hands the request to the engine; the reply, or its stream of events."""
        model = self.model
        grammar = await self.constraint(body, tools)
        reply = Reply(
            chat=chat,
            stream=body.stream,
            model=self.mid,
            n_choices=len(prompts) * body.n,
            n_prompt=sum(len(p) for p in prompts),
            echo=echo,
            token_bytes=model.token_bytes if logprobs is not None else None,
            tools=tools,
        )
        sampling = SamplingParams.pick(dict(body))
        req = BatchRequest(
            prompts,
            body.n,
            body.max_tokens,
            stop_list(body.stop),
            sampling,
            logprobs,
            grammar,
            model.marker_ids(tools),
            reuse=body.cache_prompt,
        )
        usage = bool(body.stream and (body.stream_options or {}).get("include_usage"))
        job = Job(
            req, reply, asyncio.Queue(), asyncio.get_running_loop(), echo_logprobs=echo_logprobs, include_usage=usage
        )
        self.engine.submit(job)
        if body.stream:
            return StreamingResponse(
                self.events(job),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            )
        try:
            item = await job.out.get()
        finally:
            job.cancelled = True  # the single result came (or the client left): nothing more to do
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
            job.cancelled = True  # done, failed or the client went away: free the sequences
            self.engine.wake.set()

    async def completions(self, body: CompletionBody) -> Any:
        try:
            _, token_lists = self.model.input_tokens(body.prompt, "prompt", add_bos=True, special=True)
        except ValueError as e:
            raise ApiError(400, str(e), param="prompt") from None
        for tokens in token_lists:
            self.check_prompt(tokens)
        return await self.run(
            body,
            token_lists,
            chat=False,
            echo=echo_texts(body.prompt, body.echo, body.n),
            logprobs=body.logprobs,
            echo_logprobs=body.echo and body.logprobs is not None,
        )

    async def embeddings(self, body: EmbeddingBody) -> Any:
        model = self.model
        if body.dimensions is not None and body.dimensions != model.hparams.n_embd:
            raise ApiError(
                400,
                f"this model's embeddings have {model.hparams.n_embd} dimensions, not {body.dimensions}",
                param="dimensions",
            )

        def embed() -> dict[str, Any]:
            with self.engine.lock:  # between the engine's passes, on scratch sequences of its own
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
        return await self.run(
            body, [tokens], chat=True, tools=tools, logprobs=(body.top_logprobs or 0) if body.logprobs else None
        )
