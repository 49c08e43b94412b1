"""superggml.Model: the high-level API, shaped like llama_cpp.Llama."""

from __future__ import annotations

import codecs
import gc
import inspect
import os
import sys
import time
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from . import _core
from .arch import get_architecture
from .budget import MemoryPlan, model_bytes
from .chat import CHATML, ChatTemplate
from .errors import GGUFError
from .grammar import Grammar, GrammarError, GrammarVocab, Matcher, grammar_from
from .executor import Executor
from .metrics import Metrics, MetricsWriter
from .reply import Reply
from .sampling import Sampler, SamplingParams, log_softmax
from .scheduler import LayerScheduler
from .speculative import DRAFT_BATCH, DraftLength, LookupDrafter, ModelDrafter, Speculator, accept
from .settings import Settings, options_doc, parse_size, signature
from .tokenizer import Tokenizer
from .tools import ToolFormat, ToolRequest, parse_tools, resolve_tool_choice, tool_format

__all__ = ["Model", "parse_size"]


def _return_free_memory() -> None:
    """Collect garbage and hand freed heap back to the OS (glibc), so peak RSS stays low."""
    gc.collect()
    _core.host_memory_trim()


def sampling_options(*, temperature: float, top_p: float, top_k: int, min_p: float, repeat_penalty: float,
                     frequency_penalty: float, presence_penalty: float, seed: int | None) -> dict[str, Any]:
    """OpenAI's sampling parameters as Model's samplers take them."""
    return dict(temp=temperature, top_p=top_p, top_k=top_k, min_p=min_p, repeat_penalty=repeat_penalty,
                frequency_penalty=frequency_penalty, presence_penalty=presence_penalty, seed=seed)


EMBED_BATCH = 16      # texts per forward pass in embed()
MAX_LOGPROBS = 20     # alternatives per token a request may ask for (OpenAI's top_logprobs limit)


def check_logprobs(k: int | None, name: str) -> None:
    """ValueError unless k is None or in 0..MAX_LOGPROBS."""
    if k is not None and not (isinstance(k, int) and 0 <= k <= MAX_LOGPROBS):
        raise ValueError(f"{name} must be in 0..{MAX_LOGPROBS}, not {k!r}")


def stop_list(stop: str | Sequence[str] | None) -> list[str]:
    """OpenAI's `stop` (a string, a list of them, or none) as a list."""
    return [stop] if isinstance(stop, str) else list(stop or [])


def _is_list_of_inputs(x: Any) -> bool:
    """A list of prompts or texts (strings or token lists), not one (a string or a token list)."""
    return not isinstance(x, str) and len(x) > 0 and not isinstance(x[0], (int, np.integer))


def _want_direct_io(path: str) -> bool:
    """O_DIRECT pays off when the file cannot stay in the page cache: larger than what is available."""
    return os.path.getsize(path) > int(_core.host_memory()["available"])


LogprobEntry = tuple[int, "float | None", "list[tuple[int, float]]"]   # token, its logprob, top alternatives


def logprob_entry(tok: int, logp: np.ndarray, k: int) -> LogprobEntry:
    """A token's logprob and the k most likely tokens' (ids, logprobs) from a log-probability vector."""
    top = np.argpartition(-logp, k)[:k] if 0 < k < len(logp) else np.arange(len(logp) if k else 0)
    top = top[np.argsort(-logp[top], kind="stable")]
    return int(tok), float(logp[tok]), [(int(i), float(logp[i])) for i in top]


class _Choice:
    """One completion's text as its tokens arrive: bytes to text as llama-cpp-python gives them (the whole
    completion decoded with errors="ignore": a character split across tokens waits for its rest, bytes that
    never form one are dropped), stop strings held back until they cannot match, a token limit."""

    def __init__(self, tokenizer: Tokenizer, limit: int, stop: Sequence[str], logprobs: int | None = None,
                 keep: frozenset[int] = frozenset()):
        self.tokenizer = tokenizer
        self.keep = keep                  # control tokens written into the text (a tool-call format's markers)
        self.logprobs = logprobs          # top alternatives per token to report (None: no logprobs)
        self.lp: list[LogprobEntry] = []  # the kept tokens' (token, logprob, top alternatives), not yet taken
        self.limit = limit
        self.stop = list(stop)
        self.utf8 = codecs.getincrementaldecoder("utf-8")(errors="ignore")
        self.text = ""
        self.sent = 0
        self.n = 0
        self.finish: str | None = None
        self.holdback = max((len(x) for x in self.stop), default=0)

    def push(self, tok: int, logp: np.ndarray | None = None) -> str:
        """Takes the next token (and, with logprobs, the log-probabilities it was drawn with); returns the text
        that can be sent now. Sets finish once done."""
        if self.tokenizer.is_eog(tok):
            self.finish = "stop"
            return self.flush()
        self.n += 1
        if self.logprobs is not None and logp is not None:
            self.lp.append(logprob_entry(tok, logp, self.logprobs))
        self.text += self.utf8.decode(self.tokenizer.token_to_piece(tok, special=tok in self.keep))
        hit = min((i for i in (self.text.find(x, max(0, self.sent - len(x))) for x in self.stop) if i >= 0),
                  default=-1)
        if hit >= 0:
            self.text = self.text[:hit]
            self.finish = "stop"
            if self.lp:
                self.lp.pop()             # the token that completed the stop string is not in the text
            return self.flush()
        if self.n >= self.limit:
            self.finish = "length"
            return self.flush()
        safe = len(self.text) - self.holdback
        if safe > self.sent:
            out, self.sent = self.text[self.sent:safe], safe
            return out
        return ""

    def take(self) -> list[LogprobEntry] | None:
        """The logprob entries since the last take (None without logprobs)."""
        if self.logprobs is None:
            return None
        out, self.lp = self.lp, []
        return out

    def flush(self) -> str:
        """The text not sent yet (the completion is over)."""
        self.text += self.utf8.decode(b"", final=True)
        out, self.sent = self.text[self.sent:], len(self.text)
        self.finish = self.finish or "length"
        return out


