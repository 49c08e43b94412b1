"""superggml.Llama: llama-cpp-python's high-level API (0.3.x) over a superggml Model, so that code written for
`llama_cpp.Llama` runs with one import changed (`import superggml as llama_cpp`)."""

from __future__ import annotations

import inspect
import os
import random
import tempfile
from typing import Any, Generator, Iterator, Sequence

import numpy as np
import numpy.typing as npt

from .. import native
from ..api.chat import CHATML, ChatTemplate
from ..generation.decode import pick
from ..generation.grammar import Matcher
from ..generation.sampling import Sampler, SamplingParams
from ..model import Model
from ..tokenizer import Tokenizer
from ..generation.slots import shared_prefix
from .helpers import (
    LlamaGrammar,
    LlamaRAMCache,
    LlamaState,
    LogitsProcessorList,
    StoppingCriteriaList,
)
from .hooked import CompletionRequest, chat_request, complete
from .params import POOLING, LlamaParams, NotInSuperggml


class Llama:
    """llama_cpp.Llama over superggml. The constructor takes llama_cpp's keywords (see LlamaParams: each is mapped
    onto Model's options, accepted without effect, or refused with NotImplementedError) and superggml's own
    (device_budget, paged_kv, ...). `model` is the superggml Model underneath.

    The context is llama_cpp's: `eval` appends tokens, `n_tokens` may be set lower to drop the tail (applied at
    the next eval), `sample` draws from the last logits, `generate` reuses the longest prefix already
    evaluated. Not there: `_ctx`, `_model`, `ctx`, `model` as llama.cpp pointers (superggml has no
    llama_context), the low-level `llama_*` bindings, LoRA; each raises NotImplementedError saying so."""

    def __init__(self, model_path: str | os.PathLike[str], **kwargs: Any):
        p, own = LlamaParams.split(kwargs)
        p.refuse()
        self.model_path = os.fspath(model_path)
        self.params, self.verbose, self.chat_format = p, p.verbose, p.chat_format
        f = native.GGUFFile(self.model_path)
        try:
            md = f.metadata()
            self.metadata: dict[str, Any] = {k: v for k, v in md.items() if not isinstance(v, list)}
            vocab = Tokenizer.from_metadata(md) if p.vocab_only else None
        finally:
            f.close()
        self.vocab = vocab
        self.model: Model | None = None
        if vocab is None:
            self.model = Model(self.model_path, **{**p.model_options(self.model_path, self.metadata), **own})
            if p.chat_format == "chatml":  # the template llama_cpp's chat_format names, over the GGUF's
                self.model.chat_template = chatml(self.model.tokenizer)
        self.n_batch = min(p.n_batch, p.n_ubatch)
        self.cache: LlamaRAMCache | None = None
        self._seed = p.seed
        self._n = 0  # n_tokens: the model's, or lower where the caller cut it (applied by sync)
        self._fresh = False  # the model's last logits are those of token n_tokens - 1

    @classmethod
    def from_pretrained(
        cls,
        repo_id: str,
        filename: str | None = None,
        additional_files: Sequence[str] | None = None,
        local_dir: str | None = None,
        local_dir_use_symlinks: Any = "auto",
        cache_dir: str | None = None,
        **kwargs: Any,
    ) -> Llama:
        """A Hugging Face Hub repository's GGUF (superggml.hub: the hub's cache, downloaded where missing)."""
        from .. import hub

        if additional_files:
            raise NotImplementedError("additional_files: superggml loads one GGUF file")
        return cls(hub.download(repo_id, filename, cache_dir=cache_dir or local_dir), **kwargs)

    # -- what superggml does not have ------------------------------------------------------------------------------
    @property
    def _ctx(self) -> Any:
        raise NotInSuperggml("_ctx: superggml has no llama_context; its state is Llama.model (a superggml Model)")

    @property
    def _model(self) -> Any:
        raise NotInSuperggml("_model: superggml has no llama_model; the weights are Llama.model's (superggml)")

    @property
    def ctx(self) -> Any:
        raise NotInSuperggml("ctx: superggml has no llama_context pointer")

    def set_lora(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError("LoRA: superggml does not apply LoRA adapters")

    # -- the model -----------------------------------------------------------------------------------------------
    @property
    def loaded(self) -> Model:
        """The Model, or ValueError for a vocab_only Llama."""
        if self.model is None:
            raise ValueError("this Llama was opened with vocab_only=True: it tokenizes, and nothing else")
        return self.model

    @property
    def tokenizer_(self) -> Tokenizer:
        return self.vocab if self.vocab is not None else self.loaded.tokenizer

    def tokenize(self, text: bytes, add_bos: bool = True, special: bool = False) -> list[int]:
        return self.tokenizer_.encode(text, add_special=add_bos, parse_special=special)

    def detokenize(
        self, tokens: Sequence[int], prev_tokens: Sequence[int] | None = None, special: bool = False
    ) -> bytes:
        tk, toks = self.tokenizer_, [int(t) for t in tokens]
        if prev_tokens is None:
            return tk.detokenize(toks, unparse_special=special)
        prev = [int(t) for t in prev_tokens]
        whole = tk.detokenize(prev + toks, unparse_special=special)
        return whole[len(tk.detokenize(prev, unparse_special=special)) :]

    def token_bos(self) -> int:
        b = self.tokenizer_.bos_id
        return -1 if b is None else b

    def token_eos(self) -> int:
        e = self.tokenizer_.eos_id
        return -1 if e is None else e

    def token_nl(self) -> int:
        return self.tokenize(b"\n", add_bos=False, special=False)[-1]

    def n_ctx(self) -> int:
        return self.loaded.n_ctx

    def n_vocab(self) -> int:
        return self.tokenizer_.n_vocab

    def n_embd(self) -> int:
        return int(self.loaded.hparams.n_embd)

    def close(self) -> None:
        if self.model is not None:
            self.model.close()

    def __enter__(self) -> Llama:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- the context ---------------------------------------------------------------------------------------------
    @property
    def n_tokens(self) -> int:
        return self._n

    @n_tokens.setter
    def n_tokens(self, n: int) -> None:
        self._n = max(0, min(int(n), self._n))

    @property
    def input_ids(self) -> npt.NDArray[np.intc]:
        """The context's tokens, in an array of n_ctx (as llama_cpp's; the rest is 0)."""
        m = self.loaded
        out = np.zeros(m.n_ctx, dtype=np.intc)
        toks = m.tokens[: self._n]
        out[: len(toks)] = toks
        return out

    @property
    def scores(self) -> npt.NDArray[np.single]:
        """Every evaluated row's logits with logits_all, else the last row's ([1, n_vocab])."""
        m = self.loaded
        s = m.scores
        return np.asarray(s[: self._n] if s is not None else m.logits[None, :], dtype=np.single)

    def sync(self) -> Model:
        """The model with the context cut to n_tokens."""
        m = self.loaded
        if m.n_tokens != self._n:
            m.truncate(self._n)
            self._n, self._fresh = m.n_tokens, False
        return m

    def synced(self, it: Iterator[Any]) -> Iterator[Any]:
        """`it`'s items, the context taken from the model once it ends."""
        try:
            yield from it
        finally:
            self.took_model()

    def took_model(self) -> None:
        """The model ran on its own (a completion): its context is ours."""
        self._n, self._fresh = self.loaded.n_tokens, True

    def reset(self) -> None:
        self._n, self._fresh = 0, False

    def eval(self, tokens: Sequence[int]) -> None:
        m = self.sync()
        m.eval([int(t) for t in tokens], logits_all=self.params.logits_all)
        self._n, self._fresh = m.n_tokens, True

    @property
    def seed(self) -> int:
        """The seed the next draw starts from (set_seed; each completion without one derives the next)."""
        return self._seed

    def set_seed(self, seed: int) -> None:
        self._seed = seed

    def set_cache(self, cache: LlamaRAMCache | None) -> None:
        self.cache = cache

    # -- sampling ------------------------------------------------------------------------------------------------
    def new_sampler(
        self,
        top_k: int = 40,
        top_p: float = 0.95,
        min_p: float = 0.05,
        typical_p: float = 1.0,
        temp: float = 0.80,
        repeat_penalty: float = 1.0,
        frequency_penalty: float = 0.0,
        presence_penalty: float = 0.0,
        tfs_z: float = 1.0,
        mirostat_mode: int = 0,
    ) -> Sampler:
        """llama_cpp's sampling keywords as superggml's sampler, drawing with this Llama's seed."""
        for name, value, default in (
            ("typical_p", typical_p, 1.0),
            ("tfs_z", tfs_z, 1.0),
            ("mirostat_mode", mirostat_mode, 0),
        ):
            if value != default:
                raise NotImplementedError(f"{name}={value}: superggml samples with top-k, top-p, min-p and temp")
        return Sampler(SamplingParams.pick(dict(locals(), temperature=temp)), seed=self._seed)

    def sampler_of(self, args: dict[str, Any]) -> Sampler:
        """new_sampler over the sampling keywords among a method's arguments (sample's, generate's)."""
        return self.new_sampler(**{k: args[k] for k in inspect.signature(self.new_sampler).parameters})

    def matcher(self, grammar: LlamaGrammar | None) -> Matcher | None:
        m = self.loaded
        return None if grammar is None else m.matcher(m.grammar(**grammar.options()))

    def draw(
        self, sampler: Sampler, matcher: Matcher | None, logits: Any, processors: LogitsProcessorList | None
    ) -> int:
        """A token from `logits` after the processors, within the grammar."""
        x = np.array(logits, dtype=np.single, copy=True)
        if processors:
            x = np.asarray(processors(self.input_ids[: self._n], x), dtype=np.single)
        return pick(sampler, matcher, x, self.loaded.tokens[: self._n], False)[0]

    def sample(
        self,
        top_k: int = 40,
        top_p: float = 0.95,
        min_p: float = 0.05,
        typical_p: float = 1.0,
        temp: float = 0.80,
        repeat_penalty: float = 1.0,
        frequency_penalty: float = 0.0,
        presence_penalty: float = 0.0,
        tfs_z: float = 1.0,
        mirostat_mode: int = 0,
        mirostat_eta: float = 0.1,
        mirostat_tau: float = 5.0,
        penalize_nl: bool = True,
        logits_processor: LogitsProcessorList | None = None,
        grammar: LlamaGrammar | None = None,
        idx: int | None = None,
    ) -> int:
        """A token drawn from the logits of row `idx` (default: the last evaluated)."""
        m = self.sync()
        if self._n == 0:
            raise ValueError("sample() needs evaluated tokens")
        sampler = self.sampler_of(locals())
        rows = m.scores
        row = rows[idx] if idx is not None and rows is not None and idx < self._n - 1 else m.logits
        return self.draw(sampler, self.matcher(grammar), row, logits_processor)

    def generate(
        self,
        tokens: Sequence[int],
        top_k: int = 40,
        top_p: float = 0.95,
        min_p: float = 0.05,
        typical_p: float = 1.0,
        temp: float = 0.80,
        repeat_penalty: float = 1.0,
        reset: bool = True,
        frequency_penalty: float = 0.0,
        presence_penalty: float = 0.0,
        tfs_z: float = 1.0,
        mirostat_mode: int = 0,
        mirostat_tau: float = 5.0,
        mirostat_eta: float = 0.1,
        penalize_nl: bool = True,
        logits_processor: LogitsProcessorList | None = None,
        stopping_criteria: StoppingCriteriaList | None = None,
        grammar: LlamaGrammar | None = None,
    ) -> Generator[int, Sequence[int] | None, None]:
        """Tokens after `tokens`, forever (as llama_cpp's: reset reuses the longest prefix evaluated; a value
        sent into the generator is evaluated after the token)."""
        sampler = self.sampler_of(locals())
        matcher = self.matcher(grammar)
        todo = self.reuse(list(tokens)) if reset else list(tokens)
        while True:
            if todo:
                self.eval(todo)
            logits = self.loaded.logits
            token = self.draw(sampler, matcher, logits, logits_processor)
            if stopping_criteria is not None and stopping_criteria(self.input_ids[: self._n], logits):
                return
            more = yield token
            todo = [token, *(more or [])]

    def reuse(self, tokens: list[int]) -> list[int]:
        """What of `tokens` is left to evaluate once the context keeps its longest prefix of them (the last token
        again where its logits are not the model's last)."""
        have = self.loaded.tokens[: self._n]
        n = shared_prefix(have, tokens)
        if n == len(tokens) == self._n and self._fresh:
            return []
        n = n - 1 if n == len(tokens) else n
        self.n_tokens = max(n, 0)
        return tokens[self._n :]

    # -- completions and embeddings ---------------------------------------------------------------------------------
    def create_completion(
        self,
        prompt: str | list[int],
        suffix: str | None = None,
        max_tokens: int | None = 16,
        temperature: float = 0.8,
        top_p: float = 0.95,
        min_p: float = 0.05,
        typical_p: float = 1.0,
        logprobs: int | None = None,
        echo: bool = False,
        stop: str | list[str] | None = [],  # noqa: B006  (llama_cpp's default)
        frequency_penalty: float = 0.0,
        presence_penalty: float = 0.0,
        repeat_penalty: float = 1.0,
        top_k: int = 40,
        stream: bool = False,
        seed: int | None = None,
        tfs_z: float = 1.0,
        mirostat_mode: int = 0,
        mirostat_tau: float = 5.0,
        mirostat_eta: float = 0.1,
        model: str | None = None,
        stopping_criteria: StoppingCriteriaList | None = None,
        logits_processor: LogitsProcessorList | None = None,
        grammar: LlamaGrammar | None = None,
        logit_bias: dict[int, float] | None = None,
    ) -> Any:
        """OpenAI-style text completion, as llama_cpp's (superggml's Model.create_completion where no
        processor, stopping criteria or logit bias needs the loop of its own)."""
        args = dict(locals())
        args.pop("self")
        return complete(self, CompletionRequest(**args))

    __call__ = create_completion

    def create_chat_completion(self, messages: Sequence[dict[str, Any]], **kwargs: Any) -> Any:
        """OpenAI-style chat completion with the GGUF's chat template (llama_cpp's keywords; functions and
        function_call become tools and tool_choice)."""
        req = chat_request(kwargs)
        if req.pop("seed") is None:
            self.set_seed(random.Random(self._seed).randint(0, 2**32))
        m = self.sync()
        out = m.create_chat_completion(messages, seed=self._seed, **req)
        if req.get("stream"):
            return self.synced(out)
        self.took_model()
        return out

    def create_embedding(self, input: str | list[str], model: str | None = None) -> dict[str, Any]:
        out = self.loaded.create_embedding(input, pooling=POOLING[self.params.pooling_type], normalize=False)
        out["model"] = model or self.model_path
        return out

    def embed(
        self, input: str | list[str], normalize: bool = False, truncate: bool = True, return_count: bool = False
    ) -> Any:
        m = self.loaded
        out = m.embed(input, pooling=POOLING[self.params.pooling_type], normalize=normalize)
        if not return_count:
            return out
        texts = [input] if isinstance(input, str) else input
        return out, sum(len(self.tokenize(t.encode(), add_bos=True)) for t in texts)

    # -- state ---------------------------------------------------------------------------------------------------
    def save_state(self) -> LlamaState:
        """The context (superggml's saved sequence, as bytes), with its tokens and last logits."""
        m = self.sync()
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "state")
            m.save_sequence(path)
            with open(path, "rb") as f:
                data = f.read()
        logits = np.asarray(m.logits if self._n else np.zeros(0), dtype=np.single)[None, :]
        return LlamaState(self.input_ids.copy(), logits, self._n, data, len(data), self._seed)

    def load_state(self, state: LlamaState) -> None:
        m = self.loaded
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "state")
            with open(path, "wb") as f:
                f.write(state.llama_state)
            m.load_sequence(path)
        self._n, self._fresh, self._seed = m.n_tokens, True, state.seed


def chatml(tk: Tokenizer) -> ChatTemplate:
    """chatml's template, with the vocabulary's BOS and EOS texts."""

    def piece(t: int | None) -> str:
        return "" if t is None else tk.token_to_piece(t).decode("utf-8", "replace")

    return ChatTemplate(CHATML, bos_token=piece(tk.bos_id), eos_token=piece(tk.eos_id))
