"""A small random-weight dots3note (dots3-note) GGUF laid out as the pinned llama.cpp loads it
(src/models/dots3note.cpp, load_arch_hparams / load_arch_tensors). The pinned tree and the installed gguf-py have
no dots3note converter: key spellings come from src/llama-arch.cpp, the writing order follows DeepseekV2Model's.
Absorbed MLA in every block (attn_k_b / attn_v_b, an RMS norm on the shared rope key, a head-wise sigmoid
gate), full-attention blocks with a lightning indexer (DeepSeek sparse attention), sliding-window blocks with
their own kv_lora_rank and head sizes and no indexer, a leading dense FFN, then sigmoid-routed experts with
exp_probs_b and shared experts. docs/dev/dots3note.md describes the family.

    python tests/support/synth_dots3note.py OUT.gguf [--vocab-from SOME.gguf] [--wtype f16]
"""

from __future__ import annotations

import sys

import gguf
import numpy as np
from synth_gguf import family_fields, family_parser, finish, scaled_ffn_tensors, start_header, tensor_writers

SIGMOID = 2  # LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID


def synth_dots3note(
    path,
    fields,
    *,
    n_embd=64,
    n_head=4,
    n_head_swa=None,
    n_layer=4,
    swa_layers=(1, 2),
    indexer_types=None,
    n_swa=32,
    q_lora_rank=32,
    kv_lora_rank=32,
    qk_nope=16,
    v_head_dim=16,
    kv_lora_rank_swa=16,
    qk_nope_swa=8,
    v_head_dim_swa=8,
    qk_rope=8,
    rope_base=50000.0,
    rope_base_swa=10000.0,
    indexer_heads=4,
    indexer_dim=64,
    top_k=16,
    n_dense=1,
    n_ff=96,
    n_expert=8,
    n_expert_used=2,
    n_ff_exp=32,
    n_shared=1,
    gating=SIGMOID,
    weights_scale=2.5,
    weights_norm=True,
    n_mtp=0,
    tied=False,
    n_ctx_train=1024,
    wtype="f32",
    seed=0,
) -> str:
    """A random-weight dots3note GGUF of n_layer blocks (plus n_mtp NextN blocks, which llama.cpp skips).

    Blocks in swa_layers attend over a window of n_swa tokens with MLA of kv_lora_rank_swa, qk_nope_swa + qk_rope
    (Q.K) and v_head_dim_swa (V); the others with kv_lora_rank, qk_nope + qk_rope and v_head_dim, and a lightning
    indexer of indexer_heads heads of indexer_dim (a power of 2, at least 64) picking each query's top_k keys.
    indexer_types: attention.indexer.types per block (None: 1 in the full blocks, 0 in the sliding ones); a block
    whose entry is 0 gets no indexer tensors. n_head_swa: the sliding blocks' head count (head_count becomes an
    array). The first n_dense blocks have a dense FFN of n_ff, the rest n_expert experts of n_ff_exp (n_expert_used
    per token, `gating` 1 softmax / 2 sigmoid, exp_probs_b) and n_shared shared ones (0: none written, which
    llama.cpp refuses). tied: no output.weight. wtype (f32, f16, q8_0, q4_0) is the type of the matmul weights;
    norms, the embedding, the router, the indexer's proj and the biases stay F32. Returns the path."""
    assert all(0 <= il < n_layer for il in swa_layers) and n_dense <= n_layer
    rng = np.random.default_rng(seed)
    U, F, B = gguf.GGUFValueType.UINT32, gguf.GGUFValueType.FLOAT32, gguf.GGUFValueType.BOOL
    n_vocab = next(len(v) for k, v, *_ in fields if k == "tokenizer.ggml.tokens")
    n_all = n_layer + n_mtp
    is_swa = [il in swa_layers or il >= n_layer for il in range(n_all)]  # the MTP block has the sliding geometry
    if indexer_types is None:
        indexer_types = [not s for s in is_swa[:n_layer]]
    heads = [n_head_swa if (n_head_swa and is_swa[il]) else n_head for il in range(n_all)]

    arch = "dots3note"
    w, key = start_header(path, arch, n_all, n_ctx_train, n_embd, n_ff, heads if n_head_swa else n_head, 1)
    w.add_rope_freq_base(rope_base)
    w.add_layer_norm_rms_eps(1e-6)
    key("expert_count", n_expert, U)
    key("expert_used_count", n_expert_used, U)
    key("expert_gating_func", gating, U)
    key("leading_dense_block_count", n_dense, U)
    key("vocab_size", n_vocab, U)
    key("attention.q_lora_rank", q_lora_rank, U)
    key("attention.kv_lora_rank", kv_lora_rank, U)
    key("attention.key_length", kv_lora_rank + qk_rope, U)  # the cached latent row of a full block
    key("attention.value_length", kv_lora_rank, U)
    key("attention.key_length_mla", qk_nope + qk_rope, U)
    key("attention.value_length_mla", v_head_dim, U)
    key("attention.kv_lora_rank_swa", kv_lora_rank_swa, U)
    key("attention.key_length_swa", kv_lora_rank_swa + qk_rope, U)  # a sliding block's
    key("attention.value_length_swa", kv_lora_rank_swa, U)
    key("attention.key_length_mla_swa", qk_nope_swa + qk_rope, U)
    key("attention.value_length_mla_swa", v_head_dim_swa, U)
    key("expert_feed_forward_length", n_ff_exp, U)
    key("expert_shared_count", n_shared, U)
    key("expert_weights_scale", float(weights_scale), F)
    key("expert_weights_norm", bool(weights_norm), B)
    key("rope.dimension_count", qk_rope, U)
    key("attention.sliding_window", n_swa, U)
    w.add_array(f"{arch}.attention.sliding_window_pattern", [bool(s) for s in is_swa])
    key("rope.freq_base_swa", float(rope_base_swa), F)
    key("attention.indexer.head_count", indexer_heads, U)
    key("attention.indexer.key_length", indexer_dim, U)
    key("attention.indexer.top_k", top_k, U)
    w.add_array(f"{arch}.attention.indexer.types", [bool(x) for x in indexer_types])
    if n_mtp:
        key("nextn_predict_layers", n_mtp, U)
    for k, value, vtype, sub in fields:
        w.add_key_value(k, value, vtype, sub_type=sub)

    put, t, norm = tensor_writers(w, rng, wtype, n_embd)
    t("token_embd.weight", n_vocab, n_embd, scale=1.0)
    for il in range(n_all):
        p, h, swa = f"blk.{il}.", heads[il], is_swa[il]
        kv_lora = kv_lora_rank_swa if swa else kv_lora_rank
        nope = qk_nope_swa if swa else qk_nope
        v_dim = v_head_dim_swa if swa else v_head_dim
        norm(p + "attn_norm.weight")
        t(p + "attn_q_a.weight", q_lora_rank, n_embd, scale=n_embd**-0.5)
        norm(p + "attn_q_a_norm.weight", q_lora_rank)
        t(p + "attn_q_b.weight", h * (nope + qk_rope), q_lora_rank, scale=q_lora_rank**-0.5)
        t(p + "attn_kv_a_mqa.weight", kv_lora + qk_rope, n_embd, scale=n_embd**-0.5)  # latent | shared rope key
        norm(p + "attn_kv_a_norm.weight", kv_lora)
        norm(p + "attn_k_norm.weight", qk_rope)
        t(p + "attn_k_b.weight", h, kv_lora, nope, scale=kv_lora**-0.5)  # ggml {nope, kv_lora, h}
        t(p + "attn_v_b.weight", h, v_dim, kv_lora, scale=kv_lora**-0.5)  # ggml {kv_lora, v, h}
        t(p + "attn_gate.weight", h, n_embd, scale=n_embd**-0.5)  # one gate per head
        t(p + "attn_output.weight", n_embd, h * v_dim, scale=(h * v_dim) ** -0.5)
        norm(p + "ffn_norm.weight")
        if il < n_layer and indexer_types[il]:
            norm(p + "indexer.k_norm.weight", indexer_dim)
            t(p + "indexer.k_norm.bias", indexer_dim, scale=0.1)
            t(p + "indexer.proj.weight", indexer_heads, n_embd, scale=n_embd**-0.5)
            t(p + "indexer.attn_k.weight", indexer_dim, n_embd, scale=n_embd**-0.5)
            t(p + "indexer.attn_q_b.weight", indexer_heads * indexer_dim, q_lora_rank, scale=q_lora_rank**-0.5)
        # shared experts: llama.cpp requires them, n_shared 0 makes a file it refuses
        dense = il < n_dense or il >= n_layer
        scaled_ffn_tensors(t, p, dense, n_embd, n_ff, n_expert, n_ff_exp, n_ff_exp * n_shared)
        if il >= n_layer:  # NextN block: loaded with TENSOR_SKIP, no graph uses it
            t(p + "nextn.eh_proj.weight", n_embd, 2 * n_embd, scale=(2 * n_embd) ** -0.5)
            norm(p + "nextn.enorm.weight")
            norm(p + "nextn.hnorm.weight")
            t(p + "nextn.embed_tokens.weight", n_vocab, n_embd, scale=1.0)
            norm(p + "nextn.shared_head_norm.weight")
    norm("output_norm.weight")
    if not tied:
        t("output.weight", n_vocab, n_embd, scale=n_embd**-0.5)
    return finish(w, path)


def main(argv=None) -> int:
    ap = family_parser(__doc__)
    ap.add_argument("--top-k", type=int, default=16)
    ap.add_argument("--swa-layers", default="1,2", help="comma-separated sliding-window blocks (default 1,2)")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    swa = tuple(int(x) for x in a.swa_layers.split(",") if x)
    fields = family_fields(a)
    print(synth_dots3note(a.out, fields, wtype=a.wtype, top_k=a.top_k, swa_layers=swa, seed=a.seed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
