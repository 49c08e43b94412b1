"""A small random-weight glm5-next (GLM-5.3-Flash) GGUF laid out as the pinned llama.cpp loads it
(src/models/glm5-next.cpp, load_arch_hparams / load_arch_tensors; the pinned tree has no converter, so the key
and tensor spellings are llama-arch.cpp's): KDA (kimi delta attention, recurrent) blocks with a low-rank output
gate and nope-only MLA blocks made sparse by a k-pool DSA indexer, picked by a per-block head_count_kv (0: KDA);
4 mHC residual streams (hc_attn_* / hc_ffn_* mixers, Sinkhorn-normalized); a leading dense FFN, then a
DeepSeek-style MoE (sigmoid routing with exp_probs_b, a shared expert) with optional SwiGLU clamps; an optional
NextN (MTP) block. docs/dev/glm5-next.md describes the family.

    python tests/support/synth_glm5_next.py OUT.gguf [--vocab-from SOME.gguf] [--wtype f16] [--mtp]
"""

from __future__ import annotations

import sys

import gguf
import numpy as np
from synth_gguf import family_fields, family_parser, finish, start_header, tensor_writers

SIGMOID = 2  # LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID, also llama.cpp's default for this family
HC = 4  # hyper_connection.count: llama.cpp asserts 4


