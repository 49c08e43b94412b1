"""Tokenizer built from a GGUF file's own tokenizer metadata, matching llama.cpp token for token.

The behaviour follows llama.cpp's ``src/llama-vocab.cpp`` and ``src/unicode.cpp``
(the version vendored by llama-cpp-python 0.3.36):

* ``tokenizer.ggml.model == "gpt2"``: byte-level BPE. The text is split into words by the
  pre-tokenizer regexes llama.cpp uses for ``tokenizer.ggml.pre``, evaluated the way llama.cpp
  evaluates them (code points collapsed to one character per Unicode category, ECMAScript-like
  matching, llama.cpp's own Unicode category table); the merges are done by HuggingFace
  ``tokenizers``' BPE model.
* ``tokenizer.ggml.model == "llama"``: SentencePiece-style vocabulary (llm_tokenizer_spm): the
  UTF-8 characters of the text are merged pairwise into tokens, highest token score first and
  leftmost first among equal scores, characters left over falling back to their ``<0xXX>`` byte
  tokens; spaces become "▁", with a "▁" prefix unless ``tokenizer.ggml.add_space_prefix`` is
  false (Gemma). This greedy merge cannot be a ``tokenizers`` BPE model: BPE ranks pairs, and
  pairs of equal score (common: Llama's whitespace pieces all score -1e9) would need equal ranks.

Special tokens (token types CONTROL, USER_DEFINED, UNKNOWN) are split out of the text before
tokenizing like llama.cpp's ``tokenizer_st_partition``: USER_DEFINED tokens always, CONTROL and
UNKNOWN ones only with ``parse_special=True``.
"""

from __future__ import annotations

import bisect
import heapq
import re
from array import array
from typing import Any, Iterator, Mapping, Sequence

from tokenizers import Tokenizer as _HFTokenizer
from tokenizers import models as _hf_models

from .errors import GGUFError, UnsupportedModelError

__all__ = ["Tokenizer", "TokenAttr", "TokenType"]

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

# ---------------------------------------------------------------------------------------------
# Unicode: llama.cpp's code point categories (src/unicode-data.cpp, generated from Unicode 15 by
# scripts/gen-unicode-data.py), so that results do not depend on Python's unicodedata version.
# Each entry is "<hex delta from previous range start><category>"; categories: U undefined,
# N number, L letter, Z separator, M mark, P punctuation, S symbol, C control.
# ---------------------------------------------------------------------------------------------

