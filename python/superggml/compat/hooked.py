"""llama_cpp's create_completion over superggml: Model.create_completion does the work, except where logits
processors, stopping criteria or a logit bias need a loop of their own (Llama.generate's)."""

from __future__ import annotations

import random
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Generator, Iterator, Protocol, Sequence

import numpy as np
import numpy.typing as npt

from ..generation.sampling import Sampler, SamplingParams
from ..model import Model
from ..generation.slots import shared_prefix
from .helpers import LlamaGrammar, LlamaRAMCache, LlamaState, LogitsProcessorList, StoppingCriteriaList


class Llama(Protocol):
    """What a completion uses of compat.llama.Llama."""

    model_path: str
    cache: LlamaRAMCache | None

    @property
    def loaded(self) -> Model: ...
    @property
    def seed(self) -> int: ...
    @property
    def n_tokens(self) -> int: ...
    @property
    def input_ids(self) -> npt.NDArray[np.intc]: ...
    def sync(self) -> Model: ...
    def synced(self, it: Iterator[Any]) -> Iterator[Any]: ...
    def took_model(self) -> None: ...
    def set_seed(self, seed: int) -> None: ...
    def save_state(self) -> LlamaState: ...
    def load_state(self, state: LlamaState) -> None: ...
    @property
    def new_sampler(self) -> Callable[..., Sampler]: ...
    def tokenize(self, text: bytes, add_bos: bool = True, special: bool = False) -> list[int]: ...
    def detokenize(
        self, tokens: Sequence[int], prev_tokens: Sequence[int] | None = None, special: bool = False
    ) -> bytes: ...
    @property
    def generate(self) -> Callable[..., Generator[int, Sequence[int] | None, None]]: ...


