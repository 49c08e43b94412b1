"""Every option of a Model, defined once.

Each option is a field of one of the frozen dataclasses below, with its type,
default, help text and (where it differs from ``--field-name``) its command
line flags. ``superggml.Model(path, **options)`` builds a ``Settings`` from its
keyword arguments; the command line (``superggml generate --help``) and the
``SUPERGGML_<NAME>`` environment variables that give flags their defaults are
generated from the same fields. Each group checks its values once, in
``__post_init__``, and raises ValueError naming the option.

Adding an option: add a field with ``option(...)`` to the group it belongs to.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import os
import re
from dataclasses import dataclass, field
from typing import IO, Any, Callable, Iterator, Mapping, Union

KV_PAGE_MIN, KV_PAGE_MAX = 16, 8192  # tokens per KV page (kv-cache.h; test_settings holds them to native's)
Budget = Union[int, str, tuple[int, ...]]  # device_budget: "auto", "off", bytes, or bytes per device
HostCache = Union[int, str]  # host_cache: "auto", "off" or bytes
PLACEMENTS = ("auto", "device", "host")

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "kib": 1024,
    "m": 1000**2,
    "mb": 1000**2,
    "mib": 1024**2,
    "g": 1000**3,
    "gb": 1000**3,
    "gib": 1024**3,
    "t": 1000**4,
    "tb": 1000**4,
    "tib": 1024**4,
}

KV_CACHE_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl")  # llama.cpp's -ctk/-ctv
KV_QUANTIZED = KV_CACHE_TYPES[3:]

ENV_PREFIX = "SUPERGGML_"
ALIASES = {"n_ctx": "ctx_size"}  # llama_cpp.Llama's names
DRAFT_BATCH = 64  # a draft model's rows per pass: Qwen2.5-0.5B's compute bound 152 -> 19 MiB


def parse_size(v: int | str | None) -> int | None:
    """Bytes from 123, "512MiB", "2GB", "1.5 GiB"; None stays None. ValueError otherwise."""
    if v is None or isinstance(v, int):
        if isinstance(v, int) and v < 0:
            raise ValueError("a size must be >= 0")
        return v
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(v))
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"not a size: {v!r} (examples: 512MiB, 2GB, 1048576)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


BUDGET_MODES = ("auto", "off")


def parse_budget(v: Any) -> int | str | tuple[int, ...]:
    """A device budget: "auto" (also None), "off", one size, or one per device ("512MiB,2GiB" or a sequence) as
    a tuple."""
    if v is None:
        return "auto"
    if isinstance(v, str) and v.strip().lower() in BUDGET_MODES:
        return v.strip().lower()
    if isinstance(v, str) and "," in v:
        v = [x for x in v.split(",") if x.strip()]
    if isinstance(v, (list, tuple)):
        sizes = tuple(int(parse_size(x) or 0) for x in v)
        return sizes[0] if len(sizes) == 1 else sizes
    return int(parse_size(v) or 0)


def default_threads() -> int:
    """Compute threads when none are asked for, as llama.cpp counts them: the physical cores among the CPUs this
    process may run on (one thread per core, not per hyperthread), within its cgroup's CPU quota."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)
    return max(1, min(physical_cores(cpus), cpu_quota() or len(cpus)))


def physical_cores(cpus: list[int]) -> int:
    """How many distinct cores `cpus` run on (sysfs topology; each CPU its own where it is not readable)."""
    cores = set()
    for c in cpus:
        try:
            with open(f"/sys/devices/system/cpu/cpu{c}/topology/thread_siblings_list") as f:
                cores.add(f.read().strip())
        except OSError:
            cores.add(str(c))
    return len(cores)


