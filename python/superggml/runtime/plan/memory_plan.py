"""The memory plan: how much of a model stays resident, from the memory the process can use.

``device_budget="auto"`` (the default) resolves here, once, when a model loads:

    budget = available - K/V cache - compute buffers - tokenizer - reserve - headroom

``available`` is what the process may still take on its device (the host: /proc/meminfo clipped by the memory
cgroup, clean page cache counted as free; another device: its free memory), ``reserve`` what the caller keeps
for something else (a draft model). When every weight fits in the budget the model is resident, exactly as
with ``device_budget="off"``; otherwise the blocks stream through a pool of that many bytes, the first ones
pinned, with worker-thread prefetch. The plan is plain data: ``Model.stats()["budget"]`` carries it and one
line on stderr says it.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from typing import Any

from ... import native
from ...arch import get_architecture
from ...arch.mtp import MtpArch
from ...arch.common import HParams
from ...settings import Budget, ContextSettings, HostCache, PagingSettings, Settings
from ...telemetry import host_memory
from .costs import judge_draft
from ...arch import Architecture
from .devices import Devices

MiB = 1 << 20
HEADROOM_MIN = 64 * MiB  # never planned: the allocator's slack, thread stacks, the interpreter's growth
HEADROOM_SHARE = 0.05  # and this share of what is available
TOKENIZER_BYTES_PER_TOKEN = 256  # the tokenizer's tables, per vocabulary entry (Qwen2.5's 151,936: 31 MiB measured)
SLOT_ALIGN_ROOM = 256  # bytes kept free in a slot for alignment padding
HEAD_CHUNKS_MAX = 1000  # the lm head in at most this many row chunks (the store holds 1024 views)
STATE_CHECKPOINTS = 3  # copies of a sequence's recurrent states kept to go back to (runtime/recurrent.py)


@dataclass(frozen=True)
class MemoryPlan:
    """What a model may hold on its device, and why. Sizes in bytes."""

    mode: str  # "auto": chosen here; "explicit": the caller's size; "off": all resident
    budget: int | None  # the blocks' pool (None: every weight resident)
    available: int  # memory the process could still take when the model loaded
    weights: int  # every tensor of the file
    kv: int  # the K/V cache at ctx_size, and a hybrid model's states with their checkpoints
    compute: int  # compute buffers, at most (n_batch rows, a full context)
    tokenizer: int
    reserve: int  # kept for something else (a draft model)
    headroom: int
    host_cache: int = 0  # the host tier of streamed blocks (a device that is not host memory)
    host_available: int = 0  # host memory the process could still take (0: the device is the host)
    host_kv: int = 0  # host memory kept beside the host tier for a host copy of the K/V (per-pass placement)
    draft_dropped: str = ""  # why the draft model asked for is not used (runtime/costs.py), if it is not

    @property
    def resident(self) -> bool:
        return self.budget is None

    @property
    def needed(self) -> int:
        """Memory a resident model needs: its weights and everything beside them."""
        return self.weights + self.beside

    @property
    def beside(self) -> int:
        """Memory the model needs besides its weights."""
        return self.kv + self.compute + self.tokenizer + self.reserve + self.headroom

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "resident": self.resident}

    def too_small(self, smallest: int, what: str) -> ValueError:
        """The error when the plan leaves less than `smallest` bytes for the weights' pool."""
        return too_small(self, smallest, what)

    def off_error(self, cause: str) -> ValueError:
        """The error when resident weights (device_budget='off') cannot be allocated."""
        return off_error(self, cause)

    def line(self, streamed: str = "") -> str:
        """One line for stderr."""
        what = "all weights resident" if self.resident else f"blocks stream, {gib(self.budget or 0)} pool"
        extra = ""
        if self.reserve:
            extra = f" ({self.reserve / 2**30:.1f} GiB kept for the draft model"
            if self.mode == "auto" and not self.resident:
                n_streamed = self.weights - (self.budget or 0)
                extra += (
                    f", so {gib(n_streamed)} of weights stream instead of "
                    f"{gib(max(0, n_streamed - self.reserve))}"
                )  # the reserve would join the pool
            extra += ")"
        if self.host_available and not self.resident:
            extra += (
                f"; host tier {gib(self.host_cache)} of the host's {gib(self.host_available)} available"
                if self.host_cache
                else "; no host tier"
            )
        return (
            f"superggml: device budget {self.mode}: {what}{streamed}; {gib(self.available)} available, "
            f"weights {gib(self.weights)}, K/V {gib(self.kv)}, compute {gib(self.compute)}, headroom "
            f"{gib(self.headroom + self.tokenizer)}{extra}"
        )


def gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / MiB:.0f} MiB"


def kv_type(name: str) -> Any:
    """A cache type of settings.KV_CACHE_TYPES as a GGMLType."""
    return getattr(native.GGMLType, name.upper())


def kv_bytes_per_token(hp: HParams, type_k: str, type_v: str) -> int:
    """One token's K and V over every layer (K only for a latent K/V)."""
    return (hp.n_layer_kv or hp.n_layer) * sum(
        int(native.row_size(kv_type(t), n)) for t, n in ((type_k, hp.n_embd_gqa), (type_v, hp.n_embd_v_gqa)) if n
    )


def kv_bytes(hp: HParams, ctx_size: int, type_k: str, type_v: str) -> int:
    """The K/V cache of every layer at ctx_size tokens."""
    return ctx_size * kv_bytes_per_token(hp, type_k, type_v)


def sequence_bytes(hp: HParams, ctx_size: int, type_k: str, type_v: str) -> int:
    """One sequence's memory: its K/V at ctx_size, and a hybrid model's recurrent states with the
    STATE_CHECKPOINTS copies kept of them."""
    return kv_bytes(hp, ctx_size, type_k, type_v) + hp.state_bytes * (1 + STATE_CHECKPOINTS)


def compute_bytes(hp: HParams, n_batch: int, ctx_size: int, flash_attn: bool, n_ff: int | None = None) -> int:
    """An upper bound of one block's compute buffer for a pass of n_batch rows over a full context (F32
    activations, the FFN's three intermediates n_ff wide (the architecture's ffn_width; without it, n_ff per
    expert used), a MoE block's routing, the attention scores unless flash attention tiles them), and the logits of
    one row."""
    n_ff = n_ff or hp.n_ff * max(1, hp.n_expert_used)
    scores = 0 if flash_attn else hp.n_head * ctx_size
    routing = hp.n_expert_used * hp.n_embd + 3 * hp.n_expert  # each chosen expert's output, the router's scores
    return 4 * n_batch * (6 * hp.n_embd + 3 * n_ff + routing + scores) + 4 * hp.n_vocab


def plan_memory(
    hp: HParams,
    weights: int,
    c: ContextSettings,
    device_budget: Budget,
    available: int,
    *,
    reserve: int = 0,
    n_ff: int | None = None,
) -> MemoryPlan:
    """The plan for a model whose tensors take `weights` bytes, with the context `c` and `device_budget` ("auto",
    "off", or bytes); `available` the memory the device has free for it, n_ff its architecture's ffn_width.
    ValueError when auto finds no room for even the smallest pool."""
    kv = sequence_bytes(hp, c.ctx_size, c.cache_type_k, c.cache_type_v)
    compute = compute_bytes(hp, c.n_batch, c.ctx_size, c.flash_attn, n_ff)
    tokenizer = TOKENIZER_BYTES_PER_TOKEN * hp.n_vocab
    headroom = HEADROOM_MIN + int(HEADROOM_SHARE * available)
    mode = device_budget if device_budget in ("auto", "off") else "explicit"
    p = MemoryPlan(
        mode=str(mode),
        budget=None,
        available=available,
        weights=weights,
        kv=kv,
        compute=compute,
        tokenizer=tokenizer,
        reserve=reserve,
        headroom=headroom,
    )
    if mode == "off" or (mode == "auto" and p.needed <= available):
        return p
    if mode == "explicit":
        return MemoryPlan(**{**asdict(p), "budget": int(device_budget)})  # type: ignore[arg-type]
    return MemoryPlan(**{**asdict(p), "budget": max(0, available - p.beside)})