@dataclass
class CompletionRequest:
    """create_completion's arguments, as llama_cpp names them."""

    prompt: str | list[int]
    suffix: str | None = None
    max_tokens: int | None = 16
    temperature: float = 0.8
    top_p: float = 0.95
    min_p: float = 0.05
    typical_p: float = 1.0
    logprobs: int | None = None
    echo: bool = False
    stop: str | list[str] | None = None
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repeat_penalty: float = 1.0
    top_k: int = 40
    stream: bool = False
    seed: int | None = None
    tfs_z: float = 1.0
    mirostat_mode: int = 0
    mirostat_tau: float = 5.0
    mirostat_eta: float = 0.1
    model: str | None = None
    stopping_criteria: StoppingCriteriaList | None = None
    logits_processor: LogitsProcessorList | None = None
    grammar: LlamaGrammar | None = None
    logit_bias: dict[int, float] | None = None

    @property
    def stops(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    SAMPLING = ("top_k", "top_p", "min_p", "typical_p", "repeat_penalty", "frequency_penalty", "presence_penalty")

    def sampling(self) -> dict[str, Any]:
        """Llama.new_sampler's keywords (and generate's), as llama_cpp names them: the temperature is `temp`."""
        return {"temp": self.temperature, "tfs_z": self.tfs_z, "mirostat_mode": self.mirostat_mode} | {
            n: getattr(self, n) for n in self.SAMPLING
        }

    def processors(self) -> LogitsProcessorList | None:
        """The logits processors, the logit bias last (as llama_cpp adds it)."""
        out = LogitsProcessorList(self.logits_processor or [])
        if self.logit_bias:
            bias = {int(k): float(v) for k, v in self.logit_bias.items()}

            def add_bias(input_ids: npt.NDArray[np.intc], scores: npt.NDArray[np.single]) -> npt.NDArray[np.single]:
                out = np.copy(scores)
                for i, b in bias.items():
                    out[i] += b
                return out

            out.append(add_bias)
        return out or None


def complete(llama: Llama, r: CompletionRequest) -> Any:
    """create_completion: the prompt cache's state loaded where it shares more of the prompt, the seed drawn as
    llama_cpp draws it, then the completion (Model's, or the hooked loop), saved into the cache."""
    if r.suffix is not None:
        raise NotImplementedError("suffix (fill-in-the-middle): superggml completes after the prompt only")
    m = llama.sync()
    processors = r.processors()
    hooks = processors is not None or r.stopping_criteria is not None
    # Model tokenizes the prompt itself: here only where the cache or the hooked loop needs its tokens
    tokens = prompt_tokens(llama, r.prompt) if llama.cache is not None or hooks else []
    if llama.cache is not None:
        state = llama.cache.longest(tokens)
        if state is not None and shared_prefix(state.input_ids[: state.n_tokens].tolist(), tokens) > shared_prefix(
            m.tokens[: llama.n_tokens], tokens
        ):
            llama.load_state(state)
    llama.set_seed(r.seed if r.seed is not None else random.Random(llama.seed).randint(0, 2**32))
    if not hooks:
        llama.new_sampler(**r.sampling())  # refuses what superggml does not sample with
        grammar = r.grammar.options() if r.grammar is not None else {}
        out = llama.sync().create_completion(
            r.prompt,
            max_tokens=r.max_tokens,
            **{**SamplingParams.named_in(vars(r)), "seed": llama.seed},
            stop=r.stops or None,
            stream=r.stream,
            echo=r.echo,
            logprobs=r.logprobs,
            **grammar,
        )
        if r.stream:
            return llama.synced(named(out, r, llama))
        llama.took_model()
        out = next(named(iter([out]), r, llama))
    else:
        out = hooked(llama, r, tokens, processors) if not r.stream else chunks(llama, r, tokens, processors)
    if llama.cache is not None and not r.stream:
        llama.cache[llama.input_ids[: llama.n_tokens].tolist()] = llama.save_state()
    return out


def prompt_tokens(llama: Llama, prompt: str | list[int]) -> list[int]:
    """llama_cpp's prompt tokens: BOS (where the vocabulary adds one) and the text with special tokens parsed."""
    if isinstance(prompt, str):
        return llama.tokenize(prompt.encode("utf-8"), add_bos=True, special=True)
    return [int(t) for t in prompt]


def named(out: Iterator[dict[str, Any]], r: CompletionRequest, llama: Llama) -> Iterator[dict[str, Any]]:
    """Completions (or chunks) named as llama_cpp names them: the request's model, else the model's path."""
    for item in out:
        item["model"] = r.model or llama.model_path
        yield item


def hooked_tokens(llama: Llama, r: CompletionRequest, tokens: list[int], processors: Any) -> Iterator[tuple[str, str]]:
    """(text, "") per generated piece, then ("", finish_reason): Llama.generate with the processors and stopping
    criteria, up to max_tokens or the context, cut at a stop string or an end-of-generation token."""
    m = llama.loaded
    limit = m.completion_limit(tokens, r.max_tokens)
    out: list[int] = []
    sent, finish = b"", "stop"
    gen = llama.generate(
        tokens, logits_processor=processors, stopping_criteria=r.stopping_criteria, grammar=r.grammar, **r.sampling()
    )
    for tok in gen:
        if m.tokenizer.is_eog(tok):
            break
        out.append(tok)
        text = llama.detokenize(out, prev_tokens=tokens)
        cut = min((text.find(s.encode()) for s in r.stops if s.encode() in text), default=-1)
        if cut >= 0:
            yield text[len(sent) : cut].decode("utf-8", "ignore"), ""
            break
        if not text.endswith(b"\xef\xbf\xbd"):  # not in the middle of a character
            yield text[len(sent) :].decode("utf-8", "ignore"), ""
            sent = text
        if len(out) >= limit:
            finish = "length"
            break
    gen.close()
    yield "", finish


def hooked(llama: Llama, r: CompletionRequest, tokens: list[int], processors: Any) -> dict[str, Any]:
    text, finish, n = "", "stop", 0
    for piece, reason in hooked_tokens(llama, r, tokens, processors):
        text += piece
        finish = reason or finish
        n += 1
    prompt = r.prompt if r.echo and isinstance(r.prompt, str) else ""
    choice = {"text": prompt + text, "index": 0, "logprobs": None, "finish_reason": finish}
    done = llama.n_tokens - len(tokens) + 1
    return response("text_completion", r, llama, choice) | {
        "usage": {"prompt_tokens": len(tokens), "completion_tokens": done, "total_tokens": len(tokens) + done}
    }


def chunks(llama: Llama, r: CompletionRequest, tokens: list[int], processors: Any) -> Iterator[dict[str, Any]]:
    for piece, reason in hooked_tokens(llama, r, tokens, processors):
        choice = {"text": piece, "index": 0, "logprobs": None, "finish_reason": reason or None}
        yield response("text_completion", r, llama, choice)


def response(obj: str, r: CompletionRequest, llama: Llama, choice: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": f"cmpl-{uuid.uuid4()}",
        "object": obj,
        "created": int(time.time()),
        "model": r.model or llama.model_path,
        "choices": [choice],
    }


CHAT_KEYS = (
    "temperature top_p top_k min_p stream stop max_tokens presence_penalty frequency_penalty repeat_penalty "
    "response_format grammar logprobs top_logprobs tools tool_choice"
).split()


def chat_request(kwargs: dict[str, Any]) -> dict[str, Any]:
    """create_chat_completion's llama_cpp keywords as Model's (functions and function_call as tools and
    tool_choice); "seed" kept for the caller. NotImplementedError for what superggml's chat cannot take."""
    kw = dict(kwargs)
    for name in ("logits_processor", "logit_bias", "stopping_criteria"):
        if kw.pop(name, None):
            raise NotImplementedError(f"{name} in create_chat_completion: superggml applies them to completions only")
    for name, default in (("typical_p", 1.0), ("tfs_z", 1.0), ("mirostat_mode", 0)):
        if kw.pop(name, default) != default:
            raise NotImplementedError(f"{name}: superggml samples with top-k, top-p, min-p and temperature")
    for name in ("mirostat_tau", "mirostat_eta", "model"):
        kw.pop(name, None)
    functions, call = kw.pop("functions", None), kw.pop("function_call", None)
    if functions and not kw.get("tools"):
        kw["tools"] = [{"type": "function", "function": f} for f in functions]
        if isinstance(call, dict):
            kw["tool_choice"] = {"type": "function", "function": {"name": call["name"]}}
        elif call is not None:
            kw["tool_choice"] = call
    if isinstance(kw.get("grammar"), LlamaGrammar):
        kw.update(kw.pop("grammar").options())
    if kw.get("stop") == []:
        kw["stop"] = None
    kw["logprobs"] = bool(kw.get("logprobs"))
    unknown = set(kw) - set(CHAT_KEYS) - {"seed", "json_schema"}
    if unknown:
        raise TypeError(f"create_chat_completion() got unexpected keywords: {', '.join(sorted(unknown))}")
    return {"seed": kw.pop("seed", None), **kw}
