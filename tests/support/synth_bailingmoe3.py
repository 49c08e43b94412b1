"""A small random-weight bailingmoe3 (Ling 3.0) GGUF laid out as llama.cpp's converter writes one and as the pinned
llama.cpp loads it (src/models/bailingmoe3.cpp, load_arch_hparams / load_arch_tensors): KDA blocks (kimi delta
attention, recurrent; full-rank decay and output-gate projections, the safe bounded-sigmoid decay) and MLA blocks
(absorbed latent attention with RoPE on the rope part, a sigmoid gate per head), picked by a per-block
head_count_kv (0: KDA); leading dense SwiGLU FFNs, then sigmoid-routed experts with exp_probs_b plus a shared
expert; optional per-block SwiGLU clamps, expert groups, M-RoPE sections and one MTP block.
docs/dev/bailingmoe3.md describes the family.

    python tests/support/synth_bailingmoe3.py OUT.gguf [--vocab-from SOME.gguf] [--wtype f16] [--mtp]
"""

from __future__ import annotations

import sys

import gguf
import numpy as np
from synth_gguf import family_fields, family_parser, finish, scaled_ffn_tensors, start_header, tensor_writers

SIGMOID = 2  # LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID (Ling's score_function)


def synth_bailingmoe3(
    path,
    fields,
    *,
    n_embd=64,
    n_head=4,
    n_layer=4,
    mla_layers=(1, 3),
    kda_head_dim=32,
    d_conv=4,
    gate_lower_bound=-5.0,
    safe_gate_key=True,
    q_lora_rank=None,
    kv_lora_rank=32,
    qk_nope=16,
    qk_rope=8,
    v_head_dim=16,
    rope_base=10000.0,
    mrope_sections=None,
    n_dense=1,
    n_ff=96,
    n_expert=8,
    n_expert_used=2,
    n_ff_exp=32,
    n_shared=1,
    n_ff_shexp=48,
    groups=None,
    weights_scale=2.5,
    weights_norm=True,
    swiglu_limits=None,
    mtp=False,
    tied=False,
    n_ctx_train=1024,
    wtype="f32",
    seed=0,
) -> str:
    """A random-weight bailingmoe3 GGUF of n_layer trunk blocks: those in mla_layers MLA (head_count_kv 1; n_head
    heads of qk_nope + qk_rope for Q.K, the qk_rope part roped, v_head_dim for V, over a kv_lora_rank latent;
    q_lora_rank None: one attn_q, else attn_q_a/attn_q_a_norm/attn_q_b; mrope_sections: [t, h, w] rope pairs
    summing to qk_rope / 2, written as rope.dimension_sections, which makes llama.cpp use M-RoPE), the others KDA
    (head_count_kv 0; n_head heads of kda_head_dim, causal convs of d_conv, decay bounded below by
    gate_lower_bound; safe_gate_key: write kda.safe_gate). The first n_dense blocks have a dense FFN of n_ff, the
    rest n_expert experts of n_ff_exp (n_expert_used per token) and a shared expert of n_ff_shexp (None: no key,
    llama.cpp's n_ff_exp * max(1, n_shared)); groups: (expert_group_count, expert_group_used_count) or None.
    swiglu_limits: (expert limit, shared/dense limit) per block (a float or a list of n_layer + mtp), or None.
    mtp: one MTP block after the trunk (an MLA block with nextn.* and layer_output_norm). tied: no output.weight.
    wtype (f32, f16, q8_0, q4_0) is the type of the matmul weights; norms, the embedding, the router, the convs and
    the per-head vectors stay F32. Returns the path."""
    assert all(0 <= il < n_layer for il in mla_layers) and n_dense <= n_layer
    assert mrope_sections is None or 2 * sum(mrope_sections) == qk_rope
    rng = np.random.default_rng(seed)
    U, F, B = gguf.GGUFValueType.UINT32, gguf.GGUFValueType.FLOAT32, gguf.GGUFValueType.BOOL
    A = gguf.GGUFValueType.ARRAY
    n_vocab = next(len(v) for k, v, *_ in fields if k == "tokenizer.ggml.tokens")
    n_blocks = n_layer + int(bool(mtp))
    n_head_kv = [1 if il in mla_layers or il >= n_layer else 0 for il in range(n_blocks)]

    # TextModel.set_gguf_parameters, then BailingMoeV3Model's
    w, key = start_header(path, "bailingmoe3", n_blocks, n_ctx_train, n_embd, n_ff, n_head, n_head_kv)
    key("rope.freq_base", float(rope_base), F)
    w.add_layer_norm_rms_eps(1e-6)
    key("expert_count", n_expert, U)
    key("expert_used_count", n_expert_used, U)
    key("expert_gating_func", SIGMOID, U)
    if groups:
        key("expert_group_count", groups[0], U)
        key("expert_group_used_count", groups[1], U)
    key("vocab_size", n_vocab, U)
    key("ssm.conv_kernel", d_conv, U)
    key("kda.head_dim", kda_head_dim, U)
    if safe_gate_key:
        key("kda.safe_gate", True, B)
    key("kda.gate_lower_bound", float(gate_lower_bound), F)
    if q_lora_rank:
        key("attention.q_lora_rank", q_lora_rank, U)
    key("attention.kv_lora_rank", kv_lora_rank, U)
    key("rope.dimension_count", qk_rope, U)
    w.add_key_length(kv_lora_rank + qk_rope)  # the cached latent row
    key("attention.key_length_mla", qk_nope + qk_rope, U)
    key("attention.value_length_mla", v_head_dim, U)
    key("expert_feed_forward_length", n_ff_exp, U)
    if n_ff_shexp is not None:
        key("expert_shared_feed_forward_length", n_ff_shexp, U)
    key("expert_shared_count", n_shared, U)
    key("leading_dense_block_count", n_dense, U)
    key("expert_weights_scale", float(weights_scale), F)
    key("expert_weights_norm", bool(weights_norm), B)
    if swiglu_limits is not None:
        for name, lim in zip(("swiglu_clamp_exp", "swiglu_clamp_shexp"), swiglu_limits):
            vals = [float(x) for x in lim] if isinstance(lim, (list, tuple)) else [float(lim)] * n_blocks
            w.add_key_value(f"bailingmoe3.{name}", vals, A, sub_type=F)
    if mtp:
        key("nextn_predict_layers", 1, U)
    if mrope_sections is not None:
        w.add_key_value(
            "bailingmoe3.rope.dimension_sections", [*mrope_sections, 0], A, sub_type=gguf.GGUFValueType.INT32
        )
    for k, value, vtype, sub in fields:
        w.add_key_value(k, value, vtype, sub_type=sub)

    put, t, norm = tensor_writers(w, rng, wtype, n_embd)

    def f32(name, *shape, scale):  # tensors llama-quantize leaves alone
        w.add_tensor(name, (rng.standard_normal(shape) * scale).astype(np.float32))

    def mla(p):
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
        t(p + "attn_gate.weight", n_head, n_embd, scale=n_embd**-0.5)  # one gate per head
        t(p + "attn_output.weight", n_embd, n_head * v_head_dim, scale=(n_head * v_head_dim) ** -0.5)

    def moe(p):
        n_sh = n_ff_shexp if n_ff_shexp else n_ff_exp * max(1, n_shared)
        scaled_ffn_tensors(t, p, False, n_embd, 0, n_expert, n_ff_exp, n_sh)

    t("token_embd.weight", n_vocab, n_embd, scale=1.0)
    d_inner = n_head * kda_head_dim
    for il in range(n_layer):
        p = f"blk.{il}."
        norm(p + "attn_norm.weight")
        if il in mla_layers:
            mla(p)
        else:
            for x in "qkv":  # ggml {d_conv, 1, d_inner, 1}: HF's [d_inner, 1, d_conv] reshaped
                f32(p + f"ssm_conv1d_{x}.weight", 1, d_inner, 1, d_conv, scale=0.5)
            for x in "qkv":
                t(p + f"attn_{x}.weight", d_inner, n_embd, scale=n_embd**-0.5)
            t(p + "ssm_f_a.weight", d_inner, n_embd, scale=n_embd**-0.5)
            t(p + "ssm_beta.weight", n_head, n_embd, scale=n_embd**-0.5)
            w.add_tensor(p + "ssm_a", np.exp(rng.standard_normal((n_head, 1)) * 0.5).astype(np.float32))  # exp(A_log)
            f32(p + "ssm_dt.bias", d_inner, scale=0.5)
            t(p + "ssm_g_a.weight", d_inner, n_embd, scale=n_embd**-0.5)
            norm(p + "ssm_norm.weight", kda_head_dim)
            t(p + "attn_output.weight", n_embd, d_inner, scale=d_inner**-0.5)
        norm(p + "ffn_norm.weight")
        if il < n_dense:
            scaled_ffn_tensors(t, p, True, n_embd, n_ff, 0, 0, 0)
        else:
            moe(p)
    if mtp:
        p = f"blk.{n_layer}."
        norm(p + "attn_norm.weight")
        mla(p)
        norm(p + "ffn_norm.weight")
        moe(p)
        t(p + "nextn.eh_proj.weight", n_embd, 2 * n_embd, scale=(2 * n_embd) ** -0.5)
        norm(p + "nextn.enorm.weight")
        norm(p + "nextn.hnorm.weight")
        norm(p + "layer_output_norm.weight")  # the loader's name for the MTP head norm
    norm("output_norm.weight")
    if not tied:
        t("output.weight", n_vocab, n_embd, scale=n_embd**-0.5)
    return finish(w, path)


def main(argv=None) -> int:
    ap = family_parser(__doc__)
    ap.add_argument("--mtp", action="store_true", help="add one MTP block")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    fields = family_fields(a)
    print(synth_bailingmoe3(a.out, fields, wtype=a.wtype, mtp=a.mtp, seed=a.seed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
