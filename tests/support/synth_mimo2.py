"""A small random-weight mimo2 (MiMo-V2-Flash / MiMo-V2.5) GGUF laid out as llama.cpp's converter writes one and as
the pinned llama.cpp loads it (src/models/mimo2.cpp, load_arch_hparams / load_arch_tensors): full-attention and
sliding-window blocks picked by a per-block sliding_window_pattern, K/V head counts per block, value heads narrower
than key heads, partial NeoX RoPE with its own base in the sliding blocks, learned attention sinks, the attention
output scaled by attention.value_scale, a dense SwiGLU FFN in the blocks without a router and sigmoid-routed experts
with exp_probs_b in the others, and optional MTP (nextn) blocks after the trunk. The pinned tree has no converter:
the layout follows upstream's conversion/mimo.py (MimoV2Model) and the loader. docs/dev/mimo2.md describes the
family.

    python tests/support/synth_mimo2.py OUT.gguf [--vocab-from SOME.gguf] [--wtype f16] [--mtp 1]
"""

from __future__ import annotations

import sys

import gguf
import numpy as np
from synth_gguf import dense_ffn_tensors, family_fields, family_parser, finish, start_header, tensor_writers

SIGMOID = 2  # LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID (scoring_func "sigmoid"); mimo2.cpp does not read it


