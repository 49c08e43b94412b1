"""A small random-weight qwen4exp GGUF as the pinned llama.cpp loads it (src/models/qwen4exp.cpp,
load_arch_hparams / load_arch_tensors; the pinned tree and the installed gguf-py have no converter for it, so
the layout follows the loader): Qwen3.5-style gated delta-net and gated full-attention blocks with MoE FFNs,
but hyper-connections (hc parallel residual streams, low-rank gated mixers) in place of every norm, a sigmoid
delta-net output gate, block-sparse attention (QSA: a pooled-key indexer picks whole blocks) on the attention
blocks with a compress ratio, and an optional PLE n-gram hash embedding on one delta-net block.
docs/dev/qwen4exp.md describes the family.

    python tests/support/synth_qwen4exp.py OUT.gguf [--vocab-from SOME.gguf] [--wtype f32|f16|q8_0|q4_0]
"""

from __future__ import annotations

import sys

import gguf
import numpy as np
from synth_gguf import family_fields, family_parser, finish, start_header, tensor_writers

# odd 64-bit multipliers for the PLE n-gram hash (any values load)
PLE_MULTIPLIERS = (0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0x27D4EB2F165667C5)


def synth_qwen4exp(
    path,
    fields,
    *,
    n_embd=64,
    n_head=4,
    n_head_kv=2,
    head_dim=32,
    n_rot=16,
    n_layer=4,
    interval=2,
    recurrent_layers=None,
    d_conv=4,
    d_state=16,
    n_v_heads=4,
    n_k_heads=2,
    hc=4,
    hc_rank=8,
    hc_norm_flat=True,
    idx_heads=2,
    idx_dim=32,
    idx_top_k=16,
    compress_ratios=(0, 4, 0, 0),
    ple_layer=0,
    ple_ngram=3,
    ple_heads_per_ngram=2,
    ple_conv=3,
    ple_dim=None,
    n_expert=8,
    n_expert_used=2,
    n_ff_exp=32,
    n_ff_shexp=48,
    fused_gate_up=False,
    tied=False,
    n_ctx_train=1024,
    wtype="f32",
    seed=0,
) -> str:
    """A random-weight qwen4exp GGUF of n_layer blocks. Block kinds: recurrent_layers (a list of bools, written as
    attention.recurrent_layers) or else full_attention_interval = interval (every interval-th block attention).
    Attention blocks: n_head query heads (query and sigmoid gate interleaved in attn_q) over n_head_kv KV heads of
    head_dim, IMRoPE on n_rot dims; each has an indexer (idx_heads heads of idx_dim), used where
    compress_ratios[il] > 0 (QSA over blocks of that many tokens, top idx_top_k cells plus the tail); ratio 0:
    dense. Delta-net blocks: n_v_heads value heads over n_k_heads key heads of d_state, conv window d_conv.
    hc streams with low-rank hc_rank mixers (hc_norm_flat: the gammas stored 1-D, else {n_embd, hc}).
    ple_layer: the one delta-net block with the PLE module (None: no PLE; n-grams up to ple_ngram,
    ple_heads_per_ngram heads each of ple_dim, default n_embd / heads: llama.cpp needs heads * ple_dim = n_embd;
    a dilated causal conv of ple_conv taps). MoE everywhere: n_expert experts of n_ff_exp (fused_gate_up: one ffn_gate_up_exps), a gated
    shared expert of n_ff_shexp. tied: no output.weight. wtype (f32, f16, q8_0, q4_0) is the type of the matmul
    weights; norms, the embedding, routers, convs and the hc mixers stay F32. Returns the path."""
    rng = np.random.default_rng(seed)
    U, A = gguf.GGUFValueType.UINT32, gguf.GGUFValueType.ARRAY
    U64, BOOL = gguf.GGUFValueType.UINT64, gguf.GGUFValueType.BOOL
    n_vocab = next(len(v) for k, v, *_ in fields if k == "tokenizer.ggml.tokens")
    eos = next((v for k, v, *_ in fields if k == "tokenizer.ggml.eos_token_id"), 0)
    if recurrent_layers is None:
        recr = [(il + 1) % interval != 0 for il in range(n_layer)]
    else:
        recr = [bool(x) for x in recurrent_layers]
        assert len(recr) == n_layer
    ratios = list(compress_ratios) + [0] * (n_layer - len(compress_ratios))
    ple = ple_layer is not None
    if ple:
        assert recr[ple_layer], "the PLE block must be a delta-net block"
        n_ple_heads = (ple_ngram - 1) * ple_heads_per_ngram
        ple_dim = ple_dim or n_embd // n_ple_heads
        ple_sizes = [61 + 6 * h for h in range(n_ple_heads)]
        ple_offsets = [int(x) for x in np.cumsum([0] + ple_sizes[:-1])]

    w, key = start_header(path, "qwen4exp", n_layer, n_ctx_train, n_embd, n_ff_shexp, n_head, n_head_kv)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-6)
    key("rope.dimension_count", n_rot, U)
    w.add_key_value("qwen4exp.rope.dimension_sections", [n_rot // 4, n_rot // 8, n_rot // 8, 0], A, sub_type=U)
    key("ssm.conv_kernel", d_conv, U)
    key("ssm.state_size", d_state, U)
    key("ssm.group_count", n_k_heads, U)
    key("ssm.time_step_rank", n_v_heads, U)
    key("ssm.inner_size", d_state * n_v_heads, U)
    if recurrent_layers is None:
        key("full_attention_interval", interval, U)
    else:
        w.add_key_value("qwen4exp.attention.recurrent_layers", recr, A, sub_type=BOOL)
    key("expert_count", n_expert, U)
    key("expert_used_count", n_expert_used, U)
    key("expert_feed_forward_length", n_ff_exp, U)
    key("expert_shared_feed_forward_length", n_ff_shexp, U)
    key("hyper_connection.count", hc, U)
    key("hyper_connection.low_rank", hc_rank, U)
    key("attention.indexer.head_count", idx_heads, U)
    key("attention.indexer.key_length", idx_dim, U)
    key("attention.indexer.top_k", idx_top_k, U)
    w.add_key_value("qwen4exp.attention.compress_ratios", ratios, A, sub_type=U)
    if ple:
        w.add_key_value("qwen4exp.ple.layers", [ple_layer], A, sub_type=U)
        key("ple.ngram_size", ple_ngram, U)
        key("ple.heads_per_ngram", ple_heads_per_ngram, U)
        key("ple.conv_kernel", ple_conv, U)
        key("ple.eos_token_id", eos, U)
        key("embedding_length_per_layer_input", ple_dim, U)
        w.add_key_value("qwen4exp.ple.layer_multipliers", list(PLE_MULTIPLIERS[:ple_ngram]), A, sub_type=U64)
        w.add_key_value("qwen4exp.ple.head_offsets", ple_offsets, A, sub_type=U64)
        w.add_key_value("qwen4exp.ple.head_vocab_sizes", ple_sizes, A, sub_type=U64)
    for k, value, vtype, sub in fields:
        w.add_key_value(k, value, vtype, sub_type=sub)

    put, t, norm = tensor_writers(w, rng, wtype, n_embd)
    hc_dim = hc * n_embd

    def f32(name, *shape, scale):  # kept F32 whatever wtype
        w.add_tensor(name, (rng.standard_normal(shape) * scale).astype(np.float32))

    def hc_norm(name):  # gammas folded to 1 + w; ggml {n_embd * hc} or {n_embd, hc}
        shape = (hc_dim,) if hc_norm_flat else (hc, n_embd)
        w.add_tensor(name, (1 + 0.1 * rng.standard_normal(shape)).astype(np.float32))

    def hc_mixer(prefix, inject):
        hc_norm(prefix + "norm.weight")
        t(prefix + "down.weight", hc_rank, hc_dim, scale=hc_dim**-0.5)
        t(prefix + "up.weight", hc_dim, hc_rank, scale=hc_rank**-0.5)
        if inject:
            t(prefix + "inject.weight", hc, hc_dim, scale=hc_dim**-0.5)

    t("token_embd.weight", n_vocab, n_embd, scale=1.0)
    hc_mixer("output_hc_", False)
    if not tied:
        t("output.weight", n_vocab, n_embd, scale=n_embd**-0.5)
    if ple:
        t("per_layer_token_embd.weight", ple_offsets[-1] + ple_sizes[-1], ple_dim, scale=1.0)

    key_dim, value_dim = d_state * n_k_heads, d_state * n_v_heads
    conv_dim = 2 * key_dim + value_dim
    for il in range(n_layer):
        p = f"blk.{il}."
        hc_mixer(p + "hc_attn_", True)
        hc_mixer(p + "hc_ffn_", True)
        if not recr[il]:
            t(p + "attn_q.weight", 2 * n_head * head_dim, n_embd, scale=n_embd**-0.5)
            t(p + "attn_k.weight", n_head_kv * head_dim, n_embd, scale=n_embd**-0.5)
            t(p + "attn_v.weight", n_head_kv * head_dim, n_embd, scale=n_embd**-0.5)
            t(p + "attn_output.weight", n_embd, n_head * head_dim, scale=(n_head * head_dim) ** -0.5)
            norm(p + "attn_q_norm.weight", head_dim, 0.2)
            norm(p + "attn_k_norm.weight", head_dim, 0.2)
            t(p + "indexer.q_proj.weight", idx_heads * idx_dim, n_embd, scale=n_embd**-0.5)
            t(p + "indexer.k_proj.weight", idx_dim, n_embd, scale=n_embd**-0.5)
            norm(p + "indexer.q_norm.weight", idx_dim, 0.2)
            norm(p + "indexer.k_norm.weight", idx_dim, 0.2)
        else:
            t(p + "attn_qkv.weight", conv_dim, n_embd, scale=n_embd**-0.5)
            t(p + "attn_gate.weight", value_dim, n_embd, scale=n_embd**-0.5)
            f32(p + "ssm_conv1d.weight", conv_dim, d_conv, scale=0.5)
            f32(p + "ssm_dt.bias", n_v_heads, scale=0.5)
            w.add_tensor(p + "ssm_a", (-np.exp(rng.standard_normal(n_v_heads) * 0.5)).astype(np.float32))
            t(p + "ssm_beta.weight", n_v_heads, n_embd, scale=n_embd**-0.5)
            t(p + "ssm_alpha.weight", n_v_heads, n_embd, scale=n_embd**-0.5)
            norm(p + "ssm_norm.weight", d_state)
            t(p + "ssm_out.weight", n_embd, value_dim, scale=value_dim**-0.5)
        if ple and il == ple_layer:
            t(p + "ple_key.weight", hc_dim, n_embd, scale=n_embd**-0.5)
            t(p + "ple_value.weight", n_embd, n_embd, scale=n_embd**-0.5)
            for n in ("ple_norm_key", "ple_norm_query", "ple_norm_conv"):
                hc_norm(p + n + ".weight")
            f32(p + "ple_conv1d.weight", hc_dim, ple_conv, scale=0.5)
        t(p + "ffn_gate_inp.weight", n_expert, n_embd, scale=n_embd**-0.5)
        t(p + "ffn_down_exps.weight", n_expert, n_embd, n_ff_exp, scale=n_ff_exp**-0.5)
        if fused_gate_up:  # gate rows then up rows
            t(p + "ffn_gate_up_exps.weight", n_expert, 2 * n_ff_exp, n_embd, scale=n_embd**-0.5)
        else:
            t(p + "ffn_gate_exps.weight", n_expert, n_ff_exp, n_embd, scale=n_embd**-0.5)
            t(p + "ffn_up_exps.weight", n_expert, n_ff_exp, n_embd, scale=n_embd**-0.5)
        f32(p + "ffn_gate_inp_shexp.weight", n_embd, scale=n_embd**-0.5)
        t(p + "ffn_gate_shexp.weight", n_ff_shexp, n_embd, scale=n_embd**-0.5)
        t(p + "ffn_up_shexp.weight", n_ff_shexp, n_embd, scale=n_embd**-0.5)
        t(p + "ffn_down_shexp.weight", n_embd, n_ff_shexp, scale=n_ff_shexp**-0.5)
    return finish(w, path)


def main(argv=None) -> int:
    ap = family_parser(__doc__)
    ap.add_argument("--no-ple", action="store_true", help="no PLE module")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    fields = family_fields(a)
    kw = {"ple_layer": None} if a.no_ple else {}
    print(synth_qwen4exp(a.out, fields, wtype=a.wtype, seed=a.seed, **kw))
    return 0


if __name__ == "__main__":
    sys.exit(main())
