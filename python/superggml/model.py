"""superggml.Model: the high-level API, shaped like llama_cpp.Llama."""

from __future__ import annotations

import ctypes
import gc
import os
import re
import sys
import time
import uuid
from typing import IO, Any, Iterator, Mapping, Sequence

import numpy as np

from . import _core
from .arch import get_architecture
from .chat import CHATML, ChatTemplate
from .errors import GGUFError
from .executor import Executor, ExecutorParams
from .metrics import Metrics, MetricsWriter
from .sampling import Sampler, SamplingParams
from .tokenizer import Tokenizer


_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 1024, "m": 1000**2, "mb": 1000**2, "mib": 1024**2,
          "g": 1000**3, "gb": 1000**3, "gib": 1024**3, "t": 1000**4, "tb": 1000**4, "tib": 1024**4}


def parse_size(v: int | str | None) -> int | None:
    """Bytes from 123, "512MiB", "2GB", "1.5 GiB"; None stays None. ValueError otherwise."""
    if v is None or isinstance(v, int):
        if isinstance(v, int) and v < 0:
            raise ValueError("a size must be >= 0")
        return v
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(v))
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"not a size: {v!r} (examples: 512MiB, 2GB, 1048576)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def _return_free_memory() -> None:
    """Collect garbage and hand freed heap back to the OS (glibc), so peak RSS stays low."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _layer_split(shares: Sequence[float] | None, n_dev: int, n_layer: int) -> tuple[int, ...]:
    """Blocks per device from llama.cpp-style proportions (cumulative rounding); () for the default."""
    if not shares:
        return ()
    if len(shares) != n_dev or any(x < 0 for x in shares) or sum(shares) <= 0:
        raise ValueError(f"tensor_split needs {n_dev} non-negative shares, not {list(shares)}")
    total, acc, out, prev = float(sum(shares)), 0.0, [], 0
    for x in shares:
        acc += x
        cut = round(n_layer * acc / total)
        out.append(cut - prev)
        prev = cut
    return tuple(out)


def _want_direct_io(path: str) -> bool:
    """O_DIRECT pays off when the file cannot stay in the page cache: larger than what is available."""
    return os.path.getsize(path) > int(_core.host_memory()["available"])


def _default_threads() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


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
    ``layer_stats()`` counts the moves and ``layer_events()`` lists them.
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
    activations are copied where the device changes.

    ``metrics`` (or a ``metrics_file``, a path or a text stream) writes
    JSON-lines metrics (docs/design.md's schema, ``superggml.metrics.schema()``):
    a snapshot every ``metrics_interval`` generated tokens, per-layer timing
    lines and the scheduler's moves; stderr unless a file is given.
    Streamed and resident runs give bit-identical logits (with repack off).

    >>> with Model(path, ctx_size=2048) as m:
    ...     print(m.create_completion("Once upon a time", max_tokens=16)["choices"][0]["text"])
    """

    def __init__(self, path: str | os.PathLike[str], *, ctx_size: int = 4096, n_batch: int = 512,
                 n_threads: int | None = None, seed: int | None = None, flash_attn: bool = False,
                 kv_type: str = "f16", repack: bool = True, logits_all: bool = False, verbose: bool = False,
                 device_budget: int | str | None = None, n_gpu_layers: int | None = None,
                 async_prefetch: bool = False, prefetch_depth: int = 2, dynamic_layers: bool = False,
                 mem_pressure: float = 0.85, direct_io: bool | None = None, staged_io: bool = False,
                 paged_kv: bool = False, kv_page_size: int = 256, kv_device_layers: int | None = None,
                 host_budget: int | str | None = None, kv_spill_dir: str | os.PathLike[str] | None = None,
                 metrics: bool = False, metrics_file: str | os.PathLike[str] | IO[str] | None = None,
                 metrics_pretty: bool = False, metrics_interval: int = 1,
                 devices: Sequence[str] | None = None, tensor_split: Sequence[float] | None = None):
        if ctx_size < 1:
            raise ValueError("ctx_size must be >= 1")
        if not 0.0 < mem_pressure <= 1.0:
            raise ValueError(f"mem_pressure must be in (0, 1], not {mem_pressure}")
        if n_batch < 1:
            raise ValueError("n_batch must be >= 1")
        self.path = os.fspath(path)
        self.verbose = verbose
        self.seed = seed
        self.logits_all = logits_all
        self._file = _core.GGUFFile(self.path)
        try:
            self.metadata: dict[str, Any] = self._file.metadata()
            self.arch = get_architecture(self.metadata)
            self.hparams = self.arch.hp
            self.tensor_info = {name: (typ, tuple(shape), off, nb)
                                for name, typ, shape, off, nb in self._file.tensors()}
            self.arch.validate({n: v[1] for n, v in self.tensor_info.items()})
            self._store = _core.WeightStore(self._file)
            self._exec = Executor(self.arch, self._store, ExecutorParams(
                n_ctx=ctx_size, n_batch=min(n_batch, ctx_size), n_threads=n_threads or _default_threads(),
                n_threads_auto=n_threads is None,
                flash_attn=flash_attn, kv_type=kv_type, device_budget=parse_size(device_budget),
                async_prefetch=async_prefetch, prefetch_depth=prefetch_depth, n_gpu_layers=n_gpu_layers,
                dynamic_layers=dynamic_layers, mem_pressure=mem_pressure,
                direct_io=_want_direct_io(self.path) if direct_io is None else bool(direct_io),
                staged_io=staged_io, devices=tuple(devices or ()),
                layer_split=_layer_split(tensor_split, len(devices or ()), self.hparams.n_layer),
                paged_kv=paged_kv, kv_page_size=kv_page_size,
                kv_device_layers=kv_device_layers, kv_host_budget=parse_size(host_budget),
                kv_spill_dir=os.fspath(kv_spill_dir) if kv_spill_dir is not None else None),
                # resident weights load in the background, block by block, while the KV cache and the
                # tokenizer are built and the first pass computes; streamed ones go through the pager
                preload_repack=repack)
            self.repacked_bytes = self._exec.repacked_bytes
            self.tokenizer = Tokenizer.from_metadata(self.metadata)
            for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.scores",
                        "tokenizer.ggml.token_type"):   # held by the tokenizer now; tens of MB as lists
                self.metadata.pop(key, None)
            self._file.drop_header()
            _return_free_memory()   # the vocabulary's transient objects
            if self.tokenizer.n_vocab != self.hparams.n_vocab:
                raise GGUFError(f"vocabulary has {self.tokenizer.n_vocab} tokens but the model "
                                f"{self.hparams.n_vocab}")
        except BaseException:
            if "_exec" in self.__dict__:
                self._exec.close()
            self.__dict__.pop("_exec", None)    # before the file: they point into its tensors
            self.__dict__.pop("_store", None)
            self._file.close()
            raise
        if verbose:
            hp = self.hparams
            print(f"superggml: {self.path}: {hp.arch}, {hp.n_layer} blocks, n_embd {hp.n_embd}, "
                  f"vocab {hp.n_vocab}; ctx {ctx_size}, {self.n_threads} threads, "
                  f"{self.repacked_bytes / 2**20:.0f} MiB re-laid, KV {self._exec.kv_bytes / 2**20:.0f} MiB",
                  file=sys.stderr)
        self._metrics: Metrics | None = None
        if metrics or metrics_file is not None:
            if metrics_interval < 1:
                self.close()
                raise ValueError("metrics_interval must be >= 1 token")
            self._metrics = Metrics(self, MetricsWriter(metrics_file, pretty=metrics_pretty),
                                    interval=metrics_interval)
            self._exec.record_timings = True
        self._tokens: list[int] = []     # what the KV cache holds (for the current sequence)
        self._seq = 0
        self._other_seqs: dict[int, tuple[list[int], np.ndarray | None]] = {}
        self._scores: np.ndarray | None = None
        self._closed = False
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
            self._exec.close()
            del self._exec
            del self._store
            self._file.close()

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
        return self._exec.params.n_ctx

    @property
    def n_vocab(self) -> int:
        return self.hparams.n_vocab

    @property
    def n_tokens(self) -> int:
        return len(self._tokens)

    @property
    def n_threads(self) -> int:
        return self._exec.backend.n_threads

    @property
    def tokens(self) -> list[int]:
        return list(self._tokens)

    @property
    def scores(self) -> np.ndarray | None:
        """Logits of the last eval: [n_tokens, n_vocab] with logits_all, else [1, n_vocab]."""
        return self._scores

    @property
    def logits(self) -> np.ndarray:
        """Logits after the last token fed, F32 [n_vocab]."""
        if self._scores is None:
            raise RuntimeError("no logits yet: eval() some tokens first")
        return self._scores[-1]

    # -- paging ------------------------------------------------------------
    def layer_stats(self) -> dict[str, Any]:
        """Counters of the layer pager, the scheduler and the paged KV cache (kv_*; empty when
        everything is resident):
        loads, hits, evictions, bytes_loaded, wait_seconds, read_seconds, n_slots, slot_size,
        layers_pinned, and with dynamic_layers layers_demoted / layers_promoted."""
        self._check_open()
        ex = self._exec
        d: dict[str, Any] = dict(ex.kv.stats()) if ex.kv is not None else {}
        if ex.pager is None:
            return d
        d.update(ex.pager.stats())
        d.update(n_slots=ex.pager.n_slots, slot_size=ex.pager.slot_size, direct_io=ex.pager.direct_io,
                 staged_io=ex.pager.staged,
                 layers_pinned=sum(ex.pager.pinned(k) for k in range(ex.pager.n_layers)))
        if ex.scheduler is not None:
            d.update(ex.scheduler.stats())
        return d

    def layer_events(self) -> list[dict[str, Any]]:
        """The scheduler's moves so far: {"event": "layer_demote"|"layer_promote", "layer", "t",
        "pressure", "n_slots", "pinned"}; empty without dynamic_layers."""
        self._check_open()
        sch = self._exec.scheduler
        return list(sch.events) if sch is not None else []

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

    # -- evaluation ----------------------------------------------------------
    # -- sequences (paged_kv) ---------------------------------------------------
    @property
    def sequence(self) -> int:
        return self._seq

    def use_sequence(self, seq: int) -> None:
        """Makes `seq` the sequence eval/generate extend. With paged_kv several sequences keep their own
        cached context (a server interleaves requests this way); without it only sequence 0 exists."""
        self._check_open()
        if seq == self._seq:
            return
        self._exec.use_sequence(seq)
        self._other_seqs[self._seq] = (self._tokens, self._scores)
        self._tokens, self._scores = self._other_seqs.pop(seq, ([], None))
        self._seq = seq

    def drop_sequence(self, seq: int) -> None:
        """Frees the cached context of `seq` (its KV pages); the current sequence is reset instead."""
        self._check_open()
        if seq == self._seq:
            self.reset()
            return
        self._exec.drop_sequence(seq)
        self._other_seqs.pop(seq, None)

    def reset(self) -> None:
        """Forgets the cached context."""
        self._check_open()
        self._exec.reset(0)
        self._tokens = []
        self._scores = None

    def eval(self, tokens: Sequence[int], *, logits_all: bool | None = None) -> np.ndarray:
        """Appends `tokens` to the context and returns their logits (see `scores`)."""
        self._check_open()
        tokens = [int(t) for t in tokens]
        la = self.logits_all if logits_all is None else logits_all
        self._scores = self._exec.eval(tokens, logits_all=la)
        self._tokens.extend(tokens)
        if self._metrics is not None:
            self._metrics.on_layer_timings(self._exec.timings)
            if len(tokens) == 1 and self._metrics.prompt_tokens:
                self._metrics.on_token()
            else:
                self._metrics.on_prompt(len(tokens))
        return self._scores

    def _prefill(self, tokens: Sequence[int]) -> np.ndarray:
        """Brings the cache to `tokens`, reusing the longest cached prefix; returns last logits."""
        tokens = list(tokens)
        if not tokens:
            raise ValueError("the prompt is empty")
        keep = 0
        for a, b in zip(self._tokens, tokens[:-1]):
            if a != b:
                break
            keep += 1
        self._exec.reset(keep)
        del self._tokens[keep:]
        return self.eval(tokens[keep:], logits_all=False)[-1]

    def generate(self, tokens: Sequence[int], *, temp: float = 0.8, top_k: int = 40, top_p: float = 0.95,
                 min_p: float = 0.05, repeat_penalty: float = 1.0, repeat_last_n: int = 64,
                 frequency_penalty: float = 0.0, presence_penalty: float = 0.0,
                 seed: int | None = None, reset: bool = True) -> Iterator[int]:
        """Yields sampled tokens after `tokens`, forever (stop by leaving the loop)."""
        self._check_open()
        sampler = Sampler(SamplingParams(temperature=temp, top_k=top_k, top_p=top_p, min_p=min_p,
                                         repeat_penalty=repeat_penalty, repeat_last_n=repeat_last_n,
                                         frequency_penalty=frequency_penalty,
                                         presence_penalty=presence_penalty),
                          seed=self.seed if seed is None else seed)
        logits = self._prefill(tokens) if reset or not self._tokens else self.eval(tokens)[-1]
        while True:
            tok = sampler.sample(logits, self._tokens)
            yield tok
            if self.n_tokens >= self.n_ctx:
                return
            logits = self.eval([tok])[-1]

    # -- completions ---------------------------------------------------------
    def _completion_stream(self, prompt_tokens: list[int], max_tokens: int | None, stop: Sequence[str],
                           sampling: Mapping[str, Any]) -> Iterator[tuple[str, str | None, int]]:
        """Yields (text piece, finish_reason or None, completion token count)."""
        if len(prompt_tokens) >= self.n_ctx:
            raise ValueError(f"prompt has {len(prompt_tokens)} tokens; ctx_size is {self.n_ctx}")
        limit = self.n_ctx - len(prompt_tokens)
        if max_tokens is not None and max_tokens > 0:
            limit = min(limit, max_tokens)
        pending = b""
        text = ""
        sent = 0
        n = 0
        finish = "length"
        holdback = max((len(s) for s in stop), default=0)
        for tok in self.generate(prompt_tokens, **sampling):
            if self.tokenizer.is_eog(tok):
                finish = "stop"
                break
            n += 1
            pending += self.tokenizer.token_to_piece(tok, special=False)
            try:
                text += pending.decode("utf-8")
                pending = b""
            except UnicodeDecodeError:
                if len(pending) > 8:
                    text += pending.decode("utf-8", errors="replace")
                    pending = b""
            hit = min((i for i in (text.find(s, max(0, sent - len(s))) for s in stop) if i >= 0), default=-1)
            if hit >= 0:
                text = text[:hit]
                finish = "stop"
                break
            safe = len(text) - holdback
            if safe > sent:
                yield text[sent:safe], None, n
                sent = safe
            if n >= limit:
                break
        if pending:
            text += pending.decode("utf-8", errors="replace")
        yield text[sent:], finish, n

    def create_completion(self, prompt: str | Sequence[int], *, max_tokens: int | None = 16,
                          temperature: float = 0.8, top_p: float = 0.95, top_k: int = 40, min_p: float = 0.05,
                          repeat_penalty: float = 1.0, frequency_penalty: float = 0.0,
                          presence_penalty: float = 0.0, stop: str | Sequence[str] | None = None,
                          seed: int | None = None, stream: bool = False, echo: bool = False,
                          add_bos: bool = True) -> Any:
        """OpenAI-style text completion (dict, or an iterator of chunks with stream=True)."""
        self._check_open()
        prompt_tokens = (self.tokenize(prompt, add_bos=add_bos, special=True) if isinstance(prompt, str)
                         else [int(t) for t in prompt])
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        sampling = dict(temp=temperature, top_p=top_p, top_k=top_k, min_p=min_p, repeat_penalty=repeat_penalty,
                        frequency_penalty=frequency_penalty, presence_penalty=presence_penalty, seed=seed)
        cid = f"cmpl-{uuid.uuid4()}"
        created = int(time.time())
        model_name = os.path.basename(self.path)
        prefix = prompt if (echo and isinstance(prompt, str)) else ""
        gen = self._completion_stream(prompt_tokens, max_tokens, stops, sampling)

        def chunk(text: str, finish: str | None) -> dict[str, Any]:
            return {"id": cid, "object": "text_completion", "created": created, "model": model_name,
                    "choices": [{"text": text, "index": 0, "logprobs": None, "finish_reason": finish}]}

        if stream:
            def it() -> Iterator[dict[str, Any]]:
                if prefix:
                    yield chunk(prefix, None)
                for piece, finish, _ in gen:
                    if piece or finish:
                        yield chunk(piece, finish)
            return it()
        parts, finish, n = [prefix], "length", 0
        for piece, fin, n in gen:
            parts.append(piece)
            finish = fin or finish
        out = chunk("".join(parts), finish)
        out["usage"] = {"prompt_tokens": len(prompt_tokens), "completion_tokens": n,
                        "total_tokens": len(prompt_tokens) + n}
        return out

    def apply_chat_template(self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True) -> str:
        return self.chat_template.render(messages, add_generation_prompt=add_generation_prompt)

    def create_chat_completion(self, messages: Sequence[Mapping[str, Any]], *, max_tokens: int | None = None,
                               temperature: float = 0.2, top_p: float = 0.95, top_k: int = 40,
                               min_p: float = 0.05, repeat_penalty: float = 1.0, frequency_penalty: float = 0.0,
                               presence_penalty: float = 0.0, stop: str | Sequence[str] | None = None,
                               seed: int | None = None, stream: bool = False) -> Any:
        """OpenAI-style chat completion using the GGUF's chat template."""
        prompt = self.apply_chat_template(messages)
        tokens = self.tokenize(prompt, add_bos=True, special=True)
        res = self.create_completion(tokens, max_tokens=max_tokens, temperature=temperature, top_p=top_p,
                                     top_k=top_k, min_p=min_p, repeat_penalty=repeat_penalty,
                                     frequency_penalty=frequency_penalty, presence_penalty=presence_penalty,
                                     stop=stop, seed=seed, stream=stream)
        cid = f"chatcmpl-{uuid.uuid4()}"
        if stream:
            def it() -> Iterator[dict[str, Any]]:
                first = True
                for c in res:
                    ch = c["choices"][0]
                    delta: dict[str, Any] = {"role": "assistant"} if first else {}
                    first = False
                    if ch["text"]:
                        delta["content"] = ch["text"]
                    yield {"id": cid, "object": "chat.completion.chunk", "created": c["created"],
                           "model": c["model"], "choices": [{"index": 0, "delta": delta,
                                                             "finish_reason": ch["finish_reason"]}]}
            return it()
        ch = res["choices"][0]
        return {"id": cid, "object": "chat.completion", "created": res["created"], "model": res["model"],
                "choices": [{"index": 0, "message": {"role": "assistant", "content": ch["text"]},
                             "finish_reason": ch["finish_reason"]}],
                "usage": res["usage"]}
