"""Constrained decoding: the text a completion may take (a JSON schema, any JSON object, a regex, or a Lark or
GBNF grammar), enforced by a token mask computed each step with llguidance (the Rust library llama.cpp can use
for grammars) over the GGUF's own vocabulary.

    grammar = Grammar.from_json_schema({"type": "object", "properties": {...}})
    vocab = GrammarVocab(tokenizer)            # once per model (~0.5 s for a 150k vocabulary)
    matcher = grammar.matcher(vocab)           # one per sequence
    tok = sampler.sample(matcher.mask(logits), history)
    matcher.consume(tok)
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from ..errors import SuperggmlError
from ..tokenizer import TokenAttr, Tokenizer

# JSON as models write it ({"a": 1, "b": [2, 3]}): one space after ':' and ',', no other whitespace (free
# whitespace lets a sampling model pad forever); unknown keywords and formats are ignored, as OpenAI does.
# A schema's own "x-guidance" options override these.
JSON_OPTIONS: dict[str, Any] = {
    "whitespace_flexible": False,
    "item_separator": ", ",
    "key_separator": ": ",
    "lenient": True,
}


class GrammarError(SuperggmlError, ValueError):
    """A constraint that does not compile (an invalid schema, regex or grammar) or that no text satisfies."""


def _llg() -> Any:
    try:
        import llguidance
    except ImportError as e:  # pragma: no cover - a dependency
        raise GrammarError("constrained decoding needs llguidance (pip install llguidance)") from e
    return llguidance


@dataclass(frozen=True)
class Grammar:
    """A constraint on generated text, compiled to llguidance's grammar form (`source`, JSON). `kind` says what
    it was made from: "json_schema", "json_object", "regex", "lark" or "gbnf" (checked when a matcher is
    made: `check` does it without one)."""

    source: str
    kind: str

    @classmethod
    def from_json_schema(cls, schema: Mapping[str, Any] | str) -> "Grammar":
        """Text that is JSON valid against `schema` (a dict or its JSON text)."""
        llg = _llg()
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as e:
                raise GrammarError(f"the JSON schema is not JSON: {e}") from None
        if not isinstance(schema, Mapping):
            raise GrammarError(f"a JSON schema must be an object, not {type(schema).__name__}")
        try:
            return cls(llg.LLMatcher.grammar_from_json_schema(dict(schema), defaults=JSON_OPTIONS), "json_schema")
        except (ValueError, TypeError) as e:
            raise GrammarError(f"invalid JSON schema: {e}") from None

    @classmethod
    def json_object(cls) -> "Grammar":
        """Any JSON object (OpenAI's JSON mode)."""
        return cls(cls.from_json_schema({"type": "object"}).source, "json_object")

    @classmethod
    def from_regex(cls, regex: str) -> "Grammar":
        """Text that matches `regex` whole (Rust regex syntax, as Python's for common patterns)."""
        if not isinstance(regex, str):
            raise GrammarError(f"a regex must be a string, not {type(regex).__name__}")
        return cls(_llg().LLMatcher.grammar_from_regex(regex), "regex")

    @classmethod
    def from_grammar(cls, text: str) -> "Grammar":
        """Text of a context-free grammar: llama.cpp's GBNF (`root ::= ...`) or Lark (`start: ...`, llguidance's
        dialect, which takes %json{...} and /regex/ terminals)."""
        llg = _llg()
        if not isinstance(text, str):
            raise GrammarError(f"a grammar must be a string, not {type(text).__name__}")
        from llguidance.gbnf_to_lark import is_lark_syntax

        lark = is_lark_syntax(text)
        try:
            source = llg.grammar_from("lark" if lark else "gbnf", text)
        except Exception as e:  # noqa: BLE001 - llguidance's converter raises several kinds
            raise GrammarError(f"invalid grammar: {e}") from None
        return cls(source, "lark" if lark else "gbnf")

    def matcher(self, vocab: "GrammarVocab") -> "Matcher":
        """A fresh constraint state over `vocab` (one per sequence). GrammarError when the grammar does not
        compile or no text satisfies it."""
        return Matcher(vocab, self)

    def check(self, vocab: "GrammarVocab") -> None:
        """GrammarError unless the grammar compiles and some text satisfies it."""
        self.matcher(vocab)


def grammar_from(
    *,
    grammar: "str | Grammar | None" = None,
    json_schema: Mapping[str, Any] | str | None = None,
    regex: str | None = None,
    response_format: Mapping[str, Any] | None = None,
) -> Grammar | None:
    """The one constraint of a request's options (None: free text). `response_format` is OpenAI's: {"type":
    "text"}, {"type": "json_object"} (llama-cpp-python's with a "schema" too), or {"type": "json_schema",
    "json_schema": {"name": ..., "schema": {...}}}. GrammarError when several are given or one is malformed."""
    given = [
        k
        for k, v in (
            ("grammar", grammar),
            ("json_schema", json_schema),
            ("regex", regex),
            ("response_format", response_format),
        )
        if v is not None
    ]
    if len(given) > 1:
        raise GrammarError(f"give one constraint, not {' and '.join(given)}")
    if isinstance(grammar, Grammar):
        return grammar
    if grammar is not None:
        return Grammar.from_grammar(grammar)
    if json_schema is not None:
        return Grammar.from_json_schema(json_schema)
    if regex is not None:
        return Grammar.from_regex(regex)
    if response_format is None:
        return None
    if not isinstance(response_format, Mapping):
        raise GrammarError("response_format must be an object")
    kind = response_format.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        schema = response_format.get("schema")
        return Grammar.json_object() if schema is None else Grammar.from_json_schema(schema)
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        if not isinstance(spec, Mapping) or "schema" not in spec:
            raise GrammarError("response_format json_schema needs a json_schema object with a schema")
        return Grammar.from_json_schema(spec["schema"])
    raise GrammarError(f"response_format type must be text, json_object or json_schema, not {kind!r}")


class _TokenizerView:
    """What llguidance's TokenizerWrapper reads from a tokenizer: each token's bytes (control tokens marked by a
    leading 0xFF, as llguidance's llama.cpp binding marks them), the special ids, and text -> ids."""

    def __init__(self, tk: Tokenizer):
        self.tk = tk
        self.eos_token_id = tk.eos_id
        self.bos_token_id = tk.bos_id
        self.special_token_ids = list(tk.special_ids)
        self.tokens = []
        for i in range(tk.n_vocab):
            b = bytes(tk.token_to_piece(i, special=True))
            a = tk.token_attr(i)
            if a & TokenAttr.CONTROL or (a & TokenAttr.USER_DEFINED and b.startswith(b"<") and b.endswith(b">")):
                b = b"\xff" + b
            self.tokens.append(b)

    def __call__(self, text: str | bytes) -> list[int]:
        if isinstance(text, bytes):
            text = text.decode("utf-8", errors="replace")
        return self.tk.encode(text, add_special=False, parse_special=False)


class GrammarVocab:
    """A model's vocabulary as llguidance needs it (built once per model; shared by every matcher). The tokens
    that end generation are the grammar's end: a finished grammar allows only them."""

    def __init__(self, tokenizer: Tokenizer):
        llg = _llg()
        view = _TokenizerView(tokenizer)
        self.n_vocab = tokenizer.n_vocab
        self.lltok = llg.LLTokenizer(llg.TokenizerWrapper(view), eos_token=sorted(tokenizer.eog_ids))


_KIND_NAMES = {"json_schema": "JSON schema", "json_object": "JSON object", "lark": "grammar", "gbnf": "grammar"}


class Matcher:
    """One sequence's constraint state: `mask` the logits of its next token, `consume` the token drawn."""

    def __init__(self, vocab: GrammarVocab, grammar: Grammar):
        llg = _llg()
        self.vocab = vocab
        self.grammar = grammar
        self._m = llg.LLMatcher(vocab.lltok, grammar.source, log_level=0)
        what = _KIND_NAMES.get(grammar.kind, grammar.kind)
        if self._m.is_error():
            raise GrammarError(f"invalid {what}: {self._m.get_error().strip()}")
        words = (vocab.n_vocab + 31) // 32
        self._bits = np.full(words, -1, dtype=np.int32)  # one bit per token, 1 = allowed
        self.allowed()  # the first step tells an empty language
        if self._m.is_stopped() and not self._m.is_accepting():
            raise GrammarError(f"no text satisfies this {what}")

    @property
    def done(self) -> bool:
        """The grammar is complete and nothing may follow: only an end-of-generation token is allowed."""
        return self._m.is_stopped()

    def allowed(self) -> np.ndarray:
        """bool [n_vocab]: the tokens the grammar allows next."""
        self._m.unsafe_compute_mask_ptr(self._bits.ctypes.data, self._bits.nbytes)
        return np.unpackbits(self._bits.view(np.uint8), bitorder="little", count=self.vocab.n_vocab).view(bool)

    def mask(self, logits: np.ndarray) -> np.ndarray:
        """F32 copy of `logits` [n_vocab] with the tokens the grammar forbids at -inf."""
        return np.where(self.allowed(), np.asarray(logits, dtype=np.float32), np.float32(-np.inf))

    def consume(self, tok: int) -> None:
        """Advances past `tok` (one `mask` allowed). RuntimeError if the grammar rejects it."""
        if not self._m.consume_token(int(tok)):
            raise RuntimeError(f"the grammar rejected token {tok}: {self._m.get_error()}")
