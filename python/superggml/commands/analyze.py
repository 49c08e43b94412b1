"""`superggml analyze`: a model's layer sizes and what a budget costs per token, before running it.

Sizes come from the GGUF tensor table. The prediction follows docs/design.md's
performance model with figures measured here and now: the read bandwidth W
of the file (buffered pread, and O_DIRECT) and the compute time of one
decode step. By default both are sampled, so analyze takes seconds on any
model: a few slot-sized reads spread over the file with several in flight,
as the pager's workers read, and the computation of one or two blocks of
each distinct block shape (and the lm head), scaled by the blocks of that
shape. `full=True` (`--full`) streams the whole model through a 2-slot
pool instead, several times. Per budget: the blocks that stay pinned, the
bytes B streamed per token, and the predicted time per token. With O_DIRECT
reads and prefetch that is max(T_compute, B / W) (the performance model:
the disk works while the CPU computes). With buffered reads from the page
cache it is T_compute + B / W: on a CPU that copy runs on the same cores
and memory bus as the computation, so the two add up (bench/paging.py
measures this), W being timed with the pages cached, the steady state when
the file fits.
"""

from __future__ import annotations

import mmap
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

from .. import native
from ..arch import get_architecture
from ..arch.mtp import MTP_FAMILIES
from ..runtime.plan.memory_plan import (
    SLOT_ALIGN_ROOM,
    head_chunk_bytes,
    kv_bytes_per_token,
    plan_slots,
    split_moe_budget,
)
from ..settings import PagingSettings


@dataclass(frozen=True)
class Layout:
    path: str
    arch: str
    n_layer: int
    block_bytes: tuple[int, ...]  # per block
    other: tuple[tuple[str, int], ...]  # non-block tensors (name, bytes), largest first
    head_bytes: int  # the output matrix (the tied embedding if there is none)
    kv_bytes_per_token: int  # F16 K and V over all layers
    file_bytes: int
    slot_bytes: int  # a pool slot (CPU buffers): the largest block, padded
    head_chunk_bytes: tuple[int, ...]  # the lm head's row chunks of a slot each
    n_swa: int = 0  # sliding window (tokens) of the layers that slide
    n_swa_layers: int = 0  # layers that slide
    n_expert: int = 0  # mixture of experts: experts per layer (0: dense)
    n_expert_used: int = 0  # experts a token is routed to
    expert_bytes: int = 0  # one expert's gate, up and down matrices (the largest layer's)
    dense_bytes: int = 0  # the blocks without their experts
    dense_slot_bytes: int = 0  # a slot for the largest block without its experts
    dense_head_chunk_bytes: tuple[int, ...] = ()  # the lm head's row chunks of such a slot each
    dense_held_bytes: int = 0  # what those blocks and chunks hold pinned in host slots (each its own bytes)
    block_shapes: tuple[tuple[int, ...], ...] = ()  # the blocks of each distinct shape (tensor names, types, sizes)
    n_moe_layers: int = 0  # blocks with experts (the others have a dense FFN)
    swa_chunked: bool = False  # the layers that slide attend within chunks of n_swa tokens (llama4)
    notes: tuple[str, ...] = ()  # the family's own layout (Architecture.describe)

    def expert_stream_bytes(self, hit_rate: float) -> int:
        """Expert bytes read per decoded token when `hit_rate` of the routed experts are in the cache."""
        return int(self.n_moe_layers * self.n_expert_used * self.expert_bytes * (1.0 - hit_rate))

    def kv_bytes(self, n_tokens: int, *, swa_freed: bool = False) -> int:
        """F16 K/V bytes of n_tokens; swa_freed: with the pages of sliding-window layers beyond the window
        freed (paged_kv; a window's worth per sliding layer, page rounding aside)."""
        per_layer = self.kv_bytes_per_token // self.n_layer
        if not swa_freed or not self.n_swa:
            return n_tokens * self.kv_bytes_per_token
        return per_layer * (
            (self.n_layer - self.n_swa_layers) * n_tokens + self.n_swa_layers * min(n_tokens, self.n_swa)
        )


