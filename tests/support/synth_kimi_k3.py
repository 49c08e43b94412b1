"""A small random-weight kimi-k3 (Kimi-K3) GGUF laid out as llama.cpp's converter writes one and as the pinned
llama.cpp loads it (src/models/kimi-k3.cpp, load_arch_hparams / load_arch_tensors): KDA (kimi delta attention,
recurrent) blocks and nope-only MLA blocks with a sigmoid output gate, picked by a per-block head_count_kv (0:
KDA), cross-layer residual attention (blocks banked every attn_res.block_size), a leading dense FFN, then a latent
MoE (routed experts in a down-projected space, sigmoid routing with exp_probs_b, shared experts at full width),
and the situ activation everywhere. docs/dev/kimi-k3.md describes the family.

    python tests/support/synth_kimi_k3.py OUT.gguf [--vocab-from SOME.gguf]
"""

from __future__ import annotations

import sys

import gguf
import numpy as np
from synth_gguf import dense_ffn_tensors, family_fields, family_parser, finish, start_header, tensor_writers

SIGMOID = 2  # LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID, what the converter asserts for Kimi-K3


def synth_kimi_k3(
    path,
    fields,
    *,
    n_embd=64,
    n_head=4,
    mla_layers=(1, 3),
    n_layer=4,
    kda_head_dim=32,
    d_conv=4,
    gate_lower_bound=-5.0,
    q_lora_rank=None,
    kv_lora_rank=32,
    qk_nope=16,
    qk_rope=8,
    v_head_dim=16,
    mla_gate=True,
    attn_res=2,
    n_dense=1,
    n_ff=96,
    n_expert=8,
    n_expert_used=2,
    n_ff_exp=32,
    n_shared=1,
    latent=32,
    routed_norm=True,
    weights_scale=2.5,
    weights_norm=True,
    situ=(2.0, 4.0),
    n_ctx_train=1024,
    wtype="f32",
    seed=0,
) -> str:
    """A random-weight kimi-k3 GGUF of n_layer blocks: those in mla_layers MLA (head_count_kv 1; n_head heads of
    qk_nope + qk_rope for Q·K, none of them roped, v_head_dim for V, over a kv_lora_rank latent; q_lora_rank None:
    one attn_q, else attn_q_a/attn_q_a_norm/attn_q_b; mla_gate: the sigmoid attn_gate), the others KDA
    (head_count_kv 0; n_head heads of kda_head_dim, causal convs of d_conv; gate_lower_bound None: kimi-linear's
    softplus decay, else K3's bounded sigmoid). attn_res: attn_res.block_size (0: no residual attention and no
    *_res_score tensors). The first n_dense blocks have a dense FFN of n_ff, the rest n_expert experts of n_ff_exp
    (n_expert_used per token) in a latent space of `latent` (None: experts at n_embd, no ffn_routed_*; routed_norm:
    ffn_routed_norm) plus n_shared shared experts (0: none). situ: (situ_beta, situ_linear_beta). wtype (f32, f16,
    q8_0, q4_0) is the type of the matmul weights; norms, the embedding, the router, the convs and the per-head
    vectors stay F32. Returns the path."""
    assert all(0 <= il < n_layer for il in mla_layers) and n_dense <= n_layer
    rng = np.random.default_rng(seed)
    U, F, B = gguf.GGUFValueType.UINT32, gguf.GGUFValueType.FLOAT32, gguf.GGUFValueType.BOOL
    n_vocab = next(len(v) for k, v, *_ in fields if k == "tokenizer.ggml.tokens")
    n_head_kv = [1 if il in mla_layers else 0 for il in range(n_layer)]

    # TextModel.set_gguf_parameters, then KimiK3Model's (head_count_kv rewritten as the per-block array)
    w, key = start_header(path, "kimi-k3", n_layer, n_ctx_train, n_embd, n_ff, n_head, n_head_kv)
    w.add_layer_norm_rms_eps(1e-5)
    key("expert_count", n_expert, U)
    key("expert_used_count", n_expert_used, U)
    key("vocab_size", n_vocab, U)
    key("ssm.conv_kernel", d_conv, U)
    key("kda.head_dim", kda_head_dim, U)
    if gate_lower_bound is not None:
        key("kda.gate_lower_bound", float(gate_lower_bound), F)
    if q_lora_rank:
        key("attention.q_lora_rank", q_lora_rank, U)
    key("attention.kv_lora_rank", kv_lora_rank, U)
    key("rope.dimension_count", qk_rope, U)
    w.add_key_length(kv_lora_rank + qk_rope)  # the cached latent row
    w.add_value_length(kv_lora_rank)
    key("attention.key_length_mla", qk_nope + qk_rope, U)
    key("attention.value_length_mla", v_head_dim, U)
    key("expert_feed_forward_length", n_ff_exp, U)
    key("expert_shared_count", n_shared, U)
    key("leading_dense_block_count", n_dense, U)
    key("expert_weights_scale", float(weights_scale), F)
    key("expert_weights_norm", bool(weights_norm), B)
    key("expert_gating_func", SIGMOID, U)
    if latent:
        key("expert_latent_length", latent, U)
    key("activation.situ_beta", float(situ[0]), F)
    key("activation.situ_linear_beta", float(situ[1]), F)
    key("attn_res.block_size", attn_res, U)
    for k, value, vtype, sub in fields:
        w.add_key_value(k, value, vtype, sub_type=sub)

    put, t, norm = tensor_writers(w, rng, wtype, n_embd)

    def f32(name, *shape, scale):  # tensors llama-quantize leaves alone
        w.add_tensor(name, (rng.standard_normal(shape) * scale).astype(np.float32))

    t("token_embd.weight", n_vocab, n_embd, scale=1.0)
    d_inner, hd = n_head * kda_head_dim, kda_head_dim
    n_lat = latent or n_embd
    for il in range(n_layer):
        p = f"blk.{il}."
        norm(p + "attn_norm.weight")
        if attn_res:  # res_norm * res_proj, fused by the converter
            f32(p + "attn_res_score.weight", n_embd, scale=0.1)
            f32(p + "ffn_res_score.weight", n_embd, scale=0.1)
        if il in mla_layers:
            n_qk = qk_nope + qk_rope
            if q_lora_rank:
                t(p + "attn_q_a.weight", q_lora_rank, n_embd, scale=n_embd**-0.5)
                norm(p + "attn_q_a_norm.weight", q_lora_rank)
                t(p + "attn_q_b.weight", n_head * n_qk, q_lora_rank, scale=q_lora_rank**-0.5)
            else:
                t(p + "attn_q.weight", n_head * n_qk, n_embd, scale=n_embd**-0.5)
            t(p + "attn_kv_a_mqa.weight", kv_lora_rank + qk_rope, n_embd, scale=n_embd**-0.5)
            norm(p + "attn_kv_a_norm.weight", kv_lora_rank)
            # kv_b split for the absorbed path: k_b {qk_nope, kv_lora_rank, n_head}, v_b {kv_lora_rank, v, n_head}
            t(p + "attn_k_b.weight", n_head, kv_lora_rank, qk_nope, scale=kv_lora_rank**-0.5)
            t(p + "attn_v_b.weight", n_head, v_head_dim, kv_lora_rank, scale=kv_lora_rank**-0.5)
            if mla_gate:
                t(p + "attn_gate.weight", n_head * v_head_dim, n_embd, scale=n_embd**-0.5)
            t(p + "attn_output.weight", n_embd, n_head * v_head_dim, scale=(n_head * v_head_dim) ** -0.5)
        else:
            for x in "qkv":  # ggml {d_conv, 1, d_inner, 1}, as the converter reshapes HF's [d_inner, 1, d_conv]
                f32(p + f"ssm_conv1d_{x}.weight", 1, d_inner, 1, d_conv, scale=0.5)
            for x in "qkv":
                t(p + f"attn_{x}.weight", d_inner, n_embd, scale=n_embd**-0.5)
            t(p + "ssm_f_a.weight", hd, n_embd, scale=n_embd**-0.5)
            t(p + "ssm_f_b.weight", d_inner, hd, scale=hd**-0.5)
            t(p + "ssm_beta.weight", n_head, n_embd, scale=n_embd**-0.5)
            w.add_tensor(p + "ssm_a", (-np.exp(rng.standard_normal(n_head) * 0.5)).astype(np.float32))  # -exp(A_log)
            f32(p + "ssm_dt.bias", d_inner, scale=0.5)
            t(p + "ssm_g.weight", d_inner, n_embd, scale=n_embd**-0.5)
            norm(p + "ssm_norm.weight", hd)
            t(p + "attn_output.weight", n_embd, d_inner, scale=d_inner**-0.5)
        norm(p + "ffn_norm.weight")
        if il < n_dense:
            dense_ffn_tensors(t, p, n_embd, n_ff)
            continue
        t(p + "ffn_gate_inp.weight", n_expert, n_embd, scale=n_embd**-0.5)
        f32(p + "exp_probs_b.bias", n_expert, scale=0.1)
        t(p + "ffn_gate_exps.weight", n_expert, n_ff_exp, n_lat, scale=n_lat**-0.5)
        t(p + "ffn_up_exps.weight", n_expert, n_ff_exp, n_lat, scale=n_lat**-0.5)
        t(p + "ffn_down_exps.weight", n_expert, n_lat, n_ff_exp, scale=n_ff_exp**-0.5)
        if latent:
            t(p + "ffn_routed_down.weight", latent, n_embd, scale=n_embd**-0.5)
            t(p + "ffn_routed_up.weight", n_embd, latent, scale=latent**-0.5)
            if routed_norm:
                norm(p + "ffn_routed_norm.weight", latent)
        if n_shared:
            n_sh = n_ff_exp * n_shared
            t(p + "ffn_gate_shexp.weight", n_sh, n_embd, scale=n_embd**-0.5)
            t(p + "ffn_up_shexp.weight", n_sh, n_embd, scale=n_embd**-0.5)
            t(p + "ffn_down_shexp.weight", n_embd, n_sh, scale=n_sh**-0.5)
    norm("output_norm.weight")
    t("output.weight", n_vocab, n_embd, scale=n_embd**-0.5)
    if attn_res:
        f32("output_res_score.weight", n_embd, scale=0.1)
    return finish(w, path)


def main(argv=None) -> int:
    ap = family_parser(__doc__)
    a = ap.parse_args(argv)
    print(synth_kimi_k3(a.out, family_fields(a), wtype=a.wtype))
    return 0


if __name__ == "__main__":
    sys.exit(main())
