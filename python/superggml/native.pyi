"""superggml core: GGUF files, paged tensors and ggml graphs (private; use superggml)"""

# Type stubs of the pybind11 module (csrc/bindings/*.cpp), docstrings as bound. The paging API (leases, pools,
# prefetch, the layer pager, the KV cache, GGUF files, ggml graphs) is typed; the internals (weight loader, expert
# cache, RPC, I/O fault hooks) resolve to Any through the module-level __getattr__ at the end. tests/house/test_typing.py
# checks the stub against the built module (mypy.stubtest, allowlist: tests/stubtest-allowlist.txt).

from collections.abc import Sequence
from typing import Any, ClassVar, TypeVar, overload, type_check_only

import numpy as np
import numpy.typing as npt
from typing_extensions import Buffer as _Buffer
from typing_extensions import CapsuleType, Self, TypeAlias, TypedDict

# Anything with the buffer protocol (numpy arrays are listed too: their stubs declare __buffer__ on 3.12+ only).
_BufferLike: TypeAlias = _Buffer | np.ndarray[Any, Any]
_BufferT = TypeVar("_BufferT", bound=_BufferLike)
# A ggml type where the binding takes the C int (GGMLType converts through __index__).
_TypeLike: TypeAlias = GGMLType | int
# A GGUF header value: a scalar or an array of scalars (a list).
_MetaValue: TypeAlias = int | float | bool | str | list[int] | list[float] | list[bool] | list[str] | None

# pybind11's metaclass and base class of every bound class (pybind11_builtins.pybind11_type and pybind11_object).
@type_check_only
class _pybind11_type(type): ...

@type_check_only
class _pybind11_object(metaclass=_pybind11_type): ...

# What every pybind11 enum has (not an enum.Enum): E(n) and int(e) convert, e.name is the member's name,
# E.__members__ maps names to members.
@type_check_only
class _pybind11_enum(_pybind11_object):
    def __init__(self, value: int) -> None: ...
    def __eq__(self, other: object) -> bool: ...
    def __ne__(self, other: object) -> bool: ...
    def __hash__(self) -> int: ...
    def __index__(self) -> int: ...
    def __int__(self) -> int: ...
    def __getstate__(self) -> int: ...
    def __setstate__(self, state: int) -> None: ...
    @property
    def name(self) -> str: ...
    @property
    def value(self) -> int: ...

DIRECT_ALIGN: int  # bytes O_DIRECT reads align to
KV_PAGE_MIN: int
KV_PAGE_MAX: int
GGML_VERSION: str
GGML_COMMIT: str

# ---------------------------------------------------------------------------------------------------------------
# ggml types, tensors and graphs

class GGMLType(_pybind11_enum):
    F32: ClassVar[GGMLType]
    F16: ClassVar[GGMLType]
    BF16: ClassVar[GGMLType]
    I32: ClassVar[GGMLType]
    I64: ClassVar[GGMLType]
    Q4_0: ClassVar[GGMLType]
    Q4_1: ClassVar[GGMLType]
    Q8_0: ClassVar[GGMLType]
    Q5_0: ClassVar[GGMLType]
    Q5_1: ClassVar[GGMLType]
    Q2_K: ClassVar[GGMLType]
    Q3_K: ClassVar[GGMLType]
    Q4_K: ClassVar[GGMLType]
    Q5_K: ClassVar[GGMLType]
    Q6_K: ClassVar[GGMLType]
    Q8_1: ClassVar[GGMLType]
    Q8_K: ClassVar[GGMLType]
    IQ4_NL: ClassVar[GGMLType]
    MXFP4: ClassVar[GGMLType]
    __members__: ClassVar[dict[str, GGMLType]]

class Tensor(_pybind11_object):
    """A ggml tensor (a node or leaf of a graph, or a paged weight)."""

    @property
    def shape(self) -> list[int]:
        """ne in ggml order (ne[0] = row length), trailing 1s dropped"""
    @property
    def ne(self) -> list[int]: ...
    @property
    def nb(self) -> list[int]: ...
    @property
    def type(self) -> GGMLType: ...
    @property
    def type_name(self) -> str: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def nelements(self) -> int: ...
    @property
    def element_size(self) -> int: ...
    @property
    def bound(self) -> bool: ...
    @property
    def name(self) -> str: ...
    @name.setter
    def name(self, value: str, /) -> None: ...
    def set_input(self) -> None: ...
    def set_output(self) -> None: ...

class Graph(_pybind11_object):
    """A ggml compute graph."""

    def expand(self, t: Tensor, /) -> None:
        """Adds `t` and everything it depends on; SuperggmlError if the graph has no room."""
    @property
    def n_nodes(self) -> int: ...

