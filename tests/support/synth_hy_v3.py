"""A small random-weight hy_v3 (Hunyuan HY V3) GGUF laid out as llama.cpp's converter (HYV3Model) writes one and as
the pinned llama.cpp loads it (src/models/hy-v3.cpp, load_arch_hparams / load_arch_tensors): GQA attention with Q/K
head norms and NeoX RoPE over the whole head, leading dense blocks (told by the absence of a router), then
sigmoid-routed experts with a selection bias and an always-on shared expert; optionally one MTP (nextn) block,
laid out as the loader reads it (the converter seen drops it). docs/dev/hy-v4.md describes the family.

    python tests/support/synth_hy_v3.py OUT.gguf [--vocab-from SOME.gguf] [--mtp]
"""

from __future__ import annotations

import sys

import gguf
import numpy as np
from synth_gguf import dense_ffn_tensors, family_fields, family_parser, finish, start_header, tensor_writers

SIGMOID = 2  # LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID, what HYV3Model writes (and llama.cpp's default here)


def synth_hy_v3(
    path,
    fields,
    *,
    n_embd=64,
    n_head=4,
    n_head_kv=2,
    head_dim=32,
    n_layer=4,
    n_dense=1,
    n_ff=96,
    n_expert=8,
    n_expert_used=2,
    n_ff_exp=32,
    n_shared=1,
    probs_bias=True,
    probs_bias_suffix=False,
    weights_scale=2.5,
    weights_norm=True,
    fused_qkv=False,
    fused_gate_up=False,
    tied=False,
    mtp=False,
    mtp_head_norm=True,
    rope_base=10000.0,
    n_ctx_train=1024,
    wtype="f32",
    seed=0,
) -> str:
    """A random-weight hy_v3 GGUF of n_layer blocks of n_head query heads and n_head_kv K/V heads of head_dim
    (roped whole, NeoX; RMS-normed per head). The first n_dense blocks have a dense FFN of n_ff (no router), the
    rest n_expert experts of n_ff_exp (n_expert_used per token) plus one shared expert of n_ff_exp * n_shared (0:
    none; llama.cpp then adds silu of the FFN input, see the doc). probs_bias: the router's selection bias, named
    blk.N.exp_probs_b as the loader reads it (probs_bias_suffix: blk.N.exp_probs_b.bias, which llama.cpp does not
    read). fused_qkv: one attn_qkv; fused_gate_up: one ffn_gate_up_exps; tied: no output.weight. mtp: one nextn
    block after them (nextn_predict_layers 1): a full MoE block plus nextn.eh_proj / enorm / hnorm and
    (mtp_head_norm) nextn.shared_head_norm. wtype (f32, f16, q8_0, q4_0) is the type of the matmul weights; norms,
    the embedding, the router and the bias stay F32. Returns the path."""
    assert n_dense <= n_layer
    rng = np.random.default_rng(seed)
    U, F, B = gguf.GGUFValueType.UINT32, gguf.GGUFValueType.FLOAT32, gguf.GGUFValueType.BOOL
    n_vocab = next(len(v) for k, v, *_ in fields if k == "tokenizer.ggml.tokens")
    n_all = n_layer + (1 if mtp else 0)

    # TextModel.set_gguf_parameters, then HYV3Model's
    w, key = start_header(path, "hy_v3", n_all, n_ctx_train, n_embd, n_ff, n_head, n_head_kv)
    w.add_rope_freq_base(rope_base)
    w.add_layer_norm_rms_eps(1e-5)
    key("expert_count", n_expert, U)
    key("expert_used_count", n_expert_used, U)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    key("expert_feed_forward_length", n_ff_exp, U)
    key("expert_shared_feed_forward_length", n_ff_exp * max(n_shared, 1), U)
    key("expert_weights_norm", bool(weights_norm), B)
    key("expert_weights_scale", float(weights_scale), F)
    key("expert_gating_func", SIGMOID, U)
    if mtp:
        key("nextn_predict_layers", 1, U)
    for k, value, vtype, sub in fields:
        w.add_key_value(k, value, vtype, sub_type=sub)

    put, t, norm = tensor_writers(w, rng, wtype, n_embd)
    n_q, n_kv = n_head * head_dim, n_head_kv * head_dim
    t("token_embd.weight", n_vocab, n_embd, scale=1.0)
    for il in range(n_all):
        p = f"blk.{il}."
        norm(p + "attn_norm.weight")
        if fused_qkv:
            t(p + "attn_qkv.weight", n_q + 2 * n_kv, n_embd, scale=n_embd**-0.5)
        else:
            t(p + "attn_q.weight", n_q, n_embd, scale=n_embd**-0.5)
            t(p + "attn_k.weight", n_kv, n_embd, scale=n_embd**-0.5)
            t(p + "attn_v.weight", n_kv, n_embd, scale=n_embd**-0.5)
        t(p + "attn_output.weight", n_embd, n_q, scale=n_q**-0.5)
        norm(p + "attn_q_norm.weight", head_dim)
        norm(p + "attn_k_norm.weight", head_dim)
        norm(p + "ffn_norm.weight")
        if il < n_dense:
            dense_ffn_tensors(t, p, n_embd, n_ff)
        else:
            t(p + "ffn_gate_inp.weight", n_expert, n_embd, scale=n_embd**-0.5)
            if probs_bias:
                bias = (rng.standard_normal(n_expert) * 0.1).astype(np.float32)
                w.add_tensor(p + ("exp_probs_b.bias" if probs_bias_suffix else "exp_probs_b"), bias)
            if fused_gate_up:
                t(p + "ffn_gate_up_exps.weight", n_expert, 2 * n_ff_exp, n_embd, scale=n_embd**-0.5)
            else:
                t(p + "ffn_gate_exps.weight", n_expert, n_ff_exp, n_embd, scale=n_embd**-0.5)
                t(p + "ffn_up_exps.weight", n_expert, n_ff_exp, n_embd, scale=n_embd**-0.5)
            t(p + "ffn_down_exps.weight", n_expert, n_embd, n_ff_exp, scale=n_ff_exp**-0.5)
            if n_shared:
                n_sh = n_ff_exp * n_shared
                t(p + "ffn_gate_shexp.weight", n_sh, n_embd, scale=n_embd**-0.5)
                t(p + "ffn_up_shexp.weight", n_sh, n_embd, scale=n_embd**-0.5)
                t(p + "ffn_down_shexp.weight", n_embd, n_sh, scale=n_sh**-0.5)
        if il >= n_layer:
            t(p + "nextn.eh_proj.weight", n_embd, 2 * n_embd, scale=(2 * n_embd) ** -0.5)
            norm(p + "nextn.enorm.weight")
            norm(p + "nextn.hnorm.weight")
            if mtp_head_norm:
                norm(p + "nextn.shared_head_norm.weight")
    norm("output_norm.weight")
    if not tied:
        t("output.weight", n_vocab, n_embd, scale=n_embd**-0.5)
    return finish(w, path)


def main(argv=None) -> int:
    ap = family_parser(__doc__)
    ap.add_argument("--mtp", action="store_true", help="one nextn (MTP) block after the trunk")
    a = ap.parse_args(argv)
    print(synth_hy_v3(a.out, family_fields(a), wtype=a.wtype, mtp=a.mtp))
    return 0


if __name__ == "__main__":
    sys.exit(main())