_CPT_RANGES = (
    "0C20Z1P3S1P6S1P4NaP2S3P2L1aP3S1P1S1L1aP1S1P1S1C21Z1P1S5P1S2L1P1S1C1S4N2S1L1P2S1N1L1P1N3P1L17"
    "S1L1fS1L1caS4LcSeL5S7L1S1L1S11M70L5S1L2U2L4P1L1U4S2L1P1L3U1L1U1L14U1L53S1L8bS1M7La6U1L26U2L1"
    "P6L29P2U2S3U1M2dP1M1P1M2P1M2P1M1U8L1bU4L4P2UbC6S3P2S1P2S2MbP1C1P3L2bM15NaP4L2M1L63P1L1M7C1S1"
    "M6L2M2S1M4L2NaL3S2L1PeU1C1L1M1L1eM1bU2L59MbL1UeNaL21M9L2S1P3L1U2M1S2L16M4L1M9L1M3L1M5U2PfU1L"
    "19M3U2P1U1LbU5L18S1L6U1C2U6M8L2aM18C1M21L36M3L1M12L1M7LaM2P2NaP1L10M3U1L8U2L2U2L16U1L7U1L1U3"
    "L4U2M1L1M7U2M2U2M3L1U8M1U4L2U1L3M2U2NaL2S2N6S2L1P1M1U2M3U1L6U4L2U2L16U1L7U1L2U1L2U1L2U2M1U1M"
    "5U4M2U2M3U3M1U7L4U1L1U7NaM2L3M1P1UaM3U1L9U1L3U1L16U1L7U1L2U1L5U2M1L1M8U1M3U1M3U2L1UfL2M2U2Na"
    "P1S1U7L1M6U1M3U1L8U2L2U2L16U1L7U1L2U1L5U2M1L1M7U2M2U2M3U7M3U4L2U1L3M2U2NaS1L1N6UaM1L1U1L6U3L"
    "3U1L4U3L2U1L1U1L2U3L2U3L3U3LcU4M5U3M3U1M4U2L1U6M1UeNdS8U5M5L8U1L3U1L17U1L10U2M1L1M7U1M3U1M4U"
    "7M2U1L3U2L1U2L2M2U2NaU7P1N7S1L1M3P1L8U1L3U1L17U1LaU1L5U2M1L1M7U1M3U1M4U7M2U6L2U1L2M2U2NaU1L2"
    "M1UcM4L9U1L3U1L29M2L1M7U1M3U1M4L1S1U4L3M1N7L3M2U2N13S1L6U1M3U1L12U3L18U1L9U1L1U2L7U3M1U4M6U1"
    "M1U1M8U6NaU2M2P1UcL30M1L2M7U4S1L7M8P1NaP2U25L2U1L1U1L5U1L18U1L1U1LaM1L2M9L1U2L5U1L1U1M7U1NaU"
    "2L4U20L1S3PfS1P1S3M2S6N14S1M1S1M1S1M1P4M2L8U1L24U4M14P1M2L5MbU1M24U1S8M1S6U1S2P5S4P2U25L2bM1"
    "4L1NaP6L6M4L4M3L1M3L2M7L3M4LdMcL1M1NaM4S2L26U1L1U5L1U2L2bP1L14dU1L4U2L7U1L1U1L4U2L29U1L4U2L2"
    "1U1L4U2L7U1L1U1L4U2LfU1L39U1L4U2L43U2M3P9N14U3L10SaU6L56U2L6U2P1L26cS1P1L11Z1L1aP2U3L4bP3N3L"
    "8U7L12M4U9L13M3P2U9L12M2UcLdU1L3U1M2UcL34M20P3L1P3S1L1M1U2NaU6NaU6PbM3C1M1NaU6L59U7L5M2L22M1"
    "L1U5L46UaL1fU1McU4McU4S1U3P2NaL1eU2L5UbL2cU4L1aU6NbU3S22L17M5U2P2L35MaU1M1dU2M1NaU6NaU6P7L1P"
    "6U2M1fU31M5L2fM11L8U3NaP7SaM9S9P2U1M3L1eMdL2NaL2cMeU8P4L24M14U3P5NaU3L3NaL24P2L9U7L2bU2L3P8U"
    "8M3P1M15L4M1L6M1L2M3L1U5Lc0M40L116U2L6U2L26U2L6U2L8U1L1U1L1U1L1U1L1fU2L35U1L7S1L1S3L3U1L7S3L"
    "4U2L6U1S3LdS3U2L3U1L7S2U1ZbC5P18Z2C5Z1P14S1PdS1PcZ1C5U1CaN1L1U2N6S3P2L1NaS3P2U1LdU3S21UfM21U"
    "fS2L1S4L1S2LaS1L1S3L5S6L1S1L1S1L1S1L4S1LbS2L4S5L5S4L1S1N33L2N5S2U4S178P4S1dP2SfcU19SbU15N3cS"
    "4eN16S268PeN1eS31P2S1fPaS193P16S3fP4S20P2S176U2S20U1S69Le5S6L4M3L2U5P4N1P2L26U1L1U5L1U2L38U7"
    "L1P1UeM1L17U9L7U1L7U1L7U1L7U1L7U1L7U1L7U1L7U1M20P2fL1P20S2PcU22S1aU1S59UcSd6U1aS10Z1P3S1L2N1"
    "PaS2PcS1N9M6P1L5S2N3L2P1S2U1L56U2M2S2L3P1L5aP1L4U5L2bU1L5eU1S2N4SaL20S24UbS1L10S1fU1NaS1eN8S"
    "1NfS20NaS27NfS140L19c0S40L568dU3S37U9L2eP2L10dP3L10NaL2U14L2fM4P1MaP1L1fM2L46NaM2P6U8S17L9S2"
    "L67S2L40U5L2U1L1U1L5U18L10M1L3M1L4M1L17M5S4M1U3N6S4U6L34P4U8M2L32M12U8P2NaU6M12L6P3L1P1L2M1N"
    "aL1cM8P2L17MdUbP1L1dU3M4L2fMePdU1L1NaU4P2L5M1LaNaL5U1L29MeU9L3M1L8M2U2NaU2P4L17S3L1M3L32M1L1"
    "M3L2M2L5M2L1M1L1U18L3P2LbM5P2L3M2UaL6U2L6U2L6U9L7U1L7U1L2bS1LeS2U4L73M8P1M2U2NaU6L2ba4UcL17U"
    "4L31U4C2100L16eU2L6aU26L7UcL5U5L1M1LaS1LdU1L5U1L1U1L2U1L2U1L6cS11U10L16bP2S10L40U2L36U7S1U20"
    "LcS4M10PaU6M10P23U1PeS1P1S3U1P1S1P2U4L5U1L87U2C1U1P3S1P6S1P4NaP2S3P2L1aP3S1P1S1L1aP1S1P1S1P7"
    "L59U3L6U2L6U2L6U2L3U3S7U1S7UaC3S2U2LcU1L1aU1L13U1L2U1LfU2LeU22L7bU5P3U4N2dU3S9N39S11N2S3U1Sd"
    "U3S1U2fS2dM1U82L1dU3L31UfM1N1bU4L20N4U9L14N1L8N1U5L26M5U5L1eU1P1L24U4L8P1N5U2aL9eU2NaU6L24U4"
    "L24U4L28U8L34UbP1LbU1LfU1L7U1L2U1LbU1LfU1L7U1L2U43L137U9L16UaL8U18L6U1L2aU1L9U45L6U2L1U1L2cU"
    "1L2U3L1U2L17U1P1N8L17S2N7L1fU8N9U30L13U1L2U5N5L16N6U3P1L1aU5P1U40L38U4N2L2N10U2N2eL1M3U1M2U5"
    "M4L4U1L3U1L1dU2M3U4M1N9U7P9U7L1dN2P1L1dN3U20L8S1L1cM2U4N5P7U9L36U3P7L16U2N8L13U5N8L12U7P4UcN"
    "7U50L49U37L33UdL33U7N6L24M4U8NaU126N1fU1L2aU1M2P1U2L2U4bM3L1dNaL1U8L16MbN4P5U16L12M4P4U26L15"
    "N7U14L17U9M3L35MfP7U4N1eM1L2M2L1U9M4L2dMbP2C1P4M1UaC1U2L19U7NaU6M3L24MeU1NaP4L1M2L1U8L23M1P2"
    "L1U9M3L30MeL4P4M4P1M2NaL1P1L1P3U1N14UbL12U1L19McP6M1L2M1U3eL7U1L1U1L4U1LfU1LaP1U6L2fMcU5NaU6"
    "M4U1L8U2L2U2L16U1L7U1L2U1L5U1M2L1M7U2M2U2M3U2L1U6M1U5L5M2U2M7U3M5U8bL35M12L4P5NaP2U1P1M1L3U1"
    "eL30M14L2P1L1U8NaUa6L2fM7U2M9P17L4M2U22L30M11P3L1UbNaU6PdU13L2bMdL1P1U6NaU36L1bU2MfU4NcP3S1L"
    "7Ub9L2cMfP1U64L40N13UcL8U2L1U2L8U1L2U1L18M6U1M2U2M4L1M1L1M2P3U9NaU46L8U2L27M7U2M7L1P1L1M1U1b"
    "L1MaL28M7L1M4P8M1U8L1MbL2eM10P3L1P5UdL49U7PaUf6L9U1L25M8U1M8L1P5UaN1dU3P2L1eU2M16U1MeU49L7U1"
    "L2U1L26M6U3M1U1M2U1M7L1M1U8NaU6L6U1L2U1L20M5U1M2U1M5L1U7NaU136L13M4P2U7M2L1M1LdU1L22M7U3M5Pd"
    "NaU56L1UfN15S1dUdP1L39aU66N6fU1P5UbLc4Ua4cL61P2UdL430C10M1L6MfUfaaL247U21b9L239U7L1fU1NaU4P2"
    "L4fU1NaU6L1eU2M5P1UaL30M7P5S4L4P1S1UaNaU1N7U1L15U5L13U2b0L40N17P4U65L4bU4M1L1M37U7M4LdU40L2P"
    "1L1M1UbM2UeL17f8U8L4d6U2aL9U22e7L4U1L7U1L2U1L123UfL1U1dL3U2L1UeL4U8L18cU904L6bU5LdU3L9U7LaU2"
    "S1M2P1C4U125cM2eU2M17U9S74U3cSf6UaS27U2S3cM5S3M6C8M8S2M7S1eM4S3dU15S42M3S1U7aN14UcN14UcS57U9"
    "N19U87L55U1L47U1L2U2L1U2L2U2L4U1LcU1L1U1L7U1L41U1L4U2L8U1L7U1L1cU1L4U1L5U1L1U3L7U1L154U2L19S"
    "1L19S1L1fS1L19S1L1fS1L19S1L1fS1L19S1L1fS1L19S1L8U2N32S200M37S4M32S8M1SeM1S2P5UfM5U1MfU450L1f"
    "U6L6Ud5M7U1M11U2M7U1M2U1M5U5L3eU21M1U70L2dU3M7L7U2NaU4L1S1U140L1eM1U11L2cM4NaU5S1U1d0L1cM4Na"
    "U2e6L7U1L4U1L2U1LfU1Lc5U2N9M7U29L44M7L1U4NaU4P2U311N3bS1N3S1N4U4cN2dS1NfUc2L4U1L1bU1L2U1L1U2"
    "L1U1LaU1L4U1L1U1L1U6L1U4L1U1L1U1L1U1L3U1L2U1L1U2L1U1L1U1L1U1L1U1L1U1L2U1L1U2L4U1L7U1L4U1L4U1"
    "L1U1LaU1L11U5L3U1L5U1L11U34S2U10eS2cU4S64UcSfU2SfU1SfU1S25UaNdSa1U38S1dUdS2cU4S9U7S2UeS6U9aS"
    "3d8U4S11U3SdU3S77U4S5fU6ScU4S1UfScU4S38U8SaU6S28U8S1eU2S2U4eS154UcSeU2SdU3S9U7S2eU1S7U8SeU4S"
    "9U7S9U7S93U1S37U25NaU406La6e0U20L103aU6LdeU2L1682UeL1d31UfL26eU9a2L21eU5e2L134bU5L1060Uadc51"
    "C1U1eC60U80Mf0Ufe10CfffeU2CfffeU"
)