class _Gen:
    """One completion that Model._step advances together with others: its sequence, the tokens still to feed
    (the prompt, then each sampled token), its sampler and its text."""

    def __init__(self, seq: int, prompt: Sequence[int], choice: _Choice, sampler: Sampler,
                 matcher: Matcher | None = None):
        self.seq = seq
        self.pending = list(prompt)
        self.n_prompt = len(self.pending)
        self.choice = choice
        self.sampler = sampler
        self.matcher = matcher       # its constraint's state (None: free text)

    def pick(self, logits: np.ndarray, history: Sequence[int]) -> tuple[int, np.ndarray | None]:
        """The next token from its last logits (and its logprobs if the choice reports them)."""
        return _pick(self.sampler, self.matcher, logits, history, self.choice.logprobs is not None)


    @property
    def finish(self) -> str | None:
        return self.choice.finish


def _pick(sampler: Sampler, matcher: Matcher | None, logits: np.ndarray, history: Sequence[int],
          logprobs: bool) -> tuple[int, np.ndarray | None]:
    """Draws a token from `logits` within the constraint (which then moves past it); with `logprobs` also gives
    the log-probabilities it reports (the model's own: before the constraint's mask)."""
    logp = sampler.logprobs(logits, history) if logprobs else None
    tok = sampler.sample(logits if matcher is None else matcher.mask(logits), history)
    if matcher is not None:
        matcher.consume(tok)
    return tok, logp