def synth_glm5_next(
    path,
    fields,
    *,
    n_embd=64,
    n_head=4,
    n_layer=4,
    mla_layers=(1, 3),
    shared_indexer=(3,),
    kda_head_dim=16,
    d_conv=4,
    gate_lower_bound=-5.0,
    q_lora_rank=32,
    kv_lora_rank=32,
    qk_head_dim=24,
    v_head_dim=16,
    n_rot=0,
    indexer=(2, 16, 16),
    kpool=4,
    select_tail=True,
    hc_iters=20,
    hc_eps=1e-6,
    n_dense=1,
    n_ff=96,
    n_expert=8,
    n_expert_used=2,
    n_ff_exp=32,
    n_shared=1,
    weights_scale=2.5,
    weights_norm=True,
    gating=SIGMOID,
    swiglu_limit=(7.0, None),
    norm_eps=1e-6,
    mtp=False,
    n_ctx_train=1024,
    wtype="f32",
    seed=0,
) -> str:
    """A random-weight glm5-next GGUF of n_layer trunk blocks: those in mla_layers MLA (head_count_kv 1; n_head
    heads of qk_head_dim for Q.K, none roped (n_rot: rope.dimension_count, which llama.cpp requires to be 0; None:
    unwritten), v_head_dim for V, over a kv_lora_rank latent; queries through q_lora_rank), the others KDA
    (head_count_kv 0; n_head heads of kda_head_dim, causal convs of d_conv; gate_lower_bound None: the softplus
    decay). Each MLA block has an indexer of indexer = (heads, key length, top_k) over pools of kpool tokens
    (select_tail: the unpooled tail is always attended); those in shared_indexer reuse the previous full one's
    choice and have no indexer tensors (attention.indexer.types 0; () writes no types key). hc_iters, hc_eps: the
    mHC Sinkhorn iterations and epsilon. The first n_dense blocks have a dense FFN of n_ff, the rest n_expert
    experts of n_ff_exp (n_expert_used per token) plus n_shared shared ones; gating: expert_gating_func (None:
    unwritten, sigmoid). swiglu_limit: (swiglu_clamp_exp, swiglu_clamp_shexp), each per block or None
    (unwritten; shexp then follows exp). norm_eps: attention.layer_norm_epsilon of the indexer's key norm (None:
    unwritten, 0). mtp: one NextN block after the trunk (nextn_predict_layers 1; an MLA block with a full
    indexer). wtype (f32, f16, q8_0, q4_0) is the type of the matmul weights llama-quantize would quantize
    (attn_q_a/attn_q_b at least Q8_0); norms, the embedding, routers, convs, mHC mixers, indexer weights, the
    KDA gate projections and the latent K/V projections stay F32. Returns the path."""
    assert all(0 <= il < n_layer for il in mla_layers) and n_dense <= n_layer
    assert set(shared_indexer) <= set(mla_layers)
    rng = np.random.default_rng(seed)
    U, F, B = gguf.GGUFValueType.UINT32, gguf.GGUFValueType.FLOAT32, gguf.GGUFValueType.BOOL
    A = gguf.GGUFValueType.ARRAY
    n_vocab = next(len(v) for k, v, *_ in fields if k == "tokenizer.ggml.tokens")
    n_all = n_layer + int(mtp)
    mla = [il in mla_layers or il >= n_layer for il in range(n_all)]
    n_idx_head, d_idx, top_k = indexer
    Dq, Di, Dk = qk_head_dim, n_head * kda_head_dim, kda_head_dim

    w, key = start_header(path, "glm5-next", n_all, n_ctx_train, n_embd, n_ff, n_head, [int(m) for m in mla])
    w.add_layer_norm_rms_eps(1e-5)
    if norm_eps is not None:
        key("attention.layer_norm_epsilon", float(norm_eps), F)
    key("expert_count", n_expert, U)
    key("expert_used_count", n_expert_used, U)
    key("vocab_size", n_vocab, U)
    if mtp:
        key("nextn_predict_layers", 1, U)
    key("ssm.conv_kernel", d_conv, U)
    key("kda.head_dim", kda_head_dim, U)
    if gate_lower_bound is not None:
        key("kda.gate_lower_bound", float(gate_lower_bound), F)
    key("attention.q_lora_rank", q_lora_rank, U)
    key("attention.kv_lora_rank", kv_lora_rank, U)
    if n_rot is not None:
        key("rope.dimension_count", n_rot, U)
    w.add_key_length(kv_lora_rank + (n_rot or 0))  # the cached latent row
    w.add_value_length(kv_lora_rank)
    key("attention.key_length_mla", Dq, U)
    key("attention.value_length_mla", v_head_dim, U)
    key("expert_feed_forward_length", n_ff_exp, U)
    key("expert_shared_count", n_shared, U)
    key("leading_dense_block_count", n_dense, U)
    key("expert_weights_scale", float(weights_scale), F)
    key("expert_weights_norm", bool(weights_norm), B)
    if gating is not None:
        key("expert_gating_func", gating, U)
    for name, limit in zip(("swiglu_clamp_exp", "swiglu_clamp_shexp"), swiglu_limit):
        if limit is not None:
            w.add_key_value(f"glm5-next.{name}", [float(limit)] * n_all, A, sub_type=F)
    key("attention.indexer.head_count", n_idx_head, U)
    key("attention.indexer.key_length", d_idx, U)
    key("attention.indexer.top_k", top_k, U)
    key("attention.indexer.kpool", kpool, U)
    key("attention.indexer.kpool_select_tail", bool(select_tail), B)
    if shared_indexer != ():  # read over the trunk's blocks only (n_layer entries, not block_count)
        types = [0 if il in shared_indexer else 1 for il in range(n_layer)]
        w.add_key_value("glm5-next.attention.indexer.types", types, A, sub_type=U)
    key("hyper_connection.count", HC, U)
    key("hyper_connection.sinkhorn_iterations", hc_iters, U)
    key("hyper_connection.epsilon", float(hc_eps), F)
    for k, value, vtype, sub in fields:
        w.add_key_value(k, value, vtype, sub_type=sub)

    put, t, norm = tensor_writers(w, rng, wtype, n_embd)
    t8 = tensor_writers(w, rng, "q8_0" if wtype == "q4_0" else wtype, n_embd)[1]

    def f32(name, *shape, scale):  # tensors llama-quantize leaves alone for glm5-next
        w.add_tensor(name, (rng.standard_normal(shape) * scale).astype(np.float32))

    t("token_embd.weight", n_vocab, n_embd, scale=1.0)
    norm("output_norm.weight")
    t("output.weight", n_vocab, n_embd, scale=n_embd**-0.5)
    mix = (2 + HC) * HC
    for il in range(n_all):
        p = f"blk.{il}."
        norm(p + "attn_norm.weight")
        norm(p + "ffn_norm.weight")
        if il < n_layer:
            for x in ("attn", "ffn"):
                f32(p + f"hc_{x}_fn.weight", mix, HC * n_embd, scale=0.5 * (HC * n_embd) ** -0.5)
                f32(p + f"hc_{x}_base.weight", mix, scale=0.5)
                f32(p + f"hc_{x}_scale.weight", 3, scale=0.3)
        if not mla[il]:
            for x in "qkv":  # ggml {d_conv, 1, d_inner, 1}
                f32(p + f"ssm_conv1d_{x}.weight", 1, Di, 1, d_conv, scale=0.5)
            for x in "qkv":
                t(p + f"attn_{x}.weight", Di, n_embd, scale=n_embd**-0.5)
            f32(p + "ssm_f_a.weight", Dk, n_embd, scale=n_embd**-0.5)
            f32(p + "ssm_f_b.weight", Di, Dk, scale=Dk**-0.5)
            f32(p + "ssm_beta.weight", n_head, n_embd, scale=n_embd**-0.5)
            w.add_tensor(p + "ssm_a", (-np.exp(rng.standard_normal(n_head) * 0.5)).astype(np.float32))  # -exp(A_log)
            f32(p + "ssm_dt.bias", Di, scale=0.5)
            f32(p + "ssm_g_a.weight", Dk, n_embd, scale=n_embd**-0.5)
            f32(p + "ssm_g_b.weight", Di, Dk, scale=Dk**-0.5)
            norm(p + "ssm_norm.weight", Dk)
            t(p + "attn_output.weight", n_embd, Di, scale=Di**-0.5)
        else:
            nope = Dq - (n_rot or 0)
            norm(p + "attn_q_a_norm.weight", q_lora_rank)
            norm(p + "attn_kv_a_norm.weight", kv_lora_rank)
            t8(p + "attn_q_a.weight", q_lora_rank, n_embd, scale=n_embd**-0.5)
            t8(p + "attn_q_b.weight", n_head * Dq, q_lora_rank, scale=q_lora_rank**-0.5)
            f32(p + "attn_kv_a_mqa.weight", kv_lora_rank + (n_rot or 0), n_embd, scale=n_embd**-0.5)
            # absorbed layout: k_b {nope, kv_lora_rank, n_head}, v_b {kv_lora_rank, v, n_head}
            f32(p + "attn_k_b.weight", n_head, kv_lora_rank, nope, scale=kv_lora_rank**-0.5)
            f32(p + "attn_v_b.weight", n_head, v_head_dim, kv_lora_rank, scale=kv_lora_rank**-0.5)
            t(p + "attn_output.weight", n_embd, n_head * v_head_dim, scale=(n_head * v_head_dim) ** -0.5)
            if il >= n_layer or il not in shared_indexer:
                norm(p + "indexer.k_norm.weight", d_idx)
                f32(p + "indexer.k_norm.bias", d_idx, scale=0.1)
                f32(p + "indexer.proj.weight", n_idx_head, n_embd, scale=n_embd**-0.5)
                f32(p + "indexer.attn_k.weight", d_idx, n_embd, scale=n_embd**-0.5)
                f32(p + "indexer.attn_q_b.weight", n_idx_head * d_idx, q_lora_rank, scale=q_lora_rank**-0.5)
                f32(p + "indexer_compressor_gate.weight", d_idx, n_embd, scale=n_embd**-0.5)
                f32(p + "indexer_compressor_ape.weight", kpool, d_idx, scale=0.3)
        if il < n_dense:
            t(p + "ffn_gate.weight", n_ff, n_embd, scale=n_embd**-0.5)
            t(p + "ffn_down.weight", n_embd, n_ff, scale=n_ff**-0.5)
            t(p + "ffn_up.weight", n_ff, n_embd, scale=n_embd**-0.5)
        else:
            n_sh = n_ff_exp * n_shared
            f32(p + "ffn_gate_inp.weight", n_expert, n_embd, scale=n_embd**-0.5)
            f32(p + "exp_probs_b.bias", n_expert, scale=0.1)
            t(p + "ffn_gate_exps.weight", n_expert, n_ff_exp, n_embd, scale=n_embd**-0.5)
            t(p + "ffn_down_exps.weight", n_expert, n_embd, n_ff_exp, scale=n_ff_exp**-0.5)
            t(p + "ffn_up_exps.weight", n_expert, n_ff_exp, n_embd, scale=n_embd**-0.5)
            if n_shared:  # llama.cpp requires them: 0 only to try that
                t(p + "ffn_gate_shexp.weight", n_sh, n_embd, scale=n_embd**-0.5)
                t(p + "ffn_down_shexp.weight", n_embd, n_sh, scale=n_sh**-0.5)
                t(p + "ffn_up_shexp.weight", n_sh, n_embd, scale=n_embd**-0.5)
        if il >= n_layer:
            t8(p + "nextn.eh_proj.weight", n_embd, 2 * n_embd, scale=(2 * n_embd) ** -0.5)
            norm(p + "nextn.enorm.weight")
            norm(p + "nextn.hnorm.weight")
            norm(p + "nextn.shared_head_norm.weight")
    return finish(w, path)


def main(argv=None) -> int:
    ap = family_parser(__doc__)
    ap.add_argument("--mtp", action="store_true", help="add the NextN block")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    fields = family_fields(a)
    print(synth_glm5_next(a.out, fields, wtype=a.wtype, mtp=a.mtp, seed=a.seed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