def device_plan(
    settings: Settings, arch: Architecture | MtpArch, store: native.WeightStore, devices: Devices, weights: int
) -> MemoryPlan | None:
    """The memory plan of the first of `devices` for `weights` bytes in `store`, the drafter's share included;
    or, where a draft model cannot pay for its memory (draft_that_cannot_pay), the plan without it, saying why
    in draft_dropped (the caller then does not load it)."""
    plan = plan_of(settings, arch, store, devices, weights, draft_bytes(settings, arch, store))
    alone = plan_of(settings, arch, store, devices, weights, 0) if plan is not None and plan.reserve else None
    why = draft_that_cannot_pay(settings, store, plan, alone)
    if not why or alone is None:
        return plan
    return MemoryPlan(**{**asdict(alone), "draft_dropped": why})


def plan_of(
    settings: Settings,
    arch: Architecture | MtpArch,
    store: native.WeightStore,
    devices: Devices,
    weights: int,
    reserve: int,
) -> MemoryPlan | None:
    """The memory plan of the first of `devices` (runtime/devices.Devices) with `reserve` bytes kept for a
    drafter (None for a split or a budget per device)."""
    p = settings.paging
    if devices.n_split != 1 or isinstance(p.device_budget, tuple):
        return None
    b = devices.backends[0]
    plan = plan_memory(
        arch.hp, weights, settings.context, p.device_budget, devices.free[0], reserve=reserve, n_ff=arch.ffn_width
    )
    if not (b.is_host or b.endpoint):  # a host tier, unless the host is the device or an RPC server is
        used, total = host_memory()
        plan = with_host_tier(plan, p.host_cache, max(0, total - used), placed=p.placement != "device")
    return plan


def draft_that_cannot_pay(
    settings: Settings, store: native.WeightStore, plan: MemoryPlan | None, alone: MemoryPlan | None
) -> str:
    """Why the draft model cannot pay, or "": where its memory is what pushes the streamed blocks out of the page
    cache (direct_reads chooses O_DIRECT for the plan with it and not for the plan without it, `alone`), the cost
    model (costs.py) predicts plain decoding against speculative at best. An adaptive draft length only, and the
    read mode left to the plan: draft_k or direct_io keep the draft."""
    sp, p = settings.speculative, settings.paging
    if not sp.draft_model or sp.draft_k is not None or p.direct_io is not None:
        return ""
    if plan is None or plan.budget is None or not plan.reserve or not direct_reads(store.path, plan):
        return ""
    if alone is None or direct_reads(store.path, alone):
        return ""
    draft_weights = file_shape(sp.draft_model)[1]
    verdict = judge_draft(store.path, settings.context.threads, plan.weights, plan.weights - plan.budget, draft_weights)
    return "" if verdict.pays else verdict.line()


def direct_reads(path: str, plan: MemoryPlan | None) -> bool:
    """Whether streamed blocks read with O_DIRECT: when the file cannot stay in the page cache, being larger than
    the memory available; and when a drafter's weights stay beside blocks streamed on the host and the file is
    larger than what the plan leaves the page cache: buffered reads would evict the drafter's mapped weights
    (measured: Qwen2.5-1.5B at a 256 MiB budget beside its 0.5B draft in 1280 MiB, 1.34 tok/s buffered, 10.29
    direct). And where a host tier keeps the streamed blocks for a device: the page cache would hold them twice,
    and the tier reads with several O_DIRECT reads in flight at the disk's rate."""
    if plan is not None and plan.host_cache:
        return True
    size = os.path.getsize(path)
    if size > int(native.host_memory()["available"]):
        return True
    if plan is None or plan.budget is None or not plan.reserve or plan.host_available:
        return False
    return size > plan.available - plan.budget - plan.beside


def with_host_tier(p: MemoryPlan, host_cache: HostCache, host_available: int, *, placed: bool = True) -> MemoryPlan:
    """The plan of a device that is not host memory with its host tier: host_cache bytes, or ("auto") the
    blocks that stream, within what the host has available less a headroom, and less the K/V (`placed`: blocks
    may compute on the host, their K/V mirrored there); none while every weight is resident or with "off"."""
    host_kv = p.kv if placed and p.budget is not None else 0
    if p.budget is None or host_cache == "off":
        size = 0
    elif isinstance(host_cache, int):
        size = host_cache
    else:
        keep = HEADROOM_MIN + int(HEADROOM_SHARE * host_available) + p.tokenizer + host_kv
        # the weights, not weights - budget: streamed blocks take whole slots, and a pool pins fewer blocks than
        # its budget holds (some of it streams); plan_pool gives the tier no more slots than blocks stream
        size = max(0, min(p.weights, host_available - keep))
    return MemoryPlan(**{**asdict(p), "host_cache": size, "host_available": host_available, "host_kv": host_kv})


