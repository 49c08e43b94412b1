"""Weight placement: where each tensor of the file lives while a model runs.

Resident weights are bound to the file mapping and loaded in the background, group by group (the first pass
computes block i while block i+1 loads); the matmul weights ggml-cpu has re-laid kernels for are copied into that
layout. Devices that are not host memory get copies of what their blocks read. Paged weights go through one pool
of slots per device (WeightPager; the first blocks that fit stay pinned), a MoE model's experts through the
expert cache (ExpertPager), both within the budget of the memory plan.
"""

from __future__ import annotations

from typing import Any

from ... import native
from ...errors import SuperggmlError
from ...telemetry import MemoryFn
from ..plan.memory_plan import SLOT_ALIGN_ROOM, ExpertLoan, head_chunk_bytes, host_room, plan_pool
from .pagers import Block, ExpertPager, HeadChunk, Key, NullPager, WeightPager, merge_stats
from ..plan.resolve import Resolved
from .pressure import LayerScheduler
from ...arch import Architecture
from ...arch.mtp import MtpArch

F32 = native.GGMLType.F32
I32 = native.GGMLType.I32
DIRECT_ROOM = 3 * 4096  # kept free in a slot with direct_io, for widening a chunk to O_DIRECT alignment
N_IO_WORKERS = 1  # threads reading streamed blocks


class WeightView:
    """name -> tensor, as the architecture sees it from the device whose graph is being built (`device`): a
    device that is not host memory reads its own copies of the weights other devices read too (`copies`:
    device -> name -> the copy's name)."""

    def __init__(self, store: native.WeightStore):
        self.store = store
        self.cache: dict[str, Any] = {}
        self.copies: dict[int, dict[str, str]] = {}
        self.device = 0

    def __call__(self, name: str) -> Any:
        name = self.copies.get(self.device, {}).get(name, name)
        t = self.cache.get(name)
        if t is None:
            t = self.cache[name] = self.store.get(name)
        return t

    def has(self, name: str) -> bool:
        return bool(self.store.has(name))


class MoEScratch:
    """What carries a MoE block's state from its attention-and-router graph to its experts graphs, F32/I32
    [*, n_batch]: the FFN's input (inp) and normed input (cur), the routed experts (sel) and their weights (w,
    [1, k, n_batch]), the shared expert's output, and the next block's router's guess (None: no lookahead)."""

    def __init__(self, arch: Architecture | MtpArch, n_batch: int, backend: native.Backend, lookahead: bool):
        hp, k = arch.hp, arch.hp.n_expert_used
        cx = native.Context(max_tensors=6)
        self.guess = cx.new_tensor(I32, [k, n_batch]) if lookahead else None
        self.inp = cx.new_tensor(F32, [hp.ffn_inp_width, n_batch])
        self.cur = cx.new_tensor(F32, [hp.n_embd, n_batch])
        self.sel = cx.new_tensor(I32, [k, n_batch])
        self.w = cx.new_tensor(F32, [1, k, n_batch])
        self.shared = cx.new_tensor(F32, [hp.n_embd, n_batch]) if arch.n_ff_shexp else None
        self.keep = [cx, backend.alloc_tensors(cx)]


