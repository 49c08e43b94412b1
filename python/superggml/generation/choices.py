"""One completion's text as its tokens arrive, with its stop strings, its token limit and its logprobs."""

from __future__ import annotations

import codecs
from typing import Sequence

import numpy as np

from ..tokenizer import Tokenizer

LogprobEntry = tuple[int, "float | None", "list[tuple[int, float]]"]  # token, its logprob, top alternatives


def logprob_entry(tok: int, logp: np.ndarray, k: int) -> LogprobEntry:
    """A token's logprob and the k most likely tokens' (ids, logprobs) from a log-probability vector."""
    top = np.argpartition(-logp, k)[:k] if 0 < k < len(logp) else np.arange(len(logp) if k else 0)
    top = top[np.argsort(-logp[top], kind="stable")]
    return int(tok), float(logp[tok]), [(int(i), float(logp[i])) for i in top]


class Choice:
    """One completion's text as its tokens arrive: bytes to text as llama-cpp-python gives them (the whole
    completion decoded with errors="ignore": a character split across tokens waits for its rest, bytes that
    never form one are dropped), stop strings held back until they cannot match, a token limit."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        limit: int,
        stop: Sequence[str],
        logprobs: int | None = None,
        keep: frozenset[int] = frozenset(),
    ):
        self.tokenizer = tokenizer
        self.keep = keep  # control tokens written into the text (a tool-call format's markers)
        self.logprobs = logprobs  # top alternatives per token to report (None: no logprobs)
        self.lp: list[LogprobEntry] = []  # the kept tokens' (token, logprob, top alternatives), not yet taken
        self.limit = limit
        self.stop = list(stop)
        self.utf8 = codecs.getincrementaldecoder("utf-8")(errors="ignore")
        self.text = ""
        self.sent = 0
        self.n = 0
        self.finish: str | None = None
        self.holdback = max((len(x) for x in self.stop), default=0)

    def push(self, tok: int, logp: np.ndarray | None = None) -> str:
        """Takes the next token (and, with logprobs, the log-probabilities it was drawn with); returns the text
        that can be sent now. Sets finish once done."""
        if self.tokenizer.is_eog(tok):
            self.finish = "stop"
            return self.flush()
        self.n += 1
        if self.logprobs is not None and logp is not None:
            self.lp.append(logprob_entry(tok, logp, self.logprobs))
        self.text += self.utf8.decode(self.tokenizer.token_to_piece(tok, special=tok in self.keep))
        hit = min((i for i in (self.text.find(x, max(0, self.sent - len(x))) for x in self.stop) if i >= 0), default=-1)
        if hit >= 0:
            self.text = self.text[:hit]
            self.finish = "stop"
            if self.lp:
                self.lp.pop()  # the token that completed the stop string is not in the text
            return self.flush()
        if self.n >= self.limit:
            self.finish = "length"
            return self.flush()
        safe = len(self.text) - self.holdback
        if safe > self.sent:
            out, self.sent = self.text[self.sent : safe], safe
            return out
        return ""

    def take(self) -> list[LogprobEntry] | None:
        """The logprob entries since the last take (None without logprobs)."""
        if self.logprobs is None:
            return None
        out, self.lp = self.lp, []
        return out

    def flush(self) -> str:
        """The text not sent yet (the completion is over)."""
        self.text += self.utf8.decode(b"", final=True)
        out, self.sent = self.text[self.sent :], len(self.text)
        self.finish = self.finish or "length"
        return out
