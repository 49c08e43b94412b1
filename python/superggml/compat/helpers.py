"""llama-cpp-python's helper classes, over superggml: grammars, logits processors, stopping criteria, the
prompt caches (accepted: superggml reuses the longest cached prefix itself) and saved states."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import numpy.typing as npt

from ..generation.slots import shared_prefix

LLAMA_DEFAULT_SEED = 0xFFFFFFFF  # llama.cpp's "pick one at random"

LogitsProcessor = Callable[[npt.NDArray[np.intc], npt.NDArray[np.single]], npt.NDArray[np.single]]
StoppingCriteria = Callable[[npt.NDArray[np.intc], npt.NDArray[np.single]], bool]


class LogitsProcessorList(list[LogitsProcessor]):
    """Functions (input_ids, scores) -> scores, applied in order before a token is drawn."""

    def __call__(self, input_ids: npt.NDArray[np.intc], scores: npt.NDArray[np.single]) -> npt.NDArray[np.single]:
        for processor in self:
            scores = processor(input_ids, scores)
        return scores


class StoppingCriteriaList(list[StoppingCriteria]):
    """Functions (input_ids, logits) -> bool; generation stops once any is true."""

    def __call__(self, input_ids: npt.NDArray[np.intc], logits: npt.NDArray[np.single]) -> bool:
        return any(criterion(input_ids, logits) for criterion in self)


class MinTokensLogitsProcessor:
    """Keeps the end-of-sequence token out until `min_tokens` tokens were generated (llama_cpp's)."""

    def __init__(self, min_tokens: int, token_eos: int):
        self.min_tokens, self.token_eos = min_tokens, token_eos
        self.prompt_tokens: int | None = None

    def __call__(self, input_ids: npt.NDArray[np.intc], scores: npt.NDArray[np.single]) -> npt.NDArray[np.single]:
        if self.prompt_tokens is None:
            self.prompt_tokens = len(input_ids)
        if len(input_ids) - self.prompt_tokens < self.min_tokens:
            scores[self.token_eos] = -np.inf
        return scores


@dataclass(frozen=True)
class LlamaGrammar:
    """A constraint, as llama_cpp.LlamaGrammar builds one: GBNF text (from_string), or a JSON schema
    (from_json_schema); superggml compiles either with llguidance."""

    grammar: str | None = None
    json_schema: str | None = None

    @classmethod
    def from_string(cls, grammar: str, verbose: bool = True) -> LlamaGrammar:
        return cls(grammar=grammar)

    @classmethod
    def from_file(cls, file: str, verbose: bool = True) -> LlamaGrammar:
        with open(file, encoding="utf-8") as f:
            return cls(grammar=f.read())

    @classmethod
    def from_json_schema(cls, json_schema: str, verbose: bool = True) -> LlamaGrammar:
        json.loads(json_schema)  # a clear error for text that is no JSON
        return cls(json_schema=json_schema)

    def options(self) -> dict[str, Any]:
        """Model.grammar's keywords for this constraint."""
        return {"grammar": self.grammar} if self.grammar is not None else {"json_schema": self.json_schema}


@dataclass
class LlamaState:
    """A saved context (Llama.save_state): its tokens, the last logits, the sequence's memory (superggml's saved
    sequence, as bytes) and the seed."""

    input_ids: npt.NDArray[np.intc]
    scores: npt.NDArray[np.single]
    n_tokens: int
    llama_state: bytes
    llama_state_size: int
    seed: int


@dataclass
class LlamaRAMCache:
    """Accepted for llama_cpp's API: states kept by prompt; Llama.set_cache uses it as llama_cpp does (a state
    whose tokens share a longer prefix with the prompt than the context is loaded first)."""

    capacity_bytes: int = 2 << 30
    states: dict[tuple[int, ...], LlamaState] = field(default_factory=dict)

    def longest(self, key: Sequence[int]) -> LlamaState | None:
        """The state sharing the longest prefix with `key`, if any shares one."""
        best, best_n = None, 0
        for k, state in self.states.items():
            n = shared_prefix(k, key)
            if n > best_n:
                best, best_n = state, n
        return best

    def __contains__(self, key: Sequence[int]) -> bool:
        return self.longest(key) is not None

    def __getitem__(self, key: Sequence[int]) -> LlamaState:
        state = self.longest(key)
        if state is None:
            raise KeyError("no cached state shares a prefix with the prompt")
        return state

    def __setitem__(self, key: Sequence[int], value: LlamaState) -> None:
        self.states.pop(tuple(key), None)
        self.states[tuple(key)] = value
        while len(self.states) > 1 and sum(len(s.llama_state) for s in self.states.values()) > self.capacity_bytes:
            self.states.pop(next(iter(self.states)))


LlamaCache = LlamaRAMCache


GGML_TYPES = {0: "f32", 1: "f16", 2: "q4_0", 3: "q4_1", 6: "q5_0", 7: "q5_1", 8: "q8_0", 20: "iq4_nl", 30: "bf16"}


def cache_type(t: int | str | None, what: str) -> str | None:
    """type_k/type_v (a ggml_type number, or a name) as superggml's cache type."""
    if t is None or isinstance(t, str):
        return t
    if t not in GGML_TYPES:
        raise ValueError(
            f"{what}={t}: superggml's K/V caches take {sorted(GGML_TYPES)} ({', '.join(GGML_TYPES.values())})"
        )
    return GGML_TYPES[t]


def gpu_options(
    devices: Sequence[Mapping[str, Any]], n_layer: int, n_gpu_layers: int, main_gpu: int, tensor_split: Any
) -> dict[str, Any]:
    """Model's placement options for llama_cpp's: none where the machine has no GPU (llama.cpp ignores them then);
    n_gpu_layers 0 computes on the CPU, -1 (or at least the blocks) on the GPU, N keeps the first N blocks there
    and streams the others; main_gpu picks the GPU, tensor_split splits over all of them."""
    gpus = [d["name"] for d in devices if d.get("type") in ("gpu", "igpu")]
    if not gpus:
        return {}
    if n_gpu_layers == 0:
        return {"devices": ["CPU"]}
    out: dict[str, Any] = {}
    if tensor_split is not None and any(tensor_split):
        out.update(devices=gpus, tensor_split=list(tensor_split)[: len(gpus)])
    elif main_gpu:
        if not 0 <= main_gpu < len(gpus):
            raise ValueError(f"main_gpu={main_gpu}: this machine has {len(gpus)} GPUs")
        out["devices"] = [gpus[main_gpu]]
    if 0 < n_gpu_layers < n_layer:
        out["n_gpu_layers"] = n_gpu_layers
    return out
