"""Every family's hyperparameters at their edges, against llama.cpp. For each family, its synthetic GGUF with one
integer key at a time set to 0 (a zero window, no experts used, no rotary dimensions, a zero head size, ...) and
one array key at a time emptied. Where llama.cpp loads and runs the file, superggml does too, with the same logits
bit for bit; where llama.cpp refuses it, aborts or crashes on it, superggml refuses it with a clear error
(SuperggmlError or ValueError), never another exception or a crash."""

from __future__ import annotations

import gc
import os
import warnings

import numpy as np
import pytest

import llama_ref
from superggml import Model
from superggml.errors import SuperggmlError
from synth_gguf import VARIANTS, layout_changes, metadata, synth
from prompts import TOKENS_10 as PROMPT

CHUNK = 12
# where llama.cpp runs a file and superggml refuses it on purpose, and why
REFUSED = {
    ".attention.sliding_window = 0": "its sliding blocks attend to nothing: llama.cpp gives NaN logits (gemma2), "
    "or gpt-oss's from its sinks alone",
    ".attention.indexer.top_k = 0": "the sparse attention's indexer keeps no key: llama.cpp's attention sees "
    "nothing and every logit is NaN (deepseek32, glm-dsa)",
}
# where the two differ and superggml is not settled yet: left out, and printed (none today)
KNOWN: dict[str, str] = {}
# where the pinned llama.cpp hangs (measured: past LOAD_HANG_S, in every family that has the key): superggml must
# refuse, and llama.cpp is not asked again (each would cost the suite LOAD_HANG_S)
HANGS = {
    ".rope.dimension_count = 0": "no rotary dimensions: llama.cpp's RoPE loops without end",
    ".rope.dimension_count_swa = 0": "no rotary dimensions in the sliding layers: llama.cpp's RoPE loops without end",
}
# the families whose edges found something, and one plain family; every family passed once (stop 68), and the
# whole matrix costs minutes the suite does not have
EDGE_FAMILIES = [
    "llama-headdim32",
    "gemma2-swa16-softcaps",
    "gpt-oss-8x2-swa16-yarn",
    "deepseek2-v3-groups-yarn",
    "glm4moe-bias-mtp",
    "step35-4",
    "gemma4-8x2-fused-pl",
    "gemma4-e-shared",
    "deepseek32-yarn-q8_0",
    "deepseek4-csa-hca",
    "kimi-k3-res2-latent",
    "kimi-linear-4",
    "minimax-m3-dense1",
    "mimo2-swa-sinks",
    "hy_v3-mtp",
    "hy_v4-hc4",
    "bailingmoe3-kda-mla",
    "dots3note-sparse-swa",
    "qwen4exp-qsa-ple",
    "glm5-next-kpool-shared",
]
ZEROED = (  # the integer keys that size or switch something, where 0 is an edge a file can hold
    "attention.sliding_window",
    "attention.head_count_kv",
    "attention.key_length",
    "attention.value_length",
    "attention.key_length_mla",
    "attention.value_length_mla",
    "attention.q_lora_rank",
    "attention.kv_lora_rank",
    "rope.dimension_count",
    "rope.dimension_count_swa",
    "expert_count",
    "expert_used_count",
    "expert_feed_forward_length",
    "expert_shared_feed_forward_length",
    "hyper_connection.magnitude",
    "expert_shared_count",
    "expert_group_count",
    "expert_group_used_count",
    "feed_forward_length",
    "leading_dense_block_count",
    "ssm.group_count",
    "ssm.state_size",
    "ssm.conv_kernel",
    "ssm.inner_size",
    "shortconv.l_cache",
    "attention.indexer.top_k",
    "attention.indexer.head_count",
    "attention.shared_kv_layers",
    "embedding_length_per_layer_input",
    "attention.output_group_count",
    "attention.output_lora_rank",
    "attention.indexer.key_length",
    "attention.compress_ratios",
    "hash_layer_count",
    "hyper_connection.count",
    "hyper_connection.sinkhorn_iterations",
    "swiglu_clamp_exp",
    "kda.head_dim",
    "attn_res.block_size",
    "expert_latent_length",
    "expert_shared_feed_forward_length",
    "hyper_connection.magnitude",
    "attention.indexer.block_size",
    "attention.indexer.local_blocks",
)


