"""MTP drafting: the model's own next-token-prediction block drafts, with no second model (llama.cpp's draft-mtp).

The block at position q reads the token there and the model's output-normed hidden row of position q - 1 (zeros
before the first), and gives the logits of the token at q + 1 and a hidden row of its own. So:
- every forward pass of the model hands the drafter its hidden rows (Executor.keep_hidden), kept per sequence
  by position;
- a draft first brings the block's memory up to the model's context (the positions it lacks, each with the
  model's row before it), the chosen token last: its logits are the first drafted token;
- each further drafted token goes in with the block's own hidden row, and those positions are dropped from its
  memory after the draft (the model's rows replace them once it has checked them).

The block (its tensors, and the head it reads) stays resident beside a model that may stream: a drafted token
costs one small block, not a pass over the streamed weights.
"""

from __future__ import annotations

import time
from typing import Any, Sequence

import numpy as np

from .. import native
from ..arch import mtp_arch
from ..runtime.exec.executor import Executor
from ..runtime.plan.memory_plan import mtp_bytes
from ..settings import PagingSettings, Settings
from .engine import Engine
from .speculative import Drafter, greedy_draft

MAX_SEQUENCES = 16  # sequences whose hidden rows and block memory are kept (the least recently drafted go)


class MtpDrafter(Drafter):
    """Drafts greedily with `target`'s MTP block (MtpArch) on an executor of its own: the block's weights
    resident in a store of their own over the same file, and a one-layer memory per sequence."""

    name = "mtp"

    def __init__(self, target: Engine, *, p_min: float = 0.0):
        self.target = target
        self.p_min = p_min
        self.arch = mtp_arch(target.arch)
        self.store = native.WeightStore(target.file)
        c = target.settings.context
        self.runtime = Executor.start(
            self.arch, self.store, Settings(context=c, paging=PagingSettings(device_budget="off"))
        )
        self.rows: dict[int, dict[int, np.ndarray]] = {}  # the model's sequence -> position -> its hidden row
        self.own: np.ndarray | None = None  # the block's hidden row of its last pass
        self.runtime.keep_hidden(self.on_own)
        target.runtime.keep_hidden(self.on_hidden)
        self.zero = np.zeros(self.arch.hp.residual_width, dtype=np.float32)

    def on_hidden(self, seq: int, p0: int, h: np.ndarray) -> None:
        """The model's pass gave sequence `seq` the hidden rows h of positions p0..; the block catches up on
        them once a batch of them is waiting (a long prompt's rows are not all held)."""
        rows = self.rows.pop(seq, None)
        if rows is None:
            rows = {}
            while len(self.rows) >= MAX_SEQUENCES:
                self.forget(next(iter(self.rows)))
        self.rows[seq] = rows  # most recent last
        for i, row in enumerate(h.copy()):
            rows[p0 + i] = row
        if len(rows) > self.runtime.settings.context.n_batch:
            self.feed(seq, self.target.runtime.sequences.tokens(seq)[: p0 + len(h)])

    def on_own(self, seq: int, p0: int, h: np.ndarray) -> None:
        self.own = h[-1].copy()

    def forget(self, seq: int) -> None:
        self.rows.pop(seq, None)
        if seq in self.runtime.sequences.table:
            self.runtime.sequences.drop(seq)

    def feed(self, seq: int, tokens: Sequence[int]) -> np.ndarray:
        """Brings the block's memory of `seq` to `tokens` (its cached prefix kept, the last token fed again), each
        position with the model's hidden row before it (zeros before the first, or where the row is gone: a
        prefix reused far back); returns the last position's logits. Keeps only the rows a later feed reads."""
        m, rows = self.runtime, self.rows.setdefault(seq, {})
        m.sequences.use(seq)
        keep = m.sequences.keep_prefix(tokens)
        hidden = np.stack([rows.get(q - 1, self.zero) for q in range(keep, len(tokens))])
        logits = m.eval(list(tokens[keep:]), hidden=hidden)[-1]
        for q in [q for q in rows if q < len(tokens) - 1]:
            del rows[q]
        return logits

    def draft(self, context: Sequence[int], k: int) -> list[int]:
        """Up to k tokens after `context` (the model's current sequence, then the token chosen after it, not yet
        fed)."""
        m = self.runtime
        n = len(context) - 1  # the model holds context[:n]
        k = min(k, m.settings.context.ctx_size - len(context))
        if k <= 0:
            return []
        t = time.perf_counter()
        logits = self.feed(self.target.runtime.seq.id, context)
        self.catch_up_s = time.perf_counter() - t
        out = greedy_draft(logits, k, self.p_min, self.target.tokenizer.is_eog, self.step)
        m.sequences.truncate(n + 1)  # the drafted positions held the block's own rows
        return out

    def step(self, tok: int) -> np.ndarray:
        """The logits after drafted token `tok`, fed with the block's hidden row of the pass before."""
        assert self.own is not None  # that pass (feed's, or the step before) gave its row
        return self.runtime.eval([tok], hidden=self.own[None])[-1]

    def stats(self) -> dict[str, Any]:
        return {
            "draft_mtp_block": self.arch.il,
            "draft_resident_bytes": mtp_bytes(self.target.arch, self.target.store, self.target.settings.context),
        }

    def close(self) -> None:
        self.target.runtime.keep_hidden(None)
        self.runtime.close()
        del self.runtime
        del self.store
