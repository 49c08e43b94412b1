"""The drafter a model's speculative settings ask for (a draft model, its MTP block or prompt lookup), and the
memory it holds, which the automatic budget leaves it."""

from __future__ import annotations

from typing import Any

from ..runtime.memory_plan import model_bytes
from ..settings import Settings
from .mtp import MtpDrafter, mtp_bytes
from .speculative import DRAFT_BATCH, DraftLength, LookupDrafter, ModelDrafter, Speculator


def draft_options(settings: Settings) -> dict[str, Any]:
    """The draft model's options: the model's context and threads, at most DRAFT_BATCH rows a pass."""
    c = settings.context
    return dict(
        ctx_size=c.ctx_size,
        n_batch=min(c.n_batch, DRAFT_BATCH),
        n_threads=c.n_threads,
        seed=c.seed,
        flash_attn=c.flash_attn,
        repack=c.repack,
        batch_invariant=c.batch_invariant,
    )


def draft_bytes(model: Any, settings: Settings) -> int:
    """The memory the drafter `settings` ask of `model` (superggml.Model, loading) will hold: a draft model's
    weights, or its draft_budget, and the rest; an MTP block's."""
    sp = settings.speculative
    if sp.draft_mtp:
        return mtp_bytes(model, settings.context)
    if not sp.draft_model:
        return 0
    draft = Settings.from_options(draft_options(settings)).context  # the draft's context, cache types f16
    return model_bytes(sp.draft_model, draft, sp.draft_budget_bytes)


def make_speculator(model: Any, model_cls: Any) -> Speculator:
    """The drafter the speculative settings ask for: a draft model (a `model_cls`, resident, or streamed within
    its own draft_budget), the MTP block, or prompt lookup."""
    sp = model.settings.speculative
    length = DraftLength(sp.draft_min, sp.draft_max, sp.draft_k)
    if sp.draft_mtp:
        return Speculator(MtpDrafter(model, p_min=sp.draft_p_min), length)
    if not sp.draft_model:
        return Speculator(LookupDrafter(sp.lookup_ngram), length)
    kw = draft_options(model.settings)
    # resident (the target's automatic budget left its memory), or streamed within its own draft_budget
    kw.update(device_budget="off" if sp.draft_budget is None else sp.draft_budget, async_prefetch=True)
    draft = model_cls(sp.draft_model, **kw)
    try:
        return Speculator(ModelDrafter(draft, model, p_min=sp.draft_p_min), length)
    except BaseException:
        draft.close()
        raise
