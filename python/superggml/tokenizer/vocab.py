"""A GGUF vocabulary as llama_vocab::impl::load reads it: token texts, scores and attributes, the special
token ids (from the keys, then detected by text), and the per-model defaults of each ``tokenizer.ggml.pre``."""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import Any, Mapping

from ..errors import GGUFError, UnsupportedModelError


class TokenType:
    """Values of ``tokenizer.ggml.token_type`` (llama_token_type)."""

    UNDEFINED = 0
    NORMAL = 1
    UNKNOWN = 2
    CONTROL = 3
    USER_DEFINED = 4
    UNUSED = 5
    BYTE = 6


class TokenAttr:
    """Token attribute bits (llama_token_attr)."""

    UNDEFINED = 0
    UNKNOWN = 1 << 0
    UNUSED = 1 << 1
    NORMAL = 1 << 2
    CONTROL = 1 << 3
    USER_DEFINED = 1 << 4
    BYTE = 1 << 5
    NORMALIZED = 1 << 6
    LSTRIP = 1 << 7
    RSTRIP = 1 << 8
    SINGLE_WORD = 1 << 9


_TYPE_TO_ATTR = {
    TokenType.UNDEFINED: TokenAttr.UNDEFINED,
    TokenType.NORMAL: TokenAttr.NORMAL,
    TokenType.UNKNOWN: TokenAttr.UNKNOWN,
    TokenType.CONTROL: TokenAttr.CONTROL,
    TokenType.USER_DEFINED: TokenAttr.USER_DEFINED,
    TokenType.UNUSED: TokenAttr.UNUSED,
    TokenType.BYTE: TokenAttr.BYTE,
}

# tokenizer.ggml.pre -> (pre type, overrides of the BPE defaults), as llama_vocab::impl::load.
# Defaults for BPE: clean_spaces=True, ignore_merges=False, add_bos=False.
_F = {"clean_spaces": False}
_PRE_TYPES: dict[str, tuple[str, dict[str, bool]]] = {
    "default": ("DEFAULT", {}),
    **{
        n: ("LLAMA3", {"ignore_merges": True, "add_bos": True})
        for n in (
            "llama3",
            "llama-v3",
            "llama-bpe",
            "falcon3",
            "falcon-h1",
            "pixtral",
            "midm-2.0",
            "lfm2",
            "jina-v5-nano",
        )
    },
    "deepseek-llm": ("DEEPSEEK_LLM", _F),
    "deepseek-coder": ("DEEPSEEK_CODER", _F),
    "deepseek-v3": ("DEEPSEEK3_LLM", _F),
    "spark2_5": ("SPARK2_5", _F),
    "youtu": ("YOUTU", {"clean_spaces": False, "ignore_merges": True}),
    "falcon": ("FALCON", {}),
    "mpt": ("MPT", {}),
    "starcoder": ("STARCODER", {}),
    **{
        n: ("GPT2", {})
        for n in (
            "gpt-2",
            "phi-2",
            "jina-es",
            "jina-de",
            "gigachat",
            "jina-v2-es",
            "jina-v2-de",
            "a.x-4.0",
            "mellum",
            "modern-bert",
            "exaone4",
        )
    },
    **{n: ("GPT2", {"add_sep": True}) for n in ("jina-v1-en", "jina-v2-code", "roberta-bpe")},
    "jais-2": ("JAIS2", {}),
    "refact": ("REFACT", {}),
    "command-r": ("COMMAND_R", _F),
    **{n: ("QWEN2", _F) for n in ("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2")},
    "megrez": ("QWEN2", {}),
    "qwen35": ("QWEN35", _F),
    "stablelm2": ("STABLELM2", {}),
    "olmo": ("OLMO", {}),
    "dbrx": ("DBRX", {}),
    "smaug-bpe": ("SMAUG", {}),
    "poro-chat": ("PORO", _F),
    "chatglm-bpe": ("CHATGLM4", {"bos_null": True}),
    "glm4": ("CHATGLM4", {"bos_null": True, "ignore_merges": True}),
    "glm5": ("CHATGLM4", {"bos_null": True, "ignore_merges": True}),
    "viking": ("VIKING", _F),
    "jais": ("JAIS", {}),
    "tekken": ("TEKKEN", {"clean_spaces": False, "ignore_merges": True, "add_bos": True}),
    "smollm": ("SMOLLM", _F),
    "codeshell": ("CODESHELL", {}),
    "bloom": ("BLOOM", {}),
    "gpt3-finnish": ("GPT3_FINNISH", {}),
    "exaone": ("EXAONE", {}),
    "exaone-moe": ("EXAONE_MOE", {}),
    "chameleon": ("CHAMELEON", {"clean_spaces": False, "add_bos": True}),
    "minerva-7b": ("MINERVA", {}),
    **{n: ("GPT4O", _F) for n in ("gpt-4o", "llama4", "kanana2", "talkie")},
    "granite-embed-multi-97m": ("GRANITE_EMB_MULTI", {"clean_spaces": False, "ignore_merges": True}),
    "trillion": ("TRILLION", _F),
    "granite-docling": ("GRANITE_DOCLING", _F),
    **{n: ("BAILINGMOE", _F) for n in ("bailingmoe", "bailingmoe2", "llada-moe")},
    "seed-coder": ("SEED_CODER", _F),
    "hunyuan": ("HUNYUAN", _F),
    "hunyuan-dense": ("HUNYUAN_DENSE", _F),
    "hy_v4": ("HY_V4", _F),
    "joyai-llm": ("JOYAI_LLM", _F),
    "ufakzeka": ("UFAKZEKA", _F),
    "grok-2": ("GROK_2", _F),
    "laguna": ("LAGUNA", _F),
    "minimax-m2": ("MINIMAX_M2", _F),
    "solar-open": ("SOLAR_OPEN", _F),
    "mellum2": ("MELLUM2", {}),
    "minicpm5": ("MINICPM5", {"ignore_merges": True}),
}
del _F