class Context(_pybind11_object):
    """A no-alloc ggml context: tensors and ops are made here, storage comes later."""

    def __init__(self, max_tensors: int = 1024, graph_size: int = 0) -> None: ...
    def new_graph(self) -> Graph: ...
    def new_tensor(self, type: GGMLType, shape: Sequence[int]) -> Tensor:
        """New tensor, shape in ggml order (ne[0] first)."""
    def mul_mat(self, a: Tensor, b: Tensor, /) -> Tensor:
        """a [K, M, ...] x b [K, N, ...] -> F32 [M, N, ...]"""
    def mul_mat_set_prec_f32(self, a: Tensor, /) -> None: ...
    def mul_mat_hadamard(self, a: Tensor, rot: Tensor, /) -> Tensor:
        """a rotated by rot, a Walsh-Hadamard matrix F32 [n, n], in rows of n values (the backend may use a fast transform), as llama.cpp rotates Q, K and V for a quantized K/V cache"""
    def add(self, a: Tensor, b: Tensor, /) -> Tensor: ...
    def mul(self, a: Tensor, b: Tensor, /) -> Tensor: ...
    def add_inplace(self, a: Tensor, b: Tensor, /) -> Tensor: ...
    def div(self, a: Tensor, b: Tensor, /) -> Tensor: ...
    def scale(self, a: Tensor, s: float, /) -> Tensor: ...
    def norm(self, a: Tensor, eps: float, /) -> Tensor:
        """each row less its mean, over its standard deviation (a layer norm without weight or bias)"""
    def rms_norm(self, a: Tensor, eps: float, /) -> Tensor: ...
    def silu(self, a: Tensor, /) -> Tensor: ...
    def tanh(self, a: Tensor, /) -> Tensor: ...
    def sigmoid(self, a: Tensor, /) -> Tensor: ...
    def relu(self, a: Tensor, /) -> Tensor: ...
    def sqr(self, a: Tensor, /) -> Tensor: ...
    def sqrt(self, a: Tensor, /) -> Tensor: ...
    def scale_bias(self, a: Tensor, s: float, b: float, /) -> Tensor:
        """s * a + b"""
    def top_k(self, a: Tensor, k: int) -> Tensor:
        """I32 indices of the k largest of each row, in no particular order"""
    def lightning_indexer(self, q: Tensor, k: Tensor, weights: Tensor, mask: Tensor) -> Tensor:
        """DeepSeek's sparse-attention scores: q F32 [d, n_head, n, S], k [d, 1, n_kv, S], weights F32 [n_head, n, 1, S] (prescaled), mask F16 [n_kv, n, 1, S'] -> F32 [n_kv, n, 1, S]: sum over heads of relu(q.k) * weight, plus the mask"""
    def gelu(self, a: Tensor, /) -> Tensor: ...
    def pad(self, a: Tensor, p: Sequence[int]) -> Tensor:
        """a with p[i] zeros appended along dim i"""
    def softplus(self, a: Tensor, /) -> Tensor: ...
    def exp(self, a: Tensor, /) -> Tensor: ...
    def abs(self, a: Tensor, /) -> Tensor: ...
    def sgn(self, a: Tensor, /) -> Tensor:
        """-1, 0 or 1 by the sign of each value"""
    def sub(self, a: Tensor, b: Tensor, /) -> Tensor: ...
    def arange(self, start: float, stop: float, step: float = 1.0) -> Tensor:
        """F32 [ceil((stop - start) / step)]: start, start + step, ..."""
    def pool_2d_max(self, a: Tensor, k0: int, k1: int, s0: int, s1: int) -> Tensor:
        """The largest value of each k0 x k1 window, stepping s0, s1 (no padding)"""
    def dsv4_hc_pre_gated(self, x: Tensor, gate: Tensor, scale: float) -> Tensor:
        """scale * the streams summed, each value gated by sigmoid(gate): F32 [n_embd, n_tokens]"""
    def sum_rows(self, a: Tensor, /) -> Tensor:
        """[n, ...] -> [1, ...]"""
    def clamp(self, a: Tensor, lo: float, hi: float, /) -> Tensor: ...
    def fill(self, a: Tensor, v: float, /) -> Tensor:
        """A new tensor of a's shape (contiguous F32 or F16), every element v."""
    def argsort_top_k(self, a: Tensor, k: int, /) -> Tensor:
        """I32 indices of the k largest of each row, largest first (a view of a descending argsort)"""
    def mul_mat_id(self, as_: Tensor, b: Tensor, ids: Tensor, /) -> Tensor:
        """as [K, M, n_as] (one matrix per expert) x b [K, n_b, n_tokens] with ids I32 [n_used, n_tokens] -> F32
        [M, n_used, n_tokens]"""
    def add_id(self, a: Tensor, b: Tensor, ids: Tensor, /) -> Tensor:
        """a + b[:, ids] (per-expert biases)"""
    def swiglu_oai(self, gate: Tensor, up: Tensor, alpha: float, limit: float, /) -> Tensor:
        """gpt-oss's clamped SwiGLU"""
    def swiglu_clamp(self, gate: Tensor, up: Tensor, limit: float, /) -> Tensor:
        """silu(min(gate, limit)) * clamp(up, -limit, limit) (DeepSeek V4's SwiGLU)"""
    def swiglu_split(self, gate: Tensor, up: Tensor, /) -> Tensor:
        """silu(gate) * up"""
    def geglu_split(self, gate: Tensor, up: Tensor, /) -> Tensor:
        """gelu(gate) * up (ggml's tanh approximation)"""
    def cont(self, a: Tensor, /) -> Tensor: ...
    def cast(self, a: Tensor, type: GGMLType, /) -> Tensor: ...
    def transpose(self, a: Tensor, /) -> Tensor: ...
    def reshape(self, a: Tensor, shape: Sequence[int], /) -> Tensor: ...
    def view(self, a: Tensor, shape: Sequence[int], nb: Sequence[int], offset: int = 0) -> Tensor:
        """View of `a`: shape in ggml order, nb = byte strides of dims 1.., byte offset."""
    def permute(self, a: Tensor, axis0: int, axis1: int, axis2: int, axis3: int, /) -> Tensor: ...
    def concat(self, a: Tensor, b: Tensor, dim: int) -> Tensor:
        """a and b joined along dim (the other dims equal)."""
    def repeat_4d(self, a: Tensor, ne: Sequence[int]) -> Tensor: ...
    def get_rows(self, a: Tensor, idx: Tensor, /) -> Tensor:
        """Rows of `a` at I32 indices, as F32."""
    def cpy(self, a: Tensor, b: Tensor, /) -> Tensor:
        """Copies a into b (converting type); returns a view of b."""
    def set_rows(self, dst: Tensor, src: Tensor, idx: Tensor, /) -> Tensor:
        """dst[idx[i], :] = src[i, :] (rows of ne[0] elements, converting type)."""
    def rope_ext(
        self,
        a: Tensor,
        pos: Tensor,
        freq_factors: Tensor | None,
        n_dims: int,
        mode: int,
        n_ctx_orig: int,
        freq_base: float,
        freq_scale: float = 1.0,
        ext_factor: float = 0.0,
        attn_factor: float = 1.0,
        beta_fast: float = 32.0,
        beta_slow: float = 1.0,
        *,
        offset: int = 0,
    ) -> Tensor:
        """RoPE of a [head_dim, n_head, n_tokens] at I32 positions; freq_factors (F32 [n_dims/2]) or None; offset:
        the rotated dims are [offset, offset + n_dims) (ggml_rope_set_offset), the others pass."""
    rope_ext_back = rope_ext  # the same arguments; rotates back by the same angles (DeepSeek V4's attention output)
    def rope_multi(
        self,
        a: Tensor,
        pos: Tensor,
        n_dims: int,
        sections: Sequence[int],
        mode: int,
        n_ctx_orig: int,
        freq_base: float,
        freq_scale: float = 1.0,
        ext_factor: float = 0.0,
        attn_factor: float = 1.0,
        beta_fast: float = 32.0,
        beta_slow: float = 1.0,
    ) -> Tensor:
        """Multi-section RoPE (M-RoPE, interleaved or not) of a [head_dim, n_head, n_tokens] at I32 [4 * n_tokens] positions (the sections' positions one after another)."""
    def ssm_conv(self, sx: Tensor, w: Tensor) -> Tensor:
        """The causal depthwise conv1d of Mamba-style layers: [d_inner, n_t, n_s]."""
    def ssm_scan(self, s: Tensor, x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, ids: Tensor) -> Tensor:
        """Mamba-2's selective scan over t tokens from the states ids picks in s: the outputs [head_dim * n_head *
        t * s], then the final states."""
    def gated_delta_net(
        self, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor, K: int = 1
    ) -> Tensor:
        """The gated delta rule over n_tokens: the outputs [S, H_v, t, s], then K states, most recent first."""
    def soft_max_ext(
        self, a: Tensor, mask: Tensor | None, scale: float, max_bias: float = 0.0, sinks: Tensor | None = None
    ) -> Tensor:
        """softmax(a * scale + mask) over rows; sinks (F32 [n_head]): a per-head logit that joins each row's sum"""
    def flash_attn_ext(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: Tensor | None,
        scale: float,
        max_bias: float = 0.0,
        softcap: float = 0.0,
        sinks: Tensor | None = None,
        n_kv_max: int = 0,
    ) -> Tensor:
        """q [d, n_tokens, n_head], k/v [d, n_kv, n_head_kv], mask F16 [n_kv, n_tokens] -> [d, n_head, n_tokens]; n_kv_max > 0: the mask's finite entries are a sparse K/V set, at most n_kv_max in any row"""
    def dsv4_hc_comb(self, mixes: Tensor, scale: Tensor, base: Tensor, eps: float, n_iter: int) -> Tensor:
        """The streams' mixing matrices F32 [hc, hc, n_tokens]: Sinkhorn-normalized softmax of mixes' last hc*hc rows"""
    def dsv4_hc_pre(self, x: Tensor, weights: Tensor) -> Tensor:
        """The streams summed by weight: F32 [n_embd, n_tokens]"""
    def dsv4_hc_post(self, x: Tensor, residual: Tensor, post: Tensor, comb: Tensor | None = None) -> Tensor:
        """The streams after a block: x * post[dst] + sum over src of residual[src] * comb[dst, src] (comb None: the identity) -> F32 [n_embd, hc, n_tokens]"""