def host_room(p: MemoryPlan, used: int) -> int:
    """Host bytes a plan leaves beside `used` bytes of host tier: what the host had available (where the plan
    has no host tier, as for an RPC server's device: what it has now) less the K/V mirrored there, the tokenizer
    and the headroom."""
    avail = p.host_available
    if not avail:
        in_use, total = host_memory()
        avail = max(0, total - in_use)
    keep = HEADROOM_MIN + int(HEADROOM_SHARE * avail) + p.tokenizer + p.host_kv
    return max(0, avail - keep - used)


def file_shape(path: str) -> tuple[Any, int]:
    """A GGUF's architecture and the bytes of its tensors."""
    f = native.GGUFFile(path)
    try:
        tensors = f.tensors()
        return get_architecture(f.metadata(), [t[0] for t in tensors]), sum(int(t[4]) for t in tensors)
    finally:
        f.close()


def plan_on(
    path: str, device: str, c: ContextSettings, device_budget: Budget = "auto", host_cache: HostCache = "auto"
) -> MemoryPlan:
    """The plan a model at `path` gets on a device of this machine (a ggml device name; "" or a CPU: the host)
    with the context `c`: what `superggml plan` and `analyze` show."""
    arch, weights = file_shape(path)
    used, total = host_memory()
    host_free = max(0, total - used)
    dev = next((d for d in native.devices() if d["name"] == device), None)
    free = host_free if dev is None or dev["type"] == "cpu" else int(dev["memory_free"])
    p = plan_memory(arch.hp, weights, c, device_budget, free, n_ff=arch.ffn_width)
    if dev is None or dev["type"] == "cpu":
        return p
    return with_host_tier(p, host_cache, host_free)


def model_bytes(path: str, c: ContextSettings, budget: int | None) -> int:
    """What a model at `path` holds while it runs with the context `c` and a budget (None: resident): its weights
    or its budget, its K/V cache, compute buffers and tokenizer. For a draft model, whose memory its target
    leaves it."""
    arch, weights = file_shape(path)
    hp = arch.hp
    held = weights if budget is None else min(weights, int(budget))
    return (
        held
        + sequence_bytes(hp, c.ctx_size, c.cache_type_k, c.cache_type_v)
        + compute_bytes(hp, c.n_batch, c.ctx_size, c.flash_attn, arch.ffn_width)
        + TOKENIZER_BYTES_PER_TOKEN * hp.n_vocab
    )


def draft_bytes(settings: Settings, arch: Architecture | MtpArch, store: native.WeightStore) -> int:
    """The memory the drafter `settings` ask for will hold beside the model `arch` (its weights in `store`, a
    native.WeightStore): a draft model's weights, or its draft_budget, and the rest (settings.draft_context); an
    MTP block's tensors and one layer's K/V."""
    sp = settings.speculative
    if sp.draft_mtp:
        assert isinstance(arch, Architecture), "an MTP block drafts for a model, not for another MTP block"
        return mtp_bytes(arch, store, settings.context)
    if not sp.draft_model:
        return 0
    return model_bytes(sp.draft_model, settings.draft_context, sp.draft_budget_bytes)


def mtp_bytes(arch: Architecture, store: native.WeightStore, c: ContextSettings) -> int:
    """What an MTP drafter holds: its block's tensors, the model's head when the block has none of its own (the
    token embedding is read from the mapping), and a one-layer memory of ctx_size tokens."""
    mtp = MtpArch(arch)
    held = sum(int(store.file_range(n)[1]) for n in store.names() if n.startswith(mtp.p))
    if not mtp.head_w.startswith(mtp.p) and mtp.head_w != "token_embd.weight":
        held += int(store.file_range(mtp.head_w)[1])
    return held + kv_bytes(mtp.hp, c.ctx_size, c.cache_type_k, c.cache_type_v)


