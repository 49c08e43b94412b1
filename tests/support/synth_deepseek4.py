"""A small random-weight deepseek4 (DeepSeek V4) GGUF laid out as llama.cpp's converter writes one and as the
pinned llama.cpp loads it (src/models/deepseek4.cpp, load_arch_hparams / load_arch_tensors): hyper-connections
(4 residual streams), a sliding-window raw attention with one shared K=V head and sinks, compressed K/V on some
blocks (ratio 4: CSA with the lightning indexer, ratio 128: HCA), hash-routed leading MoE blocks (a token-id to
expert-id table), sqrt-softplus routing with a selection bias elsewhere, a shared expert, SwiGLU clamping and one
MTP (nextn) block. docs/dev/deepseek4.md describes the family.

    python tests/support/synth_deepseek4.py OUT.gguf [--vocab-from SOME.gguf]
"""

from __future__ import annotations

import sys

import gguf
import numpy as np
from synth_gguf import family_fields, family_parser, finish, start_header, tensor_writers

SQRT_SOFTPLUS = 4  # LLAMA_EXPERT_GATING_FUNC_TYPE_SQRT_SOFTPLUS, the only scoring llama.cpp accepts for deepseek4
CSA, HCA = 4, 128  # the compression ratios llama.cpp knows (0: a block without compression)