def mtp_note(hp: Any, f: Any) -> tuple[str, ...]:
    """The next-token-prediction blocks after the model's own, which draft_mtp runs resident."""
    if not hp.n_nextn:
        return ()
    held = sum(
        int(nb)
        for name, _t, _s, _o, nb in f.tensors()
        if name.startswith("blk.") and int(name.split(".")[1]) >= hp.n_layer
    )
    use = (
        "a drafter with no second model (--draft-mtp), held resident"
        if hp.arch in MTP_FAMILIES
        else f"not run (superggml drafts with them in {', '.join(MTP_FAMILIES)} models)"
    )
    return (f"MTP: {hp.n_nextn} next-token-prediction block(s) after the {hp.n_layer}, {held / 2**20:.1f} MiB: {use}",)


def model_layout(path: str | os.PathLike[str]) -> Layout:
    """Per-layer sizes from the GGUF's tensor table (no weights are read)."""
    f = native.GGUFFile(os.fspath(path))
    try:
        meta = f.metadata()
        sizes = {name: nb for name, _t, _s, _o, nb in f.tensors()}
        arch = get_architecture(meta, sizes)
        hp = arch.hp
        blocks = [sum(sizes[n] for n in arch.block_tensors(il)) for il in range(hp.n_layer)]
        in_blocks = {n for il in range(hp.n_layer) for n in arch.block_tensors(il)}
        other = sorted(
            ((n, b) for n, b in sizes.items() if n not in in_blocks and not arch.is_unused(n)), key=lambda x: -x[1]
        )
        head_name = arch.output_tensor(lambda n: n in sizes)
        store = native.WeightStore(f)
        slot = max(store.slot_bytes(arch.block_tensors(il)) for il in range(hp.n_layer))
        head_bytes = store.file_range(head_name)[1]
        chunk = head_chunk_bytes(slot, SLOT_ALIGN_ROOM, head_bytes)
        slot = max(slot, chunk + SLOT_ALIGN_ROOM)
        chunks = tuple(store.file_range(c)[1] for c in store.add_row_chunks(head_name, chunk))
        del store
        experts = [sum(sizes[n] for n in arch.expert_tensors(il)) for il in range(hp.n_layer)]
        dense_slot = dense_held = 0
        dense_chunks: tuple[int, ...] = ()
        if hp.n_expert:  # the executor's slots for the blocks without their experts, and its head chunks
            exp = {n for il in range(hp.n_layer) for n in arch.expert_tensors(il)}
            store = native.WeightStore(f)
            dense_sizes = [
                store.slot_bytes([n for n in arch.block_tensors(il) if n not in exp]) for il in range(hp.n_layer)
            ]
            chunk = head_chunk_bytes(max(dense_sizes), SLOT_ALIGN_ROOM, head_bytes)
            dense_slot = max(max(dense_sizes), chunk + SLOT_ALIGN_ROOM)
            head_chunks = store.add_row_chunks(head_name, chunk)
            dense_chunks = tuple(store.file_range(c)[1] for c in head_chunks)
            dense_held = sum(dense_sizes) + sum(store.slot_bytes([c]) for c in head_chunks)
            del store
        info = {name: (str(t), tuple(shape)) for name, t, shape, _o, _n in f.tensors()}
        shapes: dict[Any, list[int]] = {}
        for il in range(hp.n_layer):
            pre = f"blk.{il}."
            key = (arch.is_swa(il), tuple(sorted((n.removeprefix(pre), *info[n]) for n in arch.block_tensors(il))))
            shapes.setdefault(key, []).append(il)
        return Layout(
            os.fspath(path),
            hp.arch,
            hp.n_layer,
            tuple(blocks),
            tuple(other),
            sizes[head_name],
            kv_bytes_per_token(hp, "f16", "f16"),
            os.path.getsize(path),
            slot,
            chunks,
            arch.n_swa,
            sum(arch.is_swa(il) for il in range(hp.n_layer)),
            hp.n_expert,
            hp.n_expert_used,
            max(experts) // max(hp.n_expert, 1),
            sum(blocks) - sum(experts),
            dense_slot,
            dense_chunks,
            dense_held,
            tuple(tuple(v) for v in shapes.values()),
            n_moe_layers=sum(arch.is_moe(il) for il in range(hp.n_layer)),
            swa_chunked=arch.swa_chunked,
            notes=tuple(arch.describe()) + mtp_note(hp, f),
        )
    finally:
        f.close()


