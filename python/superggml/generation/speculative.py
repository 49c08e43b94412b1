"""Speculative decoding: a drafter proposes the next tokens, the model checks them all in one forward pass.

While weights stream, a pass costs about one read of the streamed bytes whatever the number of tokens in it, so
a pass that checks k drafted tokens costs about what one token costs; each accepted token is a pass saved.

- Drafters: a draft model with the same vocabulary (llama.cpp's compatibility rule), prompt lookup (the
  continuation of the latest earlier match of the context's last n-gram), or the model's own MTP block
  (generation/mtp.py). All draft deterministically (the models greedily), so the draft distribution q is one
  point.
- Verification (Speculator.step): the draft is fed to the model in one pass (Executor.eval_check): with the kernels
  of any batch, as llama.cpp checks a draft; with batch_invariant each token in a lane of its own, so row i's
  logits are those of feeding the tokens one by one. Greedy keeps the longest prefix that matches
  the model's choices plus the model's own next token: the output is that of plain decoding. Sampling accepts
  a drafted token d with probability min(1, p(d) / q(d)) and otherwise draws from the residual max(0, p - q),
  normalised (speculative sampling): each token is distributed as the model's sampler would draw it.
- DraftLength picks k per step from the measured cost of a pass (fitted as a + b * rows), of a drafted token,
  and the acceptance rate: long drafts when a pass is expensive (streamed weights), short or none when not.
"""

from __future__ import annotations

import abc
import time
from typing import Any, Sequence

import numpy as np

from .engine import Engine
from .sampling import Sampler


VOCAB_MAX_SIZE_DIFFERENCE = 128  # llama.cpp's SPEC_VOCAB_MAX_SIZE_DIFFERENCE
VOCAB_CHECK_START_TOKEN_ID = 5  # llama.cpp's SPEC_VOCAB_CHECK_START_TOKEN_ID
CATCH_UP_ROWS = 16  # a draft model's new tokens fed row by row in one pass up to this many


class Drafter(abc.ABC):
    """Proposes up to k tokens to follow a context."""

    name = "none"
    catch_up_s = 0.0  # of the last draft: the time spent bringing the drafter to the context

    @abc.abstractmethod
    def draft(self, context: Sequence[int], k: int) -> list[int]:
        """Up to k tokens (fewer, or none, when it has no guess)."""

    def stats(self) -> dict[str, Any]:
        """Counters of the drafter's own (Model.stats() reports them)."""
        return {}

    def close(self) -> None:
        pass


class LookupDrafter(Drafter):
    """Prompt lookup: for n = N down to 1, the latest earlier occurrence of the context's last n tokens whose
    continuation is longest (up to k); drafts that continuation. No model, no state."""

    name = "lookup"

    def __init__(self, n: int):
        if n < 1:
            raise ValueError(f"lookup_ngram must be >= 1, not {n}")
        self.n = n

    def draft(self, context: Sequence[int], k: int) -> list[int]:
        arr = np.asarray(context, dtype=np.int64)
        size = len(arr)
        for m in range(min(self.n, size - 1), 0, -1):
            windows = np.lib.stride_tricks.sliding_window_view(arr[: size - 1], m)  # starts 0 .. size - 1 - m
            hits = np.flatnonzero((windows == arr[size - m :]).all(axis=1))
            if len(hits):
                room = np.minimum(k, size - (hits + m))
                best = hits[len(hits) - 1 - int(np.argmax(room[::-1]))]  # longest, then latest
                return arr[best + m : best + m + k].tolist()
        return []


class ModelDrafter(Drafter):
    """A draft model (superggml.Model) decoding greedily on its own sequence, brought to the context each step
    (its cached prefix reused, the rest fed in one eval). Stops a draft at an end-of-generation token or where
    its top probability falls below p_min."""

    name = "model"

    def __init__(self, draft: Engine, target: Engine, *, p_min: float = 0.0):
        check_compatible(target, draft)
        self.model = draft
        self.p_min = p_min

    def draft(self, context: Sequence[int], k: int) -> list[int]:
        m = self.model
        if len(context) + k > m.n_ctx:
            k = m.n_ctx - len(context)
        if k <= 0:
            return []
        t = time.perf_counter()
        logits = self._catch_up(context)
        self.catch_up_s = time.perf_counter() - t
        return greedy_draft(logits, k, self.p_min, m.tokenizer.is_eog, lambda tok: m.eval([tok])[-1])

    def _catch_up(self, context: Sequence[int]) -> np.ndarray:
        """Brings the draft's sequence to `context` (its cached prefix kept) and returns the last logits. A few
        new tokens (the last step's) go in one eval_check pass, as the model checked
        them; a prompt in one eval, but its last token alone, as the model fed it: a self-draft agrees exactly."""
        ex = self.model.runtime
        new = list(context[ex.sequences.keep_prefix(context) :])
        if len(new) <= CATCH_UP_ROWS:
            return ex.eval_check(new)[-1]
        ex.eval(new[:-1])
        return ex.eval(new[-1:])[-1]

    def close(self) -> None:
        self.model.close()


