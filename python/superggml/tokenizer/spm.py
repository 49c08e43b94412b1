"""llm_tokenizer_spm: SentencePiece-style vocabularies (``tokenizer.ggml.model == "llama"``).

The UTF-8 characters of the text are merged pairwise into tokens, highest token score first and leftmost first among
equal scores; characters left over fall back to their ``<0xXX>`` byte tokens. This greedy merge cannot be a
``tokenizers`` BPE model: BPE ranks pairs, and pairs of equal score (common: Llama's whitespace pieces all score
-1e9) would need equal ranks.
"""

from __future__ import annotations

import heapq
import re
from array import array
from typing import Iterator, Sequence, overload

from ..errors import GGUFError
from .unicode import UTF8_LEN, is_utf8, utf8
from .vocab import Vocab

# A SentencePiece vocabulary without a token that continues past a "▁" following another
# character (Llama's, Gemma's: pieces are whole words with their leading spaces, or runs of spaces)
# never merges across such a "▁": the text can be tokenized word by word there, with a cache.
_INNER_SPACE = re.compile("[^\u2581]\u2581")
_WORDS = re.compile("\u2581*[^\u2581]+|\u2581+")
_CACHE_SIZE = 1 << 16  # words
_CACHE_WORD = 100  # characters: longer words are not cached


class TokenTexts(Sequence[str]):
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

    @overload
    def __getitem__(self, i: int) -> str: ...
    @overload
    def __getitem__(self, i: slice) -> list[str]: ...
    def __getitem__(self, i: int | slice) -> str | list[str]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        o = self._offsets
        return self._data[o[i] : o[i + 1]].decode("utf-8", "surrogatepass")

    def __iter__(self) -> Iterator[str]:
        return (self[i] for i in range(len(self)))


class SpmEncoder:
    """Token ids of text pieces, and the vocabulary's texts and ids, for a SentencePiece vocabulary."""

    def __init__(self, vocab: Vocab):
        self.add_space_prefix = vocab.add_space_prefix
        self.scores = vocab.scores
        self.token_to_id = vocab.token_to_id
        self.bytes_to_id = {utf8(text): tid for tid, text in enumerate(vocab.tokens)}
        self.texts = TokenTexts(vocab.tokens)
        self.by_word = not any(map(_INNER_SPACE.search, vocab.tokens))
        """Tokenize word by word, with a cache (see _INNER_SPACE)."""
        self.cache: dict[str, list[int]] = {}

    def token_text(self, id: int) -> str:
        return self.texts[id]

    def token_id(self, text: str) -> int | None:
        return self.token_to_id.get(text)

    def text_of(self, data: bytes) -> str:
        """SentencePiece works on the bytes themselves: invalid ones are kept, as surrogate escapes."""
        return data.decode("utf-8", "surrogateescape")

    def pre_tokenize(self, text: str) -> list[str]:
        return [text]

    def normal_piece(self, text: str) -> bytes:
        return text.replace("\u2581", " ").encode("utf-8", "surrogatepass")

    def encode(self, piece: str, out: list[int], after_special: bool) -> None:
        """Append the tokens of a piece of text; spaces become "▁", with a "▁" before the piece after a special
        token (or at the start) unless the vocabulary says otherwise (Gemma)."""
        if self.add_space_prefix and after_special:
            piece = " " + piece
        self.encode_words(piece.replace(" ", "\u2581"), out)

    def encode_words(self, text: str, out: list[int]) -> None:
        """The tokens of ``text`` (spaces already "▁"), word by word when the vocabulary allows it (by_word) and the
        text is valid UTF-8: a byte that is not (a surrogate escape here) starts a symbol as long as its lead bits
        say, which may reach into the next word."""
        if not self.by_word or (not text.isascii() and not is_utf8(text)):
            self.tokenize(utf8(text), out)
            return
        cache = self.cache
        for word in _WORDS.findall(text):
            ids = cache.get(word)
            if ids is None:
                ids = []
                self.tokenize(word.encode("utf-8"), ids)
                if len(word) <= _CACHE_WORD:
                    if len(cache) >= _CACHE_SIZE:
                        cache.clear()
                    cache[word] = ids
            out.extend(ids)

    def tokenize(self, text: bytes, out: list[int]) -> None:
        """llm_tokenizer_spm_session::tokenize: ``text`` (spaces already "▁") split into UTF-8
        characters, adjacent symbols merged while their concatenation is a token (highest
        score first, then leftmost), symbols that are not tokens emitted as byte tokens."""
        b2i, scores = self.bytes_to_id, self.scores
        n = len(text)
        if not n:
            return
        starts: list[int] = []
        offs = 0
        while offs < n:
            starts.append(offs)
            offs += UTF8_LEN[text[offs] >> 4]
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
            tid = b2i.get(text[starts[left] : starts[left] + length])
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
            piece = text[starts[i] : starts[i] + size[i]]
            tid = b2i.get(piece)
            if tid is not None:
                out.append(tid)
            else:
                out.extend(map(self.byte_token, piece))
            i = nxt[i]

    def byte_token(self, byte: int) -> int:
        """llama_vocab::byte_to_token for SentencePiece: <0xXX>, else the one-byte token."""
        b2i = self.bytes_to_id
        tid = b2i.get(b"<0x%02X>" % byte)
        if tid is None:
            tid = b2i.get(bytes([byte]))
            if tid is None:
                raise GGUFError(f"vocabulary without a token for byte 0x{byte:02X}")
        return tid

    # ------------------------------------------------------------------ vocabulary queries