class Buffer(_pybind11_object):
    """A backend buffer (owned)."""

    @property
    def size(self) -> int: ...
    def clear(self, value: int = 0) -> None: ...

class HostReservation(_pybind11_object):
    """Host address space for tensors whose pages are committed when written (MAP_NORESERVE); release() gives pages
    back, which then read as zeros."""
    def __init__(self, size: int) -> None: ...
    @property
    def size(self) -> int: ...
    def bind(self, tensor: Tensor, offset: int) -> None:
        """Places the tensor at byte `offset` of the range."""
    def release(self, offset: int, size: int) -> None:
        """Gives the whole pages in [offset, offset + size) back to the system (they read as zeros after)."""
    def resident(self) -> int:
        """Bytes of the range backed by memory now."""

class Backend(_pybind11_object):
    """A ggml device plus the allocator of graph intermediates."""

    def __init__(self, device: str = "", n_threads: int = 4, poll: int = 0) -> None: ...
    @property
    def name(self) -> str: ...
    @property
    def device_name(self) -> str: ...
    @property
    def device_type(self) -> str:
        """cpu, gpu, igpu or accel: the kind of memory the weights land in"""
    @property
    def endpoint(self) -> str:
        """The RPC server the device is on ("host:port"); "" for a device of this machine."""
    @property
    def is_host(self) -> bool:
        """Whether the device's buffers are host memory (the CPU) or its own (a GPU, an RPC server)."""
    @property
    def n_threads(self) -> int: ...
    @n_threads.setter
    def n_threads(self, value: int, /) -> None: ...
    @property
    def poll(self) -> int:
        """CPU: the thread pool's poll level (0: idle workers sleep between graphs; 1-100: they spin first)"""
    @poll.setter
    def poll(self, value: int, /) -> None: ...
    @property
    def use_ref(self) -> bool:
        """CPU: ggml-cpu's reference matmul path (no tiled K-quant kernels from 8 rows on, no fused ops): a row's
        result does not depend on how many rows the op has. Other devices: ignored."""
    @use_ref.setter
    def use_ref(self, value: bool, /) -> None: ...
    @property
    def compute_buffer_size(self) -> int: ...
    def stats(self) -> dict[str, float]:
        """What the graphs cost so far: graphs, reused, nodes, prepare_s, launch_s, wait_s, device_s, device_graphs."""
    @property
    def timing(self) -> bool:
        """Events around each graph where the device has them (a GPU), for stats()['device_s']."""
    @timing.setter
    def timing(self, value: bool, /) -> None: ...
    def tensor_set_async(self, tensor: Tensor, data: _BufferLike) -> None:
        """Copies a contiguous buffer into the tensor: queued on this device's stream where the tensor is in the
        device's own memory (ordered with its graphs, no wait for them), else at once."""
    def compute(self, graph: Graph, sync: bool = True) -> None:
        """Allocates intermediates and runs the graph (sync=False: queued on the device's stream, see
        synchronize); the GIL is released."""
    def synchronize(self) -> None:
        """Waits for the graphs and copies queued on this device."""
    def alloc_tensors(self, ctx: Context, /) -> Buffer:
        """Allocates every unallocated tensor of the context in one new buffer of this device."""

