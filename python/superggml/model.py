"""superggml.Model: the facade, shaped like llama_cpp.Llama. It loads a GGUF (the runtime: executor, weight
placement, sequence memory), keeps the tokenizer, the chat template and the draft model, and delegates the rest:
decoding to generation/, the OpenAI shapes to api/ (inherited mixins)."""

from __future__ import annotations

import contextlib
import functools
import gc
import inspect
import os
from typing import Any, Iterator, Sequence

import numpy as np

from . import native
from .devices import servers_failed
from .api.chat import CHATML, ChatTemplate
from .api.completions import Completions, Constraints, Embeddings
from .api.tools import ToolFormat
from .arch import get_architecture
from .errors import ContextLengthError, GGUFError
from .generation.decode import generate_step
from .generation.grammar import Grammar, GrammarVocab
from .generation.sampling import Sampler, SamplingParams
from .generation import drafting
from .generation.engine import Stepper
from .metrics import Metrics, MetricsWriter
from .runtime.memory import saved
from .runtime.exec.executor import Executor
from .runtime.plan.memory_plan import MemoryPlan
from .runtime.plan.resolve import reopen, resolve
from .runtime.weights.routing import RoutingTrace
from .runtime.weights.pressure import LayerScheduler
from .settings import Settings, options_doc, parse_size, signature
from .tokenizer import Tokenizer

__all__ = ["Model", "parse_size"]

VOCAB_KEYS = ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.scores", "tokenizer.ggml.token_type")


def return_free_memory() -> None:
    """Hand freed heap back to the OS (glibc), so peak RSS stays low. The vocabulary's lists have gone by
    reference counting: a full collection (tens of ms in a large process) would find nothing more."""
    native.host_memory_trim()