def cpu_quota(proc: str = "/proc/self/cgroup", root: str = "/sys/fs/cgroup") -> int | None:
    """The CPUs the cgroup v2 quota (cpu.max) allows this process, rounded up; None without a quota."""
    try:
        with open(proc) as f:
            rel = next((line.split(":", 2)[2].strip() for line in f if line.startswith("0::")), None)
        if rel is None:
            return None
        with open(os.path.join(root, rel.lstrip("/"), "cpu.max")) as f:
            quota, period = f.read().split()
    except (OSError, ValueError):
        return None
    return None if quota == "max" else max(1, -(-int(quota) // int(period)))


def _parse_bool(s: str) -> bool:
    v = s.strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "", "false", "no", "off"):
        return False
    raise ValueError(f"not a boolean: {s!r} (on/off, true/false, yes/no, 1/0)")


def _parse_tristate(s: str) -> bool | None:
    v = s.strip().lower()
    if v == "auto":
        return None
    return _parse_bool(v)


def _parse_list(item: Callable[[str], Any]) -> Callable[[str], tuple[Any, ...]]:
    return lambda s: tuple(item(x) for x in s.split(",") if x.strip())


def option(
    default: Any,
    help: str,
    *,
    flags: tuple[str, ...] = (),
    parse: Callable[[str], Any] | None = None,
    metavar: str | None = None,
    choices: tuple[str, ...] | None = None,
    cli_default: str | None = None,
    switch: bool = False,
) -> Any:
    """A settings field. `parse` turns a command line or environment string into the value (default: the type
    of `default`; booleans become --x/--no-x, and so does a `switch`: a boolean whose default None means auto);
    `flags` add short or differently named flags."""
    if parse is None:
        parse = _parse_bool if isinstance(default, bool) else _parse_tristate if switch else type(default)
    return field(
        default=default,
        metadata=dict(
            help=help,
            flags=flags,
            parse=parse,
            metavar=metavar,
            choices=choices,
            cli_default=cli_default,
            switch=switch,
        ),
    )


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


def _set(obj: Any, name: str, value: Any) -> None:
    object.__setattr__(obj, name, value)  # normalising a frozen dataclass's field in __post_init__


def _parsed_size(v: int | str | None) -> int | None:
    """A size field as its __post_init__ left it (parse_size's bytes, or None): its type says what it accepts."""
    assert not isinstance(v, str), v
    return v


@dataclass(frozen=True)
class ContextSettings:
    """The context, the compute threads and what a forward pass returns."""

    ctx_size: int = option(4096, "context size in tokens (alias n_ctx)", flags=("-c",))
    n_batch: int = option(512, "prompt tokens per forward pass (at most ctx_size)", flags=("-b", "--batch-size"))
    n_threads: int | None = option(
        None,
        "compute threads (default: the physical cores this process may use; decoding leaves out the cores other "
        "programs keep busy, timed as it runs. Give a count for logits that do not depend on the machine's load: "
        "flash attention splits a long K/V by threads, as llama.cpp's)",
        flags=("-t", "--threads"),
        parse=int,
    )
    seed: int | None = option(None, "sampling seed (default: random)", parse=int)
    flash_attn: bool = option(False, "use ggml's flash attention")
    cache_type_k: str = option("f16", "K cache type", flags=("-ctk",), choices=KV_CACHE_TYPES)
    cache_type_v: str = option(
        "f16", "V cache type (a quantized one needs flash_attn, as llama.cpp)", flags=("-ctv",), choices=KV_CACHE_TYPES
    )
    kv_type: str | None = option(
        None, "K and V cache type at once (sets cache_type_k and cache_type_v)", parse=str, choices=KV_CACHE_TYPES
    )
    poll: int = option(
        0,
        "how long idle compute threads spin for the next graph before they sleep, 0-100 (llama.cpp's --poll; 0: "
        "they sleep at once and leave the cores to other work: a pass is several graphs with host work between)",
        parse=int,
    )
    repack: bool = option(True, "re-lay matmul weights for ggml-cpu's faster kernels at load, as llama.cpp")
    batch_invariant: bool = option(
        False,
        "a sequence's logits do not depend on the other tokens of its forward pass (other sequences, "
        "prompt chunking): ggml-cpu's reference matmul paths and no repack; as llama.cpp, the fast kernels round "
        "differently from 8 rows on",
    )
    logits_all: bool = option(False, "return the logits of every token of an eval, not only the last")
    verbose: bool = option(False, "print what was loaded and the speed to stderr", flags=("-v",))

    def __post_init__(self) -> None:
        _check(self.ctx_size >= 1, f"ctx_size must be >= 1, not {self.ctx_size}")
        _check(self.n_batch >= 1, f"n_batch must be >= 1, not {self.n_batch}")
        _check(self.n_threads is None or self.n_threads >= 1, f"n_threads must be >= 1, not {self.n_threads}")
        _check(0 <= self.poll <= 100, f"poll must be in [0, 100], not {self.poll}")
        for name in ("cache_type_k", "cache_type_v", "kv_type"):
            t = getattr(self, name)
            _check(t is None or t in KV_CACHE_TYPES, f"{name} must be one of {', '.join(KV_CACHE_TYPES)}, not {t!r}")
        if self.kv_type is not None:
            _check(
                self.cache_type_k in ("f16", self.kv_type) and self.cache_type_v in ("f16", self.kv_type),
                "kv_type sets both cache types: give it or cache_type_k/cache_type_v, not both",
            )
            _set(self, "cache_type_k", self.kv_type)
            _set(self, "cache_type_v", self.kv_type)
        _check(
            self.flash_attn or self.cache_type_v not in KV_QUANTIZED,
            f"a quantized V cache (cache_type_v={self.cache_type_v}) requires flash_attn (-fa), as llama.cpp",
        )
        _set(self, "n_batch", min(self.n_batch, self.ctx_size))
        if self.batch_invariant:
            _set(self, "repack", False)  # the re-laid weights' GEMM kernels work in tiles of rows

    @property
    def threads(self) -> int:
        """The compute threads to start with."""
        return self.n_threads or default_threads()


@dataclass(frozen=True)
class PagingSettings:
    """Which blocks stay resident and how the others stream."""

    device_budget: Budget = option(
        "auto",
        "bytes the transformer blocks may occupy (e.g. 512MiB), or one size per device of a split (e.g. "
        "512MiB,2GiB); blocks beyond it stream from the file through a pool of slots. auto: from the memory this "
        "process can use, less the K/V cache, compute buffers and a headroom: all resident when the model fits, "
        "else the largest pool that fits; off: all resident",
        parse=str,
        metavar="SIZE|auto|off",
    )
    n_gpu_layers: int | None = option(
        None,
        "blocks kept resident on the device, the rest stream (default, or -1: all that fit)",
        flags=("-ngl",),
        parse=int,
    )
    async_prefetch: bool | None = option(
        None,
        "load the next blocks in a worker thread while the current one computes (default: on when blocks stream)",
        switch=True,
    )
    prefetch_depth: int = option(2, "blocks loaded ahead with async_prefetch")
    dynamic_layers: bool = option(
        False,
        "demote resident blocks to streamed when memory pressure rises above "
        "mem_pressure, promote them again when it falls",
    )
    mem_pressure: float = option(0.85, "pressure threshold in (0, 1] for dynamic_layers", metavar="F")
    direct_io: bool | None = option(
        None,
        "read streamed blocks with O_DIRECT (on), through the page cache (off), or O_DIRECT when the file is "
        "larger than the memory available or a host tier keeps the streamed blocks (auto)",
        parse=_parse_tristate,
        choices=("auto", "on", "off"),
        cli_default="auto",
    )
    staged_io: bool = option(
        False,
        "load host slots through staging buffers and async copies, as device slots "
        "are (the GPU code path on the CPU; slower, for testing)",
    )
    host_cache: HostCache = option(
        "auto",
        "bytes of host memory that keep streamed blocks between the file and a device that is not host "
        "memory (a GPU): a block read once is copied from there on its next loads, not read again. auto: the "
        "streamed blocks, within what the host has available less a headroom; off: none. A size applies to "
        "staged_io pools on the CPU too",
        parse=str,
        metavar="SIZE|auto|off",
    )
    placement: str = option(
        "auto",
        "where a block streamed to a device that is not host memory computes, and an expert that a device's "
        "expert_cache lacks: device (copied there, over the link), host (on this machine's CPU, from the file "
        "mapping, the activations crossing the link), or auto (per pass, by the cost model: decoded tokens on the "
        "host where the link is slow, long prompts on a faster device)",
        choices=PLACEMENTS,
    )
    expert_cache: int | str | None = option(
        None,
        "bytes of device memory for the experts of a mixture-of-experts model, paged one by one through a "
        "cache (default: experts resident with their blocks)",
        parse=str,
        metavar="SIZE",
    )
    expert_lookahead: bool | None = option(
        None,
        "with expert_cache, apply the next block's router to the current hidden state and load the experts "
        "it picks while this block computes: on, off, or auto (time the first decoded tokens both ways, keep the "
        "faster)",
        parse=_parse_tristate,
        choices=("auto", "on", "off"),
        cli_default="auto",
    )

    def __post_init__(self) -> None:
        _set(self, "device_budget", parse_budget(self.device_budget))
        _set(self, "expert_cache", parse_size(self.expert_cache))
        hc = self.host_cache
        _set(
            self,
            "host_cache",
            hc.strip().lower()
            if isinstance(hc, str) and hc.strip().lower() in BUDGET_MODES
            else "auto"
            if hc is None
            else int(parse_size(hc) or 0),
        )
        _check(self.expert_cache_bytes is None or self.expert_cache_bytes > 0, "expert_cache must be a positive size")
        if self.n_gpu_layers is not None and self.n_gpu_layers < 0:
            _set(self, "n_gpu_layers", None)  # llama.cpp's -1: all that fit
        _check(
            self.placement in PLACEMENTS, f"placement must be one of {', '.join(PLACEMENTS)}, not {self.placement!r}"
        )
        _check(self.prefetch_depth >= 1, f"prefetch_depth must be >= 1, not {self.prefetch_depth}")
        _check(0.0 < self.mem_pressure <= 1.0, f"mem_pressure must be in (0, 1], not {self.mem_pressure}")

    @property
    def expert_cache_bytes(self) -> int | None:
        """expert_cache as bytes (None: no expert cache)."""
        return _parsed_size(self.expert_cache)

    @property
    def budget_bytes(self) -> int | tuple[int, ...] | None:
        """The budget as sizes; None for auto (not resolved yet: budget.plan) and off."""
        return None if isinstance(self.device_budget, str) else self.device_budget

    def paged(self, n_layer: int) -> bool:
        """Blocks of a model with n_layer blocks may stream (or move between resident and streamed)."""
        return (
            self.dynamic_layers
            or self.budget_bytes is not None
            or (self.n_gpu_layers is not None and self.n_gpu_layers < n_layer)
        )

    @property
    def options_set(self) -> bool:
        """Any paging option given."""
        return self.dynamic_layers or self.budget_bytes is not None or self.n_gpu_layers is not None

    @property
    def ahead(self) -> int:
        """Layers loaded ahead of the one computing: prefetch_depth with async_prefetch, else none."""
        return self.prefetch_depth if self.async_prefetch else 0

    @property
    def stream_slots(self) -> int:
        """Slots (or KV frames) a streaming layer cycles through: the one computing, plus the prefetched ones."""
        return self.ahead + 1

    def check_split(self, n_devices: int) -> None:
        """ValueError unless these options suit blocks split over n_devices devices."""
        if n_devices > 1:
            _check(
                not (self.dynamic_layers or self.n_gpu_layers is not None or self.expert_cache is not None),
                "a multi-device split pages with a device_budget per device, not dynamic_layers, n_gpu_layers "
                "or expert_cache",
            )
        _check(
            not isinstance(self.device_budget, tuple) or len(self.device_budget) == n_devices,
            f"device_budget gives {len(self.device_budget) if isinstance(self.device_budget, tuple) else 1} sizes "
            f"for {n_devices} devices",
        )


@dataclass(frozen=True)
class KVSettings:
    """The paged K/V cache."""

    paged_kv: bool = option(False, "K/V in pages that spill to host memory and a file")
    kv_page_size: int = option(256, f"tokens per KV page, {KV_PAGE_MIN}-{KV_PAGE_MAX}")
    kv_device_layers: int | None = option(
        None, "layers whose K/V stay on the device with paged_kv (default: all)", parse=int
    )
    host_budget: int | str | None = option(
        None, "bytes of host memory for KV pages with paged_kv (default: no limit)", parse=str, metavar="SIZE"
    )
    kv_spill_dir: str | None = option(None, "directory for KV pages beyond host_budget", parse=str, metavar="DIR")
    swa_full: bool = option(
        False,
        "with paged_kv, keep the K/V of sliding-window layers for the whole context "
        "(default: pages that left every window are freed, and going back before the "
        "window re-evaluates the prompt), as llama.cpp's --swa-full",
    )
    state_device_sequences: int | None = option(
        None,
        "sequences whose recurrent states (hybrid models) stay in device buffers; the least recently used "
        "others wait in host memory until their next pass (default: all)",
        parse=int,
    )

    def __post_init__(self) -> None:
        _check(
            KV_PAGE_MIN <= self.kv_page_size <= KV_PAGE_MAX,
            f"kv_page_size must be in {KV_PAGE_MIN}..{KV_PAGE_MAX} tokens, not {self.kv_page_size}",
        )
        _check(
            self.kv_device_layers is None or self.kv_device_layers >= 1,
            f"kv_device_layers must be >= 1, not {self.kv_device_layers}",
        )
        _check(
            self.state_device_sequences is None or self.state_device_sequences >= 1,
            f"state_device_sequences must be >= 1, not {self.state_device_sequences}",
        )
        _set(self, "host_budget", parse_size(self.host_budget))
        if self.kv_spill_dir is not None:
            _set(self, "kv_spill_dir", os.fspath(self.kv_spill_dir))

    @property
    def host_budget_bytes(self) -> int | None:
        """host_budget as bytes (None: no limit)."""
        return _parsed_size(self.host_budget)


@dataclass(frozen=True)
class MetricsSettings:
    """JSON-lines metrics (docs/design.md has the schema)."""

    metrics: bool = option(False, "JSON-lines metrics (a snapshot per token, per-layer timings, events) to stderr")
    metrics_file: str | os.PathLike[str] | IO[str] | None = option(
        None, "write the metrics to this file (a path or a text stream) instead of stderr", parse=str, metavar="PATH"
    )
    metrics_pretty: bool = option(False, "indented JSON instead of one compact line per object")
    metrics_interval: int = option(1, "a snapshot every N generated tokens", metavar="N")

    def __post_init__(self) -> None:
        _check(self.metrics_interval >= 1, f"metrics_interval must be >= 1 token, not {self.metrics_interval}")

    @property
    def enabled(self) -> bool:
        return self.metrics or self.metrics_file is not None


@dataclass(frozen=True)
class DeviceSettings:
    """Where the blocks run."""

    devices: tuple[str, ...] = option(
        (),
        "split the blocks over these ggml devices (see `superggml plan`), e.g. "
        "CUDA0,CUDA1; the same name twice gives two backends",
        parse=_parse_list(str),
        metavar="DEV,DEV",
    )
    tensor_split: tuple[float, ...] = option(
        (),
        "the devices' shares of the blocks, e.g. 3,1 (default: even; over "
        "RPC servers: by free memory and measured speed)",
        parse=_parse_list(float),
        metavar="F,F",
    )
    rpc: tuple[str, ...] = option(
        (),
        "ggml RPC servers (superggml rpc-server, llama.cpp's rpc-server) whose devices "
        "to add, e.g. 192.168.1.2:50052,192.168.1.3:50052; without devices the blocks split "
        "over this machine and them by free memory and measured speed",
        parse=_parse_list(str),
        metavar="HOST:PORT,...",
    )
    rpc_timeout: float = option(
        60.0,
        "seconds an RPC server may take to answer one command before it counts as failed (DeviceError)",
        metavar="S",
    )

    def __post_init__(self) -> None:
        _set(self, "devices", tuple(str(d) for d in self.devices or ()))
        _set(self, "tensor_split", tuple(float(x) for x in self.tensor_split or ()))
        _set(self, "rpc", tuple(str(r).strip() for r in self.rpc or ()))
        ts = self.tensor_split
        _check(not ts or (min(ts) >= 0 and sum(ts) > 0), f"tensor_split needs non-negative shares, not {list(ts)}")
        _check(
            not ts or not self.devices or len(ts) == len(self.devices),
            f"tensor_split needs {len(self.devices)} shares, not {list(ts)}",
        )
        _check(not ts or bool(self.devices or self.rpc), "tensor_split needs devices (or rpc servers) to split over")
        _check(self.rpc_timeout > 0, f"rpc_timeout must be > 0, not {self.rpc_timeout}")


@dataclass(frozen=True)
class SpeculativeSettings:
    """Speculative decoding: a drafter proposes tokens, the model checks them in one forward pass (greedy
    output unchanged, sampling keeps the model's distribution)."""

    draft_model: str | None = option(
        None,
        "GGUF of a draft model whose vocabulary matches this one's (llama.cpp's rule)",
        flags=("-md", "--model-draft"),
        parse=str,
        metavar="PATH",
    )
    draft_max: int = option(16, "most tokens drafted per step", metavar="N")
    draft_min: int = option(1, "fewest tokens drafted per step; when fewer pay off a step is plain", metavar="N")
    draft_budget: int | str | None = option(
        None, "device_budget of the draft model (default: resident)", parse=str, metavar="SIZE"
    )
    draft_p_min: float = option(0.0, "stop a draft where the draft model's top probability is below this", metavar="F")
    lookup_ngram: int = option(
        0,
        "draft by prompt lookup: the continuation of the latest earlier match of the "
        "context's last N (down to 1) tokens; 0: off",
        metavar="N",
    )
    draft_mtp: bool = option(
        False,
        "draft with the model's own next-token-prediction (MTP) block, as llama.cpp's "
        "draft-mtp (DeepSeek-V3, GLM-4.5 GGUFs that keep it): no second model",
    )
    draft_k: int | None = option(
        None,
        "draft exactly this many tokens per step (default: adaptive, from the "
        "measured cost of a pass and of a draft token and the acceptance rate)",
        parse=int,
        metavar="N",
    )

    def __post_init__(self) -> None:
        _check(self.draft_max >= 1, f"draft_max must be >= 1, not {self.draft_max}")
        _check(0 <= self.draft_min <= self.draft_max, f"draft_min must be in 0..draft_max, not {self.draft_min}")
        _check(self.lookup_ngram >= 0, f"lookup_ngram must be >= 0, not {self.lookup_ngram}")
        _check(0.0 <= self.draft_p_min < 1.0, f"draft_p_min must be in [0, 1), not {self.draft_p_min}")
        _check(self.draft_k is None or self.draft_k >= 0, f"draft_k must be >= 0, not {self.draft_k}")
        _check(
            sum(map(bool, (self.draft_model, self.lookup_ngram, self.draft_mtp))) <= 1,
            "give one of draft_model, lookup_ngram and draft_mtp",
        )
        if self.draft_model is not None:
            _set(self, "draft_model", os.fspath(self.draft_model))
        _set(self, "draft_budget", parse_size(self.draft_budget))

    @property
    def draft_budget_bytes(self) -> int | None:
        """draft_budget as bytes (None: the draft model resident)."""
        return _parsed_size(self.draft_budget)

    @property
    def enabled(self) -> bool:
        return bool(self.draft_model or self.lookup_ngram or self.draft_mtp)


GROUPS: dict[str, type] = {
    "context": ContextSettings,
    "paging": PagingSettings,
    "kv": KVSettings,
    "metrics": MetricsSettings,
    "devices": DeviceSettings,
    "speculative": SpeculativeSettings,
}


@dataclass(frozen=True)
class Settings:
    """All of a Model's options, one group each."""

    context: ContextSettings = field(default_factory=ContextSettings)
    paging: PagingSettings = field(default_factory=PagingSettings)
    kv: KVSettings = field(default_factory=KVSettings)
    metrics: MetricsSettings = field(default_factory=MetricsSettings)
    devices: DeviceSettings = field(default_factory=DeviceSettings)
    speculative: SpeculativeSettings = field(default_factory=SpeculativeSettings)

    def __post_init__(self) -> None:
        d = self.devices
        if d.devices:  # one backend per name
            self.paging.check_split(len(d.devices))
        elif d.rpc:  # this machine's CPU and the servers' devices: two or more, counted once they answer
            bb = self.paging.device_budget
            self.paging.check_split(len(bb) if isinstance(bb, tuple) else 2)
        else:
            self.paging.check_split(1)

    @property
    def draft_context(self) -> ContextSettings:
        """A draft model's context: this one's size, threads, seed and kernels, at most DRAFT_BATCH rows a pass,
        its K/V cache in f16."""
        c = self.context
        return ContextSettings(
            ctx_size=c.ctx_size,
            n_batch=min(c.n_batch, DRAFT_BATCH),
            n_threads=c.n_threads,
            seed=c.seed,
            flash_attn=c.flash_attn,
            repack=c.repack,
            batch_invariant=c.batch_invariant,
        )

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> "Settings":
        """Settings from Model's keyword arguments; TypeError for a name that is no option."""
        opts = dict(options)
        for alias, name in ALIASES.items():
            if alias in opts:
                if name in opts:
                    raise TypeError(f"{alias} and {name} are the same option: give one")
                opts[name] = opts.pop(alias)
        groups: dict[str, dict[str, Any]] = {g: {} for g in GROUPS}
        owner = {f.name: (g, f) for g, f in fields()}
        for name, value in opts.items():
            if name not in owner:
                raise TypeError(f"Model() got an unexpected keyword argument {name!r}")
            g, f = owner[name]
            if isinstance(value, str) and f.metadata["parse"] is not str:  # as on the command line: "on", "4"
                try:
                    value = _parser(f)(value)
                except (ValueError, argparse.ArgumentTypeError) as e:
                    raise ValueError(f"{name}={value!r}: {e}") from None
            groups[g][name] = value
        return cls(**{g: GROUPS[g](**kw) for g, kw in groups.items()})

    def as_options(self) -> dict[str, Any]:
        """The flat keyword arguments these settings were built from (normalised)."""
        return {f.name: getattr(getattr(self, g), f.name) for g, f in fields()}


def fields() -> Iterator[tuple[str, dataclasses.Field[Any]]]:
    """(group, field) of every option, in definition order."""
    for g, cls in GROUPS.items():
        for f in dataclasses.fields(cls):
            yield g, f


def env_name(name: str) -> str:
    return ENV_PREFIX + name.upper()


def cli_flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def add_arguments(
    parser: argparse.ArgumentParser,
    env: Mapping[str, str] | None = None,
    *,
    only: tuple[str, ...] | None = None,
    repeat: tuple[str, ...] = (),
) -> None:
    """One flag per option (those named in `only`, if given), its default read from SUPERGGML_<NAME> when set;
    values are parsed by the option. An option in `repeat` may be given several times: a list of values."""
    env = os.environ if env is None else env
    grp = parser.add_argument_group("model options (each also read from SUPERGGML_<NAME>)")
    for _, f in fields():
        if only is not None and f.name not in only:
            continue
        md = f.metadata
        names = [cli_flag(f.name)] + [x for x in md["flags"] if x != cli_flag(f.name)]
        names.sort(key=lambda x: (x.startswith("--"), x))  # short flags first
        parse = _parser(f)
        raw = env.get(env_name(f.name), md["cli_default"])
        try:
            default = parse(raw) if raw is not None else f.default
        except (ValueError, argparse.ArgumentTypeError) as e:
            parser.error(f"{env_name(f.name)}={raw!r}: {e}")
        shown = "" if f.default in (None, (), False) else f" (default {md['cli_default'] or f.default})"
        help = f"{md['help']}{shown} [{env_name(f.name)}]"
        kw: dict[str, Any] = dict(dest=f.name, default=default, help=help)
        if f.name in repeat:
            kw.update(action="append", default=None)
        if isinstance(f.default, bool) or md["switch"]:
            grp.add_argument(*names, action=argparse.BooleanOptionalAction, **kw)
            continue
        if md["choices"]:
            kw["metavar"] = "{" + ",".join(md["choices"]) + "}"
        else:
            kw["metavar"] = md["metavar"] or {int: "N", float: "F"}.get(md["parse"], "VALUE")
        grp.add_argument(*names, type=parse, **kw)


def _parser(f: dataclasses.Field[Any]) -> Callable[[str], Any]:
    """How a field reads a command line or environment string: its parse, within its choices if it has some."""
    md = f.metadata
    return _one_of(md["choices"], md["parse"]) if md["choices"] else md["parse"]


def _one_of(choices: tuple[str, ...], parse: Callable[[str], Any]) -> Callable[[str], Any]:
    def check(s: str) -> Any:
        if s not in choices:
            raise argparse.ArgumentTypeError(f"{s!r} is not one of {', '.join(choices)}")
        return parse(s)

    return check


def options_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """Model keyword arguments from the parsed flags of add_arguments."""
    return {f.name: getattr(args, f.name) for _, f in fields()}


def signature(path_param: inspect.Parameter) -> inspect.Signature:
    """Model.__init__'s signature: the path, then every option keyword-only with its default."""
    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD), path_param]
    for _, f in fields():
        params.append(inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default, annotation=f.type))
    return inspect.Signature(params)