# unicode_set_whitespace
_WHITESPACE = frozenset(
    [0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x20, 0x85, 0xA0, 0x1680, *range(0x2000, 0x200B),
     0x2028, 0x2029, 0x202F, 0x205F, 0x3000])


def _parse_ranges() -> tuple[list[int], str]:
    starts: list[int] = []
    cats: list[str] = []
    pos = 0
    for delta, cat in re.findall(r"([0-9a-f]+)([A-Z])", "".join(_CPT_RANGES)):
        pos += int(delta, 16)
        starts.append(pos)
        cats.append(cat)
    return starts, "".join(cats)


_RANGE_STARTS, _RANGE_CATS = _parse_ranges()


def _cpt_category(cpt: int) -> str:
    """llama.cpp's category of a code point: one of U N L Z M P S C."""
    if cpt >= 0x110000:
        return "U"
    return _RANGE_CATS[bisect.bisect_right(_RANGE_STARTS, cpt) - 1]


# collapsed representation used by llama.cpp's unicode_regex_split for regexes with \p{..}
_COLLAPSED_CAT = {"N": "\xd1", "L": "\xd2", "P": "\xd3", "M": "\xd4", "S": "\xd5"}


class _CollapseTable(dict):
    """str.translate table: code point -> llama.cpp's collapsed character."""

    def __missing__(self, cpt: int) -> int:
        if cpt < 128:
            value = cpt
        elif cpt in _WHITESPACE:
            value = 0x0B
        else:
            value = ord(_COLLAPSED_CAT.get(_cpt_category(cpt), "\xd0"))
        self[cpt] = value
        return value


_COLLAPSE = _CollapseTable()
# for regexes without \p{..} llama.cpp matches the code points with std::wregex, after
# replacing non-ASCII whitespace by \v (wregex's \s only knows ASCII whitespace)
_WIDE = {cpt: 0x0B for cpt in _WHITESPACE if cpt > 0x7F}

_UCAT_ENUM = {
    "\\p{N}": "N", "\\p{L}": "L", "\\p{P}": "P", "\\p{M}": "M", "\\p{S}": "S",
    "\\p{Lu}": "L", "\\p{Ll}": "L", "\\p{Lt}": "L", "\\p{Lm}": "L", "\\p{Lo}": "L",
}
# ASCII members of each category, as llama.cpp's k_ucat_map
_UCAT_ASCII = {
    "N": "0-9",
    "L": "A-Za-z",
    "P": "!-#%-*,-/:-;?-@\\[-\\]_\\{\\}",
    "M": "",
    "S": "\\$\\+<->^`\\|\\~",
}


def _collapse_regex(expr: str) -> str:
    """Port of the regex rewriting in llama.cpp's unicode_regex_split."""
    out = []
    inside = False
    i = 0
    n = len(expr)
    while i < n:
        c = expr[i]
        if c == "[" and (i == 0 or expr[i - 1] != "\\"):
            out.append("[")
            inside = True
            i += 1
            continue
        if inside and c == "]" and expr[i - 1] != "\\":
            out.append("]")
            inside = False
            i += 1
            continue
        if c == "\\" and i + 3 < n and expr[i + 1] == "p" and expr[i + 2] == "{":
            close = expr.find("}", i + 3)
            if close != -1 and close <= i + 10:
                cat = _UCAT_ENUM.get(expr[i:close + 1])
                if cat is not None:
                    body = _COLLAPSED_CAT[cat] + _UCAT_ASCII[cat]
                    out.append(body if inside else "[" + body + "]")
                    i = close + 1
                    continue
        out.append(c)
        i += 1
    return "".join(out)


def _ecma_to_python(expr: str) -> str:
    """Adapt the few ECMAScript regex features whose meaning differs in Python's re."""
    out = []
    inside = False
    i = 0
    while i < len(expr):
        c = expr[i]
        if c == "\\":
            out.append(expr[i:i + 2])
            i += 2
            continue
        if inside:
            if c == "]":
                inside = False
        elif c == "[":
            inside = True
        elif c == "$":
            c = r"\Z"  # ECMAScript $ (no multiline) matches only at the very end
        elif c == ".":
            c = "[^\\n\\r\\u2028\\u2029]"
        out.append(c)
        i += 1
    return "".join(out)


class _SplitRegex:
    __slots__ = ("pattern", "collapsed")

    def __init__(self, expr: str):
        self.collapsed = any(k in expr for k in _UCAT_ENUM)
        if self.collapsed:
            if any(ord(ch) >= 128 for ch in expr):
                raise UnsupportedModelError(
                    "regex with both unicode categories and non-ASCII characters")
            expr = _collapse_regex(expr)
        self.pattern = re.compile(_ecma_to_python(expr), re.ASCII)


