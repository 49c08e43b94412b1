"""A small random-weight minimax-m3 (MiniMax-M3) GGUF laid out as the pinned llama.cpp loads it
(src/models/minimax-m3.cpp, load_arch_hparams / load_arch_tensors; the pinned tree has no converter, so keys and
tensors follow the loader, spelled as src/llama-arch.cpp spells them): GQA attention with per-head Q/K RMS norms
and a partial NeoX RoPE, leading dense blocks (dense attention, swiglu_oai FFN), then MoE blocks (sigmoid routing
with exp_probs_b, one shared expert, swiglu_oai) whose attention is MiniMax Sparse Attention (MSA): an indexer
(one head per KV head) picks top_k position blocks of block_size per token, local_blocks of them forced. llama.cpp
runs MSA only with flash attention; without it every block is dense. docs/dev/minimax-m3.md describes the family.

    python tests/support/synth_minimax_m3.py OUT.gguf [--vocab-from SOME.gguf] [--wtype f16] [--n-dense 4] [--top-k K]
"""

from __future__ import annotations

import sys

import gguf
import numpy as np
from synth_gguf import family_fields, family_parser, finish, scaled_ffn_tensors, start_header, tensor_writers

SIGMOID = 2  # LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID


def synth_minimax_m3(
    path,
    fields,
    *,
    n_embd=64,
    n_head=4,
    n_head_kv=2,
    head_dim=32,
    n_rot=16,
    rope_base=10000.0,
    n_layer=4,
    n_dense=1,
    n_ff=96,
    n_expert=8,
    n_expert_used=2,
    n_ff_exp=32,
    n_shared=1,
    weights_scale=2.5,
    weights_norm=True,
    gating=SIGMOID,
    idx_head=None,
    idx_dim=32,
    block_size=16,
    top_k=4,
    local_blocks=1,
    n_ctx_train=4096,
    wtype="f32",
    seed=0,
    fused_qkv=False,
) -> str:
    """A random-weight minimax-m3 GGUF of n_layer blocks: n_head query heads and n_head_kv K/V heads of head_dim
    (attention.key_length = value_length), RoPE over the first n_rot of each head. Blocks below n_dense have a dense
    FFN of n_ff and no indexer (always dense attention); the others n_expert experts of n_ff_exp (n_expert_used per
    token, expert_gating_func `gating`) plus n_shared shared experts, and an MSA indexer of idx_head heads (None:
    n_head_kv, which the graph asserts) of idx_dim with top_k blocks of block_size positions, local_blocks forced.
    n_dense = n_layer gives a file with no sparse block. wtype (f32, f16, q8_0, q4_0) is the type of the matmul
    weights; norms, the embedding, the router and exp_probs_b stay F32. Returns the path."""
    assert 0 <= n_dense <= n_layer and n_shared >= 1  # the shared expert tensors are required
    rng = np.random.default_rng(seed)
    U, F, B = gguf.GGUFValueType.UINT32, gguf.GGUFValueType.FLOAT32, gguf.GGUFValueType.BOOL
    n_vocab = next(len(v) for k, v, *_ in fields if k == "tokenizer.ggml.tokens")
    idx_head = n_head_kv if idx_head is None else idx_head

    w, key = start_header(path, "minimax-m3", n_layer, n_ctx_train, n_embd, n_ff, n_head, n_head_kv)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    key("rope.dimension_count", n_rot, U)
    key("rope.freq_base", float(rope_base), F)
    key("expert_count", n_expert, U)
    key("expert_used_count", n_expert_used, U)
    key("expert_feed_forward_length", n_ff_exp, U)
    key("expert_shared_count", n_shared, U)
    key("leading_dense_block_count", n_dense, U)
    key("expert_weights_scale", float(weights_scale), F)
    key("expert_weights_norm", bool(weights_norm), B)
    key("expert_gating_func", gating, U)
    key("attention.indexer.head_count", idx_head, U)
    key("attention.indexer.key_length", idx_dim, U)
    key("attention.indexer.top_k", top_k, U)
    key("attention.indexer.block_size", block_size, U)
    key("attention.indexer.local_blocks", local_blocks, U)
    for k, value, vtype, sub in fields:
        w.add_key_value(k, value, vtype, sub_type=sub)

    put, t, norm = tensor_writers(w, rng, wtype, n_embd)

    t("token_embd.weight", n_vocab, n_embd, scale=1.0)
    n_q, n_kv = n_head * head_dim, n_head_kv * head_dim
    for il in range(n_layer):
        p = f"blk.{il}."
        norm(p + "attn_norm.weight")
        qkv = [(rng.standard_normal((rows, n_embd)) * n_embd**-0.5).astype(np.float32) for rows in (n_q, n_kv, n_kv)]
        if fused_qkv:  # the same weights as one projection, as llama.cpp also loads them
            put(p + "attn_qkv.weight", np.concatenate(qkv))
        else:
            for x, a in zip("qkv", qkv):
                put(p + f"attn_{x}.weight", a)
        norm(p + "attn_q_norm.weight", head_dim)  # one head_dim vector for every head
        norm(p + "attn_k_norm.weight", head_dim)
        t(p + "attn_output.weight", n_embd, n_q, scale=n_q**-0.5)
        norm(p + "ffn_norm.weight")
        scaled_ffn_tensors(t, p, il < n_dense, n_embd, n_ff, n_expert, n_ff_exp, n_ff_exp * n_shared)
        if il < n_dense:  # the dense blocks have no indexer
            continue
        t(p + "indexer.q_proj.weight", idx_head * idx_dim, n_embd, scale=n_embd**-0.5)
        t(p + "indexer.k_proj.weight", idx_dim, n_embd, scale=n_embd**-0.5)
        norm(p + "indexer.q_norm.weight", idx_dim)
        norm(p + "indexer.k_norm.weight", idx_dim)
    norm("output_norm.weight")
    t("output.weight", n_vocab, n_embd, scale=n_embd**-0.5)
    return finish(w, path)


def main(argv=None) -> int:
    ap = family_parser(__doc__)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--top-k", type=int, default=4)
    ap.add_argument("--local-blocks", type=int, default=1)
    ap.add_argument("--n-dense", type=int, default=1, help="leading dense blocks (4: no MSA block)")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    fields = family_fields(a)
    kw = dict(block_size=a.block_size, top_k=a.top_k, local_blocks=a.local_blocks, n_dense=a.n_dense)
    print(synth_minimax_m3(a.out, fields, wtype=a.wtype, seed=a.seed, **kw))
    return 0


if __name__ == "__main__":
    sys.exit(main())