def tensor_set(tensor: Tensor, data: _BufferLike, offset: int = 0) -> None:
    """Copies the bytes of a contiguous buffer into the tensor's storage at byte `offset`."""

def tensor_get(
    tensor: Tensor,
) -> npt.NDArray[np.float32] | npt.NDArray[np.int32] | npt.NDArray[np.uint16] | bytes:
    """Copies the tensor's contents out: numpy (shape reversed to row-major) for F32/I32/F16(raw), bytes otherwise."""

def tensor_alias(dst: Tensor, src: Tensor, offset: int = 0) -> None:
    """Points dst at src's memory from byte `offset` (same type; dst contiguous and within src): graphs built on dst
    read and write those bytes from their next compute on."""

def tensor_copy(src: Tensor, dst: Tensor) -> None:
    """Copies src into dst across backends (same type and shape)."""

def cpu_features() -> dict[str, int]:
    """The instruction sets the loaded ggml-cpu was built for (as llama.cpp's system info)."""

def vec_dot_type(type: GGMLType) -> GGMLType:
    """The type ggml-cpu converts a matmul's activations to for weights of `type` (Q8_1 for Q4_1, ...)."""

def to_vec_dot(type: GGMLType, rows: npt.ArrayLike) -> tuple[GGMLType, npt.NDArray[np.uint8]]:
    """F32 activation rows as ggml-cpu converts them for a matmul with `type` weights: (vec_dot_type, bytes)."""

