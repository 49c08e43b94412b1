"""Slots, as llama-server's: a fixed number of sequences that outlive their completions. A new completion takes
the free slot whose tokens share the longest prefix with its prompt and prefills only the rest; with no shared
prefix (or one under half that slot's tokens while an empty slot is free), an empty slot, else the least recently
used free one, is taken. A slot's sequence can be saved to a file and restored (the server's /slots)."""

from __future__ import annotations

from typing import Any, Callable, Sequence


def shared_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class Slots:
    """n slots over a model's sequences (`sequences()`: runtime.sequences, looked up on use so that a closed
    model's memory is not held here): each holds a sequence id or None, and is busy while a completion runs on
    it."""

    def __init__(self, sequences: Callable[[], Any], n: int):
        self.of = sequences
        self.seq: list[int | None] = [None] * n
        self.busy = [False] * n
        self.used = [0] * n
        self.clock = 0
        self.cached_tokens = 0  # prompt tokens a completion found in its slot, not fed again

    def __len__(self) -> int:
        return len(self.seq)

    def tokens(self, slot: int) -> list[int]:
        s = self.seq[slot]
        return self.of().tokens(s) if s is not None else []

    def take(self, prompt: Sequence[int], reuse: bool = True) -> tuple[int, int, int]:
        """(slot, sequence, tokens of the prompt it already holds) for a completion of `prompt`; the slot is
        busy until give_back. The last prompt token is always fed again, for its logits. reuse=False: nothing is
        kept (the whole prompt is fed, as a fresh sequence computes it)."""
        held = {i: self.tokens(i) for i in range(len(self.seq)) if not self.busy[i]}
        if not held:
            raise ValueError("every slot is busy")
        share = {i: shared_prefix(t, prompt[:-1]) for i, t in held.items()}
        best = max(held, key=lambda i: (share[i], -self.used[i]))
        slight = 2 * share[best] < len(held[best]) and any(not t for t in held.values())
        if not reuse or share[best] == 0 or slight:  # a slight share: keep that slot's context
            best = min(held, key=lambda i: (bool(held[i]), self.used[i]))
        k = share[best] if reuse else 0
        seq = self.seq[best]
        if seq is None:
            seq = self.seq[best] = self.of().reserve(1)[0]
        kept = self.of().truncate(k, seq)
        self.busy[best] = True
        self.cached_tokens += kept
        return best, seq, kept

    def give_back(self, slot: int) -> None:
        self.busy[slot] = False
        self.clock += 1
        self.used[slot] = self.clock

    def place(self, slot: int) -> int:
        """Slot `slot`'s sequence, emptied (made if it has none), for a restore; ValueError if it is busy."""
        if not 0 <= slot < len(self.seq):
            raise IndexError(f"slot ids are 0..{len(self.seq) - 1}")
        if self.busy[slot]:
            raise ValueError(f"slot {slot} is busy")
        seq = self.seq[slot]
        if seq is None:
            seq = self.seq[slot] = self.of().reserve(1)[0]
        self.of().truncate(0, seq)
        self.give_back(slot)
        return seq

    def close(self) -> None:
        held = [s for s in self.seq if s is not None]
        self.seq = [None] * len(self.seq)
        try:
            sequences = self.of()
        except AttributeError:  # the model is closed already: its memory went with it
            return
        sequences.release(held)
