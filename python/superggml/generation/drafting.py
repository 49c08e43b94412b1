"""The drafter a model's speculative settings ask for (a draft model, its MTP block or prompt lookup), and the
memory it holds, which the automatic budget leaves it."""

from __future__ import annotations

from typing import Any, Callable

from ..settings import Settings
from .engine import Engine
from .mtp import MtpDrafter
from .speculative import DraftLength, LookupDrafter, ModelDrafter, Speculator

DRAFT_OPTIONS = ("ctx_size", "n_batch", "n_threads", "seed", "flash_attn", "repack", "batch_invariant")


def draft_options(settings: Settings) -> dict[str, Any]:
    """The draft model's options: its context as settings.draft_context gives it (what the memory plan counted)."""
    c = settings.draft_context
    return {name: getattr(c, name) for name in DRAFT_OPTIONS}


def make_speculator(model: Engine, model_cls: Callable[..., Engine]) -> Speculator:
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