class Model(Completions, Embeddings, Constraints):
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
    checks, in ``superggml.settings``, and ``Model.settings`` holds them (the documentation's command line
    page lists every one; so does ``help(Model)``, after this example).

    ```python
    with Model(path, ctx_size=2048) as m:
        print(m.create_completion("Once upon a time", max_tokens=16)["choices"][0]["text"])
    ```
    """

    def __init__(self, path: str | os.PathLike[str], **options: Any):
        s = Settings.from_options(options)
        c = s.context
        self.path = os.fspath(path)
        self.verbose, self.seed, self.logits_all = c.verbose, c.seed, c.logits_all
        self.metrics: Metrics | None = None
        self.speculator: Stepper | None = None
        self.closed = True
        self.running = False  # a runtime is up (restart_runtime brings one back after a failure)
        self.store: Any = None  # the weights (native.WeightStore) while running
        self._grammar_vocab: GrammarVocab | None = None
        self._tool_format: ToolFormat | None = None
        self.file = native.GGUFFile(self.path)
        with contextlib.ExitStack() as undo:  # a load that fails lets go of what it took, the file last
            undo.callback(self.file.close)
            undo.callback(self.drop_runtime)
            self.load(s)
            undo.pop_all()
        self.closed = False
        self.runtime.report(self.path)
        ms = self.settings.metrics
        if ms.enabled:
            self.metrics = Metrics(
                self, MetricsWriter(ms.metrics_file, pretty=ms.metrics_pretty), interval=ms.metrics_interval
            )
            self.runtime.passes.observe(self.metrics.on_layer_timings)
        tmpl = self.metadata.get("tokenizer.chat_template")
        tk = self.tokenizer
        self.chat_template = ChatTemplate(
            tmpl if isinstance(tmpl, str) else CHATML,
            bos_token=tk.token_to_piece(tk.bos_id).decode("utf-8", "replace") if tk.bos_id is not None else "",
            eos_token=tk.token_to_piece(tk.eos_id).decode("utf-8", "replace") if tk.eos_id is not None else "",
        )

    @classmethod
    def from_pretrained(
        cls,
        repo_id: str,
        filename: str | None = None,
        *,
        local_files_only: bool | None = None,
        cache_dir: str | None = None,
        **options: Any,
    ) -> "Model":
        """A Hugging Face Hub repository's GGUF, as ``llama_cpp.Llama.from_pretrained`` opens it: ``filename`` a
        glob of the repo's files (None: its Q4_K_M file, else its first GGUF), taken from the hub's cache, or
        downloaded into it (needs the ``hub`` extra). Offline (``HF_HUB_OFFLINE=1`` or ``local_files_only``) only
        the cache is read; a file it lacks is a ``FileNotFoundError`` naming the repo and the pattern.
        ``options`` are the constructor's."""
        from . import hub

        return cls(hub.download(repo_id, filename, local_files_only=local_files_only, cache_dir=cache_dir), **options)

    def load(self, s: Settings) -> None:
        """The architecture, the weights and the runtime (the settings resolved once: runtime/plan/resolve.py), the
        tokenizer, the speculator."""
        self.metadata: dict[str, Any] = self.file.metadata()
        self.tensor_info = {name: (typ, tuple(shape), off, nb) for name, typ, shape, off, nb in self.file.tensors()}
        self.arch = get_architecture(self.metadata, self.tensor_info)
        self.hparams = self.arch.hp
        self.arch.validate({n: v[1] for n, v in self.tensor_info.items()})
        self.file.drop_header()  # read into metadata: the C++ copy of the vocabulary (~17 MiB) goes
        self.store = native.WeightStore(self.file)
        resolved = resolve(s, self.arch, self.store)
        self.runtime = Executor(self.arch, self.store, resolved)  # it holds the devices; the model what they settled
        self.running = True
        self.settings = resolved.settings
        self.memory_plan: MemoryPlan | None = resolved.memory_plan
        self.repacked_bytes = self.runtime.placement.repacked_bytes
        self.tokenizer = Tokenizer.from_metadata(self.metadata)
        for key in VOCAB_KEYS:  # held by the tokenizer now; tens of MB as lists
            self.metadata.pop(key, None)
        return_free_memory()  # the vocabulary's transient objects
        if self.tokenizer.n_vocab != self.hparams.n_vocab:
            raise GGUFError(f"vocabulary has {self.tokenizer.n_vocab} tokens but the model {self.hparams.n_vocab}")
        if self.settings.speculative.enabled:
            self.speculator = drafting.make_speculator(self, Model)

    def drop_runtime(self) -> None:
        """Closes the executor and lets go of it and the weights, before the file (they point into its tensors);
        either may be missing (a load or a restart that failed)."""
        if self.running:
            self.running = False
            self.runtime.close()
            del self.runtime
        self.store = None

    def restart_runtime(self) -> None:
        """After an RPC server it used failed: the weights and the sequences on it are gone. Reconnects and
        loads the model again, with its sequences empty and its settings and memory plan as resolved at load
        (DeviceError while the server is still down)."""
        self.drop_runtime()
        gc.collect()  # the buffers on the failed server, and with them ggml's connection to it
        self.store = native.WeightStore(self.file)
        resolved = reopen(self.settings, self.memory_plan, self.store, self.hparams.n_layer)
        self.runtime = Executor(self.arch, self.store, resolved)
        self.running = True
        if self.metrics is not None:
            self.runtime.passes.observe(self.metrics.on_layer_timings)

    # -- lifecycle ---------------------------------------------------------
    def close(self) -> None:
        """Frees the KV cache and unmaps the file; the model is unusable after."""
        if not getattr(self, "closed", True):
            self.closed = True
            if self.metrics is not None:
                self.metrics.close()
            if self.speculator is not None:
                self.speculator.close()
            self.drop_runtime()
            self.file.close()

    def __enter__(self) -> "Model":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def check_open(self) -> None:
        if self.closed:
            raise RuntimeError("the model is closed")
        if not self.running or servers_failed(self.runtime.endpoints):
            self.restart_runtime()

    # -- properties --------------------------------------------------------
    @property
    def n_ctx(self) -> int:
        return self.settings.context.ctx_size

    @property
    def n_vocab(self) -> int:
        return self.hparams.n_vocab

    @property
    def n_tokens(self) -> int:
        return self.runtime.seq.n_past

    @property
    def n_threads(self) -> int:
        """Compute threads in use now (one fewer while decoding from a stream, when chosen automatically)."""
        return self.runtime.backend.n_threads

    @property
    def tokens(self) -> list[int]:
        """What the current sequence's K/V holds."""
        return list(self.runtime.seq.tokens)

    @property
    def scores(self) -> np.ndarray | None:
        """Logits of the last eval: [n_tokens, n_vocab] with logits_all, else [1, n_vocab]."""
        return self.runtime.seq.scores

    @property
    def logits(self) -> np.ndarray:
        """Logits after the last token fed, F32 [n_vocab]."""
        if self.runtime.seq.scores is None:
            raise RuntimeError("no logits yet: eval() some tokens first")
        return self.runtime.seq.scores[-1]

    @property
    def kv_bytes(self) -> int:
        """Bytes of a contiguous K/V cache for the whole context (what paged_kv pages)."""
        return self.runtime.kv_bytes

    @property
    def device(self) -> tuple[str, str]:
        """(type, name) of the compute device (of the first, with a multi-device split): ("cpu", "CPU")."""
        return self.runtime.backend.device_type, self.runtime.backend.device_name

    # -- paging ------------------------------------------------------------
    def time_blocks(self, blocks: Sequence[int], *, repeats: int = 3) -> dict[int | str, float]:
        """Seconds of computation of each of `blocks` and of the lm head ("head") for one decoded token, only
        their weights read (Executor.time_blocks; what `superggml analyze` samples)."""
        self.check_open()
        return self.runtime.time_blocks(blocks, repeats=repeats)

    def stats(self) -> dict[str, Any]:
        """One dict of counters: the current sequence (sequence, n_sequences, n_tokens), the threads and
        devices (n_threads, devices, blocks_per_device), the background load (weights_loading); with paged
        weights the layer pager's (loads, hits, evictions, bytes_loaded, wait_seconds, read_seconds, pending,
        n_slots, slot_size, layers_pinned, direct_io, staged_io), with dynamic_layers the scheduler's
        (layers_demoted, layers_promoted) and with paged_kv the KV cache's (kv_*)."""
        self.check_open()
        st = self.runtime.stats()
        if self.speculator is not None:
            st.update(self.speculator.stats())
            streamed = int(st.get("bytes_loaded", 0)) + int(st.get("expert_bytes_loaded", 0))
            st["bytes_streamed_per_token"] = streamed / max(self.speculator.generated, 1)
        return st

    def layer_events(self) -> list[dict[str, Any]]:
        """The scheduler's moves so far: {"event": "layer_demote"|"layer_promote", "layer", "t",
        "pressure", "n_slots", "pinned"}; empty without dynamic_layers."""
        self.check_open()
        sch = self.runtime.placement.scheduler
        return list(sch.events) if sch is not None else []

    def record_routing(self, on: bool = True) -> RoutingTrace | None:
        """Records the expert cache's requests (each layer's routed experts) and its loads per layer from now on
        (on), or stops; returns the trace recorded until now. `trace.table()` holds the loads against Belady's
        optimum for the same slots (runtime/weights/routing.py). ValueError for a model whose experts do not page."""
        self.check_open()
        experts = self.runtime.placement.experts
        if experts is None:
            raise ValueError(
                "record_routing: this model's experts do not page (a MoE model with expert_cache or a budget)"
            )
        return experts.record_routing(on)

    def routing_trace(self) -> RoutingTrace | None:
        """The trace being recorded (record_routing), None when none is."""
        self.check_open()
        experts = self.runtime.placement.experts
        return experts.trace if experts is not None else None

    @property
    def scheduler(self) -> LayerScheduler | None:
        """The memory-pressure scheduler with dynamic_layers (its ``memory`` reading may be replaced)."""
        return self.runtime.placement.scheduler

    @property
    def record_timings(self) -> bool:
        """Whether every forward pass records per-layer timings (``timings``); on with metrics."""
        return self.runtime.passes.record_timings

    @record_timings.setter
    def record_timings(self, on: bool) -> None:
        self.runtime.passes.record_timings = bool(on)

    @property
    def timings(self) -> list[dict[str, Any]]:
        """Per-step timings of the last forward pass (with record_timings): layer, kind ("embed", "block",
        "head"), t_start, t_end, wait_ms, load_ms, compute_ms."""
        return [dict(t) for t in self.runtime.passes.timings]

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
        return self.runtime.seq.id

    def use_sequence(self, seq: int) -> None:
        """Makes `seq` the sequence eval/generate extend. Several sequences keep their own cached context (a
        server interleaves requests this way): pages of the paged KV cache, or without it K/V storage of
        ctx_size tokens each."""
        self.check_open()
        self.runtime.sequences.use(seq)

    def drop_sequence(self, seq: int) -> None:
        """Frees the cached context of `seq` (its KV pages); the current sequence is emptied instead."""
        self.check_open()
        self.runtime.sequences.drop(seq)

    def truncate(self, n: int) -> int:
        """Keeps the first `n` tokens of the current sequence's context, freeing the K/V after them; returns
        the tokens kept (none when sliding-window layers already freed keys position `n` needs: see swa_full)."""
        self.check_open()
        return self.runtime.sequences.truncate(n)

    def reset(self) -> None:
        """Forgets the cached context."""
        self.truncate(0)

    def save_sequence(self, path: str | os.PathLike[str]) -> None:
        """Writes the current sequence (its tokens, last logits and memory) to `path` (runtime/memory/saved.py)."""
        self.check_open()
        saved.save(self.runtime.saving, os.fspath(path), self.identity)

    def load_sequence(self, path: str | os.PathLike[str]) -> int:
        """Makes the current sequence the one saved at `path`; returns its tokens. SavedSequenceError if the
        file is another model's or cache type's, or damaged."""
        self.check_open()
        return saved.load(self.runtime.saving, os.fspath(path), self.identity)

    @functools.cached_property
    def identity(self) -> str:
        """A hash of the GGUF's header and of samples of its data (saved sequences name their model by it)."""
        return saved.model_identity(self.path)

    # -- evaluation ----------------------------------------------------------
    def eval(self, tokens: Sequence[int], *, logits_all: bool | None = None) -> np.ndarray:
        """Appends `tokens` to the context and returns their logits (see `scores`)."""
        self.check_open()
        tokens = [int(t) for t in tokens]
        scores = self.runtime.eval(tokens, logits_all=self.logits_all if logits_all is None else logits_all)
        if self.metrics is not None:
            if len(tokens) == 1 and self.metrics.prompt_tokens:
                self.metrics.on_token()
            else:
                self.metrics.on_prompt(len(tokens))
        return scores

    def generate(
        self,
        tokens: Sequence[int],
        *,
        temp: float = 0.8,
        top_k: int = 40,
        top_p: float = 0.95,
        min_p: float = 0.05,
        repeat_penalty: float = 1.0,
        repeat_last_n: int = 64,
        frequency_penalty: float = 0.0,
        presence_penalty: float = 0.0,
        seed: int | None = None,
        reset: bool = True,
        grammar: Grammar | None = None,
    ) -> Iterator[int]:
        """Yields sampled tokens after `tokens`, forever (stop by leaving the loop); with `grammar` (see
        `Model.grammar`) only tokens it allows, an end-of-generation token once it is complete."""
        self.check_open()
        sampler = self.sampler(SamplingParams.pick(dict(locals(), temperature=temp)))
        matcher = self.matcher(grammar)
        for tok, _ in generate_step(self, tokens, sampler, reset=reset, matcher=matcher):
            yield tok

    def completion_limit(self, prompt_tokens: Sequence[int], max_tokens: int | None) -> int:
        """The tokens a completion of `prompt_tokens` may add: the context left, at most max_tokens (> 0)."""
        if not prompt_tokens:
            raise ValueError("the prompt is empty")
        if len(prompt_tokens) >= self.n_ctx:
            raise ContextLengthError(f"the prompt has {len(prompt_tokens)} tokens; ctx_size is {self.n_ctx}")
        limit = self.n_ctx - len(prompt_tokens)
        if max_tokens is not None and max_tokens > 0:
            limit = min(limit, max_tokens)
        return limit

    def sampler(self, params: SamplingParams, seed: int | None = None) -> Sampler:
        """A sampler of `params`, drawing from `seed` (None: params.seed, and if that is None the model's)."""
        seed = params.seed if seed is None else seed
        return Sampler(params, seed=self.seed if seed is None else seed)

    def eval_batch(self, batch: Sequence[tuple[int, Sequence[int]]], *, logits_all: bool = False) -> list[np.ndarray]:
        """Appends tokens to several sequences (distinct ids) in shared forward passes, as llama.cpp's
        llama_batch; returns each one's logits (the last, or all with logits_all)."""
        self.check_open()
        return self.runtime.eval_batch([(int(s), [int(t) for t in toks]) for s, toks in batch], logits_all=logits_all)


Model.__init__.__signature__ = signature(  # type: ignore[attr-defined]
    inspect.Parameter("path", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation="str | os.PathLike[str]")
)
Model.__doc__ = (Model.__doc__ or "").rstrip() + "\n\n    The options:\n\n" + options_doc() + "\n"
