"""The OpenAI surface of a Model: completions, chat completions and embeddings in OpenAI's shapes, and what shapes
them (constraints, tools, the chat template). Model inherits these; they use its public methods."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Iterator, Mapping, Protocol, Sequence

import numpy as np

from ..errors import ContextLengthError
from ..generation.batch import BatchScheduler, Request
from ..generation.choices import Choice, LogprobEntry, logprob_entry
from ..generation.decode import generate_step
from ..generation.engine import Engine
from ..generation.grammar import Grammar, GrammarError, GrammarVocab, Matcher, grammar_from
from ..generation.sampling import SamplingParams, log_softmax
from ..runtime.memory.sequences import check_tokens
from .chat import text_content
from .fields import check_logprobs, stop_list
from .reply import Reply
from .tools import ToolFormat, ToolRequest, parse_tools, resolve_tool_choice, tool_format

if TYPE_CHECKING:
    from .chat import ChatTemplate

EMBED_BATCH = 16  # texts per forward pass in embed()


class ModelBase(Engine, Protocol):
    """What the mixins below use of the Model they are mixed into (superggml.Model): what generation reads of
    it (Engine), its own attributes and methods, and those one mixin calls of another. For the type checker
    only: at run time the mixins derive from object."""

    path: str
    chat_template: ChatTemplate

    @property
    def n_vocab(self) -> int: ...

    def check_open(self) -> None: ...

    def tokenize(self, text: bytes | str, add_bos: bool = True, special: bool = False) -> list[int]: ...

    # Embeddings' and Constraints', which Completions calls
    def input_tokens(self, x: Any, what: str, *, add_bos: bool, special: bool) -> tuple[bool, list[list[int]]]: ...

    def grammar(
        self,
        *,
        grammar: str | Grammar | None = None,
        json_schema: Mapping[str, Any] | str | None = None,
        regex: str | None = None,
        response_format: Mapping[str, Any] | None = None,
    ) -> Grammar | None: ...

    def chat_tokens(self, messages: Sequence[Mapping[str, Any]], tools: ToolRequest | None = None) -> list[int]: ...

    def tool_request(
        self, tools: Sequence[Mapping[str, Any]] | None, tool_choice: Any = None, parallel_tool_calls: bool = True
    ) -> ToolRequest | None: ...

    def marker_ids(self, tools: ToolRequest | None) -> frozenset[int]: ...

    def chat_constraint(self, tools: ToolRequest | None, **constraint: Any) -> Grammar | None: ...


if TYPE_CHECKING:
    Mixin = ModelBase
else:
    Mixin = object


def is_list_of_inputs(x: Any) -> bool:
    """A list of prompts or texts (strings or token lists), not one (a string or a token list)."""
    return not isinstance(x, str) and len(x) > 0 and not isinstance(x[0], (int, np.integer))


def echo_texts(prompt: Any, echo: bool, n: int) -> list[str]:
    """The text each choice of a completion echoes (choice index = prompt * n + j): its prompt when echo is on and
    the prompt is a string, else ""."""
    prompts = list(prompt) if is_list_of_inputs(prompt) else [prompt]
    return [p if echo and isinstance(p, str) else "" for p in prompts for _ in range(n)]


class Completions(Mixin):
    """create_completion and create_chat_completion (mixed into Model)."""

    def create_completion(
        self,
        prompt: str | Sequence[int] | Sequence[str] | Sequence[Sequence[int]],
        *,
        max_tokens: int | None = 16,
        temperature: float = 0.8,
        top_p: float = 0.95,
        top_k: int = 40,
        min_p: float = 0.05,
        repeat_penalty: float = 1.0,
        frequency_penalty: float = 0.0,
        presence_penalty: float = 0.0,
        stop: str | Sequence[str] | None = None,
        seed: int | None = None,
        stream: bool = False,
        echo: bool = False,
        add_bos: bool = True,
        n: int = 1,
        logprobs: int | None = None,
        grammar: str | Grammar | None = None,
        json_schema: Mapping[str, Any] | str | None = None,
        regex: str | None = None,
        response_format: Mapping[str, Any] | None = None,
    ) -> Any:
        """OpenAI-style text completion (dict, or an iterator of chunks with stream=True).

        `prompt` may be a list of prompts (strings or token lists): one choice per prompt, `index` its
        position, run together in shared forward passes (each choice stops on its own). `n` samples that many
        completions of each prompt the same way (choice index = prompt * n + j; sample j uses seed + j).
        `logprobs` (0-20): each generated token's logprob and the `logprobs` likeliest alternatives', of the
        logits after the penalties and the temperature, before top-k/top-p/min-p (OpenAI's); with `echo`, the
        prompt's tokens' too (of the raw logits).

        One constraint may shape the text: `grammar` (llama.cpp's GBNF or a Lark grammar), `json_schema`,
        `regex`, or OpenAI's `response_format` ({"type": "json_object"} or {"type": "json_schema", "json_schema":
        {"schema": ...}}). Each token is drawn among those it allows (a mask on the logits; logprobs stay the
        model's own), and the completion ends once it is complete. GrammarError (a ValueError) if it does not
        compile or nothing satisfies it."""
        self.check_open()
        if n < 1:
            raise ValueError(f"n must be >= 1, not {n}")
        check_logprobs(logprobs, "logprobs")
        constraint = self.grammar(
            grammar=grammar, json_schema=json_schema, regex=regex, response_format=response_format
        )
        _, tokens = self.input_tokens(prompt, "prompt", add_bos=add_bos, special=True)
        stops = stop_list(stop)
        sampling = SamplingParams.pick(locals())
        prompt_lp = self.echo_logprobs(tokens, logprobs, n) if echo and logprobs is not None else None
        return self.complete(
            tokens,
            n,
            max_tokens,
            stops,
            sampling,
            stream=stream,
            chat=False,
            echo=echo_texts(prompt, echo, n),
            logprobs=logprobs,
            prompt_logprobs=prompt_lp,
            grammar=constraint,
        )

    def create_chat_completion(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        max_tokens: int | None = None,
        temperature: float = 0.2,
        top_p: float = 0.95,
        top_k: int = 40,
        min_p: float = 0.05,
        repeat_penalty: float = 1.0,
        frequency_penalty: float = 0.0,
        presence_penalty: float = 0.0,
        stop: str | Sequence[str] | None = None,
        seed: int | None = None,
        stream: bool = False,
        logprobs: bool = False,
        top_logprobs: int | None = None,
        response_format: Mapping[str, Any] | None = None,
        grammar: str | Grammar | None = None,
        json_schema: Mapping[str, Any] | str | None = None,
        regex: str | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        tool_choice: Any = None,
        parallel_tool_calls: bool = True,
    ) -> Any:
        """OpenAI-style chat completion using the GGUF's chat template. `logprobs`: each token's logprob (as
        create_completion's), with the `top_logprobs` (0-20) likeliest alternatives'. `response_format`,
        `grammar`, `json_schema`, `regex`: the reply's constraint, as create_completion's.

        `tools` (OpenAI's function list) go to the template; calls the model writes come back as the message's
        `tool_calls` with finish_reason "tool_calls". `tool_choice`: "auto" (default with tools), "none",
        "required" or {"type": "function", "function": {"name": ...}}; the last two constrain the reply to a
        valid call (of any tool, several with `parallel_tool_calls`; or of the named one)."""
        self.check_open()
        check_logprobs(top_logprobs, "top_logprobs")
        if top_logprobs is not None and not logprobs:
            raise ValueError("top_logprobs needs logprobs=True")
        req = self.tool_request(tools, tool_choice, parallel_tool_calls)
        constraint = self.chat_constraint(
            req, grammar=grammar, json_schema=json_schema, regex=regex, response_format=response_format
        )
        tokens = self.chat_tokens(messages, req)
        stops = stop_list(stop)
        sampling = SamplingParams.pick(locals())
        return self.complete(
            [tokens],
            1,
            max_tokens,
            stops,
            sampling,
            stream=stream,
            chat=True,
            logprobs=(top_logprobs or 0) if logprobs else None,
            grammar=constraint,
            tools=req,
        )

    def token_bytes(self, tok: int) -> bytes:
        """A token's bytes as logprobs report it (special tokens as their text)."""
        return bytes(self.tokenizer.token_to_piece(int(tok), special=True))

    def complete(
        self,
        tokens: list[list[int]],
        n: int,
        max_tokens: int | None,
        stops: list[str],
        sampling: SamplingParams,
        *,
        stream: bool,
        chat: bool,
        echo: list[str] | None = None,
        logprobs: int | None = None,
        prompt_logprobs: list[list[LogprobEntry]] | None = None,
        grammar: Grammar | None = None,
        tools: ToolRequest | None = None,
    ) -> Any:
        """Runs the choices (n per prompt) and gives them in OpenAI's shapes (Reply)."""
        reply = Reply(
            chat=chat,
            stream=stream,
            model=os.path.basename(self.path),
            n_choices=len(tokens) * n,
            n_prompt=sum(len(t) for t in tokens),
            echo=echo,
            token_bytes=self.token_bytes if logprobs is not None else None,
            prompt_logprobs=prompt_logprobs,
            tools=tools,
        )
        keep = self.marker_ids(tools)
        if len(tokens) == 1 and n == 1:
            gen: Iterator[tuple[int, str, str | None, int, list[LogprobEntry] | None]] = (
                (0, *x) for x in self.completion_stream(tokens[0], max_tokens, stops, sampling, logprobs, grammar, keep)
            )
        else:
            gen = BatchScheduler(self).stream(Request(tokens, n, max_tokens, stops, sampling, logprobs, grammar, keep))
        if stream:

            def it() -> Iterator[dict[str, Any]]:
                yield from reply.opening()
                for i, piece, finish, k, lp in gen:
                    c = reply.chunk(i, piece, finish, k, lp)
                    if c is not None:
                        yield c

            return it()
        for i, piece, finish, k, lp in gen:
            reply.chunk(i, piece, finish, k, lp)
        return reply.final()

    def completion_stream(
        self,
        prompt_tokens: list[int],
        max_tokens: int | None,
        stop: Sequence[str],
        sampling: SamplingParams,
        logprobs: int | None = None,
        grammar: Grammar | None = None,
        keep: frozenset[int] = frozenset(),
    ) -> Iterator[tuple[str, str | None, int, list[LogprobEntry] | None]]:
        """Yields (text piece, finish_reason or None, completion token count, logprob entries of its tokens)."""
        self.check_open()
        choice = Choice(self.tokenizer, self.completion_limit(prompt_tokens, max_tokens), stop, logprobs, keep)
        for tok, logp in generate_step(
            self, prompt_tokens, self.sampler(sampling), logprobs=logprobs is not None, matcher=self.matcher(grammar)
        ):
            piece = choice.push(tok, logp)
            if choice.finish:
                break
            if piece:
                yield piece, None, choice.n, choice.take()
        else:
            piece = choice.flush()
        yield piece, choice.finish, choice.n, choice.take()

    def echo_logprobs(self, prompts: Sequence[Sequence[int]], k: int, n: int) -> list[list[LogprobEntry]]:
        """prompt_logprobs of each choice's prompt (choice index = prompt * n + j), one pass per prompt."""
        per_prompt = [self.prompt_logprobs(p, k) for p in prompts]
        return [lp for lp in per_prompt for _ in range(n)]

    def prompt_logprobs(self, prompt: Sequence[int], k: int) -> list[LogprobEntry]:
        """The prompt's tokens with their logprobs under the model (raw logits: no penalties, temperature 1;
        the first token has none), from one pass on a scratch sequence (echo with logprobs)."""
        rows = self.runtime.eval_scratch([list(prompt)], logits_all=True)[0]
        out: list[LogprobEntry] = [(int(prompt[0]), None, [])]
        for i in range(1, len(prompt)):
            out.append(logprob_entry(int(prompt[i]), log_softmax(rows[i - 1]), k))
        return out


class Embeddings(Mixin):
    """embed and create_embedding (mixed into Model)."""

    def embed(
        self,
        input: str | Sequence[int] | Sequence[str] | Sequence[Sequence[int]],
        *,
        pooling: str = "mean",
        normalize: bool = True,
        add_bos: bool = True,
        batch_size: int = EMBED_BATCH,
    ) -> Any:
        """Embeddings of a text (a list of floats) or of several (a list of them; token lists work too): the
        final norm's output (the hidden state the lm head reads) pooled over the text's tokens, "mean" or
        "last", L2-normalized with `normalize`. Up to `batch_size` texts share each forward pass, each on a
        scratch sequence of its own (the current sequence's cache is left alone)."""
        self.check_open()
        many, toks = self.input_tokens(input, "input", add_bos=add_bos, special=False)
        out = self.embed_tokens(toks, pooling, normalize, batch_size)
        return out if many else out[0]

    def input_tokens(self, x: Any, what: str, *, add_bos: bool, special: bool) -> tuple[bool, list[list[int]]]:
        """(whether `x` is a list of inputs, each input's tokens): strings tokenized, token lists as given."""
        many = is_list_of_inputs(x)
        items = list(x) if many else [x]
        if not items:
            raise ValueError(f"the {what} is empty")
        out = []
        for i, item in enumerate(items):
            if isinstance(item, str):
                out.append(self.tokenize(item, add_bos=add_bos, special=special))
            else:
                check_tokens(item, self.n_vocab, f"{what} {i}: token id" if many else f"{what} token id")
                out.append([int(t) for t in item])
        return many, out

    def embed_tokens(self, toks: list[list[int]], pooling: str, normalize: bool, batch_size: int) -> list[list[float]]:
        """embed() of token lists: one vector each."""
        if pooling not in ("mean", "last"):
            raise ValueError(f"pooling must be mean or last, not {pooling!r}")
        for i, t in enumerate(toks):
            if not t:
                raise ValueError(f"input {i} has no tokens")
            if len(t) > self.n_ctx:
                raise ContextLengthError(f"input {i} has {len(t)} tokens; ctx_size is {self.n_ctx}")
        out: list[list[float]] = []
        for b0 in range(0, len(toks), max(1, batch_size)):
            rows = self.runtime.eval_scratch(toks[b0 : b0 + batch_size], logits_all=pooling == "mean", embed=True)
            for r in rows:
                v = r.astype(np.float64).mean(axis=0) if pooling == "mean" else r[-1].astype(np.float64)
                if normalize:
                    v = v / max(float(np.linalg.norm(v)), 1e-12)
                out.append(v.astype(np.float32).tolist())
        return out

    def create_embedding(
        self,
        input: str | Sequence[int] | Sequence[str] | Sequence[Sequence[int]],
        *,
        pooling: str = "mean",
        normalize: bool = True,
    ) -> dict[str, Any]:
        """OpenAI's embeddings response for `input` (embed's; one item per text)."""
        self.check_open()
        _, toks = self.input_tokens(input, "input", add_bos=True, special=False)
        vecs = self.embed_tokens(toks, pooling, normalize, EMBED_BATCH)
        n = sum(len(t) for t in toks)
        return {
            "object": "list",
            "model": os.path.basename(self.path),
            "data": [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vecs)],
            "usage": {"prompt_tokens": n, "total_tokens": n},
        }


class Constraints(Mixin):
    """Grammars, tools and the chat template (mixed into Model)."""

    _grammar_vocab: GrammarVocab | None  # built on first use (Model starts them at None)
    _tool_format: ToolFormat | None

    def grammar(
        self,
        *,
        grammar: str | Grammar | None = None,
        json_schema: Mapping[str, Any] | str | None = None,
        regex: str | None = None,
        response_format: Mapping[str, Any] | None = None,
    ) -> Grammar | None:
        """The constraint of these options (at most one; see superggml.generation.grammar.grammar_from), checked against
        this model's vocabulary: GrammarError (a ValueError) if it does not compile or no text satisfies it."""
        g = grammar_from(grammar=grammar, json_schema=json_schema, regex=regex, response_format=response_format)
        if g is not None:
            g.check(self.grammar_vocab)
        return g

    @property
    def grammar_vocab(self) -> GrammarVocab:
        """The vocabulary as the constraint engine (llguidance) reads it; built on first use."""
        if self._grammar_vocab is None:
            self._grammar_vocab = GrammarVocab(self.tokenizer)
        return self._grammar_vocab

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        tools: ToolRequest | Sequence[Mapping[str, Any]] | None = None,
    ) -> str:
        """The conversation as the GGUF's template writes it; with `tools` (OpenAI's list, or a ToolRequest) the
        tools offered, in the template's own way (see superggml.api.tools). Earlier tool calls and results in the
        messages are written as the template expects them."""
        req = tools if isinstance(tools, ToolRequest) or tools is None else self.tool_request(tools)
        offered = req.tools if req is not None and req.active else []
        fmt = self.tool_format
        extra = {"tools": fmt.template_tools(offered)} if offered else {}
        return self.chat_template.render(
            fmt.messages(text_content(messages), offered), add_generation_prompt=add_generation_prompt, **extra
        )

    def chat_tokens(self, messages: Sequence[Mapping[str, Any]], tools: ToolRequest | None = None) -> list[int]:
        """The prompt of a chat completion: the conversation as the template writes it, tokenized (special tokens
        parsed). ChatTemplateError if the template rejects the messages."""
        return self.tokenize(self.apply_chat_template(messages, tools=tools), add_bos=True, special=True)

    @property
    def tool_format(self) -> ToolFormat:
        """How this model's chat template offers tools and writes calls (superggml.api.tools: hermes, llama3,
        mistral or generic)."""
        if self._tool_format is None:
            self._tool_format = tool_format(self.chat_template.source, self.tokenizer)
        return self._tool_format

    def tool_request(
        self, tools: Sequence[Mapping[str, Any]] | None, tool_choice: Any = None, parallel_tool_calls: bool = True
    ) -> ToolRequest | None:
        """OpenAI's tools and tool_choice, checked (ToolError for malformed tools or an unknown function,
        GrammarError for a parameters schema that does not compile); None without tools."""
        if tools is None and tool_choice in (None, "none", "auto"):
            return None
        offered = parse_tools(tools or [])
        req = ToolRequest(self.tool_format, offered, resolve_tool_choice(tool_choice, offered), parallel_tool_calls)
        if req.grammar is not None:
            req.grammar.check(self.grammar_vocab)
        return req

    def marker_ids(self, tools: ToolRequest | None) -> frozenset[int]:
        """The control tokens a tool-call format writes calls with (kept in the text to be parsed)."""
        if tools is None or not tools.active:
            return frozenset()
        ids = (self.tokenizer.token_id(m) for m in tools.format.markers)
        return frozenset(i for i in ids if i is not None)

    def chat_constraint(self, tools: ToolRequest | None, **constraint: Any) -> Grammar | None:
        """The one constraint of a chat request: its tool_choice's (required, a named function; with a template
        that does not take tools, auto's too) or its response_format/grammar/json_schema/regex."""
        g = self.grammar(**constraint)
        if tools is not None and tools.active and tools.grammar is not None:
            if g is not None and (tools.choice == "required" or not isinstance(tools.choice, str)):
                raise GrammarError("give one constraint: tool_choice required or a function, or a response_format")
            return g or tools.grammar
        return g

    def matcher(self, grammar: Grammar | None) -> Matcher | None:
        """A fresh state of `grammar` over this model's vocabulary (None: free text)."""
        return None if grammar is None else grammar.matcher(self.grammar_vocab)