def synth_mimo2(
    path,
    fields,
    *,
    n_embd=64,
    n_head=4,
    n_head_kv=1,
    n_head_kv_swa=2,
    head_dim=32,
    head_dim_v=16,
    rope_dim=10,
    n_layer=4,
    swa_layers=(1, 2),
    window=8,
    sinks="swa",
    value_scale=0.707,
    rope_base=5e6,
    rope_base_swa=1e4,
    fused_qkv=False,
    dense_layers=(0,),
    n_ff=96,
    n_expert=8,
    n_expert_used=2,
    n_ff_exp=32,
    probs_bias=True,
    groups=(1, 1),
    n_mtp=0,
    n_ctx_train=1024,
    wtype="f32",
    seed=0,
) -> str:
    """A random-weight mimo2 GGUF of n_layer trunk blocks plus n_mtp MTP blocks (block_count = n_layer + n_mtp;
    the converter always writes 3). Blocks in swa_layers slide over `window` tokens with n_head_kv_swa K/V heads,
    the others attend fully with n_head_kv; every block has n_head query heads of head_dim (Q, K) and head_dim_v
    (V), NeoX RoPE over the first rope_dim values (rope_base, rope_base_swa in the sliding blocks). sinks: "swa"
    (attn_sinks in the sliding blocks, as MiMo), "all", "full" or "none". value_scale: attention.value_scale (None:
    no key). fused_qkv: one attn_qkv per block (V2.5) instead of attn_q/k/v (V2-Flash); MTP blocks need it.
    Blocks in dense_layers have a SwiGLU FFN of n_ff, the others n_expert experts of n_ff_exp (n_expert_used per
    token), with exp_probs_b if probs_bias. groups: (expert_group_count, expert_group_used_count) or None. MTP
    blocks are sliding, dense, fused and have sinks when the sliding blocks do. wtype (f32, f16, q8_0, q4_0) is the
    type of the matmul weights; norms, sinks, the embedding and the router stay F32. Returns the path."""
    assert all(0 <= il < n_layer for il in (*swa_layers, *dense_layers)) and sinks in ("swa", "all", "full", "none")
    assert not n_mtp or fused_qkv, "mimo2's MTP graph asserts a fused attn_qkv"
    rng = np.random.default_rng(seed)
    U, F = gguf.GGUFValueType.UINT32, gguf.GGUFValueType.FLOAT32
    n_vocab = next(len(v) for k, v, *_ in fields if k == "tokenizer.ggml.tokens")
    n_all = n_layer + n_mtp
    pattern = [1 if il in swa_layers or il >= n_layer else 0 for il in range(n_all)]  # MTP blocks: 1
    kv = [n_head_kv_swa if s else n_head_kv for s in pattern]

    # TextModel.set_gguf_parameters, then MimoV2Model's
    w, key = start_header(path, "mimo2", n_all, n_ctx_train, n_embd, n_ff, n_head, kv)
    w.add_rope_freq_base(rope_base)
    w.add_rope_freq_base_swa(rope_base_swa)
    w.add_expert_used_count(n_expert_used)
    if groups:
        w.add_expert_group_count(groups[0])
        w.add_expert_group_used_count(groups[1])
    key("expert_gating_func", SIGMOID, U)
    w.add_key_length(head_dim)
    w.add_sliding_window(window)
    w.add_sliding_window_pattern(pattern)  # a list of ints: an INT32 array
    w.add_value_length(head_dim_v)
    w.add_expert_count(n_expert)
    w.add_expert_feed_forward_length(n_ff_exp)
    w.add_rope_dimension_count(rope_dim)
    w.add_layer_norm_rms_eps(1e-5)
    if value_scale is not None:
        key("attention.value_scale", float(value_scale), F)
    w.add_nextn_predict_layers(n_mtp)
    for k, value, vtype, sub in fields:
        w.add_key_value(k, value, vtype, sub_type=sub)

    _, t, norm = tensor_writers(w, rng, wtype, n_embd)
    # the MTP blocks from a generator of their own: the trunk's weights do not depend on n_mtp
    rng_mtp = np.random.default_rng([seed, 1])
    _, t_mtp, norm_mtp = tensor_writers(w, rng_mtp, wtype, n_embd)

    t("token_embd.weight", n_vocab, n_embd, scale=1.0)
    for il in range(n_all):
        p, mtp = f"blk.{il}.", il >= n_layer
        tb, nb, r = (t_mtp, norm_mtp, rng_mtp) if mtp else (t, norm, rng)
        if mtp:
            nb(p + "nextn.enorm.weight")
            nb(p + "nextn.hnorm.weight")
            tb(p + "nextn.eh_proj.weight", n_embd, 2 * n_embd, scale=(2 * n_embd) ** -0.5)
        nb(p + "attn_norm.weight")
        n_q, n_k, n_v = n_head * head_dim, kv[il] * head_dim, kv[il] * head_dim_v
        if fused_qkv:
            tb(p + "attn_qkv.weight", n_q + n_k + n_v, n_embd, scale=n_embd**-0.5)
        else:
            tb(p + "attn_q.weight", n_q, n_embd, scale=n_embd**-0.5)
            tb(p + "attn_k.weight", n_k, n_embd, scale=n_embd**-0.5)
            tb(p + "attn_v.weight", n_v, n_embd, scale=n_embd**-0.5)
        if {"all": True, "none": False, "swa": pattern[il] == 1, "full": pattern[il] == 0}[sinks]:
            w.add_tensor(p + "attn_sinks.weight", r.standard_normal(n_head).astype(np.float32))
        tb(p + "attn_output.weight", n_embd, n_head * head_dim_v, scale=(n_head * head_dim_v) ** -0.5)
        nb(p + "ffn_norm.weight")
        if il in dense_layers or mtp:
            dense_ffn_tensors(tb, p, n_embd, n_ff)
        else:
            t(p + "ffn_gate_inp.weight", n_expert, n_embd, scale=n_embd**-0.5)
            if probs_bias:
                w.add_tensor(p + "exp_probs_b.bias", (rng.standard_normal(n_expert) * 0.1).astype(np.float32))
            t(p + "ffn_gate_exps.weight", n_expert, n_ff_exp, n_embd, scale=n_embd**-0.5)
            t(p + "ffn_up_exps.weight", n_expert, n_ff_exp, n_embd, scale=n_embd**-0.5)
            t(p + "ffn_down_exps.weight", n_expert, n_embd, n_ff_exp, scale=n_ff_exp**-0.5)
        if mtp:
            nb(p + "layer_output_norm.weight")  # HF's final_layernorm
    norm("output_norm.weight")
    t("output.weight", n_vocab, n_embd, scale=n_embd**-0.5)
    return finish(w, path)


def main(argv=None) -> int:
    ap = family_parser(__doc__)
    ap.add_argument("--mtp", type=int, default=0, help="MTP blocks after the trunk (implies a fused attn_qkv)")
    ap.add_argument("--fused-qkv", action="store_true", help="one attn_qkv per block (MiMo-V2.5)")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    fields = family_fields(a)
    print(synth_mimo2(a.out, fields, wtype=a.wtype, n_mtp=a.mtp, fused_qkv=a.fused_qkv or a.mtp > 0, seed=a.seed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