# token texts llama.cpp recognises (llama_vocab::impl::load, "auto-detect special tokens by text")
_EOT_NAMES = (
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
)
_EOM_NAMES = ("<|eom_id|>",)
_FIM_NAMES = {
    "fim_pre": (
        "<|fim_prefix|>",
        "<fim-prefix>",
        "<fim_prefix>",
        "<｜fim▁begin｜>",
        "<PRE>",
        "▁<PRE>",
        "<|code_prefix|>",
        "<|prefix|>",
    ),
    "fim_suf": (
        "<|fim_suffix|>",
        "<fim-suffix>",
        "<fim_suffix>",
        "<｜fim▁hole｜>",
        "<SUF>",
        "▁<SUF>",
        "<|code_suffix|>",
        "<|suffix|>",
    ),
    "fim_mid": (
        "<|fim_middle|>",
        "<fim-middle>",
        "<fim_middle>",
        "<｜fim▁end｜>",
        "<MID>",
        "▁<MID>",
        "<|code_middle|>",
        "<|middle|>",
    ),
    "fim_pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "fim_rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "fim_sep": ("<|file_sep|>",),
}
_EOG_NAMES = (
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
)

# GGUF keys of the special token ids, in llama.cpp's order (later keys win for the FIM aliases)
_SPECIAL_ID_KEYS = (
    ("bos", "tokenizer.ggml.bos_token_id"),
    ("eos", "tokenizer.ggml.eos_token_id"),
    ("eot", "tokenizer.ggml.eot_token_id"),
    ("eom", "tokenizer.ggml.eom_token_id"),
    ("unk", "tokenizer.ggml.unknown_token_id"),
    ("sep", "tokenizer.ggml.seperator_token_id"),
    ("pad", "tokenizer.ggml.padding_token_id"),
    ("mask", "tokenizer.ggml.mask_token_id"),
    ("fim_pre", "tokenizer.ggml.fim_pre_token_id"),
    ("fim_suf", "tokenizer.ggml.fim_suf_token_id"),
    ("fim_mid", "tokenizer.ggml.fim_mid_token_id"),
    ("fim_pad", "tokenizer.ggml.fim_pad_token_id"),
    ("fim_rep", "tokenizer.ggml.fim_rep_token_id"),
    ("fim_sep", "tokenizer.ggml.fim_sep_token_id"),
    ("fim_pre", "tokenizer.ggml.prefix_token_id"),
    ("fim_suf", "tokenizer.ggml.suffix_token_id"),
    ("fim_mid", "tokenizer.ggml.middle_token_id"),
)


