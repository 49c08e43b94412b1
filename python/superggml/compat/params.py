"""llama_cpp.Llama's constructor keywords, and how each maps onto superggml's Model options."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any, Sequence

from .. import native
from .helpers import LLAMA_DEFAULT_SEED, cache_type, gpu_options

POOLING = {-1: "mean", 1: "mean", 3: "last"}  # llama_pooling_type: unspecified, mean, last


class NotInSuperggml(NotImplementedError, AttributeError):
    """A part of llama-cpp-python that superggml does not have (an AttributeError too, so hasattr() says no)."""


@dataclass
class LlamaParams:
    """llama_cpp.Llama's keywords (0.3.x), with its defaults. Each is mapped onto Model's options
    (model_options), accepted without effect where superggml has no such knob (use_mmap, use_mlock, numa,
    offload_kqv, op_offload, no_perf, split_mode, attention_type), or refused with NotImplementedError."""

    n_gpu_layers: int = 0
    split_mode: int = 1
    main_gpu: int = 0
    tensor_split: Sequence[float] | None = None
    vocab_only: bool = False
    use_mmap: bool = True
    use_mlock: bool = False
    kv_overrides: dict[str, Any] | None = None
    seed: int = LLAMA_DEFAULT_SEED
    n_ctx: int = 512
    n_batch: int = 512
    n_ubatch: int = 512
    n_threads: int | None = None
    n_threads_batch: int | None = None
    rope_scaling_type: int | None = -1
    pooling_type: int = -1
    attention_type: int = -1
    rope_freq_base: float = 0.0
    rope_freq_scale: float = 0.0
    yarn_ext_factor: float = -1.0
    yarn_attn_factor: float = 1.0
    yarn_beta_fast: float = 32.0
    yarn_beta_slow: float = 1.0
    yarn_orig_ctx: int = 0
    logits_all: bool = False
    embedding: bool = False
    offload_kqv: bool = True
    flash_attn: bool = False
    op_offload: bool | None = None
    swa_full: bool | None = None
    no_perf: bool = False
    last_n_tokens_size: int = 64
    lora_base: str | None = None
    lora_scale: float = 1.0
    lora_path: str | None = None
    numa: bool | int = False
    chat_format: str | None = None
    chat_handler: Any = None
    draft_model: Any = None
    tokenizer: Any = None
    type_k: int | str | None = None
    type_v: int | str | None = None
    spm_infill: bool = False
    verbose: bool = True

    @classmethod
    def split(cls, kwargs: dict[str, Any]) -> tuple[LlamaParams, dict[str, Any]]:
        """(llama_cpp's keywords, the rest: superggml's own options, such as device_budget)."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in kwargs.items() if k in names}), {
            k: v for k, v in kwargs.items() if k not in names
        }

    def refuse(self) -> None:
        """NotImplementedError for what superggml cannot do, naming it and why."""
        why = {
            "lora_path": "superggml does not apply LoRA adapters",
            "kv_overrides": "superggml reads the GGUF's metadata as written (no overrides)",
            "chat_handler": "superggml formats chats with the GGUF's own template (chat_handler objects are "
            "llama-cpp-python's)",
            "tokenizer": "superggml uses the GGUF's own tokenizer",
        }
        for name, reason in why.items():
            if getattr(self, name):
                raise NotImplementedError(f"{name}: {reason}")
        scaling = {
            "rope_freq_base": 0.0,
            "rope_freq_scale": 0.0,
            "yarn_ext_factor": -1.0,
            "yarn_attn_factor": 1.0,
            "yarn_orig_ctx": 0,
        }
        for name, default in scaling.items():
            if getattr(self, name) != default:
                raise NotImplementedError(f"{name}={getattr(self, name)}: superggml uses the GGUF's RoPE settings")
        if self.rope_scaling_type not in (None, -1):
            raise NotImplementedError("rope_scaling_type: superggml uses the GGUF's RoPE scaling")
        if self.chat_format not in (None, "chatml"):
            raise NotImplementedError(
                f"chat_format={self.chat_format!r}: superggml formats chats with the GGUF's own template, or "
                "chatml's (chat_format='chatml')"
            )
        if self.pooling_type not in POOLING:
            raise NotImplementedError(
                f"pooling_type={self.pooling_type}: superggml pools embeddings by mean (1) or last token (3)"
            )

    def model_options(self, path: str, metadata: dict[str, Any]) -> dict[str, Any]:
        """Model's options for these keywords, on this machine's devices."""
        arch = str(metadata.get("general.architecture", ""))
        n_ctx = self.n_ctx or int(metadata.get(f"{arch}.context_length", 4096))
        n_layer = int(metadata.get(f"{arch}.block_count", 0))
        out: dict[str, Any] = dict(
            ctx_size=n_ctx,
            n_batch=max(1, min(self.n_batch, self.n_ubatch)),
            n_threads=self.n_threads,
            flash_attn=bool(self.flash_attn),
            logits_all=self.logits_all,
            verbose=self.verbose,
            seed=None if self.seed == LLAMA_DEFAULT_SEED else self.seed,
        )
        for name, t in (("cache_type_k", self.type_k), ("cache_type_v", self.type_v)):
            ct = cache_type(t, name)
            if ct is not None:
                out[name] = ct
        if self.swa_full is not None:
            out["swa_full"] = self.swa_full
        out.update(self.draft_options())
        out.update(gpu_options(native.devices(), n_layer, self.n_gpu_layers, self.main_gpu, self.tensor_split))
        return out

    def draft_options(self) -> dict[str, Any]:
        """A draft model's path, or llama_cpp's LlamaPromptLookupDecoding (its n-gram size)."""
        d = self.draft_model
        if d is None:
            return {}
        if isinstance(d, (str, os.PathLike)):
            return {"draft_model": os.fspath(d)}
        if hasattr(d, "max_ngram_size"):
            return {"lookup_ngram": int(d.max_ngram_size)}
        raise NotImplementedError(
            f"draft_model={type(d).__name__}: superggml drafts with a GGUF path or prompt lookup decoding"
        )