def type_size(type: GGMLType, /) -> int: ...
def blck_size(type: GGMLType, /) -> int: ...
def row_size(type: GGMLType, ne: int, /) -> int: ...
def graph_overhead(n_nodes: int, /) -> int: ...
def quantize(type: GGMLType, rows: npt.ArrayLike) -> npt.NDArray[np.uint8]:
    """F32 rows [n_rows, n] -> their bytes in `type` (uint8 [n_rows, row_size]), as ggml quantizes them."""

# ---------------------------------------------------------------------------------------------------------------
# GGUF files and weights

def rows_bytes(type: _TypeLike, n_rows: int, row_len: int) -> int:
    """Bytes of n_rows rows of row_len elements of a ggml type (SuperggmlError if row_len is not a multiple of its
    block size)."""

@overload
def convert_rows(
    src_type: _TypeLike,
    src: _BufferLike,
    n_rows: int,
    row_len: int,
    dst_type: _TypeLike,
    out: None = None,
    n_threads: int = 1,
) -> npt.NDArray[np.float32] | npt.NDArray[np.float16]:
    """Converts rows of a ggml type (bytes in any buffer: a Slot, numpy, bytes) to F32 or F16 with ggml's type
    traits, into `out` (a writable contiguous buffer) or a new numpy array [n_rows, row_len]; GIL released."""

@overload
def convert_rows(
    src_type: _TypeLike,
    src: _BufferLike,
    n_rows: int,
    row_len: int,
    dst_type: _TypeLike,
    out: _BufferT,
    n_threads: int = 1,
) -> _BufferT: ...

class GGUFFile(_pybind11_object):
    """A GGUF file: header parsed, tensor ranges validated, data mapped read-only."""

    def __init__(self, path: str) -> None: ...
    @property
    def path(self) -> str: ...
    @property
    def file_size(self) -> int: ...
    @property
    def data_offset(self) -> int: ...
    @property
    def alignment(self) -> int: ...
    @property
    def closed(self) -> bool: ...
    def metadata(self) -> dict[str, _MetaValue]:
        """All key/value pairs of the header as a dict (arrays as lists)."""
    def tensors(self) -> list[tuple[str, str, list[int], int, int]]:
        """Tensor table: (name, type name, shape in ggml order, absolute offset, nbytes)."""
    def drop_header(self) -> None:
        """Frees the parsed key/value header (metadata() then raises)."""
    def close(self) -> None: ...

class WeightHome(_pybind11_enum):
    UNBOUND: ClassVar[WeightHome]
    MMAP: ClassVar[WeightHome]
    RESIDENT: ClassVar[WeightHome]
    REPACKED: ClassVar[WeightHome]
    __members__: ClassVar[dict[str, WeightHome]]

class WeightStore(_pybind11_object):
    """The weights of a GGUF file as paged tensors, bound to the mmap or to resident buffers."""

    def __init__(self, file: GGUFFile) -> None: ...
    def get(self, name: str) -> Tensor:
        """The paged tensor `name` (GGUFError if the file has none)."""
    @property
    def path(self) -> str: ...
    def has(self, name: str, /) -> bool: ...
    def names(self) -> list[str]:
        """Every tensor name of the file, in file order."""
    def add_row_chunks(self, name: str, max_bytes: int) -> list[str]:
        """Row ranges of a 2-D tensor as new paged tensors of at most max_bytes; returns their names."""
    def add_copy(self, name: str, tag: str) -> str:
        """A second paged tensor '<name>@<tag>' over the same bytes (a weight another device reads too)."""
    def file_range(self, name: str, /) -> tuple[int, int]: ...
    def slot_bytes(self, names: Sequence[str], backend: Backend | None = None, direct_io: bool = False) -> int:
        """Bytes a pool slot needs to hold these tensors (with direct_io: in the file's layout, O_DIRECT-aligned)."""
    def home(self, name: str, /) -> WeightHome: ...
    def bytes(self, home: WeightHome, /) -> int: ...
    def bind_mmap(self, names: Sequence[str] = ...) -> None:
        """Binds tensors (all if empty) to the file mapping, zero copy."""
    def load_resident(self, names: Sequence[str], backend: Backend) -> int:
        """Copies tensors into a new buffer of the backend's device; returns bytes."""
    def load_repacked(self, names: Sequence[str], backend: Backend) -> int:
        """Re-lays the weights the device can use re-laid (ggml-cpu repack); returns bytes moved."""