def ours(path):
    """superggml's logits for PROMPT, or the exception it refused the file with (any kind: the test tells)."""
    try:
        with Model(path, ctx_size=128, n_threads=2) as m:
            return m.eval(PROMPT, logits_all=True).copy()
    except Exception as e:  # noqa: BLE001 - a crash of another kind is what the test looks for
        return e


def edges(path, arch):
    """(what, values) for each integer key of ZEROED the file has (set to 0) and each array key (emptied)."""
    meta = metadata(path)
    out = []
    for k in ZEROED:
        v = meta.get(f"{arch}.{k}")
        if isinstance(v, int) and not isinstance(v, bool) and v != 0:
            out.append((f"{arch}.{k} = 0", {f"{arch}.{k}": 0}))
        elif isinstance(v, (list, tuple)) and v:
            out.append((f"{arch}.{k} = []", {f"{arch}.{k}": []}))
    return out


@pytest.mark.parametrize("variant", EDGE_FAMILIES)
def test_edge_values_run_or_are_refused_as_llama_cpp_does(tmp_path, small_vocab, variant):
    full = synth(tmp_path / "full.gguf", small_vocab, **VARIANTS[variant])
    todo, paths, refused = [], [], []
    for what, values in edges(full, VARIANTS[variant]["arch"]):
        with warnings.catch_warnings():  # a writer the generator gave up on is collected here, unclosed
            warnings.simplefilter("ignore", ResourceWarning)
            try:
                with layout_changes(values=values):
                    paths.append(synth(tmp_path / f"edge-{len(paths)}.gguf", small_vocab, **VARIANTS[variant]))
            except (ValueError, ZeroDivisionError, AssertionError, IndexError):
                gc.collect()
                continue  # the generator itself cannot lay the model out so (a zero-sized tensor)
        if any(what.endswith(h) for h in HANGS):
            refused.append((what, ours(paths.pop())))
            continue
        todo.append(what)
    wrong, statuses = [], []
    for what, g in refused:
        if not isinstance(g, (SuperggmlError, ValueError)):
            wrong.append(
                f"{what}: llama.cpp hangs on it, superggml {'runs it' if not isinstance(g, Exception) else g!r}"
            )
    for at in range(0, len(paths), CHUNK):
        chunk = paths[at : at + CHUNK]
        pending = llama_ref.start({"kind": "loads", "model": full, "models": chunk, "prompt": PROMPT})
        got = [ours(p) for p in chunk]
        ref = pending.result()
        for i, path in enumerate(chunk):
            what, status = todo[at + i], int(ref["status"][i])
            statuses.append(status)
            os.unlink(path)
            g = got[i]
            if isinstance(g, Exception) and not isinstance(g, (SuperggmlError, ValueError)):
                wrong.append(f"{what}: superggml fails with {type(g).__name__}: {g}")
            elif what in KNOWN:
                print(f"known, left out: {what}: {KNOWN[what]}")
            elif status == llama_ref.LOAD_OK:
                on_purpose = any(what.endswith(w) for w in REFUSED)
                if isinstance(g, Exception) and not on_purpose:
                    wrong.append(f"{what}: llama.cpp runs it, superggml refuses: {g}")
                elif not isinstance(g, Exception) and not np.array_equal(g, ref[f"logits{i}"]):
                    d = np.abs(g - ref[f"logits{i}"]).max()
                    wrong.append(f"{what}: llama.cpp runs it, with other logits (max |d| {d})")
            elif not isinstance(g, Exception):
                how = "refuses" if status == llama_ref.LOAD_ERROR else "aborts or crashes on"
                wrong.append(f"{what}: llama.cpp {how} it, superggml runs it")
    print(f"\n{variant}: {todo}, llama.cpp statuses {statuses}")
    assert not wrong, "\n".join(wrong)