_RE_GPT2 = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"
_RE_LLAMA3 = (
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
_RE_QWEN2 = (
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")

# llm_tokenizer_bpe: pre-tokenizer regexes per LLAMA_VOCAB_PRE_TYPE_*, applied one after the other
_PRE_REGEXES: dict[str, tuple[str, ...]] = {
    "LLAMA3": (
        _RE_LLAMA3,
    ),
    "JAIS2": (
        "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s{512}(?!\\S)|\\s{256}(?!\\S)|\\s{128}(?!\\S)|\\s{64}(?!\\S)|\\s{32}(?!\\S)|\\s{16}(?!\\S)|\\s{8}(?!\\S)|\\s{4}(?!\\S)|\\s{1,2}(?!\\S)|\\s{1}",
    ),
    "DBRX": (
        _RE_LLAMA3,
    ),
    "SMAUG": (
        _RE_LLAMA3,
    ),
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
    "GPT2": (
        _RE_GPT2,
    ),
    "MPT": (
        _RE_GPT2,
    ),
    "OLMO": (
        _RE_GPT2,
    ),
    "JAIS": (
        _RE_GPT2,
    ),
    "TRILLION": (
        _RE_GPT2,
    ),
    "GRANITE_DOCLING": (
        _RE_GPT2,
    ),
    "STABLELM2": (
        _RE_QWEN2,
    ),
    "QWEN2": (
        _RE_QWEN2,
    ),
    "HUNYUAN": (
        _RE_QWEN2,
    ),
    "SOLAR_OPEN": (
        _RE_QWEN2,
    ),
    "QWEN35": (
        "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    ),
    "PORO": (
        ' ?[^(\\s|.,!?\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c)]+',
    ),
    "BLOOM": (
        ' ?[^(\\s|.,!?\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c)]+',
    ),
    "GPT3_FINNISH": (
        ' ?[^(\\s|.,!?\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c)]+',
    ),
    "CHATGLM4": (
        _RE_LLAMA3,
    ),
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
    "UFAKZEKA": (
        '[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+',
    ),
    "GROK_2": (
        _RE_QWEN2,
    ),
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

# tokenizer.ggml.pre -> (pre type, overrides of the BPE defaults), as llama_vocab::impl::load.
# Defaults for BPE: clean_spaces=True, ignore_merges=False, add_bos=False.
_F = {"clean_spaces": False}
_PRE_TYPES: dict[str, tuple[str, dict[str, bool]]] = {
    "default": ("DEFAULT", {}),
    **{n: ("LLAMA3", {"ignore_merges": True, "add_bos": True})
       for n in ("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral",
                 "midm-2.0", "lfm2", "jina-v5-nano")},
    "deepseek-llm": ("DEEPSEEK_LLM", _F),
    "deepseek-coder": ("DEEPSEEK_CODER", _F),
    "deepseek-v3": ("DEEPSEEK3_LLM", _F),
    "spark2_5": ("SPARK2_5", _F),
    "youtu": ("YOUTU", {"clean_spaces": False, "ignore_merges": True}),
    "falcon": ("FALCON", {}),
    "mpt": ("MPT", {}),
    "starcoder": ("STARCODER", {}),
    **{n: ("GPT2", {})
       for n in ("gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de",
                 "a.x-4.0", "mellum", "modern-bert", "exaone4")},
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
_EOT_NAMES = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
              "<|end_of_text|>", "<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>",
              "<end_of_utterance>")
_EOM_NAMES = ("<|eom_id|>",)
_FIM_NAMES = {
    "fim_pre": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>",
                "▁<PRE>", "<|code_prefix|>", "<|prefix|>"),
    "fim_suf": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>",
                "▁<SUF>", "<|code_suffix|>", "<|suffix|>"),
    "fim_mid": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>",
                "▁<MID>", "<|code_middle|>", "<|middle|>"),
    "fim_pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "fim_rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "fim_sep": ("<|file_sep|>",),
}
_EOG_NAMES = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>",
              "<|calls|>", "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>",
              "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>", "<end_of_utterance>", "<eos>",
              "<turn|>", "<|tool_response>", "<｜end▁of▁sentence｜>", "[e~[")

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


# GPT-2 byte-level alphabet (unicode_byte_to_utf8_map)
def _byte_level_alphabet() -> list[str]:
    direct = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = {b: chr(b) for b in direct}
    n = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + n)
            n += 1
    return [table[b] for b in range(256)]


_BYTE_TO_CHAR = _byte_level_alphabet()
_CHAR_TO_BYTE = {c: b for b, c in enumerate(_BYTE_TO_CHAR)}
# latin-1 decoded bytes -> byte-level characters
_LATIN1_TO_BYTE_LEVEL = {b: c for b, c in enumerate(_BYTE_TO_CHAR)}
# byte-level characters -> latin-1 characters; anything else -> a character latin-1 cannot encode
_BYTE_LEVEL_TO_LATIN1 = {ord(c): b for c, b in _CHAR_TO_BYTE.items()}
for _b in range(256):
    _BYTE_LEVEL_TO_LATIN1.setdefault(_b, 0x110000 - 1)
del _b

_C_SPACE = " \t\n\v\f\r"  # C isspace() in the "C" locale


def _byte_encode(word: str) -> str:
    return word.encode("utf-8", "surrogatepass").decode("latin-1").translate(_LATIN1_TO_BYTE_LEVEL)


# A SentencePiece vocabulary without a token that continues past a "▁" following another
# character (Llama's, Gemma's: pieces are whole words with their leading spaces, or runs of spaces)
# never merges across such a "▁": the text can be tokenized word by word there, with a cache.
_SPM_INNER_SPACE = re.compile("[^\u2581]\u2581")
_SPM_WORDS = re.compile("\u2581*[^\u2581]+|\u2581+")
_SPM_CACHE_SIZE = 1 << 16  # words
_SPM_CACHE_WORD = 100  # characters: longer words are not cached

# unicode_len_utf8: the length of a UTF-8 sequence from the high four bits of its first byte
_UTF8_LEN = (1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4)


def _utf8(text: str) -> bytes:
    """A token's or a text's bytes; bytes that are not UTF-8 come back from surrogateescape."""
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogatepass")


def _is_utf8(text: str) -> bool:
    """False when ``text`` has surrogates (bytes that were not UTF-8, escaped)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _decode_utf8_like_llama(data: bytes) -> str:
    """unicode_cpts_from_utf8: invalid sequences become U+FFFD, one byte at a time."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        pass
    out = []
    i, n = 0, len(data)
    while i < n:
        b0 = data[i]
        if not b0 & 0x80:
            out.append(b0)
            i += 1
            continue
        if not b0 & 0x40:
            out.append(0xFFFD)
            i += 1
            continue
        if not b0 & 0x20:
            size, cpt = 2, b0 & 0x1F
        elif not b0 & 0x10:
            size, cpt = 3, b0 & 0x0F
        elif not b0 & 0x08:
            size, cpt = 4, b0 & 0x07
        else:
            out.append(0xFFFD)
            i += 1
            continue
        if i + size - 1 >= n or any((data[i + k] & 0xC0) != 0x80 for k in range(1, size)):
            out.append(0xFFFD)
            i += 1
            continue
        for k in range(1, size):
            cpt = (cpt << 6) | (data[i + k] & 0x3F)
        out.append(cpt)
        i += size
    return "".join(map(chr, out))



def _meta_int(meta: Mapping[str, Any], key: str) -> int | None:
    value = meta.get(key)
    if value is None:
        return None
    try:
        return int(value)
    except (TypeError, ValueError) as e:
        raise GGUFError(f"{key}: expected an integer, got {value!r}") from e


def _meta_bool(meta: Mapping[str, Any], key: str) -> bool | None:
    value = meta.get(key)
    return None if value is None else bool(value)


def _meta_list(meta: Mapping[str, Any], key: str) -> list[Any] | None:
    value = meta.get(key)
    if value is None:
        return None
    if isinstance(value, (str, bytes)):
        raise GGUFError(f"{key}: expected an array")
    return list(value)


def _texts(values: list[Any]) -> list[str]:
    """_as_text of every item; the list itself when all are str already (GGUF strings usually are)."""
    if all(type(v) is str for v in values):
        return values
    return [_as_text(v) for v in values]


def _as_text(value: Any) -> str:
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "surrogateescape")
    return str(value)


class _TokenTexts(Sequence[str]):
    """The vocabulary's token texts in one UTF-8 buffer and an offset table: Qwen2.5's 151,936 take 3.5 MiB so,
    14 MiB as a list of str."""

    def __init__(self, texts: Sequence[str]):
        data = [t.encode("utf-8", "surrogatepass") for t in texts]
        self._offsets = array("q", [0])
        total = 0
        for b in data:
            total += len(b)
            self._offsets.append(total)
        self._data = b"".join(data)

    def __len__(self) -> int:
        return len(self._offsets) - 1

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        o = self._offsets
        return self._data[o[i]:o[i + 1]].decode("utf-8", "surrogatepass")

    def __iter__(self) -> Iterator[str]:
        return (self[i] for i in range(len(self)))