def read_bandwidth(
    path: str, *, direct: bool, nbytes: int = 512 << 20, chunk: int = 32 << 20, progress: bool = False
) -> float:
    """Bytes/s of sequential reads of the file in slot-sized chunks, as the prefetch worker reads
    (O_DIRECT if `direct`). Buffered reads are timed on a second pass, once the pages are cached, as they
    are in steady state when the file fits the page cache (otherwise analyze predicts O_DIRECT)."""
    buf = mmap.mmap(-1, chunk)
    size = os.path.getsize(path)
    nbytes = min(nbytes, size // chunk * chunk) or chunk
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(
            total=nbytes,
            unit="B",
            unit_scale=True,
            desc=f"reading ({'O_DIRECT' if direct else 'buffered'})",
            leave=False,
        )
    try:
        fd = os.open(path, os.O_RDONLY | (os.O_DIRECT if direct else 0))
    except OSError:
        return float("nan")
    n_chunks = max(1, nbytes // chunk)
    span = max(size // chunk, 1)
    offsets = [(i * span // n_chunks) * chunk for i in range(n_chunks)]  # spread over the file, as layers are
    done = 0
    try:
        if not direct:  # warm the page cache
            for off in offsets:
                os.preadv(fd, [buf], off)
        t0 = time.perf_counter()
        for off in offsets:
            n = os.preadv(fd, [buf], off)
            done += n
            if bar is not None:
                bar.update(n)
    finally:
        os.close(fd)
        if bar is not None:
            bar.close()
    return done / (time.perf_counter() - t0)


def sample_bandwidth(
    path: str, *, direct: bool, nbytes: int = 512 << 20, chunk: int = 32 << 20, in_flight: int = 4
) -> float:
    """Bytes/s of slot-sized reads spread over the file with `in_flight` of them at a time, as the pager's
    workers read (O_DIRECT if `direct`; buffered reads timed on a second pass, the pages cached)."""
    size = os.path.getsize(path)
    chunk = min(chunk, max(4096, size // 4096 * 4096))
    n_chunks = max(1, min(nbytes, size) // chunk)
    span = max(size // chunk, 1)
    offsets = [(i * span // n_chunks) * chunk for i in range(n_chunks)]
    try:
        fd = os.open(path, os.O_RDONLY | (os.O_DIRECT if direct else 0))
    except OSError:
        return float("nan")
    bufs = [mmap.mmap(-1, chunk) for _ in range(in_flight)]  # page-aligned, as O_DIRECT needs

    def read(i: int) -> int:
        return os.preadv(fd, [bufs[i % in_flight]], offsets[i])

    try:
        with ThreadPoolExecutor(in_flight) as pool:
            if not direct:
                list(pool.map(read, range(n_chunks)))
            t0 = time.perf_counter()
            done = sum(pool.map(read, range(n_chunks)))
            dt = time.perf_counter() - t0
    except OSError:
        return float("nan")
    finally:
        os.close(fd)
    return done / dt


def sample_compute(
    path: str, lay: Layout, *, n_threads: int, per_shape: int = 2, **model_kw: Any
) -> tuple[float, list[int]]:
    """(seconds of computation per decoded token, the blocks timed): `per_shape` blocks of each distinct block
    shape (the first and one past the middle of its run) timed alone (Model.time_blocks), scaled by the number
    of blocks of that shape, plus the lm head. Reads those blocks' weights only."""
    sample = []
    for group in lay.block_shapes:
        picks = [group[0], group[len(group) // 2]] if len(group) > 1 else [group[0]]
        sample.append((group, list(dict.fromkeys(picks))[:per_shape]))
    blocks = [il for _, picks in sample for il in picks]
    with _calibration_model(path, n_threads, **model_kw) as m:
        t = m.time_blocks(blocks)
    total = t["head"] + sum(statistics.median(t[il] for il in picks) * len(group) for group, picks in sample)
    return total, blocks


def measure_compute(path: str, *, n_threads: int, tokens: int = 4, **model_kw: Any) -> float:
    """Seconds of computation per decoded token (graph compute only, from the per-layer timings); model_kw:
    where it runs (devices, rpc)."""
    with _calibration_model(path, n_threads, **model_kw) as m:
        m.record_timings = True
        m.eval(m.tokenize("def f(x):"))
        per_token = []
        for t in range(tokens):
            m.eval([100 + t])
            per_token.append(sum(x["compute_ms"] for x in m.timings) / 1e3)
    return statistics.median(per_token[1:] if len(per_token) > 1 else per_token)


def _calibration_model(path: str, n_threads: int, **model_kw: Any) -> Any:
    from ..model import Model

    lay = model_layout(path)
    # two slots; a MoE's dense part streams through three and its cache holds what a token routes to
    moe = 3 * lay.dense_slot_bytes + lay.n_expert_used * lay.expert_bytes if lay.n_expert else 0
    return Model(
        path,
        ctx_size=128,
        n_threads=n_threads,
        repack=False,
        device_budget=max(2 * lay.slot_bytes, moe),
        direct_io=False,
        **model_kw,
    )


@dataclass(frozen=True)
class BudgetPlan:
    budget: int
    n_slots: int
    pinned_blocks: int
    streamed_bytes: int  # per token
    predicted_s: float  # per token
    expert_cache_bytes: int = 0  # mixture of experts: the budget's expert cache
    expert_hit_rate: float = 0.0  # the hit rate the streamed bytes assume


@dataclass(frozen=True)
class Analysis:
    layout: Layout
    t_compute_s: float
    bandwidth_buffered: float
    bandwidth_direct: float
    direct_io: bool
    plans: tuple[BudgetPlan, ...] = field(default_factory=tuple)
    method: str = "sampled"  # "sampled" or "full" (the whole model streamed)
    sampled_blocks: tuple[int, ...] = ()
    seconds: float = 0.0  # the measurement's wall time

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        b = self.layout.block_bytes
        d["layout"]["block_bytes_min_avg_max"] = [min(b), sum(b) / len(b), max(b)]
        return d


def plan_moe_budget(
    lay: Layout, budget: int, *, hit_rate: float | None = None, n_batch: int = 512, async_prefetch: bool = True
) -> BudgetPlan:
    """A MoE model's budget as the executor splits it on the host (memory_plan.plan_pool): the blocks without
    their experts first, counted at what they hold (pinned if the cache can still hold the experts one batch
    routes to, else streamed), the rest the expert cache. Expert bytes read per token at `hit_rate`; None: the cache's share of all the
    experts, the hit rate of uniform routing (a router with temporal locality does better). Streamed dense
    bytes per token as plan_budget counts them. No predicted time (predicted_s is NaN)."""
    keys = [lay.dense_slot_bytes] * lay.n_layer + list(lay.dense_head_chunk_bytes)
    slot, es = lay.dense_slot_bytes, lay.expert_bytes
    stream_slots = PagingSettings(async_prefetch=async_prefetch).stream_slots
    dense = lay.dense_held_bytes or slot * len(keys)
    dense_budget, cache = split_moe_budget(
        budget,
        dense=dense,
        slot=slot,
        n_stream=stream_slots,
        n_expert=lay.n_expert,
        n_expert_used=lay.n_expert_used,
        expert_bytes=es,
        n_batch=n_batch,
    )
    n_slots, pinned = plan_slots(dense_budget, slot, len(keys), stream_slots, lay.dense_held_bytes or None)
    held = min(1.0, (cache // es) / (max(lay.n_moe_layers, 1) * lay.n_expert))
    h = held if hit_rate is None else hit_rate
    streamed = sum(keys[pinned:]) + lay.expert_stream_bytes(h)
    return BudgetPlan(budget, n_slots, min(pinned, lay.n_layer), int(streamed), float("nan"), cache, h)


def plan_budget(
    lay: Layout, budget: int, *, async_prefetch: bool = True, prefetch_depth: int = 2
) -> tuple[int, int, int]:
    """(n_slots, pinned keys, bytes streamed per token) as the executor plans a budget: slots sized for the
    largest block, the lm head in row chunks of a slot, the first keys pinned, the rest streamed."""
    keys = list(lay.block_bytes) + list(lay.head_chunk_bytes)
    n_slots, pinned = plan_slots(
        budget,
        lay.slot_bytes,
        len(keys),
        PagingSettings(async_prefetch=async_prefetch, prefetch_depth=prefetch_depth).stream_slots,
    )
    if n_slots < 1:
        raise ValueError(f"budget of {budget} bytes is smaller than one layer ({lay.slot_bytes} bytes)")
    return n_slots, pinned, int(sum(keys[pinned:]))


def analyze(
    path: str,
    budgets: Sequence[int],
    *,
    n_threads: int,
    direct_io: bool | None = None,
    async_prefetch: bool = True,
    progress: bool = False,
    measure: bool = True,
    hit_rate: float | None = None,
    full: bool = False,
    **model_kw: Any,
) -> Analysis:
    """`hit_rate`: the expert cache's, for a MoE model's budgets (None: uniform routing's, plan_moe_budget).
    `full`: time the whole model streamed (minutes on a big one) instead of sampled blocks and reads; progress:
    a line per stage on stderr. model_kw: where the compute is measured (devices, rpc: a server's device
    computes the blocks)."""
    t0 = time.perf_counter()
    lay = model_layout(path)
    nan = float("nan")
    w_buf = w_dir = tc = nan
    sampled: list[int] = []

    def say(what: str) -> None:
        if progress:
            print(f"analyze: {what} ({time.perf_counter() - t0:.1f} s)", file=sys.stderr, flush=True)

    if measure and full:
        w_buf = read_bandwidth(path, direct=False, progress=progress)
        w_dir = read_bandwidth(path, direct=True, progress=progress)
        say(f"streaming all {lay.n_layer} blocks through a 2-slot pool, 5 tokens")
        tc = measure_compute(path, n_threads=n_threads, **model_kw)
    elif measure:
        say("sampling the read rate, buffered and O_DIRECT, 4 reads in flight")
        w_buf = sample_bandwidth(path, direct=False)
        w_dir = sample_bandwidth(path, direct=True)
        n_shapes = len(lay.block_shapes)
        say(f"timing 1-2 blocks of each of {n_shapes} block shape{'s' if n_shapes > 1 else ''} and the lm head")
        tc, sampled = sample_compute(path, lay, n_threads=n_threads, **model_kw)
    say("done")
    if direct_io is None:
        direct_io = lay.file_bytes > int(native.host_memory()["available"])
    plans = []
    too_small: list[ValueError] = []
    for b in budgets:
        try:
            moe = plan_moe_budget(lay, b, hit_rate=hit_rate, async_prefetch=async_prefetch) if lay.n_expert else None
            if moe is not None:
                n_slots, pinned, streamed = moe.n_slots, moe.pinned_blocks, moe.streamed_bytes
            else:
                n_slots, pinned, streamed = plan_budget(lay, b, async_prefetch=async_prefetch)
        except ValueError as e:  # a budget below what one token needs: left out of the table
            too_small.append(e)
            continue
        if direct_io:  # the disk works while the CPU computes
            pred = max(tc, streamed / w_dir) if async_prefetch else tc + streamed / w_dir
        else:  # a memory copy on the same cores and memory bus as the computation: they add up
            pred = tc + streamed / w_buf
        plans.append(
            BudgetPlan(
                b,
                n_slots,
                min(pinned, lay.n_layer),
                streamed,
                pred,
                *((moe.expert_cache_bytes, moe.expert_hit_rate) if moe else ()),
            )
        )
    if too_small and not plans:
        raise too_small[0]
    return Analysis(
        lay,
        tc,
        w_buf,
        w_dir,
        direct_io,
        tuple(plans),
        "full" if full else "sampled",
        tuple(sampled),
        time.perf_counter() - t0,
    )


def format_analysis(a: Analysis) -> str:
    lay = a.layout
    b = lay.block_bytes
    mib = 2**20
    out = [
        f"{os.path.basename(lay.path)}: {lay.arch}, {lay.n_layer} blocks, file {lay.file_bytes / mib:.0f} MiB",
        f"blocks: min {min(b) / mib:.1f} / avg {sum(b) / len(b) / mib:.1f} / max {max(b) / mib:.1f} MiB, "
        f"total {sum(b) / mib:.0f} MiB",
        "other tensors: "
        + ", ".join(f"{n} {s / mib:.1f} MiB" for n, s in lay.other[:4])
        + (f" (+{len(lay.other) - 4} smaller)" if len(lay.other) > 4 else ""),
        f"KV cache (F16): {lay.kv_bytes_per_token / 1024:.1f} KiB per token "
        f"({lay.kv_bytes(4096) / mib:.0f} MiB at 4096 tokens)",
        *lay.notes,
        *(
            [
                f"{'chunked attention' if lay.swa_chunked else 'sliding window'}: {lay.n_swa_layers} of "
                f"{lay.n_layer} layers over {lay.n_swa} tokens; with paged_kv "
                f"their K/V beyond it is freed: {lay.kv_bytes(8192, swa_freed=True) / mib:.0f} MiB at 8192 tokens "
                f"instead of {lay.kv_bytes(8192) / mib:.0f}"
            ]
            if lay.n_swa_layers
            else []
        ),
        (
            f"measured ({a.method}{', blocks ' + ','.join(map(str, a.sampled_blocks)) if a.sampled_blocks else ''}; "
            f"{a.seconds:.1f} s): compute {a.t_compute_s * 1e3:.1f} ms/token, read {a.bandwidth_buffered / 1e9:.2f} "
            f"GB/s buffered, {a.bandwidth_direct / 1e9:.2f} GB/s O_DIRECT; reads here: "
            f"{'O_DIRECT' if a.direct_io else 'buffered'}"
            if a.t_compute_s == a.t_compute_s
            else "not measured (--no-measure): no predicted times"
        ),
        *(
            [
                f"mixture of experts: {lay.n_expert} experts per block, {lay.n_expert_used} per token, "
                f"{lay.expert_bytes / mib:.2f} MiB each; blocks without them {lay.dense_bytes / mib:.0f} MiB. With "
                f"expert_cache, experts read per token: "
                + ", ".join(f"{lay.expert_stream_bytes(h) / 1e6:.1f} MB at a {h:.0%} hit rate" for h in (0.0, 0.5, 0.9))
            ]
            if lay.n_expert
            else []
        ),
        f"{'budget MiB':>10} {'slots':>6} {'pinned blocks':>13} {'streamed MB/token':>17} {'predicted ms/token':>18}"
        + (f" {'expert cache MiB':>16} {'hit rate':>8}" if lay.n_expert else ""),
    ]
    for p in a.plans:
        pred = f"{p.predicted_s * 1e3:>18.1f}" if p.predicted_s == p.predicted_s else f"{'-':>18}"
        out.append(
            f"{p.budget / mib:>10.0f} {p.n_slots:>6} {p.pinned_blocks:>13} {p.streamed_bytes / 1e6:>17.1f} "
            + pred
            + (f" {p.expert_cache_bytes / mib:>16.0f} {p.expert_hit_rate:>8.0%}" if lay.n_expert else "")
        )
    if lay.n_expert:
        out.append(
            "MoE budgets: blocks without their experts first, the rest the expert cache; streamed bytes "
            "include the experts missed at that hit rate (default: the cache's share of the experts, "
            "uniform routing; --hit-rate sets it)"
        )
    return "\n".join(out)
