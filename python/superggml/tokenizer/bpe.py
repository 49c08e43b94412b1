"""llm_tokenizer_bpe: byte-level BPE vocabularies (``tokenizer.ggml.model == "gpt2"``).

The text is split into words by the pre-tokenizer regexes llama.cpp uses for the vocabulary's pre type, evaluated the
way llama.cpp evaluates them (see unicode.py); the merges are done by HuggingFace ``tokenizers``' BPE model.
"""

from __future__ import annotations

from typing import Any, Mapping

from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models as hf_models

from ..errors import GGUFError
from .unicode import BYTE_TO_CHAR, SplitRegex, byte_encode, byte_level_decode, decode_utf8_like_llama, regex_split
from .vocab import Vocab, meta_list, texts

_RE_GPT2 = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"
_RE_LLAMA3 = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
_RE_QWEN2 = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

# llm_tokenizer_bpe: pre-tokenizer regexes per LLAMA_VOCAB_PRE_TYPE_*, applied one after the other
PRE_REGEXES: dict[str, tuple[str, ...]] = {
    "LLAMA3": (_RE_LLAMA3,),
    "JAIS2": (
        "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s{512}(?!\\S)|\\s{256}(?!\\S)|\\s{128}(?!\\S)|\\s{64}(?!\\S)|\\s{32}(?!\\S)|\\s{16}(?!\\S)|\\s{8}(?!\\S)|\\s{4}(?!\\S)|\\s{1,2}(?!\\S)|\\s{1}",
    ),
    "DBRX": (_RE_LLAMA3,),
    "SMAUG": (_RE_LLAMA3,),
    "DEEPSEEK_LLM": (
        '[\r\n]',
        '\\s?[A-Za-z\xb5\xc0-\xd6\xd8-\xf6\xf8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df\U0001e900-\U0001e943]+',
        '\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+',
        '\\s+$',
        '[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+',
        '\\p{N}+',
    ),
    "DEEPSEEK3_LLM": (
        '\\p{N}{1,3}',
        '[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+',
        '[!"#$%&\'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+',
    ),
    "HUNYUAN_DENSE": (
        '\\p{N}{1,3}',
        '[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+',
        '[!"#$%&\'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+',
    ),
    "JOYAI_LLM": (
        '\\p{N}{1,3}',
        '[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+',
        '[!"#$%&\'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+',
    ),
    "HY_V4": (
        '\\p{N}{1,3}',
        '[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+',
        '[!"#$%&\'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+',
    ),
    "SPARK2_5": (
        '\\p{N}{1,3}',
        '[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+',
        '[!"#$%&\'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+|[\r\n]|\\s+(?!\\S)|\\s+',
        '\\p{N}',
    ),
    "YOUTU": (
        '[\uac00-\ud7a3\u3131-\u318e]+|[\uff01\u2026\u201c\u201d\u2018\u2019\u2014\uff1a\uff1b\uff0c\u3001-\u303f\ufe30-\ufe4f]+|[\u3105-\u312f]+|[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+',
        "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    ),
    "DEEPSEEK_CODER": (
        '[\r\n]',
        '\\s?\\p{L}+',
        '\\s?\\p{P}+',
        '[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+',
        '\\p{N}',
    ),
    "FALCON": (
        '[\\p{P}\\$\\+<=>\\^~\\|`]+',
        _RE_GPT2,
        '[0-9][0-9][0-9]',
    ),
    "STARCODER": (
        '\\p{N}',
        _RE_GPT2,
    ),
    "REFACT": (
        '\\p{N}',
        _RE_GPT2,
    ),
    "COMMAND_R": (
        '\\p{N}',
        _RE_GPT2,
    ),
    "SMOLLM": (
        '\\p{N}',
        _RE_GPT2,
    ),
    "CODESHELL": (
        '\\p{N}',
        _RE_GPT2,
    ),
    "EXAONE": (
        '\\p{N}',
        _RE_GPT2,
    ),
    "MINERVA": (
        '\\p{N}',
        _RE_GPT2,
    ),
    "MELLUM2": (
        '\\p{N}',
        _RE_GPT2,
    ),
    "GPT2": (_RE_GPT2,),
    "MPT": (_RE_GPT2,),
    "OLMO": (_RE_GPT2,),
    "JAIS": (_RE_GPT2,),
    "TRILLION": (_RE_GPT2,),
    "GRANITE_DOCLING": (_RE_GPT2,),
    "STABLELM2": (_RE_QWEN2,),
    "QWEN2": (_RE_QWEN2,),
    "HUNYUAN": (_RE_QWEN2,),
    "SOLAR_OPEN": (_RE_QWEN2,),
    "QWEN35": (
        "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    ),
    "PORO": (' ?[^(\\s|.,!?\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c)]+',),
    "BLOOM": (' ?[^(\\s|.,!?\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c)]+',),
    "GPT3_FINNISH": (' ?[^(\\s|.,!?\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c)]+',),
    "CHATGLM4": (_RE_LLAMA3,),
    "VIKING": (
        ' ?[^(\\s|.,!?\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c)]+',
        '\\p{N}',
    ),
    "TEKKEN": (
        '[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+',
    ),
    "CHAMELEON": (
        '<sentinel:[0-9]+>',
        '(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z',
        '([\\t\\n]|    |  )',
        '\\p{N}',
        '[\\p{P}!-/:-@\\[-`{-~]',
        _RE_GPT2,
    ),
    "GPT4O": (
        "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    ),
    "MINIMAX_M2": (
        "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    ),
    "GRANITE_EMB_MULTI": (
        "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}\\p{M}])([^a-z]))*((?=[\\p{L}\\p{M}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}\\p{M}])([^a-z]))+((?=[\\p{L}\\p{M}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    ),
    "BAILINGMOE": (
        "'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+",
    ),
    "SEED_CODER": (
        "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1}| ?[^\\s\\p{L}\\p{N}\\r\\n]+|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    ),
    "UFAKZEKA": ('[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+',),
    "GROK_2": (_RE_QWEN2,),
    "LAGUNA": (
        '[^\\n]+|[\\n]+',
        _RE_QWEN2,
    ),
    "EXAONE_MOE": (
        "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?(?:\\p{L}\\p{M}*(?: \\p{L}\\p{M}*)*)+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]?|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+",
    ),
    "MINICPM5": (
        '\\p{N}{1,3}',
        "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}+| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    ),
    "DEFAULT": (
        '[\\p{P}\\$\\+<=>\\^~\\|]+',
        _RE_GPT2,
        '\\p{N}+',
        '[0-9][0-9][0-9]',
    ),
}


class BpeEncoder:
    """Token ids of text pieces, and the vocabulary's texts and ids, for a byte-level BPE vocabulary.

    Symbols llama.cpp can form that are not tokens (byte-level characters missing from the vocabulary, results of
    merges that are not tokens) get stand-in ids past the vocabulary, resolved like llama.cpp afterwards (see
    resolve_phantoms). The tokenizers model holds the texts and ids: the vocabulary's own lists are not kept.
    """

    def __init__(self, vocab: Vocab, merges: list[tuple[str, str]]):
        self.n_vocab = vocab.n_vocab
        self.regexes = [SplitRegex(e) for e in PRE_REGEXES[vocab.pre_type]]
        self.phantom: dict[int, str] = {}  # stand-in id -> symbol that is not a token
        ids = dict(vocab.token_to_id)
        for sym in dict.fromkeys(sym for a, b in merges for sym in (a, b, a + b) if sym not in ids):
            self.add_phantom(ids, sym)
        for char in BYTE_TO_CHAR:
            self.add_phantom(ids, char)
        self.hf = HFTokenizer(hf_models.BPE(vocab=ids, merges=merges, ignore_merges=vocab.ignore_merges))

    @classmethod
    def from_metadata(cls, meta: Mapping[str, Any], vocab: Vocab) -> "BpeEncoder":
        raw_merges = meta_list(meta, "tokenizer.ggml.merges")
        if raw_merges is None:
            raise GGUFError("tokenizer.ggml.merges is missing")
        # "left right" split at the first space after the first character; llama.cpp keeps the first rank of a pair
        # (dict.fromkeys: first occurrence, in order)
        merges = list(
            dict.fromkeys((m[:p], m[p + 1 :]) for m in texts(raw_merges) for p in (m.find(" ", 1),) if p >= 0)
        )
        return cls(vocab, merges)

    def add_phantom(self, ids: dict[str, int], sym: str) -> None:
        if sym not in ids:
            ids[sym] = len(ids)
            self.phantom[ids[sym]] = sym

    def token_text(self, id: int) -> str:
        return str(self.hf.id_to_token(id))

    def token_id(self, text: str) -> int | None:
        tid = self.hf.token_to_id(text)
        return tid if tid is not None and tid < self.n_vocab else None

    def text_of(self, data: bytes) -> str:
        """Invalid UTF-8 becomes U+FFFD, as llama.cpp decodes it."""
        return decode_utf8_like_llama(data)

    def pre_tokenize(self, text: str) -> list[str]:
        return regex_split(text, self.regexes)

    def normal_piece(self, text: str) -> bytes:
        return byte_level_decode(text)

    def encode(self, piece: str, out: list[int], after_special: bool) -> None:
        """Append the tokens of a piece of text (``after_special`` matters to SentencePiece only)."""
        words = self.pre_tokenize(piece)
        if words:
            ids = self.hf.encode([byte_encode(w) for w in words], is_pretokenized=True, add_special_tokens=False).ids
            out.extend(self.resolve_phantoms(ids) if self.phantom else ids)

    def resolve_phantoms(self, ids: list[int]) -> list[int]:
        """Replace stand-in ids (symbols that are not tokens) the way llama.cpp's BPE does: by the tokens whose text
        is one of the symbol's bytes, skipping bytes without one."""
        if not ids or max(ids) < self.n_vocab:
            return ids
        out: list[int] = []
        for tid in ids:
            if tid < self.n_vocab:
                out.append(tid)
                continue
            for b in self.phantom[tid].encode("utf-8", "surrogatepass"):
                byte = self.token_id(chr(b)) if b < 0x80 else None
                if byte is not None:
                    out.append(byte)
        return out