# ---------------------------------------------------------------------------------------------------------------
# Leases: holds on memory lent to Python (pool slots, pager layers, KV frames)

class Lease(_pybind11_object):
    """A hold on memory lent by superggml (base of Slot, Layer and KVFrame). Host memory is viewed without a copy
    through the buffer protocol and __dlpack__; release() raises BufferError while views exist, and views cannot be
    made after it (SlotReleased)."""

    @property
    def nbytes(self) -> int:
        """bytes of the memory"""
    @property
    def writable(self) -> bool: ...
    @property
    def is_host(self) -> bool:
        """host memory (views allowed) or a device's (tensors only)"""
    @property
    def released(self) -> bool: ...
    @property
    def valid(self) -> bool:
        """views can be made: not released and the memory still this hold's"""
    @property
    def n_views(self) -> int:
        """live buffer-protocol views"""
    def release(self) -> None:
        """Ends the hold. BufferError while views of it are alive; waits for loads into it; unbinds its tensors.
        Calling it again does nothing."""
    def tensor(self, type: _TypeLike, shape: Sequence[int], offset: int = 0) -> Tensor:
        """A ggml tensor of `type` and `shape` (ggml order: shape[0] is the row length) over the bytes at `offset`,
        for graphs built by the caller; unbound when the lease is released."""
    def wait(self) -> None:
        """Waits for the loads into the memory (GIL released); raises the first one's error."""
    # The buffer protocol is C level (bf_getbuffer, counted views): declared so that a lease is a Buffer for
    # memoryview(), bytes() and numpy.frombuffer() (whose stubs take any Buffer when checking for Python 3.12+).
    def __buffer__(self, flags: int, /) -> memoryview: ...
    @overload
    def __array__(self, dtype: None = None, copy: bool | None = None) -> npt.NDArray[np.uint8]: ...
    @overload
    def __array__(self, dtype: npt.DTypeLike, copy: bool | None = None) -> npt.NDArray[Any]: ...
    def __dlpack__(
        self,
        *,
        stream: int | None = None,
        max_version: tuple[int, int] | None = None,
        dl_device: tuple[int, int] | None = None,
        copy: bool | None = None,
    ) -> CapsuleType:
        """DLPack capsule of the memory as a 1-D uint8 tensor (zero copy; a read-only lease needs a DLPack 1.0
        consumer); counts as a view until the consumer frees it."""
    def __dlpack_device__(self) -> tuple[int, int]: ...
    def __enter__(self) -> Self: ...
    def __exit__(self, *args: object) -> None: ...

class Slot(Lease):
    """A held pool slot (BufferPool.acquire): the slot's bytes without a copy (buffer protocol, __dlpack__,
    tensor()), valid until release()."""

    @property
    def index(self) -> int: ...
    @property
    def key(self) -> int: ...
    @property
    def hit(self) -> bool:
        """the slot already held the key's bytes (loaded or loading)"""
    @property
    def evicted(self) -> int:
        """the key whose bytes were dropped to make room, or -1"""

class Layer(Lease):
    """A layer held by LayerPager.acquire_layer: its tensors bound to one slot, viewable without a copy (read-only)
    until release()."""

    @property
    def index(self) -> int: ...
    def names(self) -> list[str]:
        """The layer's tensor names, in the order given to the pager."""
    def offset(self, name: str) -> int:
        """Byte offset of a tensor of the layer in the slot."""
    def get(self, name: str) -> Tensor:
        """The layer's paged tensor `name`, bound to the slot (for ggml graphs)."""

class KVFrame(Lease):
    """A (sequence, layer)'s K and V held in a frame by KVCache.acquire_frame: K at byte 0, V at v_offset, viewable
    without a copy until release(); rows written up to written() become dirty pages."""

    @property
    def seq(self) -> int: ...
    @property
    def layer(self) -> int: ...
    @property
    def n_valid(self) -> int:
        """rows [0, n_valid) held the cached tokens at acquire"""
    @property
    def n_end(self) -> int: ...
    @property
    def v_offset(self) -> int: ...
    def written(self, n_end: int) -> None:
        """Rows up to n_end were written: release() marks their pages dirty."""
    def k(self) -> Tensor:
        """The layer's K tensor, bound to the frame (for ggml graphs)."""
    def v(self) -> Tensor | None:
        """The layer's V tensor, bound to the frame (None for a cache of K only)."""

# ---------------------------------------------------------------------------------------------------------------
# Buffer pool, prefetch, layer pager, KV cache

