"""Contiguous K/V: each sequence's K/V of ctx_size tokens per layer, in a slot of one pool per layer."""

from __future__ import annotations

from typing import Any, Callable, Sequence


from ... import native
from ...settings import Settings
from .base import LanedKV, KVLanes


class ContiguousKV(LanedKV):
    """K/V storage of ctx_size tokens per sequence and layer, in slots of one pool per layer on its layer's device
    (`layer_device`): K and V [n_embd_gqa, ctx_size * capacity], a sequence's slot the rows [slot * ctx_size,
    (slot + 1) * ctx_size) (V transposed within it). A sequence takes the lowest free slot when it first runs
    and frees it when dropped. On the host the pools lie in a reservation of address space for RESERVED_SLOTS
    slots (native.HostReservation): a page costs memory once written, and a dropped sequence's pages go back
    to the system. Elsewhere the pool is allocated and zeroed, and doubles when full (its slots copied); a
    freed slot keeps its rows, which a later sequence's queries give no weight (they are finite). Lanes are
    aliased to slots before a pass; the sequences of a pass on consecutive slots, in lane order, are read as
    one stream tensor per layer (`streams`), so one attention covers them all."""

    RESERVED_SLOTS = 256

    def __init__(
        self,
        settings: Settings,
        hp: Any,
        backends: Sequence[Any],
        layer_device: Sequence[int],
        kv_bytes: int,
        check_available: Callable[[int, int, str], None],
    ):
        """`check_available(device, nbytes, what)` refuses what a device has no room for (Devices')."""
        self.lanes = KVLanes(settings, hp)
        self.backends = backends
        self.check_available = check_available
        self.layer_device = list(layer_device)
        self.kv_bytes = kv_bytes
        self.ctx_size = settings.context.ctx_size
        self.capacity = 0
        self.pool: tuple[list[Any], list[Any], list[Any]] = ([], [], [])  # K and V per layer, what holds them
        self.reservation: Any = None  # the host pools' address space (None: allocated pools)
        self.offsets: list[int] = []  # where each pool tensor (K of every layer, then V) lies in it
        self.slots: dict[int, int] = {}  # sequence -> slot
        self.stream_views: dict[int, tuple[list[Any], list[Any], Any]] = {}  # lanes -> K, V [g, ctx * lanes]
        self.bound: list[int | None] = []  # the slot each lane points at
        self.bound_streams: dict[int, int] = {}  # lanes -> the first slot its stream tensors point at
        self.host: Any = None  # the host backend of mirrored layers (mirror)
        self.mirrored: dict[int, tuple[Any, Any]] = {}  # layer -> its K and V pools on the host
        self.on_host: set[int] = set()  # mirrored layers whose host copy is the one written last
        self.mirror_keep: list[Any] = []
        self.moved_bytes = 0
        self.written = False  # whether any K/V was written yet
        self.storage(0, check=False)

    def grow(self, check: bool) -> None:
        """Makes room for more slots: a host reservation of RESERVED_SLOTS at first, else twice the slots,
        the used ones copied over."""
        host = all(self.backends[d].is_host for d in set(self.layer_device))
        cap = self.RESERVED_SLOTS if host and not self.capacity else max(1, 2 * self.capacity)
        ctxs = [native.Context(max_tensors=2 * self.lanes.n_layer) for _ in self.backends]
        ks, vs = self.lanes.new(lambda il: ctxs[self.layer_device[il]], cap)
        keep: list[Any] = list(ctxs)
        reservation = None
        if host:
            sizes = [-(-t.nb[1] * t.ne[1] // 4096) * 4096 for t in ks + vs]
            reservation = native.HostReservation(sum(sizes))
            offsets = [sum(sizes[:i]) for i in range(len(sizes))]
            for t, at in zip(ks + vs, offsets):
                reservation.bind(t, at)
            keep.append(reservation)
            self.offsets = offsets
        else:
            if check:
                self.check_available(
                    0,
                    self.kv_bytes * (cap - self.capacity),
                    f"the K/V of {cap} sequences (ctx_size {self.ctx_size} tokens each; paged_kv holds "
                    f"only the pages a sequence uses)",
                )
            for i, b in enumerate(self.backends):
                if i in self.layer_device:
                    buf = b.alloc_tensors(ctxs[i])
                    buf.clear(0)
                    keep.append(buf)
        if self.capacity:
            for old, new in zip(self.pool[0] + self.pool[1], ks + vs):
                view = native.Context(max_tensors=1)
                native.tensor_copy(old, view.view(new, list(old.ne[:2]), [old.nb[1]], 0))
        self.pool, self.capacity, self.reservation = (ks, vs, keep), cap, reservation
        self.bound, self.bound_streams = [], {}
        if self.mirrored:
            self.grow_mirror(list(self.mirrored))
        native.host_memory_trim()

    def mirror(self, layers: Sequence[int], backend: Any) -> bool:
        if self.reservation is not None or not layers:
            return False  # the pools are host memory already
        self.host = backend
        self.grow_mirror(list(layers))
        return True

    def grow_mirror(self, layers: list[int]) -> None:
        """Host pools of `layers` as large as the device's, what the old ones held copied over."""
        cx = native.Context(max_tensors=2 * len(layers))
        k_pools, v_pools = self.pool[0], self.pool[1]
        new = {
            il: (
                cx.new_tensor(k_pools[il].type, list(k_pools[il].ne[:2])),
                cx.new_tensor(v_pools[il].type, list(v_pools[il].ne[:2])) if v_pools else None,
            )
            for il in layers
        }
        buf = self.host.alloc_tensors(cx)
        buf.clear(0)
        for il, (k, v) in self.mirrored.items():
            for old, t in zip((k, v), new[il]):
                if old is not None and t is not None:
                    view = native.Context(max_tensors=1)
                    native.tensor_copy(old, view.view(t, list(old.ne[:2]), [old.nb[1]], 0))
        self.mirrored, self.mirror_keep = new, [cx, buf]
        self.bound, self.bound_streams = [], {}

    def targets(self) -> list[Any]:
        """Each layer's pool tensor that its lanes reach now, K of every layer, then V: a mirrored layer's on the
        host where it computes there."""
        n = self.lanes.n_layer
        out = []
        for i, t in enumerate(self.pool[0] + self.pool[1]):
            il, kv = i % n, i // n
            out.append(self.mirrored[il][kv] if il in self.on_host else t)
        return out

    def place(self, layer: int, host: bool) -> int:
        if layer not in self.mirrored or (layer in self.on_host) == host:
            return 0
        here = [self.pool[0][layer]] + ([self.pool[1][layer]] if self.pool[1] else [])
        there = [t for t in self.mirrored[layer] if t is not None]
        pairs = list(zip(here, there)) if self.written else []  # before anything is written, nothing to bring over
        moved = 0
        for a, b in pairs:
            src, dst = (a, b) if host else (b, a)
            size = src.nb[1] * self.ctx_size  # a slot's rows
            for slot in sorted(set(self.slots.values())):
                cx = native.Context(max_tensors=2)
                shape = [src.ne[0], self.ctx_size]
                native.tensor_copy(
                    cx.view(src, shape, [src.nb[1]], slot * size), cx.view(dst, shape, [dst.nb[1]], slot * size)
                )
                moved += size
        self.on_host ^= {layer}  # it was on the other side
        self.bound, self.bound_streams = [], {}
        self.moved_bytes += moved
        return moved

    def storage(self, seq: int, check: bool = True) -> int:
        """The slot of `seq`, taken when it first runs."""
        slot = self.slots.get(seq)
        if slot is None:
            used = set(self.slots.values())
            slot = next(i for i in range(len(used) + 1) if i not in used)
            if slot >= self.capacity:
                self.grow(check)
            if check and self.reservation is not None:  # the pages this sequence may come to hold
                self.check_available(
                    0,
                    self.kv_bytes,
                    f"the K/V of sequence {seq} (ctx_size "
                    f"{self.ctx_size} tokens; paged_kv holds only the pages a sequence uses)",
                )
            self.slots[seq] = slot
        return slot

    def order(self, seq: int) -> int:
        return self.storage(seq)

    def streams(self, seqs: Sequence[int]) -> bool:
        """Whether the sequences (distinct, in lane order) can be read as one stream tensor: consecutive slots."""
        if len(seqs) < 2 or len(set(seqs)) != len(seqs):
            return False
        slots = [self.storage(s) for s in seqs]
        return slots == list(range(slots[0], slots[0] + len(slots)))

    def stream_tensors(self, n: int) -> tuple[list[Any], list[Any], Any]:
        """The stream tensors of passes over n sequences: per layer K and V [n_embd_gqa, ctx_size * n], holding
        no memory of their own (bind points them at the first slot), and their context."""
        views = self.stream_views.get(n)
        if views is None:
            cx = native.Context(max_tensors=2 * self.lanes.n_layer)
            views = self.stream_views[n] = (*self.lanes.new(lambda il: cx, n), cx)
        return views

    def layer_tensors(self, il: int, n_lanes: int, streams: bool = False) -> tuple[Any, Any]:
        if not streams:
            return self.lanes.layer(il, n_lanes)
        ks, vs, _ = self.stream_tensors(n_lanes)
        return ks[il], vs[il] if vs else None

    def bind(self, seqs: Sequence[int], streams: bool = False) -> None:
        self.written = True  # a pass (or a restored sequence) writes what it binds
        slots = [self.storage(s) for s in seqs]
        if streams:
            n = len(seqs)
            if self.bound_streams.get(n) != slots[0]:
                ks, vs, _ = self.stream_tensors(n)
                for t, pool in zip(ks + vs, self.targets()):
                    self.alias(t, pool, slots[0])
                self.bound_streams[n] = slots[0]
            return
        self.lanes.ensure(len(seqs))
        self.bound += [None] * (len(seqs) - len(self.bound))
        if all(self.bound[j] == slot for j, slot in enumerate(slots)):
            return  # a decoded token: nothing moves, nothing to do per layer
        pools = self.targets()
        for j, slot in enumerate(slots):
            if self.bound[j] == slot:
                continue
            for t, pool in zip(self.lanes.k[j] + self.lanes.v[j], pools):
                self.alias(t, pool, slot)
            self.bound[j] = slot

    def alias(self, t: Any, pool: Any, slot: int) -> None:
        """Points t at a layer's pool tensor from slot `slot` on."""
        native.tensor_alias(t, pool, slot * pool.nb[1] * self.ctx_size)

    def truncate(self, seq: int, n: int) -> None:
        pass  # rows past n are written again before any query reads them

    def stats(self) -> dict[str, Any]:
        if not self.mirrored:
            return {}
        return {
            "kv_mirrored_layers": len(self.mirrored),
            "kv_on_host": len(self.on_host),
            "kv_moved_bytes": self.moved_bytes,
        }

    def drop(self, seq: int) -> None:
        slot = self.slots.pop(seq, None) if seq != 0 else None
        if slot is not None and self.reservation is not None:  # its pages back to the system
            for t, at in zip(self.pool[0] + self.pool[1], self.offsets):
                size = t.nb[1] * self.ctx_size
                self.reservation.release(at + slot * size, size)