def meta_int(meta: Mapping[str, Any], key: str) -> int | None:
    value = meta.get(key)
    if value is None:
        return None
    try:
        return int(value)
    except (TypeError, ValueError) as e:
        raise GGUFError(f"{key}: expected an integer, got {value!r}") from e


def meta_bool(meta: Mapping[str, Any], key: str) -> bool | None:
    value = meta.get(key)
    return None if value is None else bool(value)


def meta_list(meta: Mapping[str, Any], key: str) -> list[Any] | None:
    value = meta.get(key)
    if value is None:
        return None
    if isinstance(value, (str, bytes)):
        raise GGUFError(f"{key}: expected an array")
    return list(value)


def texts(values: list[Any]) -> list[str]:
    """as_text of every item; the list itself when all are str already (GGUF strings usually are)."""
    if all(type(v) is str for v in values):
        return values
    return [as_text(v) for v in values]


def as_text(value: Any) -> str:
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "surrogateescape")
    return str(value)


@dataclass
class Vocab:
    """What a tokenizer is built from. ``ids`` maps "bos", "eos", "eot", ... to a token id or None."""

    model: str
    pre: str = ""
    pre_type: str = "DEFAULT"
    tokens: list[str] = field(default_factory=list)
    token_to_id: dict[str, int] = field(default_factory=dict)
    scores: array[float] = field(default_factory=lambda: array("f"))
    attrs: array[int] = field(default_factory=lambda: array("i"))
    ids: dict[str, int | None] = field(default_factory=lambda: dict.fromkeys(SPECIAL_NAMES))
    add_bos: bool = False
    add_eos: bool = False
    add_sep: bool = False
    add_space_prefix: bool = False
    clean_spaces: bool = False
    ignore_merges: bool = False
    eog_ids: frozenset[int] = frozenset()
    special: list[tuple[str, int]] = field(default_factory=list)
    """(text, id) of the CONTROL, USER_DEFINED and UNKNOWN tokens, longest text first."""

    @property
    def n_vocab(self) -> int:
        return len(self.tokens)


SPECIAL_NAMES: tuple[str, ...] = (
    "bos",
    "eos",
    "eot",
    "eom",
    "unk",
    "sep",
    "pad",
    "mask",
    "fim_pre",
    "fim_suf",
    "fim_mid",
    "fim_pad",
    "fim_rep",
    "fim_sep",
)


def load_vocab(meta: Mapping[str, Any]) -> Vocab:
    """The vocabulary of GGUF metadata (key -> Python value): the ``tokenizer.ggml.*`` keys, plus ``general.name``
    and ``general.architecture`` (llama.cpp sets a few token attributes by model name)."""
    model = meta.get("tokenizer.ggml.model")
    if model is None:
        raise GGUFError("tokenizer.ggml.model is missing")
    pre = meta.get("tokenizer.ggml.pre")
    vocab = _model_defaults(as_text(model), "" if pre is None else as_text(pre))
    add_prefix = meta_bool(meta, "tokenizer.ggml.add_space_prefix")
    if add_prefix is not None:
        vocab.add_space_prefix = add_prefix
    vocab.tokens, vocab.token_to_id = _read_tokens(meta)
    vocab.scores, vocab.attrs = _read_scores(meta, vocab.n_vocab), _read_attrs(meta, vocab.n_vocab)
    _load_special_ids(vocab, meta)
    _detect_special_tokens(vocab)
    _apply_model_attrs(vocab, meta)
    return vocab


