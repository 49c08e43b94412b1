"""Text as llama.cpp's src/unicode.cpp sees it: its own code point categories, the regex rewriting of
unicode_regex_split, the GPT-2 byte-level alphabet and its UTF-8 decoding."""

from __future__ import annotations

import bisect
import re

from ..errors import UnsupportedModelError

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
    [
        0x09,
        0x0A,
        0x0B,
        0x0C,
        0x0D,
        0x20,
        0x85,
        0xA0,
        0x1680,
        *range(0x2000, 0x200B),
        0x2028,
        0x2029,
        0x202F,
        0x205F,
        0x3000,
    ]
)


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


class _CollapseTable(dict[int, int]):
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


COLLAPSE = _CollapseTable()
# for regexes without \p{..} llama.cpp matches the code points with std::wregex, after
# replacing non-ASCII whitespace by \v (wregex's \s only knows ASCII whitespace)
WIDE = {cpt: 0x0B for cpt in _WHITESPACE if cpt > 0x7F}

_UCAT_ENUM = {
    "\\p{N}": "N",
    "\\p{L}": "L",
    "\\p{P}": "P",
    "\\p{M}": "M",
    "\\p{S}": "S",
    "\\p{Lu}": "L",
    "\\p{Ll}": "L",
    "\\p{Lt}": "L",
    "\\p{Lm}": "L",
    "\\p{Lo}": "L",
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
                cat = _UCAT_ENUM.get(expr[i : close + 1])
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
            out.append(expr[i : i + 2])
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


class SplitRegex:
    __slots__ = ("pattern", "collapsed")

    def __init__(self, expr: str):
        self.collapsed = any(k in expr for k in _UCAT_ENUM)
        if self.collapsed:
            if any(ord(ch) >= 128 for ch in expr):
                raise UnsupportedModelError("regex with both unicode categories and non-ASCII characters")
            expr = _collapse_regex(expr)
        self.pattern = re.compile(_ecma_to_python(expr), re.ASCII)


def regex_split(text: str, regexes: list[SplitRegex]) -> list[str]:
    """unicode_regex_split: the words of ``text``, each regex splitting the pieces of the one before."""
    spans = [(0, len(text))]
    collapsed = wide = None
    for rx in regexes:
        if rx.collapsed:
            if collapsed is None:
                collapsed = text.translate(COLLAPSE)
            subject = collapsed
        else:
            if wide is None:
                wide = text.translate(WIDE)
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


BYTE_TO_CHAR = _byte_level_alphabet()
_CHAR_TO_BYTE = {c: b for b, c in enumerate(BYTE_TO_CHAR)}
# latin-1 decoded bytes -> byte-level characters
_LATIN1_TO_BYTE_LEVEL = {b: c for b, c in enumerate(BYTE_TO_CHAR)}
# byte-level characters -> latin-1 characters; anything else -> a character latin-1 cannot encode
_BYTE_LEVEL_TO_LATIN1 = {ord(c): b for c, b in _CHAR_TO_BYTE.items()}
for _b in range(256):
    _BYTE_LEVEL_TO_LATIN1.setdefault(_b, 0x110000 - 1)
del _b

C_SPACE = " \t\n\v\f\r"  # C isspace() in the "C" locale


def byte_encode(word: str) -> str:
    return word.encode("utf-8", "surrogatepass").decode("latin-1").translate(_LATIN1_TO_BYTE_LEVEL)


# unicode_len_utf8: the length of a UTF-8 sequence from the high four bits of its first byte
UTF8_LEN = (1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4)


def utf8(text: str) -> bytes:
    """A token's or a text's bytes; bytes that are not UTF-8 come back from surrogateescape."""
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogatepass")


def is_utf8(text: str) -> bool:
    """False when ``text`` has surrogates (bytes that were not UTF-8, escaped)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def decode_utf8_like_llama(data: bytes) -> str:
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


def hex_byte(text: str) -> int:
    """strtol(text, 16) of a two-character string, as llama.cpp's token_to_byte."""
    value = 0
    for ch in text:
        digit = int(ch, 16) if ch in "0123456789abcdefABCDEF" else -1
        if digit < 0:
            break
        value = value * 16 + digit
    return value & 0xFF


def byte_level_decode(text: str) -> bytes:
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