class Model:
    """A GGUF language model run layer by layer over ggml.

    Weights are used in place from the read-only mapping of the file, except
    that with ``repack`` (default, as llama.cpp) the matmul weights the CPU
    has faster re-laid kernels for are copied into that layout at load.

    With ``device_budget`` (bytes, or a string such as ``"128MiB"``) the
    transformer blocks are paged from the file through a pool of slots that
    never holds more than the budget: the first blocks that fit stay pinned,
    the rest stream through the remaining slots, loaded by a worker thread
    (``async_prefetch``: ``prefetch_depth`` blocks ahead of the computation).
    ``n_gpu_layers`` (llama.cpp's meaning) caps how many blocks stay resident
    on the device; the others stream (with no budget, the pool then has room
    for exactly those plus the streaming slots).
    ``dynamic_layers`` re-plans while running: when the device's memory
    pressure (used / total, cgroup-aware on the host) rises above
    ``mem_pressure``, the least recently used pinned blocks are demoted to
    streamed and their slots freed; when it falls, they are promoted again
    (never beyond the static plan; without a budget the plan pins every block).
    ``stats()`` counts the moves and ``layer_events()`` lists them.
    ``direct_io`` reads streamed blocks with O_DIRECT (the disk writes into
    the slot; no page cache, no CPU copy); None picks it when the file is
    larger than the memory available to this process, so it could not stay
    in the page cache anyway. ``staged_io`` loads host slots the way device
    slots are loaded (staging buffers, async copies, events), so the CPU runs
    the GPU code path; it is slower and meant for testing.

    ``paged_kv`` keeps K/V in pages of ``kv_page_size`` tokens (16-8192).
    The device holds ``kv_device_layers`` frames of one layer's K/V each
    (default: one per layer, nothing moves). With fewer, the first layers keep
    a frame of their own and the others' pages live in host memory
    (``host_budget`` bytes) and beyond it in a spill file in ``kv_spill_dir``,
    coming into one of s streaming frames while their layer runs (s = 1, or
    ``prefetch_depth`` + 1 with ``async_prefetch``, which fills them ahead).
    Logits are bit-identical to the contiguous cache.

    ``devices`` (ggml device names, e.g. ``["CUDA0", "CUDA1"]``; the same
    name twice gives two backend instances) splits the blocks over several
    devices in contiguous ranges, ``tensor_split`` giving their shares (as
    llama.cpp's; default even): each runs its blocks and their K/V, and the
    activations are copied where the device changes. ``device_budget`` may
    give one size per device, each device paging its own blocks (and, with
    ``paged_kv``, its own K/V frames).

    ``rpc`` (``["host:port", ...]``) adds ggml RPC servers' devices
    (``superggml rpc-server``, llama.cpp's ``rpc-server``): without ``devices``
    the blocks split over this machine's CPU and them by free memory;
    ``devices=["RPC[host:port]"]`` names a server's device. A server that
    cannot be reached, or fails or stops answering for ``rpc_timeout``
    seconds, raises ``superggml.DeviceError`` naming it.

    ``metrics`` (or a ``metrics_file``, a path or a text stream) writes
    JSON-lines metrics (docs/design.md's schema, ``superggml.metrics.schema()``):
    a snapshot every ``metrics_interval`` generated tokens, per-layer timing
    lines and the scheduler's moves; stderr unless a file is given.
    Streamed and resident runs give bit-identical logits (with repack off).

    Every option is keyword-only (``n_ctx`` is accepted for ``ctx_size``); they are defined, with their
    checks, in ``superggml.settings``, and ``Model.settings`` holds them:

{options}

    >>> with Model(path, ctx_size=2048) as m:
    ...     print(m.create_completion("Once upon a time", max_tokens=16)["choices"][0]["text"])
    """

    def __init__(self, path: str | os.PathLike[str], **options: Any):
        self.settings = s = Settings.from_options(options)
        c = s.context
        self.path = os.fspath(path)
        self.verbose = c.verbose
        self.seed = c.seed
        self.logits_all = c.logits_all
        self._file = _core.GGUFFile(self.path)
        try:
            self.metadata: dict[str, Any] = self._file.metadata()
            self.arch = get_architecture(self.metadata)
            self.hparams = self.arch.hp
            self.tensor_info = {name: (typ, tuple(shape), off, nb)
                                for name, typ, shape, off, nb in self._file.tensors()}
            self.arch.validate({n: v[1] for n, v in self.tensor_info.items()})
            self._file.drop_header()     # read into metadata: the C++ copy of the vocabulary (~17 MiB) goes
            self._store = _core.WeightStore(self._file)
            direct = s.paging.direct_io
            self._exec = Executor(self.arch, self._store, s,
                                  direct_io=_want_direct_io(self.path) if direct is None else direct,
                                  # resident weights load in the background, block by block, while the KV
                                  # cache and the tokenizer are built and the first pass computes; streamed
                                  # ones go through the pager
                                  preload_repack=c.repack, reserve=self._draft_bytes())
            self.settings = s = self._exec.settings          # device_budget and async_prefetch resolved
            self.memory_plan: MemoryPlan | None = self._exec.memory_plan
            self.repacked_bytes = self._exec.repacked_bytes
            self.tokenizer = Tokenizer.from_metadata(self.metadata)
            for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.scores",
                        "tokenizer.ggml.token_type"):   # held by the tokenizer now; tens of MB as lists
                self.metadata.pop(key, None)
            _return_free_memory()   # the vocabulary's transient objects
            if self.tokenizer.n_vocab != self.hparams.n_vocab:
                raise GGUFError(f"vocabulary has {self.tokenizer.n_vocab} tokens but the model "
                                f"{self.hparams.n_vocab}")
            self._spec: Speculator | None = self._speculator() if s.speculative.enabled else None
        except BaseException:
            if "_exec" in self.__dict__:
                self._exec.close()
            self.__dict__.pop("_exec", None)    # before the file: they point into its tensors
            self.__dict__.pop("_store", None)
            self._file.close()
            raise
        plan = self.memory_plan
        if plan is not None and (c.verbose or (plan.mode == "auto" and not plan.resident)):
            st = self._exec.stats()
            pinned = (f", {min(st['layers_pinned'], self.hparams.n_layer)} of {self.hparams.n_layer} blocks pinned"
                      if "layers_pinned" in st else "")
            print(plan.line(pinned), file=sys.stderr)
        if c.verbose:
            hp = self.hparams
            print(f"superggml: {self.path}: {hp.arch}, {hp.n_layer} blocks, n_embd {hp.n_embd}, "
                  f"vocab {hp.n_vocab}; ctx {c.ctx_size}, {self.n_threads} threads, "
                  f"{self.repacked_bytes / 2**20:.0f} MiB re-laid, KV {self._exec.kv_bytes / 2**20:.0f} MiB",
                  file=sys.stderr)
        self._metrics: Metrics | None = None
        self._closed = False
        self._grammar_vocab: GrammarVocab | None = None
        self._tool_format: ToolFormat | None = None
        ms = s.metrics
        if ms.enabled:
            self._metrics = Metrics(self, MetricsWriter(ms.metrics_file, pretty=ms.metrics_pretty),
                                    interval=ms.metrics_interval)
            self._exec.record_timings = True
        tmpl = self.metadata.get("tokenizer.chat_template")
        tk = self.tokenizer
        self.chat_template = ChatTemplate(
            tmpl if isinstance(tmpl, str) else CHATML,
            bos_token=tk.token_to_piece(tk.bos_id).decode("utf-8", "replace") if tk.bos_id is not None else "",
            eos_token=tk.token_to_piece(tk.eos_id).decode("utf-8", "replace") if tk.eos_id is not None else "")

    # -- lifecycle ---------------------------------------------------------
    def close(self) -> None:
        """Frees the KV cache and unmaps the file; the model is unusable after."""
        if not getattr(self, "_closed", True):
            self._closed = True
            if getattr(self, "_metrics", None) is not None:
                self._metrics.writer.close()
            if getattr(self, "_spec", None) is not None:
                self._spec.close()
            self._exec.close()
            del self._exec
            del self._store
            self._file.close()

    def _draft_bytes(self) -> int:
        """The memory the draft model will hold (its weights, or its draft_budget, and the rest), which the
        automatic budget leaves it."""
        sp = self.settings.speculative
        if not sp.draft_model:
            return 0
        return model_bytes(sp.draft_model, dict(self._draft_options(), cache_type_k="f16", cache_type_v="f16",
                                                device_budget=sp.draft_budget))

    def _draft_options(self) -> dict[str, Any]:
        """The draft model's options: the model's context and threads, at most DRAFT_BATCH rows a pass."""
        c = self.settings.context
        return dict(ctx_size=c.ctx_size, n_batch=min(c.n_batch, DRAFT_BATCH), n_threads=c.n_threads, seed=c.seed,
                    flash_attn=c.flash_attn, repack=c.repack, batch_invariant=c.batch_invariant)

    def _speculator(self) -> Speculator:
        """The drafter the speculative settings ask for: a draft model (resident, or streamed within its own
        draft_budget; _draft_options) or prompt lookup."""
        sp = self.settings.speculative
        length = DraftLength(sp.draft_min, sp.draft_max, sp.draft_k)
        if not sp.draft_model:
            return Speculator(LookupDrafter(sp.lookup_ngram), length)
        kw = self._draft_options()
        # resident (the target's automatic budget left its memory), or streamed within its own draft_budget
        kw.update(device_budget="off" if sp.draft_budget is None else sp.draft_budget, async_prefetch=True)
        draft = Model(sp.draft_model, **kw)
        try:
            return Speculator(ModelDrafter(draft, self, p_min=sp.draft_p_min), length)
        except BaseException:
            draft.close()
            raise

    def __enter__(self) -> "Model":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("the model is closed")

    # -- properties --------------------------------------------------------
    @property
    def n_ctx(self) -> int:
        return self.settings.context.ctx_size

    @property
    def n_vocab(self) -> int:
        return self.hparams.n_vocab

    @property
    def n_tokens(self) -> int:
        return self._exec.seq.n_past

    @property
    def n_threads(self) -> int:
        """Compute threads in use now (one fewer while decoding from a stream, when chosen automatically)."""
        return self._exec.backend.n_threads

    @property
    def tokens(self) -> list[int]:
        """What the current sequence's K/V holds."""
        return list(self._exec.seq.tokens)

    @property
    def scores(self) -> np.ndarray | None:
        """Logits of the last eval: [n_tokens, n_vocab] with logits_all, else [1, n_vocab]."""
        return self._exec.seq.scores

    @property
    def logits(self) -> np.ndarray:
        """Logits after the last token fed, F32 [n_vocab]."""
        if self._exec.seq.scores is None:
            raise RuntimeError("no logits yet: eval() some tokens first")
        return self._exec.seq.scores[-1]

    @property
    def kv_bytes(self) -> int:
        """Bytes of a contiguous K/V cache for the whole context (what paged_kv pages)."""
        return self._exec.kv_bytes

    @property
    def device(self) -> tuple[str, str]:
        """(type, name) of the compute device (of the first, with a multi-device split): ("cpu", "CPU")."""
        return self._exec.backend.device_type, self._exec.backend.device_name

    # -- paging ------------------------------------------------------------
    def time_blocks(self, blocks: Sequence[int], *, repeats: int = 3) -> dict[int | str, float]:
        """Seconds of computation of each of `blocks` and of the lm head ("head") for one decoded token, only
        their weights read (Executor.time_blocks; what `superggml analyze` samples)."""
        self._check_open()
        return self._exec.time_blocks(blocks, repeats=repeats)

    def stats(self) -> dict[str, Any]:
        """One dict of counters: the current sequence (sequence, n_sequences, n_tokens), the threads and
        devices (n_threads, devices, blocks_per_device), the background load (weights_loading); with paged
        weights the layer pager's (loads, hits, evictions, bytes_loaded, wait_seconds, read_seconds, pending,
        n_slots, slot_size, layers_pinned, direct_io, staged_io), with dynamic_layers the scheduler's
        (layers_demoted, layers_promoted) and with paged_kv the KV cache's (kv_*)."""
        self._check_open()
        st = self._exec.stats()
        if self._spec is not None:
            st.update(self._spec.stats())
        return st

    def layer_events(self) -> list[dict[str, Any]]:
        """The scheduler's moves so far: {"event": "layer_demote"|"layer_promote", "layer", "t",
        "pressure", "n_slots", "pinned"}; empty without dynamic_layers."""
        self._check_open()
        sch = self._exec.scheduler
        return list(sch.events) if sch is not None else []

    @property
    def scheduler(self) -> LayerScheduler | None:
        """The memory-pressure scheduler with dynamic_layers (its ``memory`` reading may be replaced)."""
        return self._exec.scheduler

    @property
    def record_timings(self) -> bool:
        """Whether every forward pass records per-layer timings (``timings``); on with metrics."""
        return self._exec.record_timings

    @record_timings.setter
    def record_timings(self, on: bool) -> None:
        self._exec.record_timings = bool(on)

    @property
    def timings(self) -> list[dict[str, Any]]:
        """Per-step timings of the last forward pass (with record_timings): layer, kind ("embed", "block",
        "head"), t_start, t_end, wait_ms, load_ms, compute_ms."""
        return [dict(t) for t in self._exec.timings]

    # -- tokens ------------------------------------------------------------
    def tokenize(self, text: bytes | str, add_bos: bool = True, special: bool = False) -> list[int]:
        """Token ids of `text` (llama_cpp.Llama.tokenize: add_bos adds the GGUF's BOS if it asks for one)."""
        if isinstance(text, bytes):
            text = text.decode("utf-8", errors="replace")
        return self.tokenizer.encode(text, add_special=add_bos, parse_special=special)

    def detokenize(self, tokens: Sequence[int], special: bool = False) -> bytes:
        """The bytes of `tokens` (special tokens' text only if `special`), as llama_detokenize."""
        return self.tokenizer.detokenize([int(t) for t in tokens], unparse_special=special)

    def token_bos(self) -> int | None:
        return self.tokenizer.bos_id

    def token_eos(self) -> int | None:
        return self.tokenizer.eos_id

    # -- sequences ------------------------------------------------------------
    @property
    def sequence(self) -> int:
        return self._exec.seq.id

    def use_sequence(self, seq: int) -> None:
        """Makes `seq` the sequence eval/generate extend. Several sequences keep their own cached context (a
        server interleaves requests this way): pages of the paged KV cache, or without it K/V storage of
        ctx_size tokens each."""
        self._check_open()
        self._exec.use_sequence(seq)

    def drop_sequence(self, seq: int) -> None:
        """Frees the cached context of `seq` (its KV pages); the current sequence is emptied instead."""
        self._check_open()
        self._exec.drop_sequence(seq)

    def truncate(self, n: int) -> int:
        """Keeps the first `n` tokens of the current sequence's context, freeing the K/V after them; returns
        the tokens kept (none when sliding-window layers already freed keys position `n` needs: see swa_full)."""
        self._check_open()
        return self._exec.truncate(n)

    def reset(self) -> None:
        """Forgets the cached context."""
        self.truncate(0)

    # -- evaluation ----------------------------------------------------------
    def eval(self, tokens: Sequence[int], *, logits_all: bool | None = None) -> np.ndarray:
        """Appends `tokens` to the context and returns their logits (see `scores`)."""
        self._check_open()
        tokens = [int(t) for t in tokens]
        scores = self._exec.eval(tokens, logits_all=self.logits_all if logits_all is None else logits_all)
        if self._metrics is not None:
            self._metrics.on_layer_timings(self._exec.timings)
            if len(tokens) == 1 and self._metrics.prompt_tokens:
                self._metrics.on_token()
            else:
                self._metrics.on_prompt(len(tokens))
        return scores

    def _prefill(self, tokens: Sequence[int]) -> np.ndarray:
        """Brings the cache to `tokens`, reusing the longest cached prefix; returns last logits."""
        tokens = list(tokens)
        if not tokens:
            raise ValueError("the prompt is empty")
        keep = self._exec.keep_prefix(tokens)
        return self.eval(tokens[keep:], logits_all=False)[-1]

    def generate(self, tokens: Sequence[int], *, temp: float = 0.8, top_k: int = 40, top_p: float = 0.95,
                 min_p: float = 0.05, repeat_penalty: float = 1.0, repeat_last_n: int = 64,
                 frequency_penalty: float = 0.0, presence_penalty: float = 0.0,
                 seed: int | None = None, reset: bool = True, grammar: Grammar | None = None) -> Iterator[int]:
        """Yields sampled tokens after `tokens`, forever (stop by leaving the loop); with `grammar` (see
        `Model.grammar`) only tokens it allows, an end-of-generation token once it is complete."""
        self._check_open()
        sampler = self._sampler(temp=temp, top_k=top_k, top_p=top_p, min_p=min_p, repeat_penalty=repeat_penalty,
                                repeat_last_n=repeat_last_n, frequency_penalty=frequency_penalty,
                                presence_penalty=presence_penalty, seed=seed)
        matcher = self._matcher(grammar)
        for tok, _ in self._generate(tokens, sampler, reset=reset, matcher=matcher):
            yield tok

    def _generate(self, tokens: Sequence[int], sampler: Sampler, *, reset: bool = True,
                  logprobs: bool = False, matcher: Matcher | None = None
                  ) -> Iterator[tuple[int, np.ndarray | None]]:
        """generate(): (token, the log-probabilities it was drawn with if `logprobs`, else None). With logprobs
        or a constraint it decodes plainly (no drafts: each token's own distribution is reported or masked)."""
        seq = self._exec.seq
        logits = self._prefill(tokens) if reset or not seq.tokens else self.eval(tokens)[-1]
        if self._spec is not None and not logprobs and matcher is None:
            for tok in self._speculate(logits, sampler):
                yield tok, None
            return
        while True:
            tok, logp = _pick(sampler, matcher, logits, seq.tokens, logprobs)
            yield tok, logp
            if self.n_tokens >= self.n_ctx:
                return
            logits = self.eval([tok])[-1]

    def _speculate(self, logits: np.ndarray, sampler: Sampler) -> Iterator[int]:
        """generate() with a drafter: each step drafts k tokens after the last one chosen, feeds that token and
        the draft in one pass (eval_rows: each row as if fed alone), keeps the drafted tokens the sampler
        accepts (speculative.accept) and one of the model's own, and truncates the rest from the K/V."""
        tok = sampler.sample(logits, self._exec.seq.tokens)
        yield tok
        while self.n_tokens + 1 < self.n_ctx:
            toks = self._spec_tokens(tok, sampler)
            for t in toks:
                if self._metrics is not None:
                    self._metrics.on_token()
                yield t
            tok = toks[-1]

    def _spec_tokens(self, tok: int, sampler: Sampler) -> list[int]:
        """One speculative step of the current sequence after `tok` (chosen, not yet fed): the accepted drafted
        tokens and the model's next one (last, not fed)."""
        spec, ex = self._spec, self._exec
        assert spec is not None
        seq = ex.seq
        base = self.n_tokens
        context = seq.tokens + [tok]
        draft = spec.timed_draft(context, spec.length.choose(self.n_ctx - base - 2))
        t = time.perf_counter()
        rows = ex.eval_rows([tok] + draft) if draft else ex.eval([tok])
        spec.length.on_pass(len(draft) + 1, time.perf_counter() - t)
        if self._metrics is not None:
            self._metrics.on_layer_timings(ex.timings)
        out: list[int] = []
        nxt = None
        for i, d in enumerate(draft):
            nxt = accept(sampler, sampler.distribution(rows[i], context + out), d)
            if nxt is not None:
                break
            out.append(d)
        if nxt is None:
            nxt = sampler.sample(rows[len(draft)], context + out)
        if draft:
            kept = ex.truncate(base + 1 + len(out))
            if kept < base + 1 + len(out):            # sliding-window keys already freed: feed them again
                ex.eval((context + out)[kept:])
        spec.on_step(len(draft), len(out))
        return out + [nxt]

    # -- completions ---------------------------------------------------------
    def _limit(self, prompt_tokens: Sequence[int], max_tokens: int | None) -> int:
        if not prompt_tokens:
            raise ValueError("the prompt is empty")
        if len(prompt_tokens) >= self.n_ctx:
            raise ValueError(f"prompt has {len(prompt_tokens)} tokens; ctx_size is {self.n_ctx}")
        limit = self.n_ctx - len(prompt_tokens)
        if max_tokens is not None and max_tokens > 0:
            limit = min(limit, max_tokens)
        return limit

    def _completion_stream(self, prompt_tokens: list[int], max_tokens: int | None, stop: Sequence[str],
                           sampling: Mapping[str, Any], logprobs: int | None = None,
                           grammar: Grammar | None = None, keep: frozenset[int] = frozenset()
                           ) -> Iterator[tuple[str, str | None, int, list[LogprobEntry] | None]]:
        """Yields (text piece, finish_reason or None, completion token count, logprob entries of its tokens)."""
        self._check_open()
        choice = _Choice(self.tokenizer, self._limit(prompt_tokens, max_tokens), stop, logprobs, keep)
        for tok, logp in self._generate(prompt_tokens, self._sampler(**sampling), logprobs=logprobs is not None,
                                        matcher=self._matcher(grammar)):
            piece = choice.push(tok, logp)
            if choice.finish:
                break
            if piece:
                yield piece, None, choice.n, choice.take()
        else:
            piece = choice.flush()
        yield piece, choice.finish, choice.n, choice.take()

    def _prompt_logprobs(self, prompt: Sequence[int], k: int) -> list[LogprobEntry]:
        """The prompt's tokens with their logprobs under the model (raw logits: no penalties, temperature 1;
        the first token has none), from one pass on a scratch sequence (echo with logprobs)."""
        rows = self._exec.eval_scratch([list(prompt)], logits_all=True)[0]
        out: list[LogprobEntry] = [(int(prompt[0]), None, [])]
        for i in range(1, len(prompt)):
            out.append(logprob_entry(int(prompt[i]), log_softmax(rows[i - 1]), k))
        return out

    def _new_gen(self, seq: int, prompt: Sequence[int], max_tokens: int | None, stop: Sequence[str],
                 sampling: Mapping[str, Any], seed_offset: int = 0, logprobs: int | None = None,
                 grammar: Grammar | None = None, keep: frozenset[int] = frozenset()) -> _Gen:
        """A completion of `prompt` on sequence `seq` (emptied first), for _step."""
        limit = self._limit(prompt, max_tokens)
        seed = self.seed if sampling.get("seed") is None else sampling["seed"]
        if seed is not None and seed >= 0:
            seed += seed_offset
        matcher = self._matcher(grammar)
        self._exec.drop_sequence(seq)
        return _Gen(seq, prompt, _Choice(self.tokenizer, limit, stop, logprobs, keep),
                    self._sampler(**{**sampling, "seed": seed}), matcher)

    # -- constraints -----------------------------------------------------------
    def grammar(self, *, grammar: str | Grammar | None = None, json_schema: Mapping[str, Any] | str | None = None,
                regex: str | None = None, response_format: Mapping[str, Any] | None = None) -> Grammar | None:
        """The constraint of these options (at most one; see superggml.grammar.grammar_from), checked against
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

    def _matcher(self, grammar: Grammar | None) -> Matcher | None:
        return None if grammar is None else grammar.matcher(self.grammar_vocab)

    def _sampler(self, *, temp: float, top_k: int, top_p: float, min_p: float, repeat_penalty: float,
                 frequency_penalty: float, presence_penalty: float, seed: int | None,
                 repeat_last_n: int = 64) -> Sampler:
        """A sampler with these settings (generate's keywords); seed None: the model's."""
        return Sampler(SamplingParams(temperature=temp, top_k=top_k, top_p=top_p, min_p=min_p,
                                      repeat_penalty=repeat_penalty, repeat_last_n=repeat_last_n,
                                      frequency_penalty=frequency_penalty, presence_penalty=presence_penalty),
                       seed=self.seed if seed is None else seed)

    def _step(self, gens: Sequence[_Gen], budget: int | None = None) -> list[tuple[_Gen, str]]:
        """Advances running completions in shared forward passes: the next token of each one decoding, then
        prompt chunks of those prefilling, up to `budget` tokens (None: all). Returns (completion, text to
        send) for each that sampled a token; a finished one has its finish set (its sequence is the caller's
        to drop)."""
        ex = self._exec
        live = [g for g in gens if g.pending and not g.finish]
        if (self._spec is not None and len(live) == 1 and len(live[0].pending) == 1 and live[0].choice.n
                and live[0].choice.logprobs is None and live[0].matcher is None):
            return [self._speculative_step(live[0])]       # one sequence decoding: draft for it
        room = budget if budget is not None else sum(len(g.pending) for g in gens)
        items, fed = [], []
        for g in sorted(live, key=lambda g: len(g.pending) > 1):
            if room <= 0:
                break
            take = g.pending[:room]
            items.append((g.seq, take))
            fed.append((g, len(take)))
            room -= len(take)
        if not items:
            return []
        logits = ex.eval_batch(items)
        m = self._metrics
        if m is not None:
            m.on_layer_timings(ex.timings)
            prefill = sum(k for g, k in fed if g.choice.n == 0 and k > 1)
            if prefill:
                m.on_prompt(prefill)
        out = []
        for (g, k), lg in zip(fed, logits):
            del g.pending[:k]
            if g.pending:                      # a prompt chunk: more to come
                continue
            history = ex._seqs[g.seq].tokens
            tok, logp = g.pick(lg[-1], history)
            piece = g.choice.push(tok, logp)
            if not g.finish:
                if m is not None and m.prompt_tokens:
                    m.on_token()
                if len(history) >= self.n_ctx:
                    piece += g.choice.flush()
                else:
                    g.pending = [tok]
            out.append((g, piece))
        return out

    def _speculative_step(self, g: _Gen) -> tuple[_Gen, str]:
        """_step for one decoding completion with a drafter: its sequence becomes the current one, then one
        step of _speculate's (the pending token and a draft in one pass, the accepted tokens kept)."""
        ex = self._exec
        ex.use_sequence(g.seq)
        toks = self._spec_tokens(g.pending[0], g.sampler)
        piece = ""
        for tok in toks:
            piece += g.choice.push(tok)
            if g.finish:
                break
            if self._metrics is not None:
                self._metrics.on_token()
        if not g.finish:
            if self.n_tokens + 1 >= self.n_ctx:
                piece += g.choice.flush()
            else:
                g.pending = [toks[-1]]
        return g, piece

    def _batch_stream(self, prompts: Sequence[list[int]], n: int, max_tokens: int | None, stop: Sequence[str],
                      sampling: Mapping[str, Any], parallel: int = 64, logprobs: int | None = None,
                      grammar: Grammar | None = None, keep: frozenset[int] = frozenset()
                      ) -> Iterator[tuple[int, str, str | None, int, list[LogprobEntry] | None]]:
        """Completions of several prompts (n of each; choice index = prompt * n + j, sampled with seed + j) run
        together, up to `parallel` at once (the next starts as one ends): each pass holds the next token of
        every running choice, and each stops on its own. Each choice is a sequence of its own, dropped when it
        ends; the current sequence is left as it is. Yields (index, text piece, finish_reason or None,
        completion token count, logprob entries of its tokens)."""
        ex = self._exec
        for p in prompts:
            self._limit(p, max_tokens)
        total = len(prompts) * n
        width = max(1, min(parallel, total))
        taken = set(ex._seqs)
        free = [i for i in range(1, len(taken) + width + 2) if i not in taken][:width]
        gens: dict[_Gen, int] = {}
        nxt = 0
        try:
            while gens or nxt < total:
                while free and nxt < total:
                    pi, j = divmod(nxt, n)
                    gens[self._new_gen(free.pop(), prompts[pi], max_tokens, stop, sampling, j, logprobs,
                                       grammar, keep)] = nxt
                    nxt += 1
                for g, piece in self._step(list(gens)):
                    if piece or g.finish:
                        yield gens[g], piece, g.finish, g.choice.n, g.choice.take()
                    if g.finish:
                        ex.drop_sequence(g.seq)
                        free.append(g.seq)
                        del gens[g]
        finally:
            for g in gens:
                ex.drop_sequence(g.seq)

    def create_completion(self, prompt: str | Sequence[int] | Sequence[str] | Sequence[Sequence[int]], *,
                          max_tokens: int | None = 16, temperature: float = 0.8, top_p: float = 0.95,
                          top_k: int = 40, min_p: float = 0.05, repeat_penalty: float = 1.0,
                          frequency_penalty: float = 0.0, presence_penalty: float = 0.0,
                          stop: str | Sequence[str] | None = None, seed: int | None = None, stream: bool = False,
                          echo: bool = False, add_bos: bool = True, n: int = 1, logprobs: int | None = None,
                          grammar: str | Grammar | None = None, json_schema: Mapping[str, Any] | str | None = None,
                          regex: str | None = None, response_format: Mapping[str, Any] | None = None) -> Any:
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
        self._check_open()
        if n < 1:
            raise ValueError(f"n must be >= 1, not {n}")
        check_logprobs(logprobs, "logprobs")
        constraint = self.grammar(grammar=grammar, json_schema=json_schema, regex=regex,
                                  response_format=response_format)
        many, tokens = self._input_tokens(prompt, "prompt", add_bos=add_bos, special=True)
        prompts = list(prompt) if many else [prompt]
        stops = stop_list(stop)
        sampling = sampling_options(temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p,
                                    repeat_penalty=repeat_penalty, frequency_penalty=frequency_penalty,
                                    presence_penalty=presence_penalty, seed=seed)
        echo_texts = [p if (echo and isinstance(p, str)) else "" for p in prompts for _ in range(n)]
        prompt_lp = None
        if echo and logprobs is not None:
            per_prompt = [self._prompt_logprobs(t, logprobs) for t in tokens]
            prompt_lp = [per_prompt[i] for i in range(len(tokens)) for _ in range(n)]
        return self._complete(tokens, n, max_tokens, stops, sampling, stream=stream, chat=False, echo=echo_texts,
                              logprobs=logprobs, prompt_logprobs=prompt_lp, grammar=constraint)

    def token_bytes(self, tok: int) -> bytes:
        """A token's bytes as logprobs report it (special tokens as their text)."""
        return bytes(self.tokenizer.token_to_piece(int(tok), special=True))

    def _complete(self, tokens: list[list[int]], n: int, max_tokens: int | None, stops: list[str],
                  sampling: dict[str, Any], *, stream: bool, chat: bool, echo: list[str] | None = None,
                  logprobs: int | None = None, prompt_logprobs: list[list[LogprobEntry]] | None = None,
                  grammar: Grammar | None = None, tools: ToolRequest | None = None) -> Any:
        """Runs the choices (n per prompt) and gives them in OpenAI's shapes (Reply)."""
        reply = Reply(chat=chat, stream=stream, model=os.path.basename(self.path), n_choices=len(tokens) * n,
                      n_prompt=sum(len(t) for t in tokens), echo=echo,
                      token_bytes=self.token_bytes if logprobs is not None else None, prompt_logprobs=prompt_logprobs,
                      tools=tools)
        keep = self.marker_ids(tools)
        if len(tokens) == 1 and n == 1:
            gen: Iterator[tuple[int, str, str | None, int, list[LogprobEntry] | None]] = (
                (0, *x) for x in self._completion_stream(tokens[0], max_tokens, stops, sampling, logprobs, grammar,
                                                         keep))
        else:
            gen = self._batch_stream(tokens, n, max_tokens, stops, sampling, logprobs=logprobs, grammar=grammar,
                                     keep=keep)
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

    # -- embeddings ------------------------------------------------------------
    def embed(self, input: str | Sequence[int] | Sequence[str] | Sequence[Sequence[int]], *, pooling: str = "mean",
              normalize: bool = True, add_bos: bool = True, batch_size: int = EMBED_BATCH) -> Any:
        """Embeddings of a text (a list of floats) or of several (a list of them; token lists work too): the
        final norm's output (the hidden state the lm head reads) pooled over the text's tokens, "mean" or
        "last", L2-normalized with `normalize`. Up to `batch_size` texts share each forward pass, each on a
        scratch sequence of its own (the current sequence's cache is left alone)."""
        self._check_open()
        many, toks = self._input_tokens(input, "input", add_bos=add_bos, special=False)
        out = self._embed(toks, pooling, normalize, batch_size)
        return out if many else out[0]

    def _input_tokens(self, x: Any, what: str, *, add_bos: bool, special: bool) -> tuple[bool, list[list[int]]]:
        """(whether `x` is a list of inputs, each input's tokens): strings tokenized, token lists as given."""
        many = _is_list_of_inputs(x)
        items = list(x) if many else [x]
        if not items:
            raise ValueError(f"the {what} is empty")
        return many, [self.tokenize(i, add_bos=add_bos, special=special) if isinstance(i, str)
                      else [int(t) for t in i] for i in items]

    def _embed(self, toks: list[list[int]], pooling: str, normalize: bool, batch_size: int) -> list[list[float]]:
        """embed() of token lists: one vector each."""
        if pooling not in ("mean", "last"):
            raise ValueError(f"pooling must be mean or last, not {pooling!r}")
        for i, t in enumerate(toks):
            if not t:
                raise ValueError(f"input {i} has no tokens")
            if len(t) > self.n_ctx:
                raise ValueError(f"input {i} has {len(t)} tokens; ctx_size is {self.n_ctx}")
            if any(not 0 <= x < self.n_vocab for x in t):
                raise ValueError(f"input {i}: token ids must be in [0, {self.n_vocab})")
        out: list[list[float]] = []
        for b0 in range(0, len(toks), max(1, batch_size)):
            rows = self._exec.eval_scratch(toks[b0:b0 + batch_size], logits_all=pooling == "mean", embed=True)
            for r in rows:
                v = r.astype(np.float64).mean(axis=0) if pooling == "mean" else r[-1].astype(np.float64)
                if normalize:
                    v = v / max(float(np.linalg.norm(v)), 1e-12)
                out.append(v.astype(np.float32).tolist())
        return out

    def create_embedding(self, input: str | Sequence[int] | Sequence[str] | Sequence[Sequence[int]], *,
                         pooling: str = "mean", normalize: bool = True) -> dict[str, Any]:
        """OpenAI's embeddings response for `input` (embed's; one item per text)."""
        self._check_open()
        _, toks = self._input_tokens(input, "input", add_bos=True, special=False)
        vecs = self._embed(toks, pooling, normalize, EMBED_BATCH)
        n = sum(len(t) for t in toks)
        return {"object": "list", "model": os.path.basename(self.path),
                "data": [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vecs)],
                "usage": {"prompt_tokens": n, "total_tokens": n}}

    def eval_batch(self, batch: Sequence[tuple[int, Sequence[int]]], *, logits_all: bool = False) -> list[np.ndarray]:
        """Appends tokens to several sequences (distinct ids) in shared forward passes, as llama.cpp's
        llama_batch; returns each one's logits (the last, or all with logits_all)."""
        self._check_open()
        return self._exec.eval_batch([(int(s), [int(t) for t in toks]) for s, toks in batch], logits_all=logits_all)

    def apply_chat_template(self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True,
                            tools: ToolRequest | Sequence[Mapping[str, Any]] | None = None) -> str:
        """The conversation as the GGUF's template writes it; with `tools` (OpenAI's list, or a ToolRequest) the
        tools offered, in the template's own way (see superggml.tools). Earlier tool calls and results in the
        messages are written as the template expects them."""
        req = tools if isinstance(tools, ToolRequest) or tools is None else self.tool_request(tools)
        offered = req.tools if req is not None and req.active else []
        fmt = self.tool_format
        extra = {"tools": fmt.template_tools(offered)} if offered else {}
        return self.chat_template.render(fmt.messages(messages, offered), add_generation_prompt=add_generation_prompt,
                                         **extra)

    @property
    def tool_format(self) -> ToolFormat:
        """How this model's chat template offers tools and writes calls (superggml.tools: hermes, llama3,
        mistral or generic)."""
        if self._tool_format is None:
            self._tool_format = tool_format(self.chat_template.source, self.tokenizer)
        return self._tool_format

    def tool_request(self, tools: Sequence[Mapping[str, Any]] | None, tool_choice: Any = None,
                     parallel_tool_calls: bool = True) -> ToolRequest | None:
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

    def create_chat_completion(self, messages: Sequence[Mapping[str, Any]], *, max_tokens: int | None = None,
                               temperature: float = 0.2, top_p: float = 0.95, top_k: int = 40,
                               min_p: float = 0.05, repeat_penalty: float = 1.0, frequency_penalty: float = 0.0,
                               presence_penalty: float = 0.0, stop: str | Sequence[str] | None = None,
                               seed: int | None = None, stream: bool = False, logprobs: bool = False,
                               top_logprobs: int | None = None, response_format: Mapping[str, Any] | None = None,
                               grammar: str | Grammar | None = None,
                               json_schema: Mapping[str, Any] | str | None = None, regex: str | None = None,
                               tools: Sequence[Mapping[str, Any]] | None = None, tool_choice: Any = None,
                               parallel_tool_calls: bool = True) -> Any:
        """OpenAI-style chat completion using the GGUF's chat template. `logprobs`: each token's logprob (as
        create_completion's), with the `top_logprobs` (0-20) likeliest alternatives'. `response_format`,
        `grammar`, `json_schema`, `regex`: the reply's constraint, as create_completion's.

        `tools` (OpenAI's function list) go to the template; calls the model writes come back as the message's
        `tool_calls` with finish_reason "tool_calls". `tool_choice`: "auto" (default with tools), "none",
        "required" or {"type": "function", "function": {"name": ...}}; the last two constrain the reply to a
        valid call (of any tool, several with `parallel_tool_calls`; or of the named one)."""
        self._check_open()
        check_logprobs(top_logprobs, "top_logprobs")
        if top_logprobs is not None and not logprobs:
            raise ValueError("top_logprobs needs logprobs=True")
        req = self.tool_request(tools, tool_choice, parallel_tool_calls)
        constraint = self.chat_constraint(req, grammar=grammar, json_schema=json_schema, regex=regex,
                                          response_format=response_format)
        tokens = self.tokenize(self.apply_chat_template(messages, tools=req), add_bos=True, special=True)
        stops = stop_list(stop)
        sampling = sampling_options(temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p,
                                    repeat_penalty=repeat_penalty, frequency_penalty=frequency_penalty,
                                    presence_penalty=presence_penalty, seed=seed)
        return self._complete([tokens], 1, max_tokens, stops, sampling, stream=stream, chat=True,
                              logprobs=(top_logprobs or 0) if logprobs else None, grammar=constraint, tools=req)


Model.__init__.__signature__ = signature(  # type: ignore[attr-defined]
    inspect.Parameter("path", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation="str | os.PathLike[str]"))
Model.__doc__ = (Model.__doc__ or "").replace("{options}", options_doc())