def too_small(p: MemoryPlan, smallest: int, what: str) -> ValueError:
    """The error when the plan leaves less than `smallest` bytes for the weights' pool."""
    return ValueError(
        f"not enough memory for this model: {gib(p.available)} available, and it needs {gib(p.beside)} besides "
        f"its weights (K/V cache {gib(p.kv)} at this ctx_size, compute {gib(p.compute)}, tokenizer and headroom "
        f"{gib(p.tokenizer + p.headroom)}"
        + (f", draft model {gib(p.reserve)}" if p.reserve else "")
        + "), which leaves "
        + (f"less than the {gib(smallest)} of {what}" if smallest else f"nothing for {what}")
        + ": lower ctx_size (-c) or n_batch (-b), quantize the K/V cache (-ctk, -ctv), free memory or raise the memory "
        "limit"
    )


def off_error(p: MemoryPlan, cause: str) -> ValueError:
    """The error when resident weights (device_budget='off') cannot be allocated."""
    return ValueError(
        f"{cause}: device_budget='off' keeps every weight resident, which needs {gib(p.needed)} "
        f"(weights {gib(p.weights)}, K/V cache {gib(p.kv)}, the rest {gib(p.needed - p.weights - p.kv)}), but "
        f"{gib(p.available)} is available; use device_budget='auto' (--device-budget auto) to stream the blocks "
        f"that do not fit, or a size such as --device-budget {max(1, int(p.available * 0.7 / 2**30))}GiB"
    )


@dataclass
class ExpertLoan:
    """An automatic plan's K/V and compute bytes that nothing holds yet, lent to an expert cache on host memory.

    The plan counts a full context's K/V and a full batch's compute buffers, but both take their pages as they
    are used: a short decode leaves them untouched. Until then the expert cache holds that much more in slots
    past its budget. Before each pass, `owed` gives what the pass will have touched (each sequence's farthest
    position, whole pages per layer, and the compute bound of the most rows a pass has had), and the cache
    sets that many slots aside first (ExpertPager.lend), returning their pages: what the plan committed is
    never exceeded."""

    size: int  # the bytes lent
    hp: HParams
    c: ContextSettings
    n_ff: int | None
    reach: dict[int, int] = field(default_factory=dict)  # sequence -> the farthest position touched
    rows: int = 0  # the most rows of a pass so far
    repaid: bool = False

    @classmethod
    def of(cls, plan: MemoryPlan | None, hp: HParams, c: ContextSettings, n_ff: int | None) -> "ExpertLoan | None":
        """The loan of an automatic plan that streams (None otherwise): its K/V (without a hybrid's states,
        which are held from the start) and its compute."""
        if plan is None or plan.mode != "auto" or plan.resident:
            return None
        return cls(kv_bytes(hp, c.ctx_size, c.cache_type_k, c.cache_type_v) + plan.compute, hp, c, n_ff)

    def owed(self, ends: dict[int, int], n: int) -> int:
        """Bytes due once a pass of n rows ends sequence s at position ends[s]."""
        if self.repaid:
            return self.size
        for s, e in ends.items():
            self.reach[s] = max(self.reach.get(s, 0), e)
        self.rows = max(self.rows, n)
        c, hp = self.c, self.hp
        pages = 2 * hp.n_layer * 4096 * len(self.reach)  # a K and a V page per layer, begun
        kv = kv_bytes_per_token(hp, c.cache_type_k, c.cache_type_v) * sum(self.reach.values()) + pages
        due = kv + compute_bytes(hp, self.rows, c.ctx_size, c.flash_attn, self.n_ff)
        self.repaid = due >= self.size  # for good: nothing is lent again
        return min(self.size, due)


@dataclass(frozen=True)
class PoolPlan:
    """One device's pool of slots for its blocks: how many, how many of them pinned, how many host tier slots
    behind them, and what is left of a MoE model's budget for its expert cache (None: no expert cache)."""

    n_slots: int
    n_pinned: int
    host_slots: int
    expert_budget: int | None


