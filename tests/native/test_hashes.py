"""Content addresses (superggml.hashes): ggml RPC's hash of each tensor, block and expert of a GGUF, computed once
and kept in a sidecar index; a changed copy changes only the hashes of what changed."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np

import synth_gguf
from superggml import gguf, native
from superggml.hashes import content_hashes, content_ranges, sidecar_path
from synth_gguf import VARIANTS, synth
from cli_runner import run_cli


def fnv1a(data: bytes) -> int:
    h = 0xCBF29CE484222325
    for x in data:
        h = ((h ^ x) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def test_the_hash_is_ggml_rpcs(tmp_path):
    data = np.random.default_rng(0).integers(0, 256, 5000, dtype=np.uint8).tobytes()
    assert native.content_hash(b"") == 0xCBF29CE484222325  # ggml-rpc.cpp's fnv_hash seed
    assert native.content_hash(data) == fnv1a(data)
    assert native.content_hash(data[2500:], native.content_hash(data[:2500])) == fnv1a(data)
    (tmp_path / "f").write_bytes(data)
    assert native.content_hash_ranges(str(tmp_path / "f"), [(0, 5000), (100, 7), (0, 0)], 2) == [
        fnv1a(data),
        fnv1a(data[100:107]),
        fnv1a(b""),
    ]


def test_tensors_blocks_and_experts_of_a_gguf(smollm2_path, tmp_path):
    path = synth(tmp_path / "moe.gguf", synth_gguf.vocab_fields(smollm2_path), **VARIANTS["qwen3moe-8x2-q8_0"])
    with gguf.open(path) as g:
        h = g.hashes(n_threads=2)
        assert h.computed and set(h.tensors) == set(g.tensors)
        for name in ("blk.0.attn_norm.weight", "blk.1.ffn_gate_inp.weight"):
            assert h.tensors[name] == f"{fnv1a(g.read(name).tobytes()):016x}"
        exps = "blk.1.ffn_up_exps.weight"
        raw = g.read(exps).tobytes()
        step = len(raw) // g.info(exps).shape[2]
        assert h.experts[exps] == [
            f"{fnv1a(raw[e * step : (e + 1) * step]):016x}" for e in range(g.info(exps).shape[2])
        ]
    assert sorted(h.blocks) == list(range(len(h.blocks))) and len(set(h.blocks.values())) == len(h.blocks)
    again = content_hashes(path)  # from the sidecar index, not computed again
    assert not again.computed and again == type(h)(h.model, h.tensors, h.blocks, h.experts)
    assert os.path.exists(sidecar_path(path))

    copy = str(tmp_path / "copy.gguf")  # one byte of block 1's expert changed
    shutil.copy(path, copy)
    with gguf.open(copy) as g:
        off = g.info(exps).offset + 3 * step + 5
    with open(copy, "r+b") as f:
        f.seek(off)
        b = f.read(1)
        f.seek(off)
        f.write(bytes([b[0] ^ 0xFF]))
    c = content_hashes(copy, cache_dir=str(tmp_path / "cache"))
    assert c.computed and os.listdir(tmp_path / "cache")
    assert [t for t in h.tensors if c.tensors[t] != h.tensors[t]] == [exps]
    assert [e for e in range(len(h.experts[exps])) if c.experts[exps][e] != h.experts[exps][e]] == [3]
    assert [b for b in h.blocks if c.blocks[b] != h.blocks[b]] == [1] and c.model != h.model

    ranges = content_ranges(path)  # what a peer is named: every tensor, every expert slice
    with gguf.open(path) as g:
        for name, info in g.tensors.items():
            assert (info.offset, info.nbytes, int(h.tensors[name], 16)) in ranges
        assert (g.info(exps).offset + 3 * step, step, int(h.experts[exps][3], 16)) in ranges
        assert len(ranges) == len(g.tensors) + sum(len(v) for v in h.experts.values())


def test_a_stale_index_is_not_used(smollm2_path, tmp_path):
    path = synth(tmp_path / "d.gguf", synth_gguf.vocab_fields(smollm2_path), "llama")
    first = content_hashes(path)
    index = sidecar_path(path)
    with open(index) as f:
        saved = json.load(f)
    saved["tensors"]["token_embd.weight"] = "0" * 16  # an index of other bytes than the file's
    saved["key"]["mtime_ns"] += 1
    with open(index, "w") as f:
        json.dump(saved, f)
    again = content_hashes(path)
    assert again.computed and again.tensors == first.tensors


def test_analyze_prints_them(smollm2_path, tmp_path, capsys):
    path = synth(tmp_path / "d.gguf", synth_gguf.vocab_fields(smollm2_path), "llama")
    out = run_cli(capsys, "analyze", "-m", path, "--no-measure", "--hashes").out
    h = content_hashes(path)
    assert f"model {h.model}" in out and f"block   0  {h.blocks[0]}" in out