def _model_defaults(model: str, pre: str) -> Vocab:
    if model == "gpt2":
        flags: dict[str, bool]
        if pre in ("", "default"):
            pre_type, flags = "DEFAULT", {}
        elif pre in _PRE_TYPES:
            pre_type, flags = _PRE_TYPES[pre]
        else:
            raise UnsupportedModelError(f"unsupported pre-tokenizer type: {pre!r}")
        vocab = Vocab(
            model,
            pre or "default",
            pre_type,
            clean_spaces=flags.get("clean_spaces", True),
            ignore_merges=flags.get("ignore_merges", False),
            add_bos=flags.get("add_bos", False),
            add_sep=flags.get("add_sep", False),
        )
        vocab.ids.update(bos=None if flags.get("bos_null") else 11, eos=11)
        return vocab
    if model == "llama":
        vocab = Vocab(model, pre, "DEFAULT", add_space_prefix=True, add_bos=True)
        vocab.ids.update(bos=1, eos=2, unk=0)
        return vocab
    raise UnsupportedModelError(f"unsupported tokenizer model: {model!r}")


def _read_tokens(meta: Mapping[str, Any]) -> tuple[list[str], dict[str, int]]:
    raw_tokens = meta_list(meta, "tokenizer.ggml.tokens")
    if not raw_tokens:
        raise GGUFError("tokenizer.ggml.tokens is missing or empty")
    n = len(raw_tokens)
    # llama.cpp reads a token as a C string: it ends at the first NUL
    tokens = [t.split("\x00", 1)[0] if "\x00" in t else t for t in texts(raw_tokens)]
    tokens = [t or f"[EMPTY_{i}]" for i, t in enumerate(tokens)] if "" in tokens else tokens
    token_to_id = dict(zip(tokens, range(n)))
    if len(token_to_id) != n:
        first: dict[str, int] = {}
        for i, text in enumerate(tokens):
            if first.setdefault(text, i) != i:
                raise GGUFError(f"duplicate token in vocabulary: {text!r} has ids {first[text]} and {i}")
    return tokens, token_to_id


def _read_scores(meta: Mapping[str, Any], n: int) -> array[float]:
    scores = meta_list(meta, "tokenizer.ggml.scores")
    if scores is not None and len(scores) < n:
        raise GGUFError("tokenizer.ggml.scores is shorter than the vocabulary")
    return array("f", [float(s) for s in scores[:n]] if scores is not None else [0.0] * n)


def _read_attrs(meta: Mapping[str, Any], n: int) -> array[int]:
    types = meta_list(meta, "tokenizer.ggml.token_type")
    if types is not None and len(types) < n:
        raise GGUFError("tokenizer.ggml.token_type is shorter than the vocabulary")
    if types is None:
        return array("i", [TokenAttr.NORMAL]) * n
    return array("i", [_TYPE_TO_ATTR.get(int(t), TokenAttr.UNDEFINED) for t in types[:n]])


def _load_special_ids(vocab: Vocab, meta: Mapping[str, Any]) -> None:
    n, ids = vocab.n_vocab, vocab.ids
    for name, value in ids.items():
        if value is not None and value >= n:
            ids[name] = None
    for name, key in _SPECIAL_ID_KEYS:
        value = meta_int(meta, key)
        if value is not None and 0 <= value < n:
            ids[name] = value
    for name in ("add_bos", "add_eos", "add_sep"):
        value = meta_bool(meta, f"tokenizer.ggml.{name}_token")
        if value is not None:
            setattr(vocab, name, value)


