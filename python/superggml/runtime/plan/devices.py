"""The devices a model runs on: resolved from its DeviceSettings (local ggml devices by name, ggml RPC servers'
added, probed and named), opened as backends with their share of the blocks, and what each had free then."""

from __future__ import annotations

import functools
import statistics
import time
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ... import native
from ...devices import RPC_CONNECT_TIMEOUT
from ...hashes import content_ranges
from ...settings import DeviceSettings, Settings
from ...telemetry import MemoryFn, device_memory_fn

DEFAULT_DEVICE = ""  # this machine's CPU
PROBE_ROWS = 2048  # the speed probe: a Q4_0 [2048 x 2048] weight times a vector,
PROBE_CHAIN = 8  # 8 times in a row per graph, the median of 3 graphs


@dataclass
class Devices:
    """The devices a model runs on: the split's devices first (n_split of them; block il runs on
    layer_device[il]), then this machine's CPU for the embedding if none of them is host memory (embed_dev).
    memory[d] reads device d's memory (used, total); free[d] is what it had free when it was opened."""

    backends: list[Any]  # native.Backend
    n_split: int
    layer_device: list[int]
    embed_dev: int
    endpoints: set[str]  # the RPC servers among them
    memory: list[MemoryFn]
    free: list[int]

    def check_available(self, d: int, nbytes: int, what: str) -> None:
        """Refuses `nbytes` for `what` when it is more than device d has free now (host: as this process sees
        it, cgroup limit included)."""
        used, total = self.memory[d]()
        if total > 0 and nbytes > total - used:
            raise ValueError(
                f"{what} of {nbytes} bytes is more than the {total - used} bytes available on {where(self.backends[d], total)}"
            )


def where(backend: Any, total: int) -> str:
    """A device named for an error about its memory."""
    if backend.device_type != "cpu":
        return f"{backend.name} (total {total} bytes)"
    limit = int(native.host_memory()["cgroup_limit"])
    return f"the host (total {total} bytes" + (f", cgroup limit {limit} bytes" if limit else "") + ")"


def open_devices(settings: Settings, store: native.WeightStore, n_layer: int) -> Devices:
    """The devices of settings.devices (devices_for) for a model of n_layer blocks whose weights are in `store`
    (a native.WeightStore), with their share of the blocks (settings.py checked that the paging options suit
    a split, as far as the options tell how many devices it has)."""
    c = settings.context
    names, shares = devices_for(settings.devices, store, c.threads)
    backends = [native.Backend(d, c.threads, c.poll) for d in names]
    n_split, bb = len(backends), settings.paging.device_budget
    if isinstance(bb, tuple) and len(bb) != n_split:  # the servers' devices counted (rpc without devices)
        raise ValueError(f"device_budget gives {len(bb)} sizes for {n_split} devices ({', '.join(names)})")
    layer_device = [i for i, k in enumerate(layer_split(n_layer, n_split, shares)) for _ in range(k)]
    hosts = [i for i, b in enumerate(backends) if b.is_host]
    if not hosts:  # the embedding rows come from the file mapping: its graph runs on the CPU
        backends.append(native.Backend(DEFAULT_DEVICE, c.threads, c.poll))
        hosts = [n_split]
    memory = [device_memory_fn(b.device_type, b.device_name) for b in backends]
    free = [max(0, total - used) for used, total in (m() for m in memory)]
    for b in backends:
        b.use_ref = c.batch_invariant
    return Devices(
        backends, n_split, layer_device, hosts[0], {b.endpoint for b in backends if b.endpoint}, memory, free
    )