class BufferPool(_pybind11_object):
    """Fixed-size slots on one backend buffer type; LRU eviction, pinning, a hard byte budget."""

    def __init__(self, slot_size: int, n_slots: int, backend: Backend | None = None, align: int = 0) -> None:
        """n_slots slots of slot_size bytes; host slots start at a multiple of `align` (4096: O_DIRECT reads go
        straight into them; 0: the buffer type's alignment)."""
    @property
    def n_slots(self) -> int: ...
    @property
    def slot_size(self) -> int: ...
    @property
    def bytes(self) -> int: ...
    @property
    def is_host(self) -> bool: ...
    def acquire(self, key: int) -> tuple[int, bool, int]:
        """(slot, hit, evicted key or -1); PoolExhausted if every slot is in use or pinned"""
    def acquire_slot(self, key: int, writable: bool = True) -> Slot:
        """Holds the slot of `key` (a hit) or takes one (LRU eviction): a Slot; PoolExhausted if every slot is in use
        or pinned."""
    def release(self, slot: int, /) -> None: ...
    def set_pinned(self, slot: int, pinned: bool, /) -> None: ...
    def drop(self, key: int, /) -> bool: ...
    def shrink(self) -> tuple[bool, int]:
        """Frees one slot's memory: (freed, evicted key or -1); freed is False if every slot is in use or pinned."""
    def grow(self) -> int:
        """Allocates one more slot; returns its index."""
    def slot_of(self, key: int, /) -> int: ...
    def key_of(self, slot: int, /) -> int: ...
    def in_use(self, slot: int, /) -> int: ...
    def read(self, slot: int, offset: int, size: int) -> npt.NDArray[np.uint8]:
        """Copy of a slot's bytes (host slots)."""
    def stats(self) -> dict[str, int]: ...  # hits, misses, evictions

class LoadFuture(_pybind11_object):
    """The completion of one load job."""

    def result(self, timeout: float | None = None) -> None:
        """Waits (GIL released); raises the load's error, TimeoutError on timeout."""
    def done(self) -> bool: ...
    def cancel(self) -> bool:
        """Cancels the job if it has not started (result() then raises LoadCancelled); returns whether it did."""

def host_to_device_rate(backend: Backend, bytes: int = 268435456, repeats: int = 5) -> float:
    """Bytes per second of async copies from the device's pinned host memory into the device (the best of
    `repeats`): the bound of a staged load."""

class Prefetcher(_pybind11_object):
    """Worker threads reading file byte ranges into pool slots (pread)."""

    def __init__(self, path: str, n_workers: int = 1, direct: bool = False, staged: bool = False) -> None: ...
    @property
    def direct(self) -> bool:
        """O_DIRECT reads are available"""
    @property
    def n_workers(self) -> int: ...
    def submit(
        self,
        key: int,
        pool: BufferPool,
        slot: int,
        ranges: Sequence[Sequence[int]],
        priority: int = 0,
        direct: bool = False,
    ) -> LoadFuture:
        """Queues reads of (file_offset, size, slot_offset) ranges into the slot; returns a LoadFuture. direct: O_DIRECT
        where the range and slot address are 4096-aligned and the file allows it."""
    def submit_slot(
        self, slot: Slot, ranges: Sequence[Sequence[int]], priority: int = 0, direct: bool | None = None
    ) -> LoadFuture:
        """Queues reads of (file_offset, size, slot_offset) ranges into a held Slot (its key names the job); the
        slot's release() waits for them. direct (default: when the prefetcher has O_DIRECT): O_DIRECT for ranges
        whose offset, size and address are 4096-aligned, buffered reads for the rest."""
    def cancel(self, key: int) -> bool:
        """Cancels every queued job for key; returns whether any."""
    def stats(
        self,
    ) -> dict[str, int | float]: ...  # completed, failed, cancelled, bytes, direct_bytes, read_seconds (float), pending

