"""A small random-weight hy_v4 (Hunyuan HY V4) GGUF laid out as llama.cpp's converter (HYV4Model, a DeepseekV2Model)
writes one and as the pinned llama.cpp loads it (src/models/hy-v4.cpp, load_arch_hparams / load_arch_tensors):
DeepSeek-V3 multi-head latent attention (absorbed: attn_k_b / attn_v_b, low-rank Q) with per-head sinks and a
sigmoid output gate, independent hyper-connections (hc residual streams: sigmoid pre / post gates, no Sinkhorn
mixing), optionally DeepSeek sparse attention (a lightning indexer on "full" blocks, its top-k reused by "shared"
ones), leading dense blocks, then sigmoid-routed experts with exp_probs_b, a clamped SwiGLU and shared experts.
No MTP. docs/dev/hy-v4.md describes the family.

    python tests/support/synth_hy_v4.py OUT.gguf [--vocab-from SOME.gguf] [--dsa]
"""

from __future__ import annotations

import sys

import gguf
import numpy as np
from synth_gguf import family_fields, family_parser, finish, scaled_ffn_tensors, start_header, tensor_writers

SIGMOID = 2  # LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID, what HYV4Model writes


def synth_hy_v4(
    path,
    fields,
    *,
    n_embd=64,
    n_head=4,
    n_layer=4,
    q_lora_rank=32,
    kv_lora_rank=32,
    qk_nope=16,
    qk_rope=16,
    v_head_dim=16,
    hc=4,
    hc_eps=1e-6,
    hc_magnitude=2.0,
    n_dense=1,
    n_ff=96,
    n_expert=8,
    n_expert_used=2,
    n_ff_exp=32,
    n_shared=1,
    probs_bias=True,
    swiglu_limit=7.0,
    weights_scale=2.5,
    weights_norm=True,
    indexer=None,
    indexer_types=None,
    rope_base=10000.0,
    yarn=None,
    n_ctx_train=1024,
    wtype="f32",
    seed=0,
) -> str:
    """A random-weight hy_v4 GGUF of n_layer blocks, each MLA over a kv_lora_rank latent (n_head heads of qk_nope +
    qk_rope for Q·K, the last qk_rope roped (NORM), v_head_dim for V; Q through q_lora_rank) with sinks and a gate,
    wrapped in hc hyper-connection streams (hc_eps, hc_magnitude). The first n_dense blocks have a dense FFN of
    n_ff, the rest n_expert experts of n_ff_exp (n_expert_used per token; probs_bias: exp_probs_b.bias) and
    n_shared shared ones (llama.cpp requires them). swiglu_limit: the routed experts' clamp (0 or None: no key).
    indexer: (heads, head size, top k) for DSA (None: no indexer keys or tensors); indexer_types: a per-block
    pattern of True ("full", own indexer) / False ("shared"), repeated over n_layer (None: every block full).
    yarn: (factor, original context) or None. wtype (f32, f16, q8_0, q4_0) is the type of the matmul weights;
    norms, the embedding, the router, the hyper-connection tensors, sinks and indexer.proj stay F32. Returns
    the path."""
    assert n_dense <= n_layer and qk_rope % 2 == 0 and n_shared >= 1
    rng = np.random.default_rng(seed)
    U, F, B = gguf.GGUFValueType.UINT32, gguf.GGUFValueType.FLOAT32, gguf.GGUFValueType.BOOL
    n_vocab = next(len(v) for k, v, *_ in fields if k == "tokenizer.ggml.tokens")
    if indexer:
        pattern = (True,) if indexer_types is None else indexer_types
        indexer_types = [bool(pattern[il % len(pattern)]) for il in range(n_layer)]

    # TextModel.set_gguf_parameters, DeepseekV2Model's (head_count_kv forced to 1), then HYV4Model's
    w, key = start_header(path, "hy_v4", n_layer, n_ctx_train, n_embd, n_ff, n_head, 1)
    if yarn:
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(yarn[0])
        w.add_rope_scaling_orig_ctx_len(yarn[1])
    w.add_rope_freq_base(rope_base)
    w.add_layer_norm_rms_eps(1e-6)
    key("expert_count", n_expert, U)
    key("expert_used_count", n_expert_used, U)
    key("leading_dense_block_count", n_dense, U)
    key("vocab_size", n_vocab, U)
    key("attention.q_lora_rank", q_lora_rank, U)
    key("attention.kv_lora_rank", kv_lora_rank, U)
    key("attention.key_length", kv_lora_rank + qk_rope, U)  # the cached latent row
    key("attention.value_length", kv_lora_rank, U)
    key("attention.key_length_mla", qk_nope + qk_rope, U)
    key("attention.value_length_mla", v_head_dim, U)
    key("expert_feed_forward_length", n_ff_exp, U)
    key("expert_shared_count", n_shared, U)
    key("expert_weights_scale", float(weights_scale), F)
    if weights_norm:
        key("expert_weights_norm", True, B)
    key("rope.dimension_count", qk_rope, U)
    key("expert_gating_func", SIGMOID, U)
    if swiglu_limit:
        w.add_array("hy_v4.swiglu_clamp_exp", [float(swiglu_limit)] * n_layer)
    key("hyper_connection.count", hc, U)
    key("hyper_connection.epsilon", float(hc_eps), F)
    key("hyper_connection.magnitude", float(hc_magnitude), F)
    if indexer:
        key("attention.indexer.head_count", indexer[0], U)
        key("attention.indexer.key_length", indexer[1], U)
        key("attention.indexer.top_k", indexer[2], U)
        w.add_array("hy_v4.attention.indexer.types", indexer_types)  # llama.cpp's default: no block full
    for k, value, vtype, sub in fields:
        w.add_key_value(k, value, vtype, sub_type=sub)

    put, t, norm = tensor_writers(w, rng, wtype, n_embd)

    def f32(name, *shape, scale):  # the converter keeps these F32
        w.add_tensor(name, (rng.standard_normal(shape) * scale).astype(np.float32))

    n_qk = qk_nope + qk_rope
    t("token_embd.weight", n_vocab, n_embd, scale=1.0)
    for il in range(n_layer):
        p = f"blk.{il}."
        norm(p + "attn_norm.weight")
        t(p + "attn_q_a.weight", q_lora_rank, n_embd, scale=n_embd**-0.5)
        norm(p + "attn_q_a_norm.weight", q_lora_rank)
        t(p + "attn_q_b.weight", n_head * n_qk, q_lora_rank, scale=q_lora_rank**-0.5)
        t(p + "attn_kv_a_mqa.weight", kv_lora_rank + qk_rope, n_embd, scale=n_embd**-0.5)  # latent | rope K
        norm(p + "attn_kv_a_norm.weight", kv_lora_rank)
        # kv_b split: k_b ggml {qk_nope, kv_lora_rank, n_head}, v_b {kv_lora_rank, v_head_dim, n_head}
        t(p + "attn_k_b.weight", n_head, kv_lora_rank, qk_nope, scale=kv_lora_rank**-0.5)
        t(p + "attn_v_b.weight", n_head, v_head_dim, kv_lora_rank, scale=kv_lora_rank**-0.5)
        t(p + "attn_output.weight", n_embd, n_head * v_head_dim, scale=(n_head * v_head_dim) ** -0.5)
        t(p + "attn_gate.weight", n_head * v_head_dim, n_embd, scale=n_embd**-0.5)
        f32(p + "attn_sinks.weight", n_head, scale=0.5)
        if indexer and indexer_types[il]:
            n_idx, d_idx, _ = indexer
            t(p + "indexer.attn_q_b.weight", n_idx * d_idx, q_lora_rank, scale=q_lora_rank**-0.5)
            t(p + "indexer.attn_k.weight", d_idx, n_embd, scale=n_embd**-0.5)
            norm(p + "indexer.k_norm.weight", d_idx)
            f32(p + "indexer.k_norm.bias", d_idx, scale=0.1)
            t(p + "indexer.proj.weight", n_idx, n_embd, scale=n_embd**-0.5)
        for x in ("attn", "ffn"):  # hc_fn ggml {hc * n_embd, 2 * hc}: pre rows then post rows
            f32(p + f"hc_{x}_fn.weight", 2 * hc, hc * n_embd, scale=(hc * n_embd) ** -0.5)
            f32(p + f"hc_{x}_base.weight", 2 * hc, scale=0.5)
            f32(p + f"hc_{x}_scale.weight", 2, scale=0.5)
        norm(p + "ffn_norm.weight")
        scaled_ffn_tensors(t, p, il < n_dense, n_embd, n_ff, n_expert, n_ff_exp, n_ff_exp * n_shared, probs_bias)
    norm("output_norm.weight")
    t("output.weight", n_vocab, n_embd, scale=n_embd**-0.5)
    f32("output_hc_fn.weight", hc, hc * n_embd, scale=(hc * n_embd) ** -0.5)
    f32("output_hc_base.weight", hc, scale=0.5)
    f32("output_hc_scale.weight", 1, scale=0.5)
    return finish(w, path)


def main(argv=None) -> int:
    ap = family_parser(__doc__)
    ap.add_argument("--dsa", action="store_true", help="DSA: 4 indexer heads of 32, top 16, blocks full/shared")
    a = ap.parse_args(argv)
    dsa = dict(indexer=(4, 32, 16), indexer_types=(True, False)) if a.dsa else {}
    print(synth_hy_v4(a.out, family_fields(a), wtype=a.wtype, **dsa))
    return 0


if __name__ == "__main__":
    sys.exit(main())
