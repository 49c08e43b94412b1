"""A structure-aware fuzzer for superggml's GGUF loading path.

The seed is a small GGUF written with `gguf` (metadata of every value type,
arrays, and tensors of F32/F16/Q8_0/Q4_0). A walker records where each
structural field sits (counts, key and string lengths, value and array
types, tensor n_dims, dims, types and offsets, the alignment value); each
input sets one or more of them to boundary or random values, or flips,
inserts, deletes or truncates bytes. Every input must either load (file,
metadata, tensor table, every tensor's bytes read back) or raise a Python
exception. The loop runs in a child process so a crash or a hang is caught
and the input that caused it is kept.

    python tests/support/fuzz_gguf.py N SEED OUT_DIR             (child: prints progress lines)
    python tests/support/fuzz_gguf.py --corpus N SEED OUT_DIR    (writes N inputs for tests/cpp/gguf_fuzz.cpp)
"""

from __future__ import annotations

import os
import random
import struct
import sys
import tempfile

import numpy as np

BOUNDARY_U32 = [
    0,
    1,
    2,
    3,
    4,
    7,
    8,
    31,
    32,
    33,
    63,
    64,
    255,
    256,
    4095,
    4096,
    65535,
    0x7FFFFFFF,
    0x80000000,
    0xFFFFFFFE,
    0xFFFFFFFF,
]
BOUNDARY_U64 = BOUNDARY_U32 + [2**32, 2**40, 2**62, 2**63 - 1, 2**63, 2**64 - 2, 2**64 - 1]


def seed_file(path: str) -> bytes:
    import gguf

    w = gguf.GGUFWriter(path, "llama")
    w.add_uint32("llama.block_count", 2)
    w.add_uint64("fuzz.u64", 12345)
    w.add_int32("fuzz.i32", -7)
    w.add_float32("fuzz.f32", 0.5)
    w.add_bool("fuzz.flag", True)
    w.add_string("fuzz.text", "hello gguf")
    w.add_array("fuzz.ints", [1, 2, 3, 4])
    w.add_array("fuzz.strs", ["a", "bb", "ccc"])
    w.add_uint32("general.alignment", 32)
    rng = np.random.default_rng(0)
    w.add_tensor("a.f32", rng.standard_normal((4, 8)).astype(np.float32))
    w.add_tensor("b.f16", rng.standard_normal((2, 16)).astype(np.float16))
    w.add_tensor("c.q8_0", rng.integers(0, 255, (2, 34), dtype=np.uint8), raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("d.q4_0", rng.integers(0, 255, (1, 18), dtype=np.uint8), raw_dtype=gguf.GGMLQuantizationType.Q4_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with open(path, "rb") as f:
        return f.read()


def fields(data: bytes) -> list[tuple[int, int]]:
    """(offset, width in bytes) of every structural integer of the header."""
    out: list[tuple[int, int]] = [(4, 4), (8, 8), (16, 8)]  # version, tensor count, kv count
    pos = 24
    n_t, n_kv = struct.unpack_from("<QQ", data, 8)
    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}

    def string() -> None:
        nonlocal pos
        out.append((pos, 8))
        n = struct.unpack_from("<Q", data, pos)[0]
        pos += 8 + n

    def value(t: int) -> None:
        nonlocal pos
        if t == 8:
            string()
        elif t == 9:
            out.append((pos, 4))
            out.append((pos + 4, 8))
            at, n = struct.unpack_from("<IQ", data, pos)
            pos += 12
            for _ in range(n):
                value(at)
        else:
            out.append((pos, sizes[t]))
            pos += sizes[t]

    for _ in range(n_kv):
        string()
        out.append((pos, 4))
        t = struct.unpack_from("<I", data, pos)[0]
        pos += 4
        value(t)
    for _ in range(n_t):
        string()
        out.append((pos, 4))
        nd = struct.unpack_from("<I", data, pos)[0]
        pos += 4
        for _ in range(nd):
            out.append((pos, 8))
            pos += 8
        out.append((pos, 4))  # type
        out.append((pos + 4, 8))  # offset
        pos += 12
    return out


def mutate(seed: bytes, fs: list[tuple[int, int]], rng: random.Random) -> bytes:
    b = bytearray(seed)
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        if not b:
            break
        op = rng.random()
        if op < 0.6:
            off, width = rng.choice(fs)
            pool = BOUNDARY_U64 if width == 8 else BOUNDARY_U32
            v = rng.choice(pool) if rng.random() < 0.7 else rng.getrandbits(8 * width)
            if width < 4:
                v &= (1 << (8 * width)) - 1
            if rng.random() < 0.2:
                v = (int.from_bytes(b[off : off + width], "little") + rng.choice([-1, 1, -8, 8])) % (1 << (8 * width))
            b[off : off + width] = (v % (1 << (8 * width))).to_bytes(width, "little")
        elif op < 0.75:
            i = rng.randrange(len(b))
            b[i] ^= 1 << rng.randrange(8)
        elif op < 0.85:
            del b[rng.randrange(len(b)) :]  # truncation (to 0 bytes too)
        elif op < 0.93:
            i = rng.randrange(len(b))
            b[i:i] = bytes(rng.getrandbits(8) for _ in range(rng.choice([1, 4, 8, 32])))
        else:
            i = rng.randrange(len(b))
            del b[i : i + rng.choice([1, 4, 8, 32])]
    return bytes(b)


def try_load(path: str) -> str:
    """'ok' or the exception's class name; anything else (a crash) ends the process."""
    from superggml import native

    try:
        f = native.GGUFFile(path)
        try:
            f.metadata()
            infos = f.tensors()
            store = native.WeightStore(f)
            store.bind_mmap()
            for name, *_ in infos:
                t = store.get(name)
                if t.nbytes <= 1 << 20:
                    native.tensor_get(t) if t.type_name in ("f32", "f16") else None
            del store
        finally:
            f.close()
        return "ok"
    except Exception as e:  # noqa: BLE001 - every Python exception is an acceptable outcome
        return type(e).__name__


def run(n: int, seed: int, out_dir: str) -> None:
    tmp = os.path.join("/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir(), f"sgfuzz-{os.getpid()}")
    base = seed_file(tmp + ".seed.gguf")
    fs = fields(base)
    rng = random.Random(seed)
    outcomes: dict[str, int] = {}
    current = os.path.join(out_dir, "current.gguf")
    try:
        for i in range(n):
            data = mutate(base, fs, rng)
            with open(current, "wb") as f:  # kept if this input brings the process down
                f.write(data)
            r = try_load(current)
            outcomes[r] = outcomes.get(r, 0) + 1
            if i % 1000 == 999 or i == n - 1:
                print(f"progress {i + 1} " + " ".join(f"{k}={v}" for k, v in sorted(outcomes.items())), flush=True)
    finally:
        os.unlink(tmp + ".seed.gguf")
    os.unlink(current)
    print("done", flush=True)


def write_corpus(n: int, seed: int, out_dir: str) -> None:
    """n mutated inputs as files (for the C++ driver tests/cpp/gguf_fuzz.cpp under ASan + UBSan)."""
    base = seed_file(os.path.join(out_dir, "seed.gguf"))
    fs = fields(base)
    rng = random.Random(seed)
    for i in range(n):
        with open(os.path.join(out_dir, f"in{i:06d}.gguf"), "wb") as f:
            f.write(mutate(base, fs, rng))


if __name__ == "__main__":
    if sys.argv[1] == "--corpus":
        write_corpus(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
    else:
        run(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