def synth_deepseek4(
    path,
    fields,
    *,
    n_embd=64,
    n_head=4,
    head_dim=128,
    n_rot=16,
    q_lora_rank=64,
    o_groups=2,
    o_lora_rank=32,
    n_swa=32,
    compress_ratios=(0, CSA, HCA, CSA),
    n_hash=2,
    mtp=True,
    n_expert=8,
    n_expert_used=2,
    n_ff_exp=32,
    n_shared=1,
    indexer=(4, 64, 8),
    hc_iters=20,
    hc_eps=1e-6,
    swiglu_limit=1.0,
    weights_scale=1.5,
    weights_norm=True,
    rope_base=10000.0,
    compress_rope_base=160000.0,
    yarn=(4.0, 256),
    n_ctx_train=1024,
    wtype="f32",
    seed=0,
) -> str:
    """A random-weight deepseek4 GGUF: len(compress_ratios) trunk blocks (0: raw sliding-window attention only,
    4: plus the overlapped CSA compressor and the lightning indexer, 128: plus the HCA compressor), the first
    n_hash of them hash-routed (blk.N.ffn_gate_tid2eid), the others routed by sqrt-softplus + exp_probs_b; mtp:
    one nextn block after them (ratio 0, as llama.cpp's MTP graph requires). Keep a ratio-4 block: without one
    llama.cpp dies (SIGFPE) creating its context. indexer: (heads, head size, top k);
    its head size must be a multiple of 64 (llama.cpp's Hadamard rotation of the indexer keys) and should differ
    from head_dim (equal sizes also rotate the attention caches, which the real model does not). yarn: (factor,
    original context) or None: the YaRN keys, applied by llama.cpp to the compressed blocks only. wtype (f32,
    f16, q8_0, q4_0) is the type of the matmul weights; norms, the embedding, the router, the hyper-connection
    and position-bias tensors stay F32 and the tid2eid table I32. Returns the path."""
    assert n_head % o_groups == 0 and head_dim >= n_rot and indexer[1] >= n_rot and indexer[1] % 64 == 0
    assert all(r in (0, CSA, HCA) for r in compress_ratios) and n_hash <= len(compress_ratios)
    rng = np.random.default_rng(seed)
    U, F, B = gguf.GGUFValueType.UINT32, gguf.GGUFValueType.FLOAT32, gguf.GGUFValueType.BOOL
    n_layer = len(compress_ratios)
    ratios = [int(r) for r in compress_ratios] + ([0] if mtp else [])
    n_all = len(ratios)
    n_vocab = next(len(v) for k, v, *_ in fields if k == "tokenizer.ggml.tokens")
    hc = 4  # hyper_connection.count: llama.cpp's graph asserts 4

    # TextModel.set_gguf_parameters (num_key_value_heads forced to 1: one shared K=V head), then DeepseekV4Model's
    w, key = start_header(path, "deepseek4", n_all, n_ctx_train, n_embd, n_ff_exp, n_head, 1)
    if yarn:
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(float(yarn[0]))
        w.add_rope_scaling_orig_ctx_len(int(yarn[1]))
        w.add_rope_scaling_yarn_beta_fast(32.0)
        w.add_rope_scaling_yarn_beta_slow(1.0)
    w.add_rope_freq_base(rope_base)
    w.add_layer_norm_rms_eps(1e-6)
    key("expert_used_count", n_expert_used, U)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    key("expert_gating_func", SQRT_SOFTPLUS, U)
    key("vocab_size", n_vocab, U)
    key("rope.dimension_count", n_rot, U)
    key("attention.q_lora_rank", q_lora_rank, U)
    key("attention.output_lora_rank", o_lora_rank, U)
    key("attention.output_group_count", o_groups, U)
    w.add_array("deepseek4.attention.compress_ratios", ratios)  # INT32, as gguf-py's add_array writes ints
    key("attention.compress_rope_freq_base", float(compress_rope_base), F)
    key("expert_feed_forward_length", n_ff_exp, U)
    key("expert_count", n_expert, U)
    key("expert_shared_count", n_shared, U)
    key("expert_weights_scale", float(weights_scale), F)
    key("hash_layer_count", n_hash, U)
    if mtp:
        key("nextn_predict_layers", 1, U)
    key("expert_weights_norm", bool(weights_norm), B)
    w.add_array("deepseek4.swiglu_clamp_exp", [float(swiglu_limit)] * n_all)  # required by llama.cpp
    key("attention.sliding_window", n_swa, U)
    key("attention.indexer.head_count", indexer[0], U)
    key("attention.indexer.key_length", indexer[1], U)
    key("attention.indexer.top_k", indexer[2], U)
    key("hyper_connection.count", hc, U)
    key("hyper_connection.sinkhorn_iterations", hc_iters, U)
    key("hyper_connection.epsilon", float(hc_eps), F)
    for k, value, vtype, sub in fields:
        w.add_key_value(k, value, vtype, sub_type=sub)

    put, t, norm = tensor_writers(w, rng, wtype, n_embd)

    # the converter writes the tid2eid tables and the merged routed experts first, then the rest
    for il in range(min(n_hash, n_layer)):  # ggml {n_expert_used, n_vocab}: distinct experts per token
        table = np.argsort(rng.random((n_vocab, n_expert)), axis=1)[:, :n_expert_used].astype(np.int32)
        put(f"blk.{il}.ffn_gate_tid2eid.weight", table)
    for il in range(n_all):
        p = f"blk.{il}."
        t(p + "ffn_gate_exps.weight", n_expert, n_ff_exp, n_embd, scale=n_embd**-0.5)
        t(p + "ffn_down_exps.weight", n_expert, n_embd, n_ff_exp, scale=n_ff_exp**-0.5)
        t(p + "ffn_up_exps.weight", n_expert, n_ff_exp, n_embd, scale=n_embd**-0.5)

    t("token_embd.weight", n_vocab, n_embd, scale=1.0)
    dims = dict(
        n_embd=n_embd,
        n_head=n_head,
        head_dim=head_dim,
        q_lora_rank=q_lora_rank,
        o_groups=o_groups,
        o_lora_rank=o_lora_rank,
        hc=hc,
        indexer=indexer,
        n_expert=n_expert,
        n_ff_exp=n_ff_exp,
        n_shared=n_shared,
    )
    for il in range(n_all):
        block_tensors(t, norm, f"blk.{il}.", ratios[il], il < n_hash, il >= n_layer, dims)
    norm("output_norm.weight")
    t("output.weight", n_vocab, n_embd, scale=n_embd**-0.5)
    t("output_hc_fn.weight", hc, hc * n_embd, scale=0.5 * (hc * n_embd) ** -0.5)
    t("output_hc_base.weight", hc, scale=0.5)
    put("output_hc_scale.weight", np.array([1.0 + 0.1 * rng.standard_normal()], dtype=np.float32))
    return finish(w, path)