def plan_pool(
    p: PagingSettings,
    plan: MemoryPlan | None,
    budget: int | None,
    *,
    slot: int,
    n_keys: int,
    host_tier: int,
    moe: dict[str, int] | None = None,
    name: str = "",
    big: int = 0,
    held: int | None = None,
) -> PoolPlan:
    """The pool of n_keys keys of `slot` bytes within a device's budget (None: none given; n_gpu_layers pinned,
    or all), with at most `host_tier` bytes of host tier slots. For a MoE model whose experts page (moe: its
    n_expert, n_expert_used, expert_bytes and n_batch) the budget is split with the expert cache
    (split_moe_budget); `held`, given for host slots, is what the keys hold pinned (their own bytes, where a
    slot's untouched rest costs nothing): the dense part counts that, not slot * n_keys (a MoE block without its
    experts is much smaller than a dense lead block). ValueError when the budget is smaller than one layer
    (block `big`), or than the streaming slots of an automatic plan."""
    expert_budget = p.expert_cache_bytes
    dense = held if held is not None else slot * n_keys
    if budget is None:
        budget = (p.n_gpu_layers + p.stream_slots) * slot if p.n_gpu_layers is not None else n_keys * slot
    else:
        if plan is not None and plan.mode == "auto" and budget < p.stream_slots * slot:
            raise too_small(plan, p.stream_slots * slot, f"{p.stream_slots} blocks of {slot} bytes streaming")
        if moe is not None and expert_budget is None:
            budget, expert_budget = split_moe_budget(budget, dense=dense, slot=slot, n_stream=p.stream_slots, **moe)
    n_slots, n_pinned = plan_slots(budget, slot, n_keys, p.stream_slots, held)
    if n_slots < 1:
        raise ValueError(
            f"device_budget{name} of {budget} bytes is smaller than one layer: block {big} needs {slot} bytes"
        )
    if p.n_gpu_layers is not None:
        n_pinned = min(n_pinned, p.n_gpu_layers)
    host_slots = max(0, min(host_tier // slot, n_keys - n_pinned))
    return PoolPlan(n_slots, n_pinned, host_slots, expert_budget)


def plan_slots(budget: int, slot: int, n_keys: int, n_stream: int, held: int | None = None) -> tuple[int, int]:
    """(pool slots, pinned keys) for a budget: a slot for every key once the budget covers what the keys hold
    (`held`, host slots; else their slots); otherwise as many slots as fit, the last n_stream of them
    streaming and the first keys keeping the others. 0 slots: the budget is smaller than one layer."""
    if held is not None and budget >= held:
        return n_keys, n_keys
    n_slots = min(budget // slot, n_keys)
    if n_slots >= n_keys:
        return n_slots, n_keys
    return n_slots, max(0, n_slots - min(n_slots, n_stream))


def split_moe_budget(
    budget: int,
    *,
    dense: int,
    slot: int,
    n_stream: int,
    n_expert: int,
    n_expert_used: int,
    expert_bytes: int,
    n_batch: int,
) -> tuple[int, int]:
    """(dense budget, expert cache) of a MoE model's budget: its dense part (`dense` bytes in slots of `slot`)
    first, every block pinned if the expert cache can still hold what one batch routes to; otherwise the dense
    part streams through the fewest slots and the cache gets the rest, which must hold what one token routes to
    (a batch then runs its experts in chunks of rows)."""
    batch = min(n_expert, n_expert_used * n_batch) * expert_bytes
    stream = min(n_stream, dense // slot) * slot  # the fewest slots the dense part streams through
    dense_budget = dense if budget - batch >= dense else max(budget - batch, stream)
    if budget - dense_budget < n_expert_used * expert_bytes:
        raise ValueError(
            f"device_budget of {budget} bytes cannot hold {stream // slot} blocks without their "
            f"experts ({slot} bytes each) and the {n_expert_used} experts a token is routed to "
            f"({expert_bytes} bytes each): give it at least {stream + n_expert_used * expert_bytes} "
            f"bytes"
        )
    return dense_budget, budget - dense_budget


def head_chunk_bytes(slot: int, room: int, head_bytes: int) -> int:
    """The bytes of one of the lm head's row chunks at most: a block's slot less `room`, or, where the blocks are
    smaller than that leaves (a MoE's blocks without their experts), a HEAD_CHUNKS_MAX-th of the head; the
    pool's slot is then widened to chunk + room."""
    return max(slot - room, -(-head_bytes // HEAD_CHUNKS_MAX))
