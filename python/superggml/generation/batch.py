"""The one scheduler: continuous batching of completions over a model's sequences.

Prompt lists, `n=`, `superggml generate --prompts-file` and the server all run through BatchScheduler. Each
`step` is one shared forward pass (schedule -> pass -> update, as vLLM v1's): the next token of every completion
decoding, then prompt chunks of those prefilling, up to `batch_tokens` tokens. It returns plain data: (completion,
text to send) for each that sampled a token. A completion has a sequence of its own, reserved from the model's
sequences when it starts and dropped when it ends; or, with slots (the server's), the sequence of a slot, which
outlives it so that a later prompt that extends its tokens prefills only the rest (generation/slots.py). The
model's current sequence is left alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator, Sequence

import numpy as np

from .choices import Choice, LogprobEntry
from .decode import pick
from .engine import Engine
from .grammar import Grammar, Matcher
from .sampling import Sampler, SamplingParams
from .slots import Slots


@dataclass(eq=False)
class Request:
    """Completions of `prompts` (token lists), n of each: choice index = prompt * n + j, sampled with seed + j."""

    prompts: list[list[int]]
    n: int
    max_tokens: int | None
    stop: Sequence[str]
    sampling: SamplingParams
    logprobs: int | None = None  # alternatives per token to report (None: no logprobs)
    grammar: Grammar | None = None  # the constraint on each choice's text
    keep: frozenset[int] = frozenset()  # control tokens kept in the text (tool-call markers)
    reuse: bool = True  # with slots: start from a slot's shared prefix (cache_prompt)

    @property
    def n_choices(self) -> int:
        return len(self.prompts) * self.n


@dataclass(eq=False)
class Completion:
    """One running choice: its sequence, the tokens still to feed (the prompt, then each sampled token), its
    sampler, its constraint's state and its text."""

    index: int
    seq: int
    pending: list[int]
    choice: Choice
    sampler: Sampler
    matcher: Matcher | None = None
    request: Request | None = field(default=None, repr=False)
    slot: int | None = None  # the slot whose sequence it runs on
    kept: int = 0  # prompt tokens its sequence already held

    @property
    def finish(self) -> str | None:
        return self.choice.finish

    def take(self) -> tuple[int, str | None, int, list[LogprobEntry] | None]:
        """(index, finish_reason or None, tokens so far, logprob entries since the last take)."""
        return self.index, self.finish, self.choice.n, self.choice.take()