def greedy_draft(logits: np.ndarray, k: int, p_min: float, is_eog: Any, after: Any) -> list[int]:
    """Up to k greedy tokens from `logits` on: stopping after an end-of-generation token, or before a token whose
    probability is below p_min; after(tok) feeds a token and gives the logits that follow it."""
    out: list[int] = []
    while True:
        tok = int(np.argmax(logits))
        if p_min > 0.0:
            x = logits.astype(np.float64)
            if 1.0 / np.exp(x - x[tok]).sum() < p_min:
                break
        out.append(tok)
        if len(out) == k or is_eog(tok):
            break
        logits = after(tok)
    return out


def check_compatible(target: Engine, draft: Engine) -> None:
    """llama.cpp's rule for a draft model: the same vocabulary type, BOS/EOS and add-BOS, sizes within 128 and
    the same token text from id 5 on; ValueError naming the first difference."""
    a, b = target.tokenizer, draft.tokenizer
    if a.model != b.model:
        raise ValueError(f"the draft model's vocabulary is {b.model!r}, the model's {a.model!r}")
    for what in ("bos_id", "eos_id", "add_bos"):
        if getattr(a, what) != getattr(b, what):
            raise ValueError(f"the draft model's {what} is {getattr(b, what)}, the model's {getattr(a, what)}")
    if abs(a.n_vocab - b.n_vocab) > VOCAB_MAX_SIZE_DIFFERENCE:
        raise ValueError(
            f"the draft model has {b.n_vocab} tokens, the model {a.n_vocab}: more than "
            f"{VOCAB_MAX_SIZE_DIFFERENCE} apart"
        )
    for i in range(VOCAB_CHECK_START_TOKEN_ID, min(a.n_vocab, b.n_vocab)):
        if a.token_to_piece(i, special=True) != b.token_to_piece(i, special=True):
            raise ValueError(
                f"token {i} differs between the model ({a.token_to_piece(i, special=True)!r}) and the "
                f"draft model ({b.token_to_piece(i, special=True)!r})"
            )


def accept(
    sampler: Sampler, p: tuple[np.ndarray, np.ndarray], d: int, q: tuple[np.ndarray, np.ndarray] | None = None
) -> int | None:
    """Speculative sampling of one drafted token d against the model's distribution p (ids, probs as
    Sampler.distribution gives): None when d is accepted, else the token drawn from the residual max(0, p - q)
    normalised. q: the draft's distribution (None: d with certainty). Greedy samplers accept exactly their
    argmax."""
    ids, probs = p
    if sampler.params.greedy:
        return None if int(ids[0]) == d else int(ids[0])
    pd = float(probs[ids == d].sum())
    if q is None:
        qd, q_at = 1.0, (ids == d).astype(np.float64)
    else:
        qd = float(q[1][q[0] == d].sum())
        lookup = dict(zip(q[0].tolist(), q[1].tolist()))
        q_at = np.array([lookup.get(int(i), 0.0) for i in ids])
    if qd > 0.0 and sampler.rng.random() < min(1.0, pd / qd):
        return None
    residual = np.maximum(probs - q_at, 0.0)
    total = residual.sum()
    if total <= 0.0:  # p == q: nothing left (only when d could not be rejected)
        return int(ids[np.argmax(probs)])
    return int(ids[sampler.rng.choice(len(ids), p=residual / total)])