def block_tensors(t, norm, p, ratio, hashed, is_mtp, d):
    """Block p's tensors (d: synth_deepseek4's dimensions) but the routed experts and the tid2eid table."""
    n_embd, n_head, hd, qr = d["n_embd"], d["n_head"], d["head_dim"], d["q_lora_rank"]
    hc, mix = d["hc"], (2 + d["hc"]) * d["hc"]
    t(p + "hc_attn_fn.weight", mix, hc * n_embd, scale=0.5 * (hc * n_embd) ** -0.5)
    t(p + "hc_attn_base.weight", mix, scale=0.5)
    t(p + "hc_attn_scale.weight", 3, scale=0.3)
    norm(p + "attn_norm.weight")
    t(p + "attn_sinks.weight", n_head, scale=0.5)
    t(p + "attn_q_a.weight", qr, n_embd, scale=n_embd**-0.5)
    norm(p + "attn_q_a_norm.weight", qr)
    t(p + "attn_q_b.weight", n_head * hd, qr, scale=qr**-0.5)
    t(p + "attn_kv.weight", hd, n_embd, scale=n_embd**-0.5)
    norm(p + "attn_kv_a_norm.weight", hd)
    # as in the file: {n_head * head_dim / o_groups, o_groups * o_lora_rank}; llama.cpp views it 3-D
    t(p + "attn_output_a.weight", d["o_groups"] * d["o_lora_rank"], n_head * hd // d["o_groups"], scale=0.05)
    t(p + "attn_output_b.weight", n_embd, d["o_groups"] * d["o_lora_rank"], scale=0.1)
    if ratio:
        coff = 2 if ratio == CSA else 1  # the overlapped (CSA) compressor projects a previous and a current half
        t(p + "attn_compressor_kv.weight", coff * hd, n_embd, scale=n_embd**-0.5)
        t(p + "attn_compressor_gate.weight", coff * hd, n_embd, scale=n_embd**-0.5)
        t(p + "attn_compressor_ape.weight", ratio, coff * hd, scale=0.3)
        norm(p + "attn_compressor_norm.weight", hd)
    if ratio == CSA:
        n_idx, d_idx, _ = d["indexer"]
        t(p + "indexer.attn_q_b.weight", n_idx * d_idx, qr, scale=qr**-0.5)
        t(p + "indexer.proj.weight", n_idx, n_embd, scale=n_embd**-0.5)
        t(p + "indexer_compressor_kv.weight", 2 * d_idx, n_embd, scale=n_embd**-0.5)
        t(p + "indexer_compressor_gate.weight", 2 * d_idx, n_embd, scale=n_embd**-0.5)
        t(p + "indexer_compressor_ape.weight", ratio, 2 * d_idx, scale=0.3)
        norm(p + "indexer_compressor_norm.weight", d_idx)
    t(p + "hc_ffn_fn.weight", mix, hc * n_embd, scale=0.5 * (hc * n_embd) ** -0.5)
    t(p + "hc_ffn_base.weight", mix, scale=0.5)
    t(p + "hc_ffn_scale.weight", 3, scale=0.3)
    norm(p + "ffn_norm.weight")
    t(p + "ffn_gate_inp.weight", d["n_expert"], n_embd, scale=0.5)
    if not hashed:
        t(p + "exp_probs_b.bias", d["n_expert"], scale=0.1)
    n_sh = d["n_ff_exp"] * d["n_shared"]
    t(p + "ffn_gate_shexp.weight", n_sh, n_embd, scale=n_embd**-0.5)
    t(p + "ffn_up_shexp.weight", n_sh, n_embd, scale=n_embd**-0.5)
    t(p + "ffn_down_shexp.weight", n_embd, n_sh, scale=n_sh**-0.5)
    if is_mtp:  # eh_proj: [e_proj | h_proj] on [enorm(embedding); hnorm(hidden)]; embedding and head shared
        t(p + "nextn.eh_proj.weight", n_embd, 2 * n_embd, scale=(2 * n_embd) ** -0.5)
        norm(p + "nextn.enorm.weight")
        norm(p + "nextn.hnorm.weight")
        norm(p + "nextn.shared_head_norm.weight")


def main(argv=None) -> int:
    ap = family_parser(__doc__, wtype=False)
    a = ap.parse_args(argv)
    print(synth_deepseek4(a.out, family_fields(a)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