class BatchScheduler:
    """Continuous batching over `model` (superggml.Model): up to `parallel` completions at once."""

    def __init__(self, model: Engine, *, parallel: int = 64, batch_tokens: int | None = None, slots: bool = False):
        self.model = model
        self.parallel = max(1, parallel)
        self.batch_tokens = batch_tokens
        self.running: list[Completion] = []
        self.slots = Slots(lambda: model.runtime.sequences, self.parallel) if slots else None
        self.prompt_rows = 0  # prompt tokens the last step fed (its time counts as prompt processing)

    @property
    def free(self) -> int:
        return self.parallel - len(self.running)

    def add(self, req: Request, indices: Sequence[int] | None = None) -> list[Completion]:
        """Starts choices of `req` (default: all of them), each on a sequence of its own."""
        m = self.model
        indices = list(range(req.n_choices)) if indices is None else list(indices)
        if len(indices) > self.free:
            raise ValueError(f"{len(indices)} completions asked for, {self.free} of {self.parallel} free")
        limits = {i: m.completion_limit(req.prompts[i // req.n], req.max_tokens) for i in indices}
        out: list[Completion] = []
        try:
            for i in indices:
                prompt = list(req.prompts[i // req.n])
                seed = m.seed if req.sampling.seed is None else req.sampling.seed
                if seed is not None and seed >= 0:
                    seed += i % req.n
                choice = Choice(m.tokenizer, limits[i], req.stop, req.logprobs, req.keep)
                sampler, matcher = m.sampler(req.sampling, seed), m.matcher(req.grammar)
                if self.slots is not None:
                    slot, seq, kept = self.slots.take(prompt, reuse=req.reuse)
                else:
                    slot, seq, kept = None, m.runtime.sequences.reserve(1)[0], 0
                out.append(Completion(i, seq, prompt[kept:], choice, sampler, matcher, req, slot, kept))
        except BaseException:
            self.end(out)
            raise
        self.running += out
        return out

    def finish(self, done: Sequence[Completion]) -> None:
        """Ends completions (finished or cancelled): their sequences are dropped."""
        gone = set(map(id, done))
        self.running = [c for c in self.running if id(c) not in gone]
        self.end(done)

    def end(self, done: Sequence[Completion]) -> None:
        """The completions' sequences: back to their slots, or dropped."""
        for c in done:
            if c.slot is not None and self.slots is not None:
                self.slots.give_back(c.slot)
        self.model.runtime.sequences.release([c.seq for c in done if c.slot is None])

    def close(self) -> None:
        """Drops the slots' sequences."""
        if self.slots is not None:
            self.slots.close()

    def step(self) -> list[tuple[Completion, str]]:
        """One forward pass: (completion, text to send) for each that sampled a token. Finished ones (finish
        set) are ended (finish()) before it returns."""
        live = [c for c in self.running if c.pending and not c.finish]
        self.prompt_rows = 0
        spec = self.model.speculator
        if (
            spec is not None
            and len(live) == 1
            and len(live[0].pending) == 1
            and live[0].choice.n
            and live[0].choice.logprobs is None
            and live[0].matcher is None
        ):
            out = [self.speculative_step(live[0])]  # one sequence decoding: draft for it
        else:
            out = self.batched_step(live)
        self.finish([c for c, _ in out if c.finish])
        return out

    def batched_step(self, live: list[Completion]) -> list[tuple[Completion, str]]:
        m = self.model
        ex = m.runtime
        room = self.batch_tokens if self.batch_tokens is not None else sum(len(c.pending) for c in live)
        items, fed = [], []
        for c in sorted(live, key=lambda c: len(c.pending) > 1):
            if room <= 0:
                break
            take = c.pending[:room]
            items.append((c.seq, take))
            fed.append((c, len(take)))
            room -= len(take)
        if not items:
            return []
        logits = ex.eval_batch(items)
        prefill = sum(k for c, k in fed if c.choice.n == 0 and k > 1)
        self.prompt_rows = prefill
        metrics = m.metrics
        if metrics is not None and prefill:
            metrics.on_prompt(prefill)
        out = []
        for (c, k), lg in zip(fed, logits):
            del c.pending[:k]
            if c.pending:  # a prompt chunk: more to come
                continue
            out.append((c, self.update(c, lg[-1], ex.sequences.get(c.seq).tokens)))
        return out

    def update(self, c: Completion, logits: np.ndarray, history: list[int]) -> str:
        """Samples a completion's next token from its logits; the text it adds."""
        tok, logp = pick(c.sampler, c.matcher, logits, history, c.choice.logprobs is not None)
        piece = c.choice.push(tok, logp)
        if not c.finish:
            if self.model.metrics is not None and self.model.metrics.prompt_tokens:
                self.model.metrics.on_token()
            if len(history) >= self.model.n_ctx:
                piece += c.choice.flush()
            else:
                c.pending = [tok]
        return piece

    def speculative_step(self, c: Completion) -> tuple[Completion, str]:
        """step() for one decoding completion with a speculator: its sequence becomes the model's current one
        for one speculative step (the pending token and a draft in one pass, the accepted tokens kept)."""
        m, spec = self.model, self.model.speculator
        assert spec is not None, "a speculative step without a speculator"
        m.runtime.sequences.use(c.seq)
        toks = spec.step(m, c.pending[0], c.sampler)
        piece = ""
        for tok in toks:
            piece += c.choice.push(tok)
            if c.finish:
                break
            if m.metrics is not None:
                m.metrics.on_token()
        if not c.finish:
            if m.n_tokens + 1 >= m.n_ctx:
                piece += c.choice.flush()
            else:
                c.pending = [toks[-1]]
        return c, piece

    def stream(self, req: Request) -> Iterator[tuple[int, str, str | None, int, list[LogprobEntry] | None]]:
        """Runs every choice of `req`, up to `parallel` at once (the next starts as one ends); yields (index,
        text piece, finish_reason or None, completion token count, logprob entries of its tokens)."""
        for p in req.prompts:
            self.model.completion_limit(p, req.max_tokens)
        nxt = 0
        try:
            while self.running or nxt < req.n_choices:
                k = min(self.free, req.n_choices - nxt)
                if k:
                    self.add(req, range(nxt, nxt + k))
                    nxt += k
                for c, piece in self.step():
                    if piece or c.finish:
                        i, finish, n, lp = c.take()
                        yield i, piece, finish, n, lp
        finally:
            self.finish(list(self.running))