class DraftLength:
    """Chooses k, the tokens to draft this step, for the most tokens per second: with acceptance rate a per
    drafted token (each is checked only when the ones before it were accepted), a step yields
    (1 - a^(k+1)) / (1 - a) tokens and costs pass(k + 1) + k * draft_s + step_s, pass(rows) = fixed + per_row *
    rows, step_s the time a step spends outside its pass and draft (sampling, the caller's work on each token)
    (each measured row count's moving average, a line fitted to them for the others; the first pass of a
    row count built its graphs, so the second replaces it). The first two steps are plain and the next two
    check a free guess (the last token again), to measure passes of one row and of two before any drafting is
    paid for. k = 0 (a plain step) when no draft pays (on 2 cores a resident model's extra rows cost about
    half a pass each); then a probe drafts k_min now and then, every PROBE steps at first, twice as rarely
    after each probe that did not pay."""

    PROBE = 16
    PROBE_MAX = 512
    PRIOR_ACCEPT = (3.0, 4.0)  # accepted, checked: a prior of 0.75 worth a few tokens

    def __init__(self, k_min: int, k_max: int, fixed: int | None = None):
        self.k_min, self.k_max, self.fixed = k_min, k_max, fixed
        self.passes: dict[int, float] = {}  # rows -> seconds of such a pass (moving average)
        self.samples: dict[int, int] = {}  # rows -> passes measured
        self.accepted, self.checked = self.PRIOR_ACCEPT
        self.draft_s: float | None = None
        self.step_s = 0.0
        self.plain_steps = 0
        self.probe_every = self.PROBE

    @property
    def rate(self) -> float:
        return self.accepted / self.checked

    def on_draft(self, n: int, seconds: float) -> None:
        if n:
            s = seconds / n
            self.draft_s = s if self.draft_s is None else 0.8 * self.draft_s + 0.2 * s

    def on_between(self, seconds: float) -> None:
        """A step spent `seconds` outside its pass and its draft."""
        self.step_s = 0.8 * self.step_s + 0.2 * seconds if self.step_s else seconds

    def on_pass(self, rows: int, seconds: float) -> None:
        """A pass of `rows` took `seconds`. The first of each row count also built its graphs: the second
        replaces it."""
        n = self.samples.get(rows, 0)
        self.samples[rows] = n + 1
        self.passes[rows] = seconds if n < 2 else 0.8 * self.passes[rows] + 0.2 * seconds  # n >= 2: measured

    def on_check(self, drafted: int, accepted: int) -> None:
        decay = 0.98**drafted  # recent steps weigh more
        self.accepted = self.accepted * decay + accepted
        self.checked = self.checked * decay + accepted + (1 if accepted < drafted else 0)

    def pass_cost(self) -> tuple[float, float]:
        """(fixed, per_row) seconds of a pass, from the passes measured."""
        if not self.passes:
            return 1.0, 0.0
        rows = np.array(list(self.passes), dtype=np.float64)
        secs = np.array(list(self.passes.values()), dtype=np.float64)
        if len(rows) == 1:
            return float(secs[0]), 0.0
        per_row, _ = np.polyfit(rows, secs, 1)
        per_row = max(float(per_row), 0.0)
        return max(float(np.median(secs - per_row * rows)), 0.0), per_row

    @property
    def probing(self) -> bool:
        """A pass of two rows not yet measured (twice: the first also built its graphs): the next draft may be
        any guess (its cost is the point)."""
        return self.fixed is None and self.samples.get(2, 0) < 2

    def costs(self, up_to: int) -> list[float]:
        """Seconds of a pass of 0..up_to rows: each measured row count's average, the fitted line elsewhere."""
        fixed, per_row = self.pass_cost()
        return [self.passes.get(r, fixed + per_row * r) for r in range(up_to + 1)]

    def choose(self, room: int) -> int:
        """k for the next step, at most room."""
        hi = min(self.k_max, room)
        if self.fixed is not None:
            return max(0, min(self.fixed, room))
        if hi < max(self.k_min, 1):
            return 0
        if self.samples.get(1, 0) < 2:
            return 0  # plain passes first: their cost
        if self.probing:
            return 1  # then two rows (a free guess)
        draft_s = self.draft_s if self.draft_s is not None else 0.0
        a = min(self.rate, 0.999)
        cost = [c + self.step_s for c in self.costs(hi + 1)]
        plain = 1.0 / max(cost[1], 1e-9)
        best_k, best, ideal = 0, plain, plain
        for k in range(max(self.k_min, 1), hi + 1):
            speed = (1.0 - a ** (k + 1)) / (1.0 - a) / max(cost[k + 1] + k * draft_s, 1e-9)
            ideal = max(ideal, (k + 1) / max(cost[k + 1], 1e-9))
            if speed > best:
                best_k, best = k, speed
        if best_k:
            self.plain_steps, self.probe_every = 0, self.PROBE
            return best_k
        if ideal < 1.05 * plain:  # rows cost as much as passes: not even free, always right drafts would pay
            return 0
        self.plain_steps += 1
        if self.plain_steps >= self.probe_every:
            self.plain_steps = 0
            self.probe_every = min(2 * self.probe_every, self.PROBE_MAX)
            return max(self.k_min, 1)
        return 0