class WeightPlacement:
    """The weights of one model over its devices: resident (loaded in the background from the start) or paged
    (make_pools: pagers, experts), as resolve.resolve settled them."""

    def __init__(
        self, arch: Architecture | MtpArch, store: native.WeightStore, resolved: Resolved, *, load: bool = True
    ):
        """`load`: start the background load of resident weights (False: the caller has bound them)."""
        self.arch, self.hp, self.store = arch, arch.hp, store
        devices = resolved.devices
        self.backends = devices.backends
        self.layer_device = devices.layer_device
        self.n_split = devices.n_split
        self.head_dev = self.layer_device[-1]
        self.settings = resolved.settings
        self.memory_plan = resolved.memory_plan
        pg = self.settings.paging
        self.direct_io = bool(pg.direct_io)
        self.view = WeightView(store)
        self.paged = pg.paged(self.hp.n_layer)
        self.loader: Any = None  # background load of resident weights (start_loading)
        self.pagers: list[WeightPager | NullPager] = [NullPager() for _ in self.backends]  # per device
        self.experts: ExpertPager | None = None  # experts paged one by one (expert_cache)
        self.loan: ExpertLoan | None = None  # the plan's untouched K/V and compute, lent to the expert cache
        self.host_experts: Any = None  # placement.ExpertPlacer: missed experts computed on the host
        self.experts_split = (
            False  # the cache's misses may compute on the host (a device cache, placement not "device")
        )
        self.expert_rows = 0
        self.moe: MoEScratch | None = None
        self.scheduler: LayerScheduler | None = None
        self.repacked_bytes = 0
        self.remote_bytes = 0  # weights copied to devices that are not host memory
        self.n_pinned = 0
        self.host_tier_used = 0  # bytes of host tier the pools took
        self.head_chunks: list[str] = []
        self.decode_threads: int | None = None  # compute threads for single-token steps while streaming
        if pg.expert_cache is not None and not self.hp.n_expert:
            raise ValueError("expert_cache applies to mixture-of-experts models; this model is dense")
        # a MoE model under a device_budget pages its experts too: its dense part is planned first, the rest of
        # the budget is the expert cache (plan_pool splits it). On a GPU (expert_cache given: fed from the host
        # tier), over a split or to an RPC server, a MoE block streams whole by default, its experts with it: the
        # device cache is not yet bit-identical on a card (bench/gpu/results/2026-11-28-h200-notes.md)
        self.experts_paged = pg.expert_cache is not None or (
            self.hp.n_expert > 0 and pg.budget_bytes is not None and self.n_split == 1 and self.backends[0].is_host
        )
        if self.experts_paged and self.n_split > 1:
            raise ValueError("paged experts run on one device for now, not a multi-device split")
        self.remote = self.plan_copies()
        if load and not self.paged:
            self.start_loading(self.settings.context.repack, devices.embed_dev)
        try:
            self.make_pools(devices.memory[0])
        except BaseException:
            self.close()  # the loader's threads must stop before the caller unmaps the file
            raise

    def host_tier_bytes(self) -> int:
        """Bytes of host memory for the host tier of the pools (a size given, or the plan's)."""
        hc = self.settings.paging.host_cache
        if isinstance(hc, int):
            return hc
        return self.memory_plan.host_cache if self.memory_plan is not None and hc == "auto" else 0

    def layers_on(self, d: int) -> list[int]:
        """The blocks device d runs, in order."""
        return [il for il, dev in enumerate(self.layer_device) if dev == d]

    def block_tensors(self, il: int) -> list[str]:
        """Block il's tensors that load with it (its experts go through the expert cache instead, if any)."""
        names = self.arch.block_tensors(il)
        if not self.experts_paged:
            return names
        experts = set(self.arch.expert_tensors(il))
        return [n for n in names if n not in experts]

    def outside_blocks(self) -> list[str]:
        """The tensors no block lists, but the output norm, the lm head, the token embedding and those the pass does
        not use (Architecture.is_unused)."""
        blocks = {n for il in range(self.hp.n_layer) for n in self.arch.block_tensors(il)}
        return [
            n
            for n in self.store.names()
            if n
            not in blocks | {self.arch.output_tensor(self.store.has), self.arch.output_norm, *self.arch.embed_tensors}
            and not self.arch.is_unused(n)
        ]

    def load_groups(self) -> list[list[str]]:
        """The weights in the order a forward pass uses them: block 0 (with the global tensors every block
        reads), block 1, ..., then the output head. The token embedding is left out (a pass reads only its
        prompt's rows, straight from the mapping) unless the head is tied to it."""
        groups = [self.block_tensors(il) for il in range(self.hp.n_layer)]
        groups[0] = self.outside_blocks() + groups[0]
        groups.append([self.arch.output_norm, self.arch.output_tensor(self.store.has)])
        return groups

    def plan_copies(self) -> dict[int, list[str]]:
        """What each device that is not host memory holds of the weights outside the blocks: a copy of each
        one its blocks read (rope factors and the like) and, on the head's device, of the output norm and
        (resident) the lm head, so a tied head does not take the embedding away from the CPU that reads its
        rows. Fills view.copies; returns device -> the names it loads (its blocks too, if resident)."""
        out = self.arch.output_tensor(self.store.has)
        remote: dict[int, list[str]] = {}
        for d in range(self.n_split):
            if self.backends[d].is_host:
                continue
            head = [self.arch.output_norm] + ([] if self.paged else [out]) if d == self.head_dev else []
            copies = {n: self.store.add_copy(n, f"dev{d}") for n in self.outside_blocks() + head}
            self.view.copies[d] = copies
            own = [] if self.paged else [n for il in self.layers_on(d) for n in self.block_tensors(il)]
            remote[d] = own + list(copies.values())
        return remote

    def host_copies(self, names: list[str], host: int, repack: bool = False) -> None:
        """Copies of the tensors `names` bound to the file mapping, for the graphs the host device `host` computes
        them in (per-pass placement): the originals stay bound to the device's slots or buffers. repack: the
        matrices re-laid for the host's faster kernels (ggml-cpu repack, as a resident model's), where the host's
        memory holds them beside the host tier; the others stay on the mapping."""
        copies = {n: self.store.add_copy(n, "host") for n in names}
        self.store.bind_mmap(list(copies.values()))
        self.view.copies.setdefault(host, {}).update(copies)
        if repack and self.memory_plan is not None:
            matmul = set(self.arch.matmul_weights(self.store.has))
            want = [n for n in names if n in matmul]
            need = sum(self.store.file_range(n)[1] for n in want)
            if want and need <= host_room(self.memory_plan, self.host_tier_used):
                self.repacked_bytes += int(self.store.load_repacked([copies[n] for n in want], self.backends[host]))

    def load_remote(self) -> None:
        """Copies each non-host device's weights (plan_copies) into a buffer of its own."""
        for d, names in self.remote.items():
            if names:
                self.remote_bytes += int(self.store.load_resident(names, self.backends[d]))

    def start_loading(self, repack: bool, embed_dev: int) -> int:
        """Resident weights: binds them to the file mapping, places the re-laid ones (ggml-cpu repack) and
        starts worker threads that load them group by group (load_groups); the reads overlap everything after.
        The weights of devices that are not host memory are copied there first. Returns the bytes of the
        re-laid buffers."""
        if self.paged:
            raise RuntimeError("a paged model streams its blocks: nothing to load ahead")
        remote = {n for names in self.remote.values() for n in names}
        groups = [[n for n in g if n not in remote] for g in self.load_groups()]
        paged = (
            {n for il in range(self.hp.n_layer) for n in self.arch.expert_tensors(il)} if self.experts_paged else set()
        )  # experts in the expert cache stay as in the file
        repacked = [n for n in self.arch.matmul_weights(self.store.has) if n not in remote | paged] if repack else []
        try:
            self.loader = native.WeightLoader(
                self.store,
                groups,
                repacked,
                self.backends[embed_dev],
                n_workers=max(1, min(2, self.settings.context.threads)),
            )
            self.load_remote()
        except SuperggmlError as e:
            if self.memory_plan is None or "cannot allocate" not in str(e):
                raise
            raise self.memory_plan.off_error(str(e)) from e
        self.repacked_bytes = int(self.loader.repacked_bytes)
        return self.repacked_bytes

    def loaded(self, group: int | None) -> None:
        """Waits for a group of the background load; forgets the loader once everything is in."""
        if group is not None and self.loader is not None:
            self.loader.wait(group)

    def pass_done(self) -> None:
        """Between passes: a background load that has finished is forgotten, so the next plan merges."""
        if self.loader is not None and self.loader.done():
            self.loader = None

    def close(self) -> None:
        """Stops the background load (before the file's mapping goes away)."""
        if self.loader is not None:
            self.loader.cancel()
            self.loader = None

    def block_places(self) -> list[str]:
        """Each block's place (WeightPager.places), "resident" where no pager holds it."""
        places: dict[int, str] = {}
        for pg in self.pagers:
            places.update(pg.places())
        return [places.get(b, "resident") for b in range(self.hp.n_layer)]

    @property
    def pager(self) -> WeightPager | NullPager:
        """The first device's pager (the only one of a model on one device)."""
        return self.pagers[0]

    def pool_keys(self, d: int) -> tuple[list[list[str]], list[Key], list[int], int, int]:
        """Device d's pool: the tensors of each key (its blocks; on the head's device the lm head's row chunks,
        a slot each, less the room a chunk's size may take when padded to the buffer alignment), the keys,
        each block's bytes in a slot, the slot's size, and what the keys hold once all pinned (each its own
        bytes: in host slots the rest of a slot is never touched, so never charged)."""
        blocks, store = self.layers_on(d), self.store
        layers = [self.block_tensors(il) for il in blocks]
        keys: list[Key] = [Block(il) for il in blocks]
        sizes = [store.slot_bytes(layer, self.backends[d], self.direct_io) for layer in layers]
        slot = max(sizes)
        if d == self.head_dev:  # the lm head is the largest tensor of small models
            room, head = SLOT_ALIGN_ROOM + (DIRECT_ROOM if self.direct_io else 0), self.arch.output_tensor(store.has)
            chunk = head_chunk_bytes(slot, room, store.file_range(head)[1])
            slot = max(slot, chunk + room)
            self.head_chunks = store.add_row_chunks(head, chunk)
            layers += [[ch] for ch in self.head_chunks]
            keys += [HeadChunk(i) for i in range(len(self.head_chunks))]
        held = sum(sizes) + sum(store.slot_bytes(ch, self.backends[d], self.direct_io) for ch in layers[len(sizes) :])
        return layers, keys, sizes, slot, held

    def make_pools(self, memory: MemoryFn) -> None:
        """What pages: each device's blocks through a pool of slots of its own (pool_keys), within its budget,
        the first ones that fit pinned, as memory_plan.plan_pool plans it; the expert cache; with
        dynamic_layers, the scheduler that moves blocks, following `memory` (the device's reading)."""
        p, c, b = self.settings.paging, self.settings.context, self.backends[0]
        tier, bb, expert_budget = self.host_tier_bytes(), p.budget_bytes, p.expert_cache_bytes
        if self.paged:
            names = {n for il in range(self.hp.n_layer) for n in self.arch.block_tensors(il)}
            self.store.bind_mmap([n for n in self.store.names() if n not in names])
            self.load_remote()
        moe = None
        if self.experts_paged:
            strided = p.staged_io or not b.is_host
            hp = self.hp
            expert_bytes = ExpertPager.slot_bytes(self.store, self.arch, direct=self.direct_io, strided=strided)
            moe = dict(
                n_expert=hp.n_expert, n_expert_used=hp.n_expert_used, n_batch=c.n_batch, expert_bytes=expert_bytes
            )
        for d in [d for d in range(self.n_split) if self.paged and d in self.layer_device]:
            layers, keys, sizes, slot, held = self.pool_keys(d)
            bd = self.backends[d]
            pool = plan_pool(
                p,
                self.memory_plan,
                bb[d] if isinstance(bb, tuple) else bb,
                slot=slot,
                n_keys=len(layers),
                host_tier=tier - self.host_tier_used if not bd.is_host or p.staged_io else 0,
                moe=moe,
                name=f" of {bd.name}" if self.n_split > 1 else "",
                big=self.layers_on(d)[sizes.index(max(sizes))],
                held=held if moe and bd.is_host and not p.staged_io else None,
            )
            expert_budget, self.host_tier_used = pool.expert_budget, self.host_tier_used + pool.host_slots * slot
            core = native.LayerPager(
                self.store,
                layers,
                n_slots=pool.n_slots,
                slot_size=slot,
                n_workers=N_IO_WORKERS,
                backend=bd,
                direct_io=self.direct_io,
                staged=p.staged_io,
                host_slots=pool.host_slots,
            )
            pager = self.pagers[d] = WeightPager(core, keys, p.ahead)
            for key in keys[: pool.n_pinned]:
                pager.pin(key)
            self.n_pinned += pool.n_pinned
        first = self.pagers[0]
        streams = isinstance(first, WeightPager) and self.n_pinned < first.n_keys
        if c.n_threads is None and p.async_prefetch and self.n_split == 1 and streams and b.device_type == "cpu":
            # blocks stream while others compute: when decoding, the prefetch worker needs a core of its own
            # (2 cores, Qwen2.5-1.5B at a 25% budget: 14.0 tok/s with 1 compute thread, 8.8 with 2); prefill
            # is compute-bound and keeps them all
            self.decode_threads = max(1, c.threads - N_IO_WORKERS)
        if p.dynamic_layers and isinstance(first, WeightPager):
            self.scheduler = LayerScheduler(
                first.core,
                planned=list(range(self.n_pinned)),
                n_keys=first.n_keys,
                stream_slots=first.core.n_slots - self.n_pinned,
                mem_pressure=p.mem_pressure,
                memory=memory,
            )
        if self.experts_paged:
            assert expert_budget is not None
            self.make_experts(expert_budget)

    def make_experts(self, budget: int) -> None:
        """The MoE blocks' scratch (MoEScratch) and the expert cache of `budget` bytes; expert_rows: the rows of a
        pass whose routed experts the cache can pin at once (a pass's experts graphs run over chunks of them)."""
        hp, c, p, b = self.hp, self.settings.context, self.settings.paging, self.backends[0]
        # the next block's router's guess: only when every block is resident or pinned (its router is there)
        ahead = p.expert_lookahead is not False and (not self.paged or self.n_pinned >= hp.n_layer)
        self.moe = MoEScratch(self.arch, c.n_batch, b, ahead)
        host = b.is_host and not p.staged_io and p.expert_cache_bytes is None and self.n_split == 1
        self.loan = ExpertLoan.of(self.memory_plan, hp, c, self.arch.ffn_width) if host else None
        self.experts_split = not b.is_host and p.placement != "device"
        self.experts = ExpertPager(
            self.store,
            self.store.path,
            self.arch,
            budget,
            b,
            direct_io=self.direct_io,
            lookahead=p.expert_lookahead,
            loan=self.loan.size if self.loan else 0,
            staged=p.staged_io,
            host_tier=max(0, self.host_tier_bytes() - self.host_tier_used),
            split=self.experts_split,
        )
        self.host_tier_used += self.experts.tier_slots * self.experts.expert_bytes
        self.expert_rows = max(1, min(c.n_batch, self.experts.base_slots // hp.n_expert_used))

    def lend(self, ends: dict[int, int], n: int) -> None:
        """Before a pass of n rows that ends sequence s at ends[s]: the expert cache gives back what of its loan
        the pass's K/V and compute buffers may touch."""
        if self.loan is not None and self.experts is not None:
            self.experts.lend(self.loan.owed(ends, n))

    def stats(self) -> dict[str, Any]:
        paged = [p.stats() for p in self.pagers if isinstance(p, WeightPager)]
        d = merge_stats(paged)
        if len(paged) > 1:
            d["pager_per_device"] = paged
        if self.experts is not None:
            d.update(self.experts.stats())
        if self.scheduler is not None:
            d.update(self.scheduler.stats())
        return d
