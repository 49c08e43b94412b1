"""The ggml devices a model runs on: local ones by name, and ggml RPC servers' (added, probed, named)."""

from __future__ import annotations

import functools
import statistics
import time
from typing import Any, Sequence

import numpy as np

from . import native
from .hashes import content_ranges
from .settings import DeviceSettings

DEFAULT_DEVICE = ""  # this machine's CPU
RPC_CONNECT_TIMEOUT = 5.0  # seconds to reach an RPC server and get its HELLO


PROBE_ROWS = 2048  # the speed probe: a Q4_0 [2048 x 2048] weight times a vector,
PROBE_CHAIN = 8  # 8 times in a row per graph, the median of 3 graphs


@functools.lru_cache(maxsize=1)
def probe_weight() -> np.ndarray:
    """The speed probe's weight, quantized once per process."""
    rows = np.random.default_rng(0).standard_normal((PROBE_ROWS, PROBE_ROWS), dtype=np.float32) * 0.02
    return native.quantize(native.GGMLType.Q4_0, rows)


def measure_speed(device: str, n_threads: int) -> float:
    """Matrix-vector products per second on `device`, as a decoded token does them (a quantized weight read
    once per product), the round trip to an RPC server included: the speed the split balances."""
    be = native.Backend(device, n_threads)
    wctx = native.Context(2)
    w = wctx.new_tensor(native.GGMLType.Q4_0, [PROBE_ROWS, PROBE_ROWS])
    x = wctx.new_tensor(native.GGMLType.F32, [PROBE_ROWS, 1])
    keep = be.alloc_tensors(wctx)
    native.tensor_set(w, probe_weight())
    native.tensor_set(x, np.ones(PROBE_ROWS, np.float32))
    ctx = native.Context(4 * PROBE_CHAIN, 4 * PROBE_CHAIN)
    g, y = ctx.new_graph(), x
    for _ in range(PROBE_CHAIN):
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
    return PROBE_CHAIN / max(statistics.median(times), 1e-9)


def transfer_rate(device: str, nbytes: int = 256 << 20, repeats: int = 5) -> float:
    """Bytes per second from the device's pinned host memory into the device (the best of `repeats` copies of
    nbytes): the bound of a streamed block's load once its bytes are in host memory."""
    return float(native.host_to_device_rate(native.Backend(device, 1), nbytes, repeats))


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
        return add_rpc_server(ep, connect_timeout=min(RPC_CONNECT_TIMEOUT, d.rpc_timeout), timeout=d.rpc_timeout)

    rpc: list[dict[str, Any]] = [x for ep in d.rpc for x in add(ep)]
    if d.devices:
        names = []
        for n in d.devices:
            if "[" not in n or not n.endswith("]"):
                names.append(n)
                continue
            name, ep = n[:-1].split("[", 1)
            on = add(ep) if ep not in d.rpc else [x for x in rpc if x["endpoint"] == ep]
            pick = [x for x in on if x["name"] == name] or (on if len(on) == 1 else [])
            if not pick:
                raise ValueError(
                    f"device {n!r}: the server at {ep} has devices {', '.join(x['name'] for x in on)}; name one of them"
                )
            names.append(pick[0]["name"])
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


def devices_for(d: DeviceSettings, store: Any, n_threads: int) -> tuple[list[str], tuple[float, ...]]:
    """resolve_devices for the weights of `store` (a native.WeightStore); when a server speaks superggml's
    relay, the file's ranges are registered by content hash, so that it loads those it holds itself."""
    names, shares = resolve_devices(d, n_threads=n_threads, weights_bytes=store_bytes(store))
    if any(x["addressed"] for x in native.rpc_stats().values()):
        native.content_index_set(store.path, content_ranges(store.path))
    return names, shares


def store_bytes(store: Any) -> int:
    """The bytes of the tensors of a native.WeightStore."""
    return sum(int(store.file_range(n)[1]) for n in store.names())


def add_rpc_server(
    endpoint: str, *, connect_timeout: float = RPC_CONNECT_TIMEOUT, timeout: float = 60.0
) -> list[dict[str, Any]]:
    """Adds a ggml RPC server's devices to this process (DeviceError names a server that cannot be used, or one
    that takes longer than the timeouts, in seconds, to connect or to answer)."""
    return list(native.rpc_add_server(endpoint.strip(), connect_timeout=connect_timeout, timeout=timeout))


def start_rpc_server(
    endpoint: str,
    cache: str,
    n_threads: int,
    mem: int,
    models: Sequence[tuple[str, list[tuple[int, int, int]]]],
    direct: bool,
) -> None:
    """Serves this machine's CPU over ggml RPC at `endpoint` from a thread of this process: `cache` a folder for
    tensors sent by hash ("" none), `mem` the bytes it reports free (0: the host's), `models` files it loads
    ranges from by content hash, `direct` with O_DIRECT."""
    native.rpc_server_start(endpoint, cache, n_threads, mem, list(models), direct)


def servers_failed(endpoints: set[str]) -> bool:
    """Whether one of these RPC servers has failed (what it held is gone)."""
    if not endpoints:
        return False
    rs = native.rpc_stats()
    return any(rs[e]["failed"] for e in endpoints if e in rs)


def server_counters(endpoints: set[str]) -> dict[str, int]:
    """What went over the wire to these RPC servers (from every user of them in this process), and what they
    loaded from their own copies instead."""
    rs = native.rpc_stats()
    on = [rs[e] for e in endpoints if e in rs]
    return {
        "rpc_bytes_sent": sum(int(x["bytes_sent"]) for x in on),
        "rpc_bytes_received": sum(int(x["bytes_received"]) for x in on),
        "rpc_loaded_by_peer": sum(int(x["loaded_by_peer"]) for x in on),
    }