class Speculator:
    """A drafter, the draft length and the counts Model.stats() reports."""

    def __init__(self, drafter: Drafter, length: DraftLength):
        self.drafter = drafter
        self.length = length
        self.steps = self.drafted = self.accepted = self.generated = 0
        self.last_end, self.next_at = 0.0, (-1, -1)  # when the last step ended; the next step it continues

    def timed_draft(self, context: Sequence[int], k: int) -> list[int]:
        t = time.perf_counter()
        out = self.drafter.draft(context, k)[:k] if k else []
        # per drafted token, without the catch-up: after a plain stretch that is its tokens, drafting each
        # step it is the last step's few
        self.length.on_draft(len(out), time.perf_counter() - t - self.drafter.catch_up_s)
        return out

    def on_step(self, drafted: int, accepted: int, probe: bool = False) -> None:
        """A step checked `drafted` tokens and kept `accepted` of them, plus one of the model's own (probe: a
        guess to time a pass, which says nothing of the drafter)."""
        if drafted:
            if not probe:
                self.length.on_check(drafted, accepted)
            self.drafted += drafted
            self.accepted += accepted
        self.steps += 1
        self.generated += accepted + 1

    def stats(self) -> dict[str, Any]:
        fixed, per_row = self.length.pass_cost()
        return {
            "draft": self.drafter.name,
            "draft_steps": self.steps,
            "draft_tokens": self.drafted,
            "draft_accepted": self.accepted,
            "draft_acceptance": self.accepted / self.drafted if self.drafted else None,
            "draft_tokens_per_pass": self.generated / self.steps if self.steps else None,
            "draft_k_mean": self.drafted / self.steps if self.steps else None,
            "draft_pass_s": fixed,
            "draft_pass_row_s": per_row,
            "draft_token_s": self.length.draft_s,
            **self.drafter.stats(),
        }

    def close(self) -> None:
        self.drafter.close()

    def step(self, model: Engine, tok: int, sampler: Sampler) -> list[int]:
        """One speculative step of the model's current sequence after `tok` (chosen, not yet fed): it drafts k
        tokens, feeds `tok` and the draft in one pass (eval_check), keeps the drafted
        tokens the sampler accepts (accept) and one of the model's own, and truncates the rest from the K/V.
        Returns the accepted drafted tokens and the model's next one (last, not fed)."""
        t0 = time.perf_counter()
        ex = model.runtime
        seq = ex.seq
        base = seq.n_past
        context = seq.tokens + [tok]
        k = self.length.choose(model.n_ctx - base - 2)
        # probing: the cost of a pass of two rows before the drafter's (a draft model's prompt) is paid
        probe = bool(k) and self.length.probing
        draft = [int(context[-1])] if probe else self.timed_draft(context, k)
        t = time.perf_counter()
        rows = ex.eval_check([tok] + draft) if draft else ex.eval([tok])
        pass_s = time.perf_counter() - t
        self.length.on_pass(len(draft) + 1, pass_s)
        out: list[int] = []
        nxt = None
        for i, d in enumerate(draft):
            nxt = accept(sampler, sampler.distribution(rows[i], context + out), d)
            if nxt is not None:
                break
            out.append(d)
        if nxt is None:
            nxt = sampler.sample(rows[len(draft)], context + out)
        if draft:
            kept = ex.sequences.truncate(base + 1 + len(out))
            if kept < base + 1 + len(out):  # sliding-window keys already freed: feed them again
                ex.eval((context + out)[kept:])
        self.on_step(len(draft), len(out), probe)
        end = time.perf_counter()
        if self.next_at == (seq.id, base):  # after the pass, and the caller's time since the last step
            self.length.on_between(end - t - pass_s + t0 - self.last_end)
        self.last_end, self.next_at = end, (seq.id, base + 1 + len(out))
        return out + [nxt]
