"""ggml RPC servers from this process: added (a device name that names its server resolved), served, watched.
How a model's blocks split over devices, and what each device measures, is runtime/plan/devices.py."""

from __future__ import annotations

from typing import Any, Sequence

from . import native

RPC_CONNECT_TIMEOUT = 5.0  # seconds to reach an RPC server and get its HELLO


def add_rpc_server(
    endpoint: str, *, connect_timeout: float = RPC_CONNECT_TIMEOUT, timeout: float = 60.0
) -> list[dict[str, Any]]:
    """Adds a ggml RPC server's devices to this process (DeviceError names a server that cannot be used, or one
    that takes longer than the timeouts, in seconds, to connect or to answer)."""
    return list(native.rpc_add_server(endpoint.strip(), connect_timeout=connect_timeout, timeout=timeout))


def rpc_device(spec: str) -> str:
    """The ggml device that "NAME[host:port]" names (the server added first): the server's device NAME, or its
    only one ("RPC[host:port]")."""
    name, ep = spec[:-1].split("[", 1)
    on = add_rpc_server(ep)
    pick = [x for x in on if x["name"] == name] or (on if len(on) == 1 else [])
    if not pick:
        raise ValueError(
            f"device {spec!r}: the server at {ep} has devices {', '.join(x['name'] for x in on)}; name one"
        )
    return str(pick[0]["name"])


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
