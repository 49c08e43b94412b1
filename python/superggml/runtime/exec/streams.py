"""Per device: the graphs queued on its stream (a host synchronisation only where a result is read), and the
buffers that live as long as the executor (the activations between graphs, the cache's rotations)."""

from __future__ import annotations

from typing import Any, Sequence

from ... import native
from ..memory.rotation import cache_rotations, hadamard

F32 = native.GGMLType.F32


class DeviceStreams:
    """Graphs queued on the devices' streams: a device of this machine with a stream of its own (a GPU) gets a
    graph queued (compute(sync=False)) and the host goes on; the CPU computes as it is called, and an RPC
    server's replies keep its calls in order. The executor waits for a device where the host needs its work
    done (wait, synchronize)."""

    def __init__(self, backends: Sequence[Any]):
        self.backends = backends
        self.queued: set[int] = set()  # devices with graphs queued since the last wait

    def queues(self, dev: int) -> bool:
        b = self.backends[dev]
        return not b.is_host and not b.endpoint

    def compute(self, dev: int, graph: Any, may_queue: bool) -> None:
        """Runs a graph on device dev: queued where the device queues and the caller allows it."""
        queue = may_queue and self.queues(dev)
        try:
            self.backends[dev].compute(graph, sync=not queue)
        finally:
            if queue:
                self.queued.add(dev)

    def wait(self, dev: int) -> None:
        """Waits for device dev's queued graphs."""
        if dev in self.queued:
            self.queued.discard(dev)
            self.backends[dev].synchronize()

    def synchronize(self) -> None:
        """Waits for every queued graph."""
        while self.queued:
            self.backends[self.queued.pop()].synchronize()


def activations(
    hp: Any, c: Any, backends: Sequence[Any], head_dims: Sequence[int] = (), indexer_rot: int = 0
) -> tuple[list[Any], list[dict[str, Any]], list[Any]]:
    """Per device: the activations F32 [residual_width, n_batch] that persist between graphs, and the Walsh-Hadamard
    rotations a quantized cache holds Q, K and V rotated by (none for a latent K/V: one type, V read from K, as
    llama.cpp's; with layers of other head sizes, `head_dims`, K's rotation of each size too, "k<size>", as
    llama.cpp's caches of each kind of layer; a sparse-attention indexer's, "indexer"); with what holds them."""
    n_rot = cache_rotations(hp, c, head_dims)
    ctxs = [native.Context(max_tensors=4 + len(head_dims)) for _ in backends]
    acts = []
    for i, cx in enumerate(ctxs):
        a = cx.new_tensor(F32, [hp.residual_width, c.n_batch])
        a.name = f"act_d{i}"
        acts.append(a)
    n_rot["indexer"] = indexer_rot
    rot = [{x: cx.new_tensor(F32, [n, n]) for x, n in n_rot.items() if n} for cx in ctxs]
    keep: list[Any] = ctxs + [b.alloc_tensors(cx) for b, cx in zip(backends, ctxs)]
    for buf in keep[len(ctxs) :]:
        buf.clear(0)
    for r in rot:
        for t in r.values():
            native.tensor_set(t, hadamard(t.ne[0]), 0)
    return acts, rot, keep
