"""The ggml devices a model runs on: local ones by name, and ggml RPC servers' (added, probed, named)."""

from __future__ import annotations

from typing import Any

from . import native
from .settings import DeviceSettings

DEFAULT_DEVICE = ""   # ggml's first device
RPC_CONNECT_TIMEOUT = 5.0   # seconds to reach an RPC server and get its HELLO


def resolve_devices(d: DeviceSettings) -> tuple[list[str], tuple[float, ...]]:
    """The ggml devices the blocks split over, and their shares. RPC servers are probed and their devices
    added first (DeviceError names a server that cannot be used). `devices` may name them as ggml does
    ("RPC0": numbered in the order servers were added to this process) or by server: "RPC[host:port]" (its
    device, if it has one) or "RPC0[host:port]" (as superggml shows them); a server named there is added if
    `rpc` does not list it. With servers and no devices: this machine's CPU and the servers' devices, by free
    memory, as llama.cpp splits."""
    def add(ep: str) -> list[dict[str, Any]]:
        return list(native.rpc_add_server(ep, connect_timeout=min(RPC_CONNECT_TIMEOUT, d.rpc_timeout),
                                         timeout=d.rpc_timeout))

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
                raise ValueError(f"device {n!r}: the server at {ep} has devices "
                                 f"{', '.join(x['name'] for x in on)}; name one of them")
            names.append(pick[0]["name"])
        return names, d.tensor_split
    if not rpc:
        return [DEFAULT_DEVICE], ()
    names = ["CPU"] + [r["name"] for r in rpc]
    if d.tensor_split:
        if len(d.tensor_split) != len(names):
            raise ValueError(f"tensor_split needs {len(names)} shares (CPU and {len(rpc)} RPC devices), not "
                             f"{list(d.tensor_split)}")
        return names, d.tensor_split
    free = {x["name"]: int(x["memory_free"]) for x in native.devices()}
    free["CPU"] = int(native.host_memory()["available"])
    return names, tuple(float(max(1, free.get(n, 0))) for n in names)