class Tokenizer:
    """A GGUF vocabulary with llama.cpp's tokenization (``llama_tokenize``/``llama_detokenize``).

    Build it with :meth:`from_metadata`. Token ids are plain ``int``; a missing special token is
    ``None`` (llama.cpp's ``LLAMA_TOKEN_NULL``).
    """

    model: str
    """``tokenizer.ggml.model``: ``"gpt2"`` (byte-level BPE) or ``"llama"`` (SentencePiece)."""
    pre: str
    """``tokenizer.ggml.pre`` as given (``"default"`` when absent; ``""`` for SentencePiece)."""
    pre_type: str
    """llama.cpp's LLAMA_VOCAB_PRE_TYPE_* name for ``pre`` (``"DEFAULT"`` for SentencePiece)."""
    n_vocab: int
    bos_id: int | None
    eos_id: int | None
    eot_id: int | None
    eom_id: int | None
    unk_id: int | None
    sep_id: int | None
    pad_id: int | None
    mask_id: int | None
    fim_pre_id: int | None
    fim_suf_id: int | None
    fim_mid_id: int | None
    fim_pad_id: int | None
    fim_rep_id: int | None
    fim_sep_id: int | None
    add_bos: bool
    add_eos: bool
    add_sep: bool
    add_space_prefix: bool
    clean_spaces: bool
    ignore_merges: bool
    eog_ids: frozenset[int]
    """Token ids that end generation, as llama.cpp's ``llama_vocab_is_eog``."""

    def __init__(self) -> None:  # use from_metadata()
        self._tokens: Sequence[str] = []
        self._token_to_id: dict[str, int] = {}   # none kept for BPE: the tokenizers model has the vocabulary
        self._attrs = array("i")
        self._scores = array("f")
        self._pieces: dict[int, bytes] = {}
        self._special: list[tuple[str, int]] = []
        self._regexes: list[_SplitRegex] = []
        self._hf: _HFTokenizer | None = None
        self._bytes_to_id: dict[bytes, int] = {}  # SentencePiece: token bytes -> id
        self.spm_by_word = False  # see _SPM_INNER_SPACE
        self._spm_cache: dict[str, list[int]] = {}
        self._phantom: dict[int, str] = {}  # stand-in id -> symbol that is not a token

    # ------------------------------------------------------------------ construction

    @classmethod
    def from_metadata(cls, meta: Mapping[str, Any]) -> "Tokenizer":
        """Build the tokenizer from GGUF metadata (key -> Python value).

        Uses the ``tokenizer.ggml.*`` keys, plus ``general.name`` and ``general.architecture``
        when present (llama.cpp sets a few token attributes by model name). Raises
        UnsupportedModelError for a ``tokenizer.ggml.model`` or ``tokenizer.ggml.pre``
        this module does not implement, GGUFError for missing or inconsistent metadata.
        """
        self = cls()
        model = meta.get("tokenizer.ggml.model")
        if model is None:
            raise GGUFError("tokenizer.ggml.model is missing")
        model = _as_text(model)
        pre_value = meta.get("tokenizer.ggml.pre")
        pre = "" if pre_value is None else _as_text(pre_value)
        self.model = model

        self.add_space_prefix = False
        self.add_eos = False
        self.add_sep = False
        self.ignore_merges = False
        ids = dict.fromkeys(("bos", "eos", "eot", "eom", "unk", "sep", "pad", "mask", "fim_pre",
                             "fim_suf", "fim_mid", "fim_pad", "fim_rep", "fim_sep"), None)
        if model == "gpt2":
            if pre in ("", "default"):
                pre_type, flags = "DEFAULT", {}
            elif pre in _PRE_TYPES:
                pre_type, flags = _PRE_TYPES[pre]
            else:
                raise UnsupportedModelError(f"unsupported pre-tokenizer type: {pre!r}")
            self.pre = pre or "default"
            self.pre_type = pre_type
            self.clean_spaces = flags.get("clean_spaces", True)
            self.ignore_merges = flags.get("ignore_merges", False)
            self.add_bos = flags.get("add_bos", False)
            self.add_sep = flags.get("add_sep", False)
            ids["bos"] = ids["eos"] = 11
            if flags.get("bos_null"):
                ids["bos"] = None
            self._regexes = [_SplitRegex(e) for e in _PRE_REGEXES[pre_type]]
        elif model == "llama":
            self.pre = pre
            self.pre_type = "DEFAULT"
            self.clean_spaces = False
            self.add_space_prefix = True
            self.add_bos = True
            ids.update(bos=1, eos=2, unk=0)
        else:
            raise UnsupportedModelError(f"unsupported tokenizer model: {model!r}")
        add_prefix = _meta_bool(meta, "tokenizer.ggml.add_space_prefix")
        if add_prefix is not None:
            self.add_space_prefix = add_prefix

        raw_tokens = _meta_list(meta, "tokenizer.ggml.tokens")
        if not raw_tokens:
            raise GGUFError("tokenizer.ggml.tokens is missing or empty")
        n = len(raw_tokens)
        # llama.cpp reads a token as a C string: it ends at the first NUL
        tokens = [t.split("\x00", 1)[0] if "\x00" in t else t for t in _texts(raw_tokens)]
        tokens = [t or f"[EMPTY_{i}]" for i, t in enumerate(tokens)] if "" in tokens else tokens
        token_to_id = dict(zip(tokens, range(n)))
        if len(token_to_id) != n:
            first: dict[str, int] = {}
            for i, text in enumerate(tokens):
                if first.setdefault(text, i) != i:
                    raise GGUFError(f"duplicate token in vocabulary: {text!r} has ids {first[text]} and {i}")
        self._tokens, self._token_to_id, self.n_vocab = tokens, token_to_id, n

        scores = _meta_list(meta, "tokenizer.ggml.scores")
        if scores is not None and len(scores) < n:
            raise GGUFError("tokenizer.ggml.scores is shorter than the vocabulary")
        self._scores = array("f", [float(s) for s in scores[:n]] if scores is not None else [0.0] * n)
        types = _meta_list(meta, "tokenizer.ggml.token_type")
        if types is not None and len(types) < n:
            raise GGUFError("tokenizer.ggml.token_type is shorter than the vocabulary")
        if types is None:
            self._attrs = array("i", [TokenAttr.NORMAL]) * n
        else:
            self._attrs = array("i", [_TYPE_TO_ATTR.get(int(t), TokenAttr.UNDEFINED) for t in types[:n]])

        self._load_special_ids(meta, ids)
        self._detect_special_tokens()
        self._apply_model_attrs(meta)

        if model == "gpt2":      # the tokenizers model holds the texts and ids (see _text, token_id)
            self._hf = self._build_bpe(meta)
            self._token_to_id, self._tokens, self._scores = {}, [], array("f")
        else:
            self._bytes_to_id = {_utf8(text): tid for tid, text in enumerate(tokens)}
            self.spm_by_word = not any(map(_SPM_INNER_SPACE.search, tokens))
            self._tokens = _TokenTexts(tokens)
        return self

    def _load_special_ids(self, meta: Mapping[str, Any], ids: dict[str, int | None]) -> None:
        n = self.n_vocab
        for name, value in ids.items():
            if value is not None and value >= n:
                ids[name] = None
        for name, key in _SPECIAL_ID_KEYS:
            value = _meta_int(meta, key)
            if value is not None and 0 <= value < n:
                ids[name] = value
        for name in ("add_bos", "add_eos", "add_sep"):
            value = _meta_bool(meta, f"tokenizer.ggml.{name}_token")
            if value is not None:
                setattr(self, name, value)
        self._ids = ids

    def _detect_special_tokens(self) -> None:
        """Port of the text-based detection of EOT/EOM/FIM/EOG tokens in llama.cpp's load."""
        ids, attrs, t2i = self._ids, self._attrs, self._token_to_id
        CONTROL = TokenAttr.CONTROL

        def first_of(names: Sequence[str]) -> int | None:
            # llama.cpp takes the first match in its hash-map order; take the first name here
            for name in names:
                if name in t2i:
                    return t2i[name]
            return None

        for name, names in (("eot", _EOT_NAMES), ("eom", _EOM_NAMES), *_FIM_NAMES.items()):
            if ids[name] is None:
                tid = first_of(names)
                if tid is not None:
                    ids[name] = tid
                    attrs[tid] |= CONTROL

        for tid, text in enumerate(self._tokens):
            if attrs[tid] & CONTROL and not attrs[tid] & TokenAttr.UNUSED and "unused" in text:
                attrs[tid] |= TokenAttr.UNUSED

        eog = {ids[k] for k in ("fim_pad", "fim_rep", "fim_sep") if ids[k] is not None}
        for name in _EOG_NAMES:
            tid = t2i.get(name)
            if tid is not None:
                eog.add(tid)
                attrs[tid] |= CONTROL
        for name in ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"):
            tid = t2i.get(name)
            if tid is not None:
                attrs[tid] = TokenAttr.USER_DEFINED
        for name in ("eos", "eot", "eom"):
            if ids[name] is not None:
                eog.add(ids[name])
        texts = {self._tokens[t] for t in eog}
        end_id = t2i.get("<|end|>")
        if "<|end|>" in texts and (
                ("<|return|>" in texts and ("<|call|>" in texts or "<|calls|>" in texts))
                or (("<|call|>" in texts or "<|calls|>" in texts) and "<|flush|>" in texts)):
            eog.discard(end_id)
            attrs[end_id] = TokenAttr.USER_DEFINED
        s_id = t2i.get("</s>")
        if "<|tool_response>" in texts and "</s>" in texts:
            eog.discard(s_id)
            attrs[s_id] = TokenAttr.NORMAL
        self.eog_ids = frozenset(eog)

        for name in ids:
            setattr(self, f"{name}_id", ids[name])

        special_mask = CONTROL | TokenAttr.USER_DEFINED | TokenAttr.UNKNOWN
        special = [tid for tid in range(self.n_vocab) if attrs[tid] & special_mask]
        # longest first, like llama.cpp (ties in its unstable sort: by id here)
        special.sort(key=lambda tid: -len(self._tokens[tid].encode("utf-8", "surrogatepass")))
        self._special = [(self._tokens[tid], tid) for tid in special]

    def _apply_model_attrs(self, meta: Mapping[str, Any]) -> None:
        """LSTRIP/RSTRIP attributes llama.cpp sets by model name (after the piece cache)."""
        name = _as_text(meta.get("general.name", "")).lower()
        arch = _as_text(meta.get("general.architecture", ""))
        attrs, t2i = self._attrs, self._token_to_id
        if (any(p in self.pre for p in ("jina-v2-de", "jina-v2-es", "jina-v2-code"))
                or any(a in arch for a in ("nomic-bert-moe", "jina-bert-v3"))):
            if "<mask>" in t2i:
                attrs[t2i["<mask>"]] |= TokenAttr.LSTRIP
        elif "phi-3" in name or "phi3" in name:
            for _, tid in self._special:
                attrs[tid] |= TokenAttr.RSTRIP
            for text, on in (("</s>", True), ("<unk>", False), ("<s>", False),
                             ("<|endoftext|>", False)):
                if text not in t2i:
                    raise GGUFError(f"phi-3 vocabulary without {text!r}")
                if on:
                    attrs[t2i[text]] |= TokenAttr.RSTRIP
                else:
                    attrs[t2i[text]] &= ~TokenAttr.RSTRIP
        elif "modern-bert" in name:
            if "[MASK]" in t2i:
                attrs[t2i["[MASK]"]] |= TokenAttr.LSTRIP

    def _build_bpe(self, meta: Mapping[str, Any]) -> _HFTokenizer:
        """llm_tokenizer_bpe's merges as a tokenizers BPE model. Symbols llama.cpp can form that
        are not tokens (byte-level characters missing from the vocabulary, results of merges
        that are not tokens) get stand-in ids past the vocabulary, resolved like llama.cpp
        afterwards (see _resolve_phantoms)."""
        raw_merges = _meta_list(meta, "tokenizer.ggml.merges")
        if raw_merges is None:
            raise GGUFError("tokenizer.ggml.merges is missing")
        vocab = self._token_to_id       # not kept after (see token_id)
        # "left right" split at the first space after the first character; llama.cpp keeps the first rank
        # of a pair (dict.fromkeys: first occurrence, in order)
        merges = list(dict.fromkeys((m[:p], m[p + 1:]) for m in _texts(raw_merges)
                                    for p in (m.find(" ", 1),) if p >= 0))
        missing = [sym for a, b in merges for sym in (a, b, a + b) if sym not in vocab]
        for sym in dict.fromkeys(missing):
            self._add_phantom(vocab, sym)
        for char in _BYTE_TO_CHAR:
            self._add_phantom(vocab, char)
        bpe = _hf_models.BPE(vocab=vocab, merges=merges, ignore_merges=self.ignore_merges)
        return _HFTokenizer(bpe)

    def _add_phantom(self, vocab: dict[str, int], sym: str) -> None:
        if sym not in vocab:
            vocab[sym] = len(vocab)
            self._phantom[vocab[sym]] = sym

    def _resolve_phantoms(self, ids: list[int]) -> list[int]:
        """Replace stand-in ids (symbols that are not tokens) the way llama.cpp's BPE does: by
        the tokens whose text is one of the symbol's bytes, skipping bytes without one."""
        if not ids or max(ids) < self.n_vocab:
            return ids
        out: list[int] = []
        for tid in ids:
            if tid < self.n_vocab:
                out.append(tid)
                continue
            for b in self._phantom[tid].encode("utf-8", "surrogatepass"):
                byte = self.token_id(chr(b)) if b < 0x80 else None
                if byte is not None:
                    out.append(byte)
        return out

    def _spm_encode(self, text: str, out: list[int]) -> None:
        """SentencePiece tokens of ``text`` (spaces already "▁"), word by word when the
        vocabulary allows it (_SPM_INNER_SPACE) and the text is valid UTF-8: a byte that is not
        (a surrogate escape here) starts a symbol as long as its lead bits say, which may
        reach into the next word."""
        if not self.spm_by_word or (not text.isascii() and not _is_utf8(text)):
            self._spm_tokenize(_utf8(text), out)
            return
        cache = self._spm_cache
        for word in _SPM_WORDS.findall(text):
            ids = cache.get(word)
            if ids is None:
                ids = []
                self._spm_tokenize(word.encode("utf-8"), ids)
                if len(word) <= _SPM_CACHE_WORD:
                    if len(cache) >= _SPM_CACHE_SIZE:
                        cache.clear()
                    cache[word] = ids
            out.extend(ids)

    def _spm_tokenize(self, text: bytes, out: list[int]) -> None:
        """llm_tokenizer_spm_session::tokenize: ``text`` (spaces already "▁") split into UTF-8
        characters, adjacent symbols merged while their concatenation is a token (highest
        score first, then leftmost), symbols that are not tokens emitted as byte tokens."""
        b2i, scores = self._bytes_to_id, self._scores
        n = len(text)
        if not n:
            return
        starts: list[int] = []
        offs = 0
        while offs < n:
            starts.append(offs)
            offs += _UTF8_LEN[text[offs] >> 4]
        count = len(starts)
        size = [end - start for start, end in zip(starts, [*starts[1:], n])]
        prev = list(range(-1, count - 1))
        nxt = [*range(1, count), -1]
        heap: list[tuple[float, int, int, int]] = []
        push, pop = heapq.heappush, heapq.heappop

        def try_add(left: int, right: int) -> None:
            if left < 0 or right < 0:
                return
            length = size[left] + size[right]
            tid = b2i.get(text[starts[left]:starts[left] + length])
            if tid is not None:
                push(heap, (-scores[tid], left, right, length))

        for i in range(1, count):
            try_add(i - 1, i)
        while heap:
            _, left, right, length = pop(heap)
            # one of the two merged since the pair was queued
            if size[left] == 0 or size[right] == 0 or size[left] + size[right] != length:
                continue
            size[left] = length
            size[right] = 0
            nxt[left] = after = nxt[right]
            if after >= 0:
                prev[after] = left
            try_add(prev[left], left)
            try_add(left, after)

        i = 0
        while i != -1:
            piece = text[starts[i]:starts[i] + size[i]]
            tid = b2i.get(piece)
            if tid is not None:
                out.append(tid)
            else:
                out.extend(map(self._spm_byte_token, piece))
            i = nxt[i]

    def _spm_byte_token(self, byte: int) -> int:
        """llama_vocab::byte_to_token for SentencePiece: <0xXX>, else the one-byte token."""
        b2i = self._bytes_to_id
        tid = b2i.get(b"<0x%02X>" % byte)
        if tid is None:
            tid = b2i.get(bytes([byte]))
            if tid is None:
                raise GGUFError(f"vocabulary without a token for byte 0x{byte:02X}")
        return tid

    # ------------------------------------------------------------------ vocabulary queries

    def token_text(self, id: int) -> str:
        """The token's text as stored in the GGUF vocabulary."""
        return self._text(self._check_id(id))

    def _text(self, id: int) -> str:
        if self._hf is not None:
            return str(self._hf.id_to_token(id))
        return self._tokens[id]

    def token_attr(self, id: int) -> int:
        """The token's llama_token_attr bits (see :class:`TokenAttr`)."""
        return self._attrs[self._check_id(id)]

    def token_id(self, text: str) -> int | None:
        """The id of the token whose text is exactly ``text``, or None."""
        if self._hf is not None:
            tid = self._hf.token_to_id(text)
            return tid if tid is not None and tid < self.n_vocab else None
        return self._token_to_id.get(text)

    def is_eog(self, id: int) -> bool:
        """True for tokens that end generation (eos, eot, eom, <|im_end|>, <|endoftext|>...)."""
        return id in self.eog_ids

    def is_control(self, id: int) -> bool:
        return bool(self._attrs[self._check_id(id)] & TokenAttr.CONTROL)

    @property
    def special_ids(self) -> list[int]:
        """Ids of the CONTROL, USER_DEFINED and UNKNOWN tokens, longest text first: the tokens
        that tokenizer_st_partition splits out of the text."""
        return [tid for _, tid in self._special]

    def _check_id(self, id: int) -> int:
        if not 0 <= id < self.n_vocab:
            raise IndexError(f"token id {id} out of range [0, {self.n_vocab})")
        return id

    # ------------------------------------------------------------------ encoding

    def encode(self, text: str | bytes, *, add_special: bool = True,
               parse_special: bool = False) -> list[int]:
        """Token ids of ``text``, as ``llama_tokenize(text, add_special, parse_special)``.

        ``add_special`` adds BOS/EOS when the vocabulary asks for them; ``parse_special`` turns
        the text of CONTROL tokens (e.g. ``<|im_start|>``) into those tokens (USER_DEFINED
        tokens are always recognised). ``bytes`` are decoded like llama.cpp does: for a
        byte-level BPE vocabulary invalid UTF-8 becomes U+FFFD, a SentencePiece one tokenizes the
        bytes as they are (a byte that is not UTF-8 ends in byte tokens).
        """
        if isinstance(text, (bytes, bytearray, memoryview)):
            if self.model == "llama":
                # SentencePiece works on the bytes themselves: keep invalid ones as they are
                text = bytes(text).decode("utf-8", "surrogateescape")
            else:
                text = _decode_utf8_like_llama(bytes(text))
        fragments = self._partition(text, parse_special) if text else []
        out: list[int] = []
        if add_special and self.add_bos:
            if self.bos_id is None:
                raise GGUFError("tokenizer.ggml.add_bos_token is true but there is no BOS token")
            out.append(self.bos_id)
        if self.model == "llama":
            is_prev_special = True
            for frag in fragments:
                if isinstance(frag, int):
                    out.append(frag)
                    is_prev_special = True
                    continue
                piece = text[frag[0]:frag[1]]
                if self.add_space_prefix and is_prev_special:
                    piece = " " + piece
                self._spm_encode(piece.replace(" ", "\u2581"), out)
                is_prev_special = False
        else:
            for frag in fragments:
                if isinstance(frag, int):
                    out.append(frag)
                else:
                    words = self.pre_tokenize(text[frag[0]:frag[1]])
                    if words:
                        out.extend(self._hf_encode([_byte_encode(w) for w in words]))
        if add_special and self.add_eos:
            if self.eos_id is None:
                raise GGUFError("tokenizer.ggml.add_eos_token is true but there is no EOS token")
            out.append(self.eos_id)
        return out

    __call__ = encode

    def _hf_encode(self, words: list[str]) -> list[int]:
        assert self._hf is not None
        ids = self._hf.encode(words, is_pretokenized=True, add_special_tokens=False).ids
        return self._resolve_phantoms(ids) if self._phantom else ids

    def _partition(self, text: str, parse_special: bool) -> list[int | tuple[int, int]]:
        """tokenizer_st_partition: split special tokens out, leaving (start, end) text spans."""
        frags: list[int | tuple[int, int]] = [(0, len(text))]
        skip = TokenAttr.CONTROL | TokenAttr.UNKNOWN
        attrs = self._attrs
        for tok, tid in self._special:
            attr = attrs[tid]
            if not parse_special and attr & skip:
                continue
            if tok not in text:
                continue
            lstrip = attr & TokenAttr.LSTRIP
            rstrip = attr & TokenAttr.RSTRIP
            new: list[int | tuple[int, int]] = []
            for frag in frags:
                if isinstance(frag, int):
                    new.append(frag)
                    continue
                off, end = frag
                while True:
                    match = text.find(tok, off, end)
                    if match < 0:
                        if end > off:
                            new.append((off, end))
                        break
                    left_end = match
                    if lstrip:
                        while left_end > off and text[left_end - 1] in _C_SPACE:
                            left_end -= 1
                    if left_end > off:
                        new.append((off, left_end))
                    new.append(tid)
                    off = match + len(tok)
                    if off >= end:
                        break
                    if rstrip:
                        while off < end and text[off] in _C_SPACE:
                            off += 1
            frags = new
        return frags

    def pre_tokenize(self, text: str) -> list[str]:
        """The words llama.cpp's BPE pre-tokenizer splits ``text`` into (not byte-encoded)."""
        if self.model != "gpt2":
            return [text]
        spans = [(0, len(text))]
        collapsed = wide = None
        for rx in self._regexes:
            if rx.collapsed:
                if collapsed is None:
                    collapsed = text.translate(_COLLAPSE)
                subject = collapsed
            else:
                if wide is None:
                    wide = text.translate(_WIDE)
                subject = wide
            finditer = rx.pattern.finditer
            new = []
            for start, end in spans:
                last = 0
                for m in finditer(subject[start:end]):
                    a, b = m.span()
                    if a == b:
                        continue
                    if a > last:
                        new.append((start + last, start + a))
                    new.append((start + a, start + b))
                    last = b
                if start + last < end:
                    new.append((start + last, end))
            spans = new
        return [text[a:b] for a, b in spans]

    # ------------------------------------------------------------------ decoding

    def _piece(self, id: int) -> bytes:
        """llama.cpp's cached piece (token_to_piece with special=true, no lstrip)."""
        piece = self._pieces.get(id)
        if piece is None:
            attr = self._attrs[id]
            text = self._text(id)
            if attr & (TokenAttr.UNKNOWN | TokenAttr.CONTROL | TokenAttr.USER_DEFINED):
                piece = text.encode("utf-8", "surrogatepass")
            elif attr & TokenAttr.NORMAL:
                if self.model == "llama":
                    piece = text.replace("\u2581", " ").encode("utf-8", "surrogatepass")
                else:
                    piece = _byte_level_decode(text)
            elif attr & TokenAttr.BYTE:
                piece = bytes([_hex_byte(text[3:5])])
            else:
                piece = b""
            self._pieces[id] = piece
        return piece

    def token_to_piece(self, id: int, *, special: bool = True, lstrip: int = 0) -> bytes:
        """The bytes of one token, as ``llama_token_to_piece(id, lstrip, special)``.

        With ``special=False`` CONTROL and UNKNOWN tokens give ``b""``; ``lstrip`` drops up to
        that many leading spaces.
        """
        self._check_id(id)
        if not special and self._attrs[id] & (TokenAttr.UNKNOWN | TokenAttr.CONTROL):
            return b""
        piece = self._piece(id)
        while lstrip > 0 and piece[:1] == b" ":
            piece = piece[1:]
            lstrip -= 1
        return piece

    def detokenize(self, ids: Sequence[int], *, remove_special: bool = False,
                   unparse_special: bool = False) -> bytes:
        """Bytes of the text, as ``llama_detokenize(ids, remove_special, unparse_special)``."""
        ids = list(ids)
        remove_space = self.add_space_prefix
        if remove_special and self.add_bos and ids and ids[0] == self.bos_id:
            remove_space = False
            ids = ids[1:]
        if remove_special and self.add_eos and ids and ids[-1] == self.eos_id:
            ids = ids[:-1]
        parts = []
        for tid in ids:
            parts.append(self.token_to_piece(tid, special=unparse_special, lstrip=remove_space))
            remove_space = False
        text = b"".join(parts)
        if self.clean_spaces and text:
            text = _clean_spaces(text)
        return text

    def decode(self, ids: Sequence[int], *, skip_special: bool = False) -> str:
        """The text of ``ids``. ``skip_special=False`` renders special tokens as their text
        (llama_detokenize with unparse_special); ``skip_special=True`` drops CONTROL tokens and
        the BOS/EOS the vocabulary adds (remove_special). Invalid UTF-8 becomes U+FFFD."""
        data = self.detokenize(ids, remove_special=skip_special, unparse_special=not skip_special)
        return data.decode("utf-8", "replace")

    def __len__(self) -> int:
        return self.n_vocab

    def __repr__(self) -> str:
        return (f"Tokenizer(model={self.model!r}, pre={self.pre!r}, n_vocab={self.n_vocab}, "
                f"bos_id={self.bos_id}, eos_id={self.eos_id}, add_bos={self.add_bos})")


