"""The one place that chooses a sequence memory: contiguous or paged K/V, shared K/V, or a hybrid of K/V and
recurrent states, from the settings and the architecture."""

from __future__ import annotations

import dataclasses
from typing import Sequence

from ...arch import Architecture
from ...arch.mtp import MtpArch
from ...settings import Settings
from ..plan.devices import Devices
from .base import RECORD_ROWS, KVLayers, SequenceMemory
from .compressed import CompressedKV
from .contiguous import ContiguousKV
from .hybrid import HybridMemory
from .paged import paged_kv
from .recurrent import RecurrentFamily, RecurrentStates
from .shared import SharedKV


def kv_cache(
    settings: Settings, layers: KVLayers, layer_device: Sequence[int], devices: Devices, kv_bytes: int
) -> SequenceMemory:
    """The K/V of `layers` (each on its layer_device, one of `devices`), paged (settings.kv.paged_kv) or
    contiguous (its growth checked against the device's memory)."""
    if settings.kv.paged_kv:
        return paged_kv(settings, layers, devices.backends, layer_device, devices.n_split)
    return ContiguousKV(settings, layers.hp, devices.backends, layer_device, kv_bytes, devices.check_available)


def sequence_memory(
    settings: Settings, arch: Architecture | MtpArch, devices: Devices, kv_bytes: int
) -> SequenceMemory:
    """The memory the model's layers need: a K/V cache (contiguous, or paged_kv), or for a hybrid model
    (arch.is_recurrent) a K/V cache of its attention layers beside the recurrent states of the others."""
    hp, layer_device = arch.hp, devices.layer_device
    layout = arch.compressed_layout()
    if layout is not None:
        ratios, idx_dim = layout
        raw = None
        if settings.kv.paged_kv:  # the raw keys of every block in pages: a K-only K/V sliding over n_swa
            every = KVLayers(hp, arch.n_swa, [True] * hp.n_layer)
            raw = paged_kv(settings, every, devices.backends, layer_device, devices.n_split)
        return CompressedKV(
            settings, ratios, hp.head_dim, idx_dim, devices.backends, layer_device, devices.check_available, raw
        )
    recurrent = [arch.is_recurrent(il) for il in range(hp.n_layer)]
    stateless = [arch.is_stateless(il) for il in range(hp.n_layer)]
    own = [arch.kv_source(il) == il for il in range(hp.n_layer)]
    attn = [il for il in range(hp.n_layer) if not recurrent[il] and not stateless[il] and own[il]]
    # the attention layers alone, numbered 0.. in order
    layers = KVLayers(dataclasses.replace(hp, n_layer=len(attn)), arch.n_swa, [arch.is_swa(il) for il in attn])
    kv = kv_cache(settings, layers, [layer_device[il] for il in attn], devices, kv_bytes)
    if not all(own):  # layers reading an earlier layer's K/V
        assert not any(recurrent), "shared K/V in a hybrid model"
        apart = [il for il in range(hp.n_layer) if layer_device[il] != layer_device[arch.kv_source(il)]]
        if apart:
            raise ValueError(
                f"block {apart[0]} reads the K/V of block {arch.kv_source(apart[0])}, which the split puts on another "
                "device: split the blocks so that each shares a device with the block it reads"
            )
        return SharedKV(kv, [attn.index(arch.kv_source(il)) for il in range(hp.n_layer)], own)
    if len(attn) == hp.n_layer:
        return kv
    assert isinstance(arch, RecurrentFamily), f"{hp.arch} has recurrent layers but no recurrent states"
    n_r, n_s = arch.state_sizes
    states = RecurrentStates(
        [devices.backends[layer_device[il]] for il in range(hp.n_layer) if recurrent[il]],
        n_r,
        n_s,
        settings.kv.state_device_sequences,
        arch.replay,
        arch.record_size(RECORD_ROWS),
    )
    return HybridMemory(kv, states, recurrent, stateless)