def options_doc() -> str:
    """A line per option, for Model's docstring."""
    lines = []
    for g, cls in GROUPS.items():
        lines.append(f"    {(cls.__doc__ or '').strip()}")
        for f in dataclasses.fields(cls):
            lines.append(f"      ``{f.name}`` (default {f.default!r}): {f.metadata['help']}")
    return "\n".join(lines)


def options_markdown() -> str:
    """Every option as Markdown tables, a table per group: its keyword, flags, environment variable, default and
    help (the documentation's command line page)."""
    out = []
    for cls in GROUPS.values():
        out += [f"### {(cls.__doc__ or '').strip().splitlines()[0]}", "", "| keyword | flags | variable | default | |"]
        out.append("|---|---|---|---|---|")
        for f in dataclasses.fields(cls):
            md = f.metadata
            flags = [cli_flag(f.name)] + [x for x in md["flags"] if x != cli_flag(f.name)]
            default = md["cli_default"] if md["cli_default"] is not None else f.default
            help = str(md["help"]).replace("|", "\\|")
            out.append(
                f"| `{f.name}` | {', '.join(f'`{x}`' for x in sorted(flags, key=len))} | `{env_name(f.name)}` | "
                f"`{default!r}` | {help} |"
            )
        out.append("")
    return "\n".join(out)