def _hex_byte(text: str) -> int:
    """strtol(text, 16) of a two-character string, as llama.cpp's token_to_byte."""
    value = 0
    for ch in text:
        digit = int(ch, 16) if ch in "0123456789abcdefABCDEF" else -1
        if digit < 0:
            break
        value = value * 16 + digit
    return value & 0xFF


def _byte_level_decode(text: str) -> bytes:
    """llama_decode_text: GPT-2 byte-level characters back to bytes."""
    try:
        return text.translate(_BYTE_LEVEL_TO_LATIN1).encode("latin-1")
    except UnicodeEncodeError:
        pass
    raw = text.encode("utf-8", "surrogatepass")
    out = bytearray()
    for ch in text:
        b = _CHAR_TO_BYTE.get(ch)
        if b is not None:
            out.append(b)
        else:
            out += b"[UNK_BYTE_0x" + ch.encode("utf-8", "surrogatepass").hex().encode() + raw + b"]"
    return bytes(out)


def _clean_spaces(text: bytes) -> bytes:
    """The clean_spaces passes of llama_vocab::impl::detokenize, ported literally."""
    buf = bytearray(text)
    SP, Q = 0x20, 0x27
    # first pass: " ?", " !", " .", " ,"
    total1, total = len(buf), 1
    for i in range(1, total1):
        x = buf[i]
        if buf[i - 1] == SP and x in b"?!.,":
            total -= 1
        buf[total] = x
        total += 1
    # second pass: strip single apostrophe between spaces
    total2, total = total, (1 if total else 0)
    i = 1
    while i < total2:
        x = buf[i]
        if x == Q and i + 1 < total2 and buf[i - 1] == SP and buf[i + 1] == SP:
            total -= 1
            i += 1
            buf[i] = 0
        buf[total] = x
        total += 1
        i += 1
    # third pass: apostrophe contractions
    total3, total = total, (1 if total else 0)
    for i in range(1, total3):
        x = buf[i]
        if buf[i - 1] == SP and x == Q and i + 1 < total3:
            x1 = buf[i + 1]
            if x1 in b"sm":
                total -= 1
            elif x1 not in b"td" and i + 2 < total3:
                x2 = buf[i + 2]
                if (x1, x2) in ((0x72, 0x65), (0x76, 0x65)):  # 're 've
                    total -= 1
        buf[total] = x
        total += 1
    return bytes(buf[:total])
