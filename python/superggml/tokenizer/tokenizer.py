"""Tokenizer built from a GGUF file's own tokenizer metadata, matching llama.cpp token for token.

The behaviour follows llama.cpp's ``src/llama-vocab.cpp`` and ``src/unicode.cpp`` (the version vendored by
llama-cpp-python 0.3.36): vocab.py reads the vocabulary, bpe.py (``tokenizer.ggml.model == "gpt2"``) and spm.py
(``"llama"``) turn text into tokens, unicode.py sees text as llama.cpp does.

Special tokens (token types CONTROL, USER_DEFINED, UNKNOWN) are split out of the text before tokenizing like
llama.cpp's ``tokenizer_st_partition``: USER_DEFINED tokens always, CONTROL and UNKNOWN ones only with
``parse_special=True``.
"""

from __future__ import annotations

import hashlib
import pickle
from typing import Any, Mapping, Sequence

from ..errors import GGUFError
from .bpe import BpeEncoder
from .spm import SpmEncoder
from .unicode import C_SPACE, hex_byte
from .vocab import SPECIAL_NAMES, TokenAttr, Vocab, load_vocab


NAME_KEYS = ("general.name", "general.architecture")


def vocabulary_key(meta: Mapping[str, Any]) -> bytes:
    """A digest of what a tokenizer is built from: the ``tokenizer.ggml.*`` keys, ``general.name`` and
    ``general.architecture``. Equal digests give equal tokenizers; nothing of the metadata is kept."""
    used = sorted((k, v) for k, v in meta.items() if k.startswith("tokenizer.ggml.") or k in NAME_KEYS)
    return hashlib.sha256(pickle.dumps(used, protocol=pickle.HIGHEST_PROTOCOL)).digest()


_LAST: dict[bytes, "Tokenizer"] = {}  # the last tokenizer built, by its vocabulary_key


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
    encoder: BpeEncoder | SpmEncoder
    """Text pieces to tokens, and the vocabulary's texts and ids."""

    def __init__(self, vocab: Vocab, encoder: BpeEncoder | SpmEncoder):
        for name in (
            "model",
            "pre",
            "pre_type",
            "n_vocab",
            "add_bos",
            "add_eos",
            "add_sep",
            "add_space_prefix",
            "clean_spaces",
            "ignore_merges",
            "eog_ids",
        ):
            setattr(self, name, getattr(vocab, name))
        for name in SPECIAL_NAMES:
            setattr(self, f"{name}_id", vocab.ids[name])
        self.encoder = encoder
        self._attrs = vocab.attrs
        self._special = vocab.special
        self._pieces: dict[int, bytes] = {}

    @classmethod
    def from_metadata(cls, meta: Mapping[str, Any]) -> "Tokenizer":
        """Build the tokenizer from GGUF metadata (key -> Python value).

        Uses the ``tokenizer.ggml.*`` keys, plus ``general.name`` and ``general.architecture``
        when present (llama.cpp sets a few token attributes by model name). Raises
        UnsupportedModelError for a ``tokenizer.ggml.model`` or ``tokenizer.ggml.pre``
        this module does not implement, GGUFError for missing or inconsistent metadata.

        The last tokenizer built is kept: metadata with the same vocabulary (a draft beside its target, the same
        model loaded again) gets that one back instead of a new one.
        """
        key = vocabulary_key(meta)
        if key in _LAST:
            return _LAST[key]
        vocab = load_vocab(meta)
        encoder = BpeEncoder.from_metadata(meta, vocab) if vocab.model == "gpt2" else SpmEncoder(vocab)
        made = cls(vocab, encoder)
        _LAST.clear()
        _LAST[key] = made
        return made

    # ------------------------------------------------------------------ vocabulary queries

    def token_text(self, id: int) -> str:
        """The token's text as stored in the GGUF vocabulary."""
        return self.encoder.token_text(self._check_id(id))

    def token_attr(self, id: int) -> int:
        """The token's llama_token_attr bits (see :class:`TokenAttr`)."""
        return self._attrs[self._check_id(id)]

    def token_id(self, text: str) -> int | None:
        """The id of the token whose text is exactly ``text``, or None."""
        return self.encoder.token_id(text)

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

    def encode(self, text: str | bytes, *, add_special: bool = True, parse_special: bool = False) -> list[int]:
        """Token ids of ``text``, as ``llama_tokenize(text, add_special, parse_special)``.

        ``add_special`` adds BOS/EOS when the vocabulary asks for them; ``parse_special`` turns
        the text of CONTROL tokens (e.g. ``<|im_start|>``) into those tokens (USER_DEFINED
        tokens are always recognised). ``bytes`` are decoded like llama.cpp does: for a
        byte-level BPE vocabulary invalid UTF-8 becomes U+FFFD, a SentencePiece one tokenizes the
        bytes as they are (a byte that is not UTF-8 ends in byte tokens).
        """
        if isinstance(text, (bytes, bytearray, memoryview)):
            text = self.encoder.text_of(bytes(text))
        out: list[int] = []
        if add_special and self.add_bos:
            if self.bos_id is None:
                raise GGUFError("tokenizer.ggml.add_bos_token is true but there is no BOS token")
            out.append(self.bos_id)
        after_special = True
        for frag in self._partition(text, parse_special) if text else []:
            if isinstance(frag, int):
                out.append(frag)
                after_special = True
            else:
                self.encoder.encode(text[frag[0] : frag[1]], out, after_special)
                after_special = False
        if add_special and self.add_eos:
            if self.eos_id is None:
                raise GGUFError("tokenizer.ggml.add_eos_token is true but there is no EOS token")
            out.append(self.eos_id)
        return out

    __call__ = encode

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
                        while left_end > off and text[left_end - 1] in C_SPACE:
                            left_end -= 1
                    if left_end > off:
                        new.append((off, left_end))
                    new.append(tid)
                    off = match + len(tok)
                    if off >= end:
                        break
                    if rstrip:
                        while off < end and text[off] in C_SPACE:
                            off += 1
            frags = new
        return frags

    def pre_tokenize(self, text: str) -> list[str]:
        """The words llama.cpp's BPE pre-tokenizer splits ``text`` into (not byte-encoded)."""
        return self.encoder.pre_tokenize(text)

    # ------------------------------------------------------------------ decoding

    def _piece(self, id: int) -> bytes:
        """llama.cpp's cached piece (token_to_piece with special=true, no lstrip)."""
        piece = self._pieces.get(id)
        if piece is None:
            attr = self._attrs[id]
            text = self.encoder.token_text(id)
            if attr & (TokenAttr.UNKNOWN | TokenAttr.CONTROL | TokenAttr.USER_DEFINED):
                piece = text.encode("utf-8", "surrogatepass")
            elif attr & TokenAttr.NORMAL:
                piece = self.encoder.normal_piece(text)
            elif attr & TokenAttr.BYTE:
                piece = bytes([hex_byte(text[3:5])])
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

    def detokenize(self, ids: Sequence[int], *, remove_special: bool = False, unparse_special: bool = False) -> bytes:
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
        return (
            f"Tokenizer(model={self.model!r}, pre={self.pre!r}, n_vocab={self.n_vocab}, "
            f"bos_id={self.bos_id}, eos_id={self.eos_id}, add_bos={self.add_bos})"
        )


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
