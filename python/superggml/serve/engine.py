"""The engine: one thread owns the model and advances every running request in each forward pass."""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from ..api.reply import Reply
from ..generation.batch import BatchScheduler, Completion
from ..generation.batch import Request as BatchRequest
from ..model import Model
from .errors import ApiError


@dataclass(eq=False)
class Job:
    request: BatchRequest
    reply: Reply
    out: "asyncio.Queue[Any]"
    loop: asyncio.AbstractEventLoop
    echo_logprobs: bool = False  # the echoed prompts' logprobs too
    include_usage: bool = False  # a stream ends with a chunk of the usage (stream_options.include_usage)
    running: list[Completion] = field(default_factory=list)
    unstarted: list[int] = field(default_factory=list)  # choices not started yet
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
        self.max_queue, self.queued = max_queue, 0  # choices waiting to start
        self.active: list[Job] = []
        self.pending: Job | None = None  # taken from the queue, waiting for sequences to free
        self.stopping = False
        self.wake = threading.Event()
        self.lock = threading.Lock()  # the model, for requests outside the engine (metrics)
        self.lock_queue = threading.Lock()
        self.served = 0
        self.steps = 0
        self.prompt_tokens = self.generated_tokens = self.cached_tokens = 0
        self.prompt_seconds = self.generation_seconds = 0.0  # engine steps with prompt rows, and without
        self.thread = threading.Thread(target=self.run, name="superggml-engine", daemon=True)
        self.thread.start()

    def submit(self, job: Job) -> None:
        n = job.request.n_choices
        with self.lock_queue:
            if self.queued and self.queued + n > self.max_queue:
                raise ApiError(
                    503,
                    f"the server is overloaded: {self.queued} completions are waiting to start "
                    f"(--max-queue {self.max_queue}); retry later",
                    "server_error",
                    "overloaded",
                    headers={"Retry-After": "1"},
                )
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
                if job.echo_logprobs and not job.opened:  # one pass over each prompt, on a scratch sequence
                    job.reply.prompt_lp = self.model.echo_logprobs(req.prompts, req.logprobs or 0, req.n)
                new = self.scheduler.add(req, take)
            job.running += new
            self.prompt_tokens += sum(len(c.pending) for c in new)  # fed: what their slots did not hold
            self.cached_tokens += sum(c.kept for c in new)
            if not job.opened:
                job.opened = True
                for c in job.reply.opening():  # the echoed prompts (with their logprobs): the first chunks
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
                    elif job.include_usage:
                        self.send(job, job.reply.usage_chunk())
                    self.finish(job)

    def count_step(self, generated: int, seconds: float) -> None:
        """A step's tokens and time: the time of a step that fed prompt rows is prompt processing (as
        llama-server's, which counts the prompt's batch and the first token's sampling there), else generation."""
        self.steps += 1
        self.generated_tokens += generated
        if self.scheduler.prompt_rows:
            self.prompt_seconds += seconds
        else:
            self.generation_seconds += seconds

    def counts(self) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "generated_tokens": self.generated_tokens,
            "cached_tokens": self.cached_tokens,
            "decode_steps": self.steps,
            "requests": self.served,
            "processing": len(self.active),
            "deferred": self.waiting.qsize() + (self.pending is not None),
            "prompt_seconds": self.prompt_seconds,
            "generation_seconds": self.generation_seconds,
        }

    @staticmethod
    def chunk_args(c: Completion, piece: str) -> tuple[Any, ...]:
        i, finish, n, lp = c.take()
        return i, piece, finish, n, lp
