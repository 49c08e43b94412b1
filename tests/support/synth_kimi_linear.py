"""A small random-weight kimi-linear (Kimi-Linear) GGUF laid out as upstream llama.cpp's converter
(KimiLinearModel, not in the pinned tree) writes one and as the pinned llama.cpp loads it
(src/models/kimi-linear.cpp): KDA (kimi delta attention, recurrent) blocks and nope-only MLA blocks, picked by a
per-block head_count_kv (0: KDA), plain pre-norm residuals, a leading dense SwiGLU FFN, then a sigmoid-routed MoE
with exp_probs_b and shared experts. docs/dev/kimi-linear.md describes the family.

    python tests/support/synth_kimi_linear.py OUT.gguf [--vocab-from SOME.gguf]
"""

from __future__ import annotations

import sys

import gguf
import numpy as np
from synth_gguf import family_fields, family_parser, finish, scaled_ffn_tensors, start_header, tensor_writers

SIGMOID = 2  # LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID: moe_router_activation_func "sigmoid"


def synth_kimi_linear(
    path,
    fields,
    *,
    n_embd=64,
    n_head=4,
    mla_layers=(1, 3),
    n_layer=4,
    kda_head_dim=32,
    d_conv=4,
    fused_qkv=False,
    q_lora_rank=None,
    kv_lora_rank=32,
    qk_nope=16,
    qk_rope=8,
    v_head_dim=16,
    legacy_kv_b=False,
    n_dense=1,
    n_ff=96,
    n_expert=8,
    n_expert_used=2,
    n_ff_exp=32,
    n_shared=1,
    weights_scale=2.5,
    gating=SIGMOID,
    n_ctx_train=1024,
    wtype="f32",
    seed=0,
) -> str:
    """A random-weight kimi-linear GGUF of n_layer blocks: those in mla_layers MLA (head_count_kv 1; n_head heads
    of qk_nope + qk_rope for Q·K, none of them roped, v_head_dim for V, over a kv_lora_rank latent; q_lora_rank
    None: one attn_q, else attn_q_a/attn_q_a_norm/attn_q_b, which the pinned llama.cpp refuses; legacy_kv_b: one
    attn_kv_b and the MHA-cache metadata (key/value_length_mla 0, head_count_kv n_head) instead of attn_k_b/attn_v_b),
    the others KDA (head_count_kv 0; n_head heads of kda_head_dim, causal convs of d_conv; fused_qkv: one attn_qkv
    instead of attn_q/k/v, the same weights). The first n_dense blocks have a dense FFN of n_ff, the rest n_expert experts of n_ff_exp
    (n_expert_used per token) plus n_shared shared experts (0: no shared tensors). gating: expert_gating_func.
    wtype (f32, f16, q8_0, q4_0) is the type of the matmul weights; norms, the embedding, the router, the convs and
    the per-head vectors stay F32. Returns the path."""
    assert all(0 <= il < n_layer for il in mla_layers) and n_dense <= n_layer
    rng = np.random.default_rng(seed)
    U, F = gguf.GGUFValueType.UINT32, gguf.GGUFValueType.FLOAT32
    n_vocab = next(len(v) for k, v, *_ in fields if k == "tokenizer.ggml.tokens")
    n_qk = qk_nope + qk_rope
    kv_mla = n_head if legacy_kv_b else 1
    n_head_kv = [kv_mla if il in mla_layers else 0 for il in range(n_layer)]

    # TextModel.set_gguf_parameters (head_count_kv overwritten in place by KimiLinearModel's per-block array)
    w, key = start_header(path, "kimi-linear", n_layer, n_ctx_train, n_embd, n_ff, n_head, n_head_kv)
    w.add_layer_norm_rms_eps(1e-5)
    key("expert_count", n_expert, U)
    key("expert_used_count", n_expert_used, U)
    key("expert_gating_func", gating, U)
    # HF head_dim (n_embd / n_head) as key/value_length; key_length rewritten in place below
    w.add_key_length(n_qk if legacy_kv_b else kv_lora_rank + qk_rope)
    w.add_value_length(v_head_dim if legacy_kv_b else n_embd // n_head)
    # KimiLinearModel.set_gguf_parameters
    key("vocab_size", n_vocab, U)
    key("ssm.conv_kernel", d_conv, U)
    key("kda.head_dim", kda_head_dim, U)
    if q_lora_rank:
        key("attention.q_lora_rank", q_lora_rank, U)
    key("attention.kv_lora_rank", kv_lora_rank, U)
    key("rope.dimension_count", qk_rope, U)
    key("attention.key_length_mla", 0 if legacy_kv_b else n_qk, U)
    key("attention.value_length_mla", 0 if legacy_kv_b else v_head_dim, U)
    key("expert_feed_forward_length", n_ff_exp, U)
    key("expert_shared_count", n_shared, U)
    key("leading_dense_block_count", n_dense, U)
    key("expert_weights_scale", float(weights_scale), F)
    for k, value, vtype, sub in fields:
        w.add_key_value(k, value, vtype, sub_type=sub)

    put, t, norm = tensor_writers(w, rng, wtype, n_embd)

    def f32(name, *shape, scale):  # tensors llama-quantize leaves alone
        w.add_tensor(name, (rng.standard_normal(shape) * scale).astype(np.float32))

    t("token_embd.weight", n_vocab, n_embd, scale=1.0)
    d_inner, hd = n_head * kda_head_dim, kda_head_dim
    for il in range(n_layer):
        p = f"blk.{il}."
        norm(p + "attn_norm.weight")
        if il in mla_layers:
            if q_lora_rank:
                t(p + "attn_q_a.weight", q_lora_rank, n_embd, scale=n_embd**-0.5)
                norm(p + "attn_q_a_norm.weight", q_lora_rank)
                t(p + "attn_q_b.weight", n_head * n_qk, q_lora_rank, scale=q_lora_rank**-0.5)
            else:
                t(p + "attn_q.weight", n_head * n_qk, n_embd, scale=n_embd**-0.5)
            t(p + "attn_kv_a_mqa.weight", kv_lora_rank + qk_rope, n_embd, scale=n_embd**-0.5)
            norm(p + "attn_kv_a_norm.weight", kv_lora_rank)
            if legacy_kv_b:  # HF's kv_b_proj: per head qk_nope K rows then v_head_dim V rows
                t(p + "attn_kv_b.weight", n_head * (qk_nope + v_head_dim), kv_lora_rank, scale=kv_lora_rank**-0.5)
            else:  # kv_b split for the absorbed path: k_b {qk_nope, kv_lora_rank, n_head}, v_b {kv_lora_rank, v, n_head}
                t(p + "attn_k_b.weight", n_head, kv_lora_rank, qk_nope, scale=kv_lora_rank**-0.5)
                t(p + "attn_v_b.weight", n_head, v_head_dim, kv_lora_rank, scale=kv_lora_rank**-0.5)
            t(p + "attn_output.weight", n_embd, n_head * v_head_dim, scale=(n_head * v_head_dim) ** -0.5)
        else:
            for x in "qkv":  # ggml {d_conv, 1, d_inner, 1}, as the converter reshapes HF's [d_inner, d_conv]
                f32(p + f"ssm_conv1d_{x}.weight", 1, d_inner, 1, d_conv, scale=0.5)
            qkv = [(rng.standard_normal((d_inner, n_embd)) * n_embd**-0.5).astype(np.float32) for _ in "qkv"]
            if fused_qkv:  # the same weights as one {n_embd, 3 * d_inner} matrix, q rows first
                put(p + "attn_qkv.weight", np.concatenate(qkv))
            else:
                for x, a in zip("qkv", qkv):
                    put(p + f"attn_{x}.weight", a)
            t(p + "ssm_f_a.weight", hd, n_embd, scale=n_embd**-0.5)
            t(p + "ssm_f_b.weight", d_inner, hd, scale=hd**-0.5)
            t(p + "ssm_beta.weight", n_head, n_embd, scale=n_embd**-0.5)
            a = -np.exp(rng.standard_normal((1, 1, n_head, 1)) * 0.5)  # -exp(A_log), HF's [1, 1, n_head, 1]
            w.add_tensor(p + "ssm_a", a.astype(np.float32))
            f32(p + "ssm_dt.bias", d_inner, scale=0.5)
            t(p + "ssm_g_a.weight", hd, n_embd, scale=n_embd**-0.5)
            t(p + "ssm_g_b.weight", d_inner, hd, scale=hd**-0.5)
            norm(p + "ssm_norm.weight", hd)
            t(p + "attn_output.weight", n_embd, d_inner, scale=d_inner**-0.5)
        norm(p + "ffn_norm.weight")
        scaled_ffn_tensors(t, p, il < n_dense, n_embd, n_ff, n_expert, n_ff_exp, n_ff_exp * n_shared)
    norm("output_norm.weight")
    t("output.weight", n_vocab, n_embd, scale=n_embd**-0.5)
    return finish(w, path)


def main(argv=None) -> int:
    ap = family_parser(__doc__)
    a = ap.parse_args(argv)
    print(synth_kimi_linear(a.out, family_fields(a), wtype=a.wtype))
    return 0


if __name__ == "__main__":
    sys.exit(main())
