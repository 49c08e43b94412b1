"""Sequences: what each one's memory holds (its tokens) and the logits of its last eval, over a SequenceMemory.

One sequence is current (what eval extends); others are addressed by id (eval_batch, a scheduler's). Ids are
allocated here for every user (`reserve`), so a scheduler, scratch passes and the caller's own never collide.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from ...errors import ContextLengthError
from .base import SequenceMemory


@dataclass
class SequenceState:
    """One sequence's cached context: the tokens its K/V holds, and the logits of its last eval."""

    id: int
    tokens: list[int] = field(default_factory=list)
    scores: np.ndarray | None = None

    @property
    def n_past(self) -> int:
        return len(self.tokens)


class Sequences:
    """The sequences of one model, their memory, and the checks a feed passes."""

    def __init__(self, memory: SequenceMemory, ctx_size: int, n_vocab: int):
        self.memory = memory
        self.ctx_size = ctx_size
        self.n_vocab = n_vocab
        self.current = SequenceState(0)
        self.table: dict[int, SequenceState] = {0: self.current}
        self.reserved: set[int] = set()

    def __len__(self) -> int:
        return len(self.table)

    def get(self, seq: int) -> SequenceState:
        """Sequence `seq` (created empty on first use)."""
        if seq < 0:
            raise ValueError("sequence ids are >= 0")
        return self.table.setdefault(seq, SequenceState(seq))

    def tokens(self, seq: int) -> list[int]:
        """What sequence `seq` holds."""
        st = self.table.get(seq)
        return list(st.tokens) if st is not None else []

    def reserve(self, n: int) -> list[int]:
        """n ids that no sequence and no other reservation uses (the lowest above 0), reserved until release."""
        out: list[int] = []
        i = 1
        while len(out) < n:
            if i not in self.table and i not in self.reserved:
                out.append(i)
            i += 1
        self.reserved.update(out)
        return out

    def release(self, ids: Sequence[int]) -> None:
        """Drops the sequences `ids` and gives their ids back."""
        for i in ids:
            self.drop(i)
            self.reserved.discard(i)

    def use(self, seq: int) -> None:
        """Makes `seq` current (an empty current one is forgotten, as a dropped one is)."""
        if seq < 0:
            raise ValueError("sequence ids are >= 0")
        if not self.current.tokens:
            self.table.pop(self.current.id)
        self.current = self.get(seq)

    def drop(self, seq: int) -> None:
        """Frees the memory of `seq` (the current sequence is emptied, the others forgotten)."""
        self.memory.drop(seq)
        if seq == self.current.id:
            self.current.tokens.clear()
            self.current.scores = None
        else:
            self.table.pop(seq, None)

    def truncate(self, n: int, seq_id: int | None = None) -> int:
        """Keeps the first n tokens of the current sequence (or of `seq_id`) and frees the memory after them;
        the sequence has no last logits after it. Returns the tokens kept, fewer when the memory cannot go back
        to n itself (memory.truncate_point): none when sliding-window layers have already freed keys that
        position n needs (paged_kv without swa_full), as llama.cpp then re-evaluates the prompt; a recurrent
        state's latest checkpoint before n. The caller feeds the rest again."""
        seq = self.current if seq_id is None else self.get(seq_id)
        if not 0 <= n <= seq.n_past:
            raise ValueError(f"truncate: n must be in [0, {seq.n_past}], not {n}")
        n = self.memory.truncate_point(seq.id, n)
        self.memory.truncate(seq.id, n)
        del seq.tokens[n:]
        seq.scores = None
        return n

    def keep_prefix(self, tokens: Sequence[int]) -> int:
        """Truncates the current sequence to its longest cached prefix of tokens[:-1] (the last token is always
        fed again, for its logits); returns the tokens kept (see truncate)."""
        keep = 0
        for a, b in zip(self.current.tokens, tokens[:-1]):
            if a != b:
                break
            keep += 1
        return self.truncate(keep)

    def rollback(self, seq: SequenceState, start: int) -> None:
        """After a failed eval: `seq` goes back to `start` (K/V rows written past it are overwritten later), or
        as far back as its memory can (truncate_point)."""
        n = self.memory.truncate_point(seq.id, start)
        self.memory.truncate(seq.id, n)
        del seq.tokens[n:]
        if n < start:
            seq.scores = None

    def check_feed(self, seq: SequenceState, tokens: Sequence[int]) -> None:
        """ValueError unless `tokens` may extend `seq`: at least one, in the vocabulary, within ctx_size."""
        n = len(tokens)
        where = "" if seq is self.current else f" in sequence {seq.id}"
        if n == 0:
            raise ValueError("eval needs at least one token")
        if seq.n_past + n > self.ctx_size:
            raise ContextLengthError(
                f"context overflow{where}: {seq.n_past} cached + {n} new tokens > ctx_size {self.ctx_size}"
            )
        check_tokens(tokens, self.n_vocab)


def check_tokens(tokens: Sequence[int], n_vocab: int, what: str = "token id") -> None:
    """ValueError naming the first token id outside [0, n_vocab)."""
    bad = [t for t in tokens if not 0 <= int(t) < n_vocab]
    if bad:
        raise ValueError(f"{what} {bad[0]} out of range [0, {n_vocab})")