def _detect_special_tokens(vocab: Vocab) -> None:
    """Port of the text-based detection of EOT/EOM/FIM/EOG tokens in llama.cpp's load."""
    ids, attrs, t2i = vocab.ids, vocab.attrs, vocab.token_to_id
    CONTROL = TokenAttr.CONTROL
    for name, names in (("eot", _EOT_NAMES), ("eom", _EOM_NAMES), *_FIM_NAMES.items()):
        if ids[name] is None:
            # llama.cpp takes the first match in its hash-map order; take the first name here
            tid = next((t2i[n] for n in names if n in t2i), None)
            if tid is not None:
                ids[name] = tid
                attrs[tid] |= CONTROL
    for tid, text in enumerate(vocab.tokens):
        if attrs[tid] & CONTROL and not attrs[tid] & TokenAttr.UNUSED and "unused" in text:
            attrs[tid] |= TokenAttr.UNUSED
    vocab.eog_ids = _detect_eog(vocab)
    special_mask = CONTROL | TokenAttr.USER_DEFINED | TokenAttr.UNKNOWN
    special = [tid for tid in range(vocab.n_vocab) if attrs[tid] & special_mask]
    # longest first, like llama.cpp (ties in its unstable sort: by id here)
    special.sort(key=lambda tid: -len(vocab.tokens[tid].encode("utf-8", "surrogatepass")))
    vocab.special = [(vocab.tokens[tid], tid) for tid in special]


def _detect_eog(vocab: Vocab) -> frozenset[int]:
    ids, attrs, t2i = vocab.ids, vocab.attrs, vocab.token_to_id
    eog = {t for t in (ids["fim_pad"], ids["fim_rep"], ids["fim_sep"]) if t is not None}
    for name in _EOG_NAMES:
        tid = t2i.get(name)
        if tid is not None:
            eog.add(tid)
            attrs[tid] |= TokenAttr.CONTROL
    for name in ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"):
        tid = t2i.get(name)
        if tid is not None:
            attrs[tid] = TokenAttr.USER_DEFINED
    for tid in (ids["eos"], ids["eot"], ids["eom"]):
        if tid is not None:
            eog.add(tid)
    texts = {vocab.tokens[t] for t in eog}
    calls = "<|call|>" in texts or "<|calls|>" in texts
    if "<|end|>" in texts and (("<|return|>" in texts and calls) or (calls and "<|flush|>" in texts)):
        end_id = t2i["<|end|>"]
        eog.discard(end_id)
        attrs[end_id] = TokenAttr.USER_DEFINED
    if "<|tool_response>" in texts and "</s>" in texts:
        s_id = t2i["</s>"]
        eog.discard(s_id)
        attrs[s_id] = TokenAttr.NORMAL
    return frozenset(eog)


def _apply_model_attrs(vocab: Vocab, meta: Mapping[str, Any]) -> None:
    """LSTRIP/RSTRIP attributes llama.cpp sets by model name (after the piece cache)."""
    name = as_text(meta.get("general.name", "")).lower()
    arch = as_text(meta.get("general.architecture", ""))
    attrs, t2i = vocab.attrs, vocab.token_to_id
    if any(p in vocab.pre for p in ("jina-v2-de", "jina-v2-es", "jina-v2-code")) or any(
        a in arch for a in ("nomic-bert-moe", "jina-bert-v3")
    ):
        if "<mask>" in t2i:
            attrs[t2i["<mask>"]] |= TokenAttr.LSTRIP
    elif "phi-3" in name or "phi3" in name:
        for _, tid in vocab.special:
            attrs[tid] |= TokenAttr.RSTRIP
        for text, on in (("</s>", True), ("<unk>", False), ("<s>", False), ("<|endoftext|>", False)):
            if text not in t2i:
                raise GGUFError(f"phi-3 vocabulary without {text!r}")
            if on:
                attrs[t2i[text]] |= TokenAttr.RSTRIP
            else:
                attrs[t2i[text]] &= ~TokenAttr.RSTRIP
    elif "modern-bert" in name:
        if "[MASK]" in t2i:
            attrs[t2i["[MASK]"]] |= TokenAttr.LSTRIP