def layer_split(n_layer: int, n_dev: int, shares: tuple[float, ...] = ()) -> tuple[int, ...]:
    """Blocks per device from the shares (cumulative rounding, as llama.cpp); even without them."""
    n_dev = max(1, n_dev)
    if not shares:
        return tuple(n_layer // n_dev + (1 if i < n_layer % n_dev else 0) for i in range(n_dev))
    total, acc, out, prev = sum(shares), 0.0, [], 0
    for x in shares:
        acc += x
        cut = round(n_layer * acc / total)
        out.append(cut - prev)
        prev = cut
    return tuple(out)


def devices_for(d: DeviceSettings, store: native.WeightStore, n_threads: int) -> tuple[list[str], tuple[float, ...]]:
    """resolve_devices for the weights of `store` (a native.WeightStore); when a server speaks superggml's
    relay, the file's ranges are registered by content hash, so that it loads those it holds itself."""
    names, shares = resolve_devices(d, n_threads=n_threads, weights_bytes=store_bytes(store))
    if any(x["addressed"] for x in native.rpc_stats().values()):
        native.content_index_set(store.path, content_ranges(store.path))
    return names, shares


def store_bytes(store: native.WeightStore) -> int:
    """The bytes of the tensors of a native.WeightStore."""
    return sum(int(store.file_range(n)[1]) for n in store.names())


def resolve_devices(
    d: DeviceSettings, *, n_threads: int = 1, weights_bytes: int = 0
) -> tuple[list[str], tuple[float, ...]]:
    """The ggml devices the blocks split over, and their shares. RPC servers are probed and their devices
    added first (DeviceError names a server that cannot be used). `devices` may name them as ggml does
    ("RPC0": numbered in the order servers were added to this process) or by server: "RPC[host:port]" (its
    device, if it has one) or "RPC0[host:port]" (as superggml shows them); a server named there is added if
    `rpc` does not list it. With servers and no devices: this machine's CPU and the servers' devices, by free
    memory and measured speed (measure_speed, balance) over `weights_bytes`; with devices named and no
    tensor_split, a split over RPC servers is balanced the same way."""

    def add(ep: str) -> list[dict[str, Any]]:
        timeout = d.rpc_timeout
        return list(
            native.rpc_add_server(ep.strip(), connect_timeout=min(RPC_CONNECT_TIMEOUT, timeout), timeout=timeout)
        )

    rpc: list[dict[str, Any]] = [x for ep in d.rpc for x in add(ep)]
    if d.devices:
        names = []
        for n in d.devices:
            if "[" not in n or not n.endswith("]"):
                names.append(n)
                continue
            name, ep = n[:-1].split("[", 1)
            on = add(ep) if ep not in d.rpc else [x for x in rpc if x["endpoint"] == ep]
            names.append(pick_device(n, name, ep, on))
        if d.tensor_split or len(names) < 2 or not (rpc or any("[" in n for n in d.devices)):
            return names, d.tensor_split
        return names, balanced(names, n_threads, weights_bytes)
    if not rpc:
        return [default_device()], ()
    names = ["CPU"] + [r["name"] for r in rpc]
    if d.tensor_split:
        if len(d.tensor_split) != len(names):
            raise ValueError(
                f"tensor_split needs {len(names)} shares (CPU and {len(rpc)} RPC devices), not {list(d.tensor_split)}"
            )
        return names, d.tensor_split
    return names, balanced(names, n_threads, weights_bytes)


def pick_device(n: str, name: str, ep: str, on: list[dict[str, Any]]) -> str:
    """The device `name` among those of the server at `ep` (`on`): by name, or the server's only one."""
    pick = [x for x in on if x["name"] == name] or (on if len(on) == 1 else [])
    if not pick:
        raise ValueError(
            f"device {n!r}: the server at {ep} has devices {', '.join(x['name'] for x in on)}; name one of them"
        )
    return str(pick[0]["name"])


def default_device() -> str:
    """The device a model computes on when none is named: this machine's first GPU, as llama.cpp offloads to it,
    else the CPU."""
    for d in native.devices():
        if d["type"] in ("gpu", "igpu") and not d["name"].startswith("RPC"):
            return str(d["name"])
    return DEFAULT_DEVICE


def free_memory(names: Sequence[str]) -> list[int]:
    """Each device's free memory (this machine's CPU: what this process may use), at least 1 byte."""
    free = {x["name"]: int(x["memory_free"]) for x in native.devices()}
    free["CPU"] = int(native.host_memory()["available"])
    return [max(1, free.get(n, 0)) for n in names]


def balanced(names: list[str], n_threads: int, weights_bytes: int) -> tuple[float, ...]:
    """The shares of `names` by free memory and measured speed (by free memory alone without weights_bytes,
    as llama.cpp splits)."""
    mem = free_memory(names)
    if weights_bytes <= 0:
        return tuple(float(m) for m in mem)
    return balance(mem, [measure_speed(n, n_threads) for n in names], weights_bytes)


@functools.lru_cache(maxsize=1)
def probe_weight() -> np.ndarray:
    """The speed probe's weight, quantized once per process."""
    rows = np.random.default_rng(0).standard_normal((PROBE_ROWS, PROBE_ROWS), dtype=np.float32) * 0.02
    return native.quantize(native.GGMLType.Q4_0, rows)


def probe_bytes() -> int:
    """Bytes of the speed probe's quantized weight: what one of its products reads."""
    return int(native.row_size(native.GGMLType.Q4_0, PROBE_ROWS)) * PROBE_ROWS


def transfer_rate(device: str, nbytes: int = 256 << 20, repeats: int = 5) -> float:
    """Bytes per second from the device's pinned host memory into the device (the best of `repeats` copies of
    nbytes): the bound of a streamed block's load once its bytes are in host memory."""
    return float(native.host_to_device_rate(native.Backend(device, 1), nbytes, repeats))


def measure_speed(device: str, n_threads: int, rows: int = 1) -> float:
    """Matrix products per second on `device` of the probe's weight by `rows` rows, as a pass of that many rows
    does them (the weight read once per product), the round trip to an RPC server included. With one row (a
    decoded token's matrix-vector products) it is the speed the split balances."""
    be = native.Backend(device, n_threads)
    chain = PROBE_CHAIN if rows == 1 else 1  # a product over many rows is long enough to time alone
    wctx = native.Context(2)
    w = wctx.new_tensor(native.GGMLType.Q4_0, [PROBE_ROWS, PROBE_ROWS])
    x = wctx.new_tensor(native.GGMLType.F32, [PROBE_ROWS, rows])
    keep = be.alloc_tensors(wctx)
    native.tensor_set(w, probe_weight())
    native.tensor_set(x, np.ones((rows, PROBE_ROWS), np.float32))
    ctx = native.Context(4 * chain, 4 * chain)
    g, y = ctx.new_graph(), x
    for _ in range(chain):
        y = ctx.mul_mat(w, y)
    y.set_output()
    g.expand(y)
    times = []
    for i in range(4):
        t0 = time.perf_counter()
        be.compute(g)
        native.tensor_get(y)
        if i:
            times.append(time.perf_counter() - t0)
    del keep
    return chain / max(statistics.median(times), 1e-9)


def balance(free: Sequence[int], speed: Sequence[float], total: int) -> tuple[float, ...]:
    """Each device's share of `total` bytes of blocks: in proportion to its speed, so that no share takes much
    longer than the others; where the devices hold the blocks between them, none is given more than its free
    memory (the rest goes to the others, by speed), so none streams while another has room."""
    n = len(free)
    share = [0.0] * n
    if total <= 0 or sum(free) < total:
        return tuple(float(v) for v in speed)
    active, left = set(range(n)), float(total)
    while active:
        s = sum(speed[i] for i in active)
        over = [i for i in active if left * speed[i] / s > free[i]]
        if not over:
            for i in active:
                share[i] = left * speed[i] / s
            break
        for i in over:
            share[i] = float(free[i])
            left -= free[i]
            active.discard(i)
    return tuple(max(x, 1.0) for x in share)