class LayerPager(_pybind11_object):
    """Streams groups of paged tensors (layers) through a buffer pool with worker-thread prefetch."""

    def __init__(
        self,
        store: WeightStore,
        layers: Sequence[Sequence[str]],
        n_slots: int,
        slot_size: int = 0,
        n_workers: int = 1,
        backend: Backend | None = None,
        direct_io: bool = False,
        staged: bool = False,
        host_slots: int = 0,
    ) -> None:
        """host_slots: a host tier of that many layers between the file and a staged pool."""
    @property
    def host_slots(self) -> int: ...
    @property
    def host_bytes(self) -> int: ...
    @property
    def staged(self) -> bool:
        """loads go through staging buffers and async device copies"""
    @property
    def direct_io(self) -> bool:
        """O_DIRECT reads are in use"""
    @property
    def n_layers(self) -> int: ...
    @property
    def slot_size(self) -> int: ...
    @property
    def n_slots(self) -> int: ...
    def layer_bytes(self, layer: int, /) -> int: ...
    def prefetch(self, layer: int, priority: int = 0) -> bool: ...
    def acquire(self, layer: int) -> None:
        """Waits for the layer's bytes (GIL released) and binds its tensors to the slot."""
    def acquire_layer(self, layer: int) -> Layer:
        """acquire() (GIL released) as a Layer lease whose release() releases the layer."""
    def release(self, layer: int, /) -> None: ...
    def pin(self, layer: int, /) -> None: ...
    def unpin(self, layer: int) -> None: ...
    def pinned(self, layer: int) -> bool: ...
    def shrink(self) -> bool:
        """Frees one slot's memory (evicting its unpinned layer); False if every slot is in use or pinned."""
    def grow(self) -> None:
        """Allocates one more slot."""
    def resident(self, layer: int, /) -> bool: ...
    def last_load(self, layer: int) -> tuple[float, float] | None:
        """(start, end) wall-clock seconds of the layer's last finished load, or None"""
    # loads, hits, evictions, bytes_loaded, wait_seconds (float), read_seconds (float), pending, failed, completed
    def stats(self) -> dict[str, int | float]: ...

class KVCache(_pybind11_object):
    """Paged K/V cache: pages of page_size tokens in device frames, host memory (a budget) and a spill file.
    v empty: a cache of K only (a latent K/V)."""

    def __init__(
        self,
        k: Sequence[Tensor],
        v: Sequence[Tensor],
        page_size: int = 256,
        n_frames: int = 0,
        host_budget: int | None = None,
        spill_dir: str = "",
        v_trans: bool = True,
        backend: Backend | None = None,
        n_workers: int = 1,
        n_stream: int = 1,
    ) -> None: ...
    def acquire(self, seq: int, layer: int, n_valid: int, k: Tensor | None = None, v: Tensor | None = None) -> None:
        """Binds the layer's K/V (or the tensors k, v of its shape: a lane of a pass over several sequences) to a
        frame holding rows [0, n_valid) of (seq, layer)."""
    def acquire_frame(self, seq: int, layer: int, n_valid: int) -> KVFrame:
        """acquire() (GIL released) as a KVFrame lease whose release() releases (seq, layer)."""
    def release(self, seq: int, layer: int, n_end: int) -> None:
        """Rows up to n_end were written: their pages are dirty."""
    def prefetch(self, seq: int, layer: int, n_valid: int) -> bool:
        """Starts filling a frame on a worker; False if no frame is free."""
    def seq_truncate(self, seq: int, n: int) -> None:
        """Forgets tokens >= n of the sequence (0: all), freeing their pages."""
    def seq_forget(self, seq: int, layer: int, n_first: int) -> None:
        """Frees the pages of (seq, layer) wholly below token n_first (outside a sliding window)."""
    @property
    def page_bytes(self) -> int: ...
    @property
    def page_size(self) -> int: ...
    def stats(self) -> dict[str, int | float]: ...  # kv_* counts and bytes; kv_page_waste is a float

# ---------------------------------------------------------------------------------------------------------------
# Memory telemetry

class _HostMemory(TypedDict):
    total: int
    available: int
    cgroup_limit: int
    cgroup_usage: int
    cgroup_cache: int
    process_rss: int
    process_peak: int
    pressure: float

class _DeviceMemory(TypedDict):
    name: str
    description: str
    type: str
    memory_free: int
    memory_total: int

def host_memory() -> _HostMemory:
    """Host memory as this process sees it: /proc/meminfo clipped by its memory cgroup (bytes)."""

def ggml_log_counts() -> dict[str, int]:
    """How often ggml logged each message about CUDA graphs (digits as #): captured, reused, reset, disabled."""

def host_memory_trim() -> bool:
    """Returns freed heap memory to the system (glibc malloc_trim); whether any was released."""

def devices() -> list[_DeviceMemory]:
    """The ggml devices of this build: name, description, type, memory_free, memory_total."""

# ---------------------------------------------------------------------------------------------------------------
# Content addresses (csrc/content-hash.h)

def content_hash(data: _BufferLike, seed: int = 0xCBF29CE484222325) -> int:
    """FNV-1a (64-bit) of the bytes, as ggml RPC hashes a tensor's data; seed continues an earlier hash."""

def content_hash_ranges(path: str, ranges: Sequence[tuple[int, int]], n_threads: int = 1) -> list[int]:
    """content_hash of each (offset, size) range of the file, read on n_threads threads (GIL released)."""

def content_index_set(path: str, ranges: Sequence[tuple[int, int, int]]) -> None:
    """Sets the content hashes of (offset, size, hash) ranges of the file at `path`: writes of those ranges to
    superggml RPC peers go by hash. An empty list forgets them."""

# The internals (WeightLoader, ExpertCache, rpc_*, I/O fault hooks) are not typed.
def __getattr__(name: str) -> Any: ...
