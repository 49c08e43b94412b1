"""A mixture of experts larger than its memory: superggml's expert cache against llama.cpp's mmap, side by side
under the same real RAM limit (a child memory cgroup of a quarter of the file's size).

    python bench/moe_limited.py [--arch qwen3moe|deepseek2|qwen35moe|kimi-linear|...] [--tokens 16] [--json PATH]
    python bench/moe_limited.py --small          # a ~340 MB model, superggml only: a quick functional run
                                                 # (limit: a quarter of the file + the overhead)

The model is synthetic, laid out as tests/support/synth_gguf.py writes its family (same tensor names and keys, SmolLM2's
vocabulary, random quantized experts and attention, F32 norms, router and embedding, an untied quantized output).
- qwen3moe (the default): 16 layers x 64 experts of n_ff_exp 768, 8 per token, n_embd 1024, Q8_0: 2.4 GiB of
  experts, 2.7 GiB in all.
- qwen3moe-30b: Qwen3-30B-A3B's shape (48 layers, 128 experts of n_ff_exp 768, 8 per token, n_embd 2048, 32
  heads and 4 K/V heads of 128), Q4_0: about 17 GB.
- deepseek2: DeepSeek-V2-Lite's shape (27 layers, the first dense; multi-head latent attention with kv_lora_rank
  512, 16 heads, no q_lora; 64 experts of n_ff_exp 1408, 6 per token, 2 shared), Q4_0: about 15.5B weights,
  8.7 GB.
- qwen35moe: Qwen3.5-35B-A3B's shape (40 layers, every 4th gated full attention, the others gated delta-net;
  256 experts of n_ff_exp 512, 8 per token, a gated shared expert), Q4_0, SmolLM2's vocabulary: about 34B weights,
  19 GB.
- kimi-linear: Kimi-Linear-48B-A3B's dimensions (its public config.json), 9 of its 27 layers: n_embd 2304; KDA
  blocks of 32 heads of 128 with short convs of 4, MLA blocks where its linear_attn_config's full_attn_layers put
  them (4, 8, 12, ..., 1-based: blocks 3 and 7 of these 9; 32 heads, kv_lora_rank 512, qk_nope 128, qk_rope 64
  (never roped), v_head_dim 128, no q_lora); block 0 dense (intermediate_size 9216), the others 256 experts of
  1024, 8 per token, sigmoid routing with exp_probs_b, 1 shared expert, routed_scaling_factor 2.446; Q4_0,
  SmolLM2's vocabulary (not its own 163840): about 8.3 GiB (tests/support/synth_kimi_linear.py's layout).
It is written tensor by tensor (never held in memory) and cached under /work/tmp (or --cache-dir).

Every run is its own child process in a memory cgroup of a quarter of the file's size, with the file's pages
dropped from the page cache first. The same 16-token prompt, then `tokens` tokens decoded one by one,
teacher-forced from a token stream that repeats the previous token with probability 0, 0.5 or 0.9 (its temporal
locality; as bench/moe.py). Timed: the decode only.
- llama.cpp (llama-cpp-python): mmap, no repack (what runs at that limit), 2 threads; at locality 0 (and at the
  localities of --llama-localities).
- superggml: device_budget = limit - overhead, async_prefetch, direct_io (O_DIRECT reads of the experts); the
  dense part is planned first and the rest of the budget is the expert cache. Its hit rate, the expert bytes it
  read per token against the routed-experts floor (MoE layers * n_expert_used * bytes per expert: every routed
  expert read once per token, what paging experts without a cache costs), the router lookahead's
  precision/recall and whether its timed trial kept it (expert_lookahead auto, the default; --lookahead
  auto,on,off adds runs with it forced on and off). --budgets auto,0.75,0.9 runs superggml with no options
  at all ("auto": the plan's own budget, default context) and with hand budgets of those shares of the limit
  (nothing else set) instead.
Both save the logits of the prompt's last token and of the last decoded token: their argmax and largest
difference are reported (a check that both ran the same model).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from typing import Any

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
SUPPORT = os.path.join(HERE, "..", "tests", "support")

MODELS = {
    "qwen3moe": dict(
        arch="qwen3moe",
        wtype="q8_0",
        n_layer=16,
        n_embd=1024,
        n_head=16,
        n_head_kv=4,
        head_dim=64,
        n_expert=64,
        n_expert_used=8,
        n_ff_exp=768,
        n_lead=0,
    ),
    # MiniMax-M2 (230B-A10B): n_embd 3072, 48 heads (8 K/V) of 128, RoPE over 64, 256 experts of 1536, 8 per
    # token, sigmoid routing with exp_probs_b; 4 of its 62 layers (each 2 GiB of Q4_0 experts), to fit the disk
    "minimax-m2": dict(
        arch="minimax-m2",
        wtype="q4_0",
        n_layer=4,
        n_embd=3072,
        n_head=48,
        n_head_kv=8,
        head_dim=128,
        n_rot=64,
        n_expert=256,
        n_expert_used=8,
        n_ff_exp=1536,
        n_lead=0,
    ),
    "qwen3moe-small": dict(
        arch="qwen3moe",
        wtype="q8_0",
        n_layer=8,
        n_embd=512,
        n_head=8,
        n_head_kv=4,
        head_dim=64,
        n_expert=32,
        n_expert_used=4,
        n_ff_exp=512,
        n_lead=0,
    ),
    # Qwen3-30B-A3B: 48 layers, n_embd 2048, 32 heads (4 K/V) of 128, 128 experts of 768, 8 per token
    "qwen3moe-30b": dict(
        arch="qwen3moe",
        wtype="q4_0",
        n_layer=48,
        n_embd=2048,
        n_head=32,
        n_head_kv=4,
        head_dim=128,
        n_expert=128,
        n_expert_used=8,
        n_ff_exp=768,
        n_lead=0,
    ),
    # DeepSeek-V2-Lite: 27 layers (the first dense, n_ff 10944), n_embd 2048, 16 heads, kv_lora_rank 512, rope 64,
    # nope 128, v 128, no q_lora; 64 experts of 1408, 6 per token, 2 shared
    "deepseek2": dict(
        arch="deepseek2",
        wtype="q4_0",
        n_layer=27,
        n_embd=2048,
        n_head=16,
        kv_lora=512,
        qk_rope=64,
        qk_nope=128,
        v_head=128,
        n_expert=64,
        n_expert_used=6,
        n_shared=2,
        n_ff_exp=1408,
        n_ff=10944,
        n_lead=1,
    ),
    # Qwen3.5-35B-A3B: 40 layers (every 4th gated full attention: 16 heads of 256, 2 K/V heads; the others gated
    # delta-net: 32 value heads of 128 over 16 key heads, a conv window of 4), n_embd 2048; 256 experts of 512,
    # 8 per token, a gated shared expert of 512
    "qwen35moe": dict(
        arch="qwen35moe",
        wtype="q4_0",
        n_layer=40,
        n_embd=2048,
        n_head=16,
        n_head_kv=2,
        head_dim=256,
        interval=4,
        d_state=128,
        n_v_heads=32,
        n_k_heads=16,
        d_conv=4,
        n_expert=256,
        n_expert_used=8,
        n_ff_exp=512,
        n_ff_shexp=512,
        n_lead=0,
    ),
    "qwen35moe-small": dict(
        arch="qwen35moe",
        wtype="q4_0",
        n_layer=8,
        n_embd=512,
        n_head=8,
        n_head_kv=2,
        head_dim=64,
        interval=4,
        d_state=32,
        n_v_heads=8,
        n_k_heads=4,
        d_conv=4,
        n_expert=32,
        n_expert_used=4,
        n_ff_exp=256,
        n_ff_shexp=256,
        n_lead=0,
    ),
    # DeepSeek V4's layout (hyper-connections, one K=V head of 512 with sinks, CSA and HCA compressed K/V, a
    # lightning indexer, hash-routed and sqrt-softplus experts with a shared one) at dimensions of our choosing:
    # n_embd 4096, 64 heads, 128 experts of 2048, 6 per token, 5 blocks (ratios 4, 128, 4, 128, 4), Q4_0: ~9 GB
    "deepseek4": dict(
        arch="deepseek4",
        wtype="q4_0",
        n_layer=5,
        n_embd=4096,
        n_head=64,
        head_dim=512,
        n_rot=64,
        q_lora=1024,
        o_groups=8,
        o_rank=1024,
        n_swa=128,
        ratios=(4, 128, 4, 128, 4),
        indexer=(64, 128, 512),
        n_hash=1,
        n_expert=128,
        n_expert_used=6,
        n_ff_exp=2048,
        n_shared=1,
        n_lead=0,
    ),
    "deepseek4-small": dict(
        arch="deepseek4",
        wtype="q4_0",
        n_layer=4,
        n_embd=512,
        n_head=8,
        head_dim=128,
        n_rot=32,
        q_lora=256,
        o_groups=2,
        o_rank=128,
        n_swa=64,
        ratios=(4, 128, 4, 0),
        indexer=(8, 64, 64),
        n_hash=1,
        n_expert=32,
        n_expert_used=4,
        n_ff_exp=512,
        n_shared=1,
        n_lead=0,
    ),
    # Kimi-Linear-48B-A3B (config.json): n_embd 2304; KDA: 32 heads of 128, short_conv_kernel_size 4; MLA on the
    # full_attn_layers (1-based) 4, 8, 12, 16, 20, 24, 27: 32 heads, kv_lora_rank 512, qk_nope 128, qk_rope 64,
    # v_head_dim 128, q_lora_rank null; first_k_dense_replace 1 (intermediate_size 9216), then 256 experts of 1024,
    # 8 per token, 1 shared, sigmoid routing, routed_scaling_factor 2.446; 9 of its 27 layers (past 8 GB in Q4_0)
    "kimi-linear": dict(
        arch="kimi-linear",
        wtype="q4_0",
        n_layer=9,
        n_embd=2304,
        n_head=32,
        kda_head_dim=128,
        d_conv=4,
        full_attn=(4, 8, 12, 16, 20, 24, 27),
        kv_lora=512,
        qk_nope=128,
        qk_rope=64,
        v_head=128,
        n_expert=256,
        n_expert_used=8,
        n_shared=1,
        n_ff_exp=1024,
        n_ff=9216,
        weights_scale=2.446,
        n_lead=1,
    ),
    "kimi-linear-small": dict(
        arch="kimi-linear",
        wtype="q4_0",
        n_layer=8,
        n_embd=512,
        n_head=8,
        kda_head_dim=64,
        d_conv=4,
        full_attn=(4, 8),
        kv_lora=128,
        qk_nope=64,
        qk_rope=32,
        v_head=64,
        n_expert=32,
        n_expert_used=4,
        n_shared=1,
        n_ff_exp=512,
        n_ff=1024,
        weights_scale=2.446,
        n_lead=1,
    ),
    "deepseek2-small": dict(
        arch="deepseek2",
        wtype="q4_0",
        n_layer=8,
        n_embd=512,
        n_head=8,
        kv_lora=128,
        qk_rope=32,
        qk_nope=64,
        v_head=64,
        n_expert=32,
        n_expert_used=4,
        n_shared=2,
        n_ff_exp=512,
        n_ff=1024,
        n_lead=1,
    ),
}
PROMPT = 16
MiB = 1 << 20


# ------------------------------------------------------------------------------------------------ the model


def tensor_specs(p: dict, n_vocab: int) -> list[tuple]:
    """(name, numpy shape, kind, scale) in tests/support/synth_gguf.py's order for p["arch"], untied: kind "q" (a matrix
    quantized to p["wtype"]), "f32" (random F32), "norm" (1 + scale * N(0, 1))."""
    e, fe, ne = p["n_embd"], p["n_ff_exp"], p["n_expert"]
    out = [
        ("token_embd.weight", (n_vocab, e), "f32", 1.0),
        ("output_norm.weight", (e,), "norm", 0.1),
        ("output.weight", (n_vocab, e), "q", 0.2),
    ]
    experts = [
        ("ffn_gate_exps.weight", (ne, fe, e), "q", 0.08),
        ("ffn_up_exps.weight", (ne, fe, e), "q", 0.08),
        ("ffn_down_exps.weight", (ne, e, fe), "q", 0.08),
    ]
    if p["arch"] == "deepseek4":
        return deepseek4_specs(p, n_vocab)
    if p["arch"] == "kimi-linear":
        return kimi_linear_specs(p, n_vocab)
    for il in range(p["n_layer"]):
        b = f"blk.{il}."
        if p["arch"] == "qwen35moe":
            out += qwen35_block(p, b, (il + 1) % p["interval"] == 0) + [(b + n, s, k, c) for n, s, k, c in experts]
            continue
        if p["arch"] == "deepseek2":
            kv, h, qk = p["kv_lora"], p["n_head"], p["qk_nope"] + p["qk_rope"]
            out += [
                (b + "attn_norm.weight", (e,), "norm", 0.1),
                (b + "attn_q.weight", (h * qk, e), "q", 0.3),
                (b + "attn_kv_a_mqa.weight", (kv + p["qk_rope"], e), "q", 0.3),
                (b + "attn_kv_a_norm.weight", (kv,), "norm", 0.1),
                (b + "attn_k_b.weight", (h, kv, p["qk_nope"]), "q", 0.15),
                (b + "attn_v_b.weight", (h, p["v_head"], kv), "q", 0.15),
                (b + "attn_output.weight", (e, h * p["v_head"]), "q", 0.08),
                (b + "ffn_norm.weight", (e,), "norm", 0.1),
            ]
            if il < p["n_lead"]:
                out += [
                    (b + f"ffn_{n}.weight", shape, "q", 0.08)
                    for n, shape in (("gate", (p["n_ff"], e)), ("up", (p["n_ff"], e)), ("down", (e, p["n_ff"])))
                ]
            else:
                fs = fe * p["n_shared"]
                out += [(b + "ffn_gate_inp.weight", (ne, e), "f32", 0.5)] + [(b + n, s, k, c) for n, s, k, c in experts]
                out += [
                    (b + "ffn_gate_shexp.weight", (fs, e), "q", 0.08),
                    (b + "ffn_up_shexp.weight", (fs, e), "q", 0.08),
                    (b + "ffn_down_shexp.weight", (e, fs), "q", 0.08),
                ]
            continue
        hd = p["head_dim"]
        out += [
            (b + "attn_norm.weight", (e,), "norm", 0.1),
            (b + "ffn_norm.weight", (e,), "norm", 0.1),
            (b + "attn_q.weight", (p["n_head"] * hd, e), "q", 0.3),
            (b + "attn_k.weight", (p["n_head_kv"] * hd, e), "q", 0.3),
            (b + "attn_v.weight", (p["n_head_kv"] * hd, e), "q", 0.08),
            # sigmoid routing saturates on logits of a large spread: MiniMax's router gets logits of unit spread
            (b + "ffn_gate_inp.weight", (ne, e), "f32", e**-0.5 if p["arch"] == "minimax-m2" else 0.5),
        ] + [(b + n, s, k, c) for n, s, k, c in experts]
        whole = p["arch"] == "minimax-m2"  # its Q/K norms span every head, its router has exp_probs_b
        out += [
            (b + "attn_output.weight", (e, p["n_head"] * hd), "q", 0.08),
            (b + "attn_q_norm.weight", (p["n_head"] * hd if whole else hd,), "norm", 0.2),
            (b + "attn_k_norm.weight", (p["n_head_kv"] * hd if whole else hd,), "norm", 0.2),
        ] + ([(b + "exp_probs_b.bias", (ne,), "f32", 0.1)] if whole else [])
    return out


def deepseek4_specs(p: dict, n_vocab: int) -> list[tuple]:
    """A deepseek4 model's tensors in tests/support/synth_deepseek4.py's order (no MTP block): kind "i32" is the
    token-id to expert table of a hash-routed block."""
    e, ne, fe, hd, qr = p["n_embd"], p["n_expert"], p["n_ff_exp"], p["head_dim"], p["q_lora"]
    h, hc, g, o = p["n_head"], 4, p["o_groups"], p["o_rank"]
    mix, (ih, idim, _) = (2 + hc) * hc, p["indexer"]
    out: list[tuple] = [
        (f"blk.{il}.ffn_gate_tid2eid.weight", (n_vocab, p["n_expert_used"]), "i32", 0) for il in range(p["n_hash"])
    ]
    for il in range(p["n_layer"]):
        b = f"blk.{il}."
        out += [
            (b + "ffn_gate_exps.weight", (ne, fe, e), "q", e**-0.5),
            (b + "ffn_down_exps.weight", (ne, e, fe), "q", fe**-0.5),
            (b + "ffn_up_exps.weight", (ne, fe, e), "q", e**-0.5),
        ]
    out += [("token_embd.weight", (n_vocab, e), "f32", 1.0)]
    for il, r in enumerate(p["ratios"]):
        b = f"blk.{il}."
        out += [
            (b + "hc_attn_fn.weight", (mix, hc * e), "f32", 0.5 * (hc * e) ** -0.5),
            (b + "hc_attn_base.weight", (mix,), "f32", 0.5),
            (b + "hc_attn_scale.weight", (3,), "f32", 0.3),
            (b + "attn_norm.weight", (e,), "norm", 0.1),
            (b + "attn_sinks.weight", (h,), "f32", 0.5),
            (b + "attn_q_a.weight", (qr, e), "q", e**-0.5),
            (b + "attn_q_a_norm.weight", (qr,), "norm", 0.1),
            (b + "attn_q_b.weight", (h * hd, qr), "q", qr**-0.5),
            (b + "attn_kv.weight", (hd, e), "q", e**-0.5),
            (b + "attn_kv_a_norm.weight", (hd,), "norm", 0.1),
            (b + "attn_output_a.weight", (g * o, h * hd // g), "q", 0.05),
            (b + "attn_output_b.weight", (e, g * o), "q", 0.1 * (g * o / 64) ** -0.5),
        ]
        if r:
            c = 2 if r == 4 else 1
            out += [
                (b + "attn_compressor_kv.weight", (c * hd, e), "q", e**-0.5),
                (b + "attn_compressor_gate.weight", (c * hd, e), "q", e**-0.5),
                (b + "attn_compressor_ape.weight", (r, c * hd), "f32", 0.3),
                (b + "attn_compressor_norm.weight", (hd,), "norm", 0.1),
            ]
        if r == 4:
            out += [
                (b + "indexer.attn_q_b.weight", (ih * idim, qr), "q", qr**-0.5),
                (b + "indexer.proj.weight", (ih, e), "f32", e**-0.5),
                (b + "indexer_compressor_kv.weight", (2 * idim, e), "q", e**-0.5),
                (b + "indexer_compressor_gate.weight", (2 * idim, e), "q", e**-0.5),
                (b + "indexer_compressor_ape.weight", (r, 2 * idim), "f32", 0.3),
                (b + "indexer_compressor_norm.weight", (idim,), "norm", 0.1),
            ]
        fs = fe * p["n_shared"]
        out += [
            (b + "hc_ffn_fn.weight", (mix, hc * e), "f32", 0.5 * (hc * e) ** -0.5),
            (b + "hc_ffn_base.weight", (mix,), "f32", 0.5),
            (b + "hc_ffn_scale.weight", (3,), "f32", 0.3),
            (b + "ffn_norm.weight", (e,), "norm", 0.1),
            (b + "ffn_gate_inp.weight", (ne, e), "f32", 0.5),
        ]
        if il >= p["n_hash"]:
            out += [(b + "exp_probs_b.bias", (ne,), "f32", 0.1)]
        out += [
            (b + "ffn_gate_shexp.weight", (fs, e), "q", e**-0.5),
            (b + "ffn_up_shexp.weight", (fs, e), "q", e**-0.5),
            (b + "ffn_down_shexp.weight", (e, fs), "q", fs**-0.5),
        ]
    return out + [
        ("output_hc_fn.weight", (hc, hc * e), "f32", 0.5 * (hc * e) ** -0.5),
        ("output_hc_base.weight", (hc,), "f32", 0.5),
        ("output_hc_scale.weight", (1,), "f32", 0.3),
        ("output_norm.weight", (e,), "norm", 0.1),
        ("output.weight", (n_vocab, e), "q", 0.2),
    ]


def kimi_linear_specs(p: dict, n_vocab: int) -> list[tuple]:
    """A kimi-linear model's tensors in tests/support/synth_kimi_linear.py's order: KDA blocks (separate Q, K, V and
    their 4-D convs, low-rank decay and output gate), MLA blocks on full_attn (1-based) with one attn_q and the
    absorbed attn_k_b/attn_v_b, the first n_lead blocks dense, the rest routed experts with exp_probs_b and the
    shared expert; kind "neg" is ssm_a (-exp(A_log))."""
    e, h, hd, ne, fe = p["n_embd"], p["n_head"], p["kda_head_dim"], p["n_expert"], p["n_ff_exp"]
    kv, nope, rope, vh, di = p["kv_lora"], p["qk_nope"], p["qk_rope"], p["v_head"], p["n_head"] * p["kda_head_dim"]
    out: list[tuple] = [("token_embd.weight", (n_vocab, e), "f32", 1.0)]
    for il in range(p["n_layer"]):
        b = f"blk.{il}."
        out += [(b + "attn_norm.weight", (e,), "norm", 0.1)]
        if il + 1 in p["full_attn"]:
            out += [
                (b + "attn_q.weight", (h * (nope + rope), e), "q", e**-0.5),
                (b + "attn_kv_a_mqa.weight", (kv + rope, e), "q", e**-0.5),
                (b + "attn_kv_a_norm.weight", (kv,), "norm", 0.1),
                (b + "attn_k_b.weight", (h, kv, nope), "q", kv**-0.5),
                (b + "attn_v_b.weight", (h, vh, kv), "q", kv**-0.5),
                (b + "attn_output.weight", (e, h * vh), "q", (h * vh) ** -0.5),
            ]
        else:
            out += [(b + f"ssm_conv1d_{x}.weight", (1, di, 1, p["d_conv"]), "f32", 0.5) for x in "qkv"]
            out += [(b + f"attn_{x}.weight", (di, e), "q", e**-0.5) for x in "qkv"]
            out += [
                (b + "ssm_f_a.weight", (hd, e), "q", e**-0.5),
                (b + "ssm_f_b.weight", (di, hd), "q", hd**-0.5),
                (b + "ssm_beta.weight", (h, e), "q", e**-0.5),
                (b + "ssm_a", (1, 1, h, 1), "neg", 0.5),
                (b + "ssm_dt.bias", (di,), "f32", 0.5),
                (b + "ssm_g_a.weight", (hd, e), "q", e**-0.5),
                (b + "ssm_g_b.weight", (di, hd), "q", hd**-0.5),
                (b + "ssm_norm.weight", (hd,), "norm", 0.1),
                (b + "attn_output.weight", (e, di), "q", di**-0.5),
            ]
        out += [(b + "ffn_norm.weight", (e,), "norm", 0.1)]
        if il < p["n_lead"]:
            f = p["n_ff"]
            out += [
                (b + "ffn_gate.weight", (f, e), "q", e**-0.5),
                (b + "ffn_up.weight", (f, e), "q", e**-0.5),
                (b + "ffn_down.weight", (e, f), "q", f**-0.5),
            ]
            continue
        fs = fe * p["n_shared"]
        out += [
            (b + "ffn_gate_inp.weight", (ne, e), "f32", e**-0.5),
            (b + "exp_probs_b.bias", (ne,), "f32", 0.1),
            (b + "ffn_gate_exps.weight", (ne, fe, e), "q", e**-0.5),
            (b + "ffn_up_exps.weight", (ne, fe, e), "q", e**-0.5),
            (b + "ffn_down_exps.weight", (ne, e, fe), "q", fe**-0.5),
            (b + "ffn_gate_shexp.weight", (fs, e), "q", e**-0.5),
            (b + "ffn_up_shexp.weight", (fs, e), "q", e**-0.5),
            (b + "ffn_down_shexp.weight", (e, fs), "q", fs**-0.5),
        ]
    return out + [
        ("output_norm.weight", (e,), "norm", 0.1),
        ("output.weight", (n_vocab, e), "q", e**-0.5),
    ]


def qwen35_block(p: dict, b: str, attention: bool) -> list[tuple]:
    """A qwen35moe block's tensors but its experts, in tests/support/synth_gguf.py's order."""
    e, hd, S = p["n_embd"], p["head_dim"], p["d_state"]
    out = [(b + "attn_norm.weight", (e,), "norm", 0.1), (b + "post_attention_norm.weight", (e,), "norm", 0.1)]
    if attention:
        out += [
            (b + "attn_q.weight", (2 * p["n_head"] * hd, e), "q", 0.3),
            (b + "attn_k.weight", (p["n_head_kv"] * hd, e), "q", 0.3),
            (b + "attn_v.weight", (p["n_head_kv"] * hd, e), "q", 0.08),
            (b + "attn_output.weight", (e, p["n_head"] * hd), "q", 0.08),
            (b + "attn_q_norm.weight", (hd,), "norm", 0.2),
            (b + "attn_k_norm.weight", (hd,), "norm", 0.2),
        ]
    else:
        inner, ch, nv = S * p["n_v_heads"], S * (p["n_v_heads"] + 2 * p["n_k_heads"]), p["n_v_heads"]
        out += [
            (b + "attn_qkv.weight", (ch, e), "q", 0.3),
            (b + "attn_gate.weight", (inner, e), "q", 0.3),
            (b + "ssm_conv1d.weight", (ch, p["d_conv"]), "f32", 0.5),
            (b + "ssm_dt.bias", (nv,), "f32", 0.5),
            (b + "ssm_a", (nv,), "neg", 0.5),
            (b + "ssm_beta.weight", (nv, e), "q", 0.3),
            (b + "ssm_alpha.weight", (nv, e), "q", 0.3),
            (b + "ssm_norm.weight", (S,), "norm", 0.1),
            (b + "ssm_out.weight", (e, inner), "q", 0.08),
        ]
    fs = p["n_ff_shexp"]
    return out + [
        (b + "ffn_gate_inp.weight", (p["n_expert"], e), "f32", 0.5),
        (b + "ffn_gate_inp_shexp.weight", (e,), "f32", 0.3),
        (b + "ffn_gate_shexp.weight", (fs, e), "q", 0.08),
        (b + "ffn_up_shexp.weight", (fs, e), "q", 0.08),
        (b + "ffn_down_shexp.weight", (e, fs), "q", 0.08),
    ]


def write_keys(w: Any, p: dict, n_vocab: int) -> None:
    """The family's keys, as tests/support/synth_gguf.py writes them."""
    import gguf

    U = gguf.GGUFValueType.UINT32
    w.add_block_count(p["n_layer"])
    w.add_context_length(512)
    w.add_embedding_length(p["n_embd"])
    w.add_head_count(p["n_head"])
    w.add_rope_freq_base(10000.0)
    if p["arch"] == "qwen35moe":
        hd = p["head_dim"]
        w.add_feed_forward_length(p["n_ff_exp"])
        w.add_head_count_kv(p["n_head_kv"])
        w.add_layer_norm_rms_eps(1e-6)
        w.add_key_length(hd)
        w.add_value_length(hd)
        w.add_array("qwen35moe.rope.dimension_sections", [hd // 8 - hd // 16, hd // 32, hd // 32, 0])
        for name, value in (
            ("rope.dimension_count", hd // 4),
            ("ssm.conv_kernel", p["d_conv"]),
            ("ssm.state_size", p["d_state"]),
            ("ssm.group_count", p["n_k_heads"]),
            ("ssm.time_step_rank", p["n_v_heads"]),
            ("ssm.inner_size", p["d_state"] * p["n_v_heads"]),
            ("full_attention_interval", p["interval"]),
            ("expert_count", p["n_expert"]),
            ("expert_used_count", p["n_expert_used"]),
            ("expert_feed_forward_length", p["n_ff_exp"]),
            ("expert_shared_feed_forward_length", p["n_ff_shexp"]),
        ):
            w.add_key_value(f"qwen35moe.{name}", value, U)
        return
    if p["arch"] == "deepseek4":
        deepseek4_keys(w, p, n_vocab)
        return
    if p["arch"] == "kimi-linear":
        kimi_linear_keys(w, p, n_vocab)
        return
    if p["arch"] == "deepseek2":

        def key(name: str, value: Any) -> None:
            w.add_key_value(f"deepseek2.{name}", value, U)

        w.add_feed_forward_length(p["n_ff"])
        w.add_head_count_kv(1)
        w.add_layer_norm_rms_eps(1e-6)
        for name, value in (
            ("expert_count", p["n_expert"]),
            ("expert_used_count", p["n_expert_used"]),
            ("leading_dense_block_count", p["n_lead"]),
            ("vocab_size", n_vocab),
            ("attention.q_lora_rank", 0),
            ("attention.kv_lora_rank", p["kv_lora"]),
            ("attention.key_length", p["kv_lora"] + p["qk_rope"]),
            ("attention.value_length", p["kv_lora"]),
            ("attention.key_length_mla", p["qk_nope"] + p["qk_rope"]),
            ("attention.value_length_mla", p["v_head"]),
            ("expert_feed_forward_length", p["n_ff_exp"]),
            ("expert_shared_count", p["n_shared"]),
            ("rope.dimension_count", p["qk_rope"]),
        ):
            key(name, value)
        w.add_key_value("deepseek2.expert_weights_scale", 1.0, gguf.GGUFValueType.FLOAT32)
        return
    w.add_feed_forward_length(p["n_ff_exp"])
    w.add_head_count_kv(p["n_head_kv"])
    w.add_layer_norm_rms_eps(1e-5)
    w.add_key_length(p["head_dim"])
    w.add_value_length(p["head_dim"])
    w.add_expert_count(p["n_expert"])
    w.add_expert_used_count(p["n_expert_used"])
    w.add_expert_feed_forward_length(p["n_ff_exp"])
    if p["arch"] == "minimax-m2":
        w.add_key_value("minimax-m2.rope.dimension_count", p["n_rot"], U)
        w.add_key_value("minimax-m2.expert_gating_func", 2, U)


def kimi_linear_keys(w: Any, p: dict, n_vocab: int) -> None:
    """kimi-linear's keys after write_keys' first ones, as tests/support/synth_kimi_linear.py writes them: the block
    kind is the per-block head_count_kv (0: KDA, 1: an absorbed MLA block)."""
    import gguf

    U = gguf.GGUFValueType.UINT32

    def key(name: str, value: Any) -> None:
        w.add_key_value(f"kimi-linear.{name}", value, U)

    w.add_feed_forward_length(p["n_ff"])
    w.add_head_count_kv([int(il + 1 in p["full_attn"]) for il in range(p["n_layer"])])
    w.add_layer_norm_rms_eps(1e-5)
    w.add_key_length(p["kv_lora"] + p["qk_rope"])  # the absorbed MLA cache row
    w.add_value_length(p["n_embd"] // p["n_head"])  # HF's head_dim, as the converter writes it (unread)
    for name, value in (
        ("expert_count", p["n_expert"]),
        ("expert_used_count", p["n_expert_used"]),
        ("expert_gating_func", 2),  # sigmoid
        ("vocab_size", n_vocab),
        ("ssm.conv_kernel", p["d_conv"]),
        ("kda.head_dim", p["kda_head_dim"]),
        ("attention.kv_lora_rank", p["kv_lora"]),
        ("rope.dimension_count", p["qk_rope"]),
        ("attention.key_length_mla", p["qk_nope"] + p["qk_rope"]),
        ("attention.value_length_mla", p["v_head"]),
        ("expert_feed_forward_length", p["n_ff_exp"]),
        ("expert_shared_count", p["n_shared"]),
        ("leading_dense_block_count", p["n_lead"]),
    ):
        key(name, value)
    w.add_key_value("kimi-linear.expert_weights_scale", p["weights_scale"], gguf.GGUFValueType.FLOAT32)


def deepseek4_keys(w: Any, p: dict, n_vocab: int) -> None:
    """deepseek4's keys after write_keys' first ones, as tests/support/synth_deepseek4.py writes them."""
    import gguf

    U, F, B = gguf.GGUFValueType.UINT32, gguf.GGUFValueType.FLOAT32, gguf.GGUFValueType.BOOL

    def key(name: str, value: Any, vtype: Any = U) -> None:
        w.add_key_value(f"deepseek4.{name}", value, vtype)

    w.add_feed_forward_length(p["n_ff_exp"])
    w.add_head_count_kv(1)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_key_length(p["head_dim"])
    w.add_value_length(p["head_dim"])
    ih, idim, top = p["indexer"]
    for name, value in (
        ("expert_used_count", p["n_expert_used"]),
        ("expert_gating_func", 4),
        ("vocab_size", n_vocab),
        ("rope.dimension_count", p["n_rot"]),
        ("attention.q_lora_rank", p["q_lora"]),
        ("attention.output_lora_rank", p["o_rank"]),
        ("attention.output_group_count", p["o_groups"]),
        ("expert_feed_forward_length", p["n_ff_exp"]),
        ("expert_count", p["n_expert"]),
        ("expert_shared_count", p["n_shared"]),
        ("hash_layer_count", p["n_hash"]),
        ("attention.sliding_window", p["n_swa"]),
        ("attention.indexer.head_count", ih),
        ("attention.indexer.key_length", idim),
        ("attention.indexer.top_k", top),
        ("hyper_connection.count", 4),
        ("hyper_connection.sinkhorn_iterations", 20),
    ):
        key(name, value)
    w.add_array("deepseek4.attention.compress_ratios", list(p["ratios"]))
    key("attention.compress_rope_freq_base", 160000.0, F)
    key("expert_weights_scale", 1.5, F)
    key("expert_weights_norm", True, B)
    key("hyper_connection.epsilon", 1e-6, F)
    w.add_array("deepseek4.swiglu_clamp_exp", [10.0] * p["n_layer"])


def write_model(path: str, p: dict, fields: list, seed: int = 0) -> None:
    """Streams the GGUF: every tensor's info first, then header, keys and tensor infos, then each tensor's data,
    generated (and quantized in chunks of rows) only when it is written."""
    import gguf

    from superggml import native

    n_vocab = next(len(v) for k, v, *_ in fields if k == "tokenizer.ggml.tokens")
    w = gguf.GGUFWriter(path, p["arch"])
    write_keys(w, p, n_vocab)
    for key, value, vtype, sub in fields:
        w.add_key_value(key, value, vtype, sub_type=sub)
    specs = tensor_specs(p, n_vocab)
    qtype = getattr(gguf.GGMLQuantizationType, p["wtype"].upper())
    block, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    for name, shape, kind, _ in specs:
        if kind == "q":
            row = shape[-1] // block * block_bytes
            bshape = (*shape[:-1], row)
            w.add_tensor_info(name, bshape, np.dtype(np.uint8), int(np.prod(bshape)), raw_dtype=qtype)
        elif kind == "i32":
            w.add_tensor_info(name, shape, np.dtype(np.int32), int(np.prod(shape)) * 4)
        else:
            w.add_tensor_info(name, shape, np.dtype(np.float32), int(np.prod(shape)) * 4)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    rng = np.random.default_rng(seed)
    for name, shape, kind, scale in specs:
        if kind == "norm":
            a = (1 + scale * rng.standard_normal(shape)).astype(np.float32)
        elif kind == "neg":  # ssm_a: -exp(A_log)
            a = (-np.exp(scale * rng.standard_normal(shape))).astype(np.float32)
        elif kind == "f32":
            a = rng.standard_normal(shape, dtype=np.float32) * np.float32(scale)
        elif kind == "i32":  # distinct experts for each token id
            a = np.argsort(rng.random((shape[0], p["n_expert"])), axis=1)[:, : shape[1]].astype(np.int32)
        else:
            rows, k = int(np.prod(shape[:-1])), shape[-1]
            a = np.empty((rows, k // block * block_bytes), np.uint8)
            step = max(1, (16 * MiB) // (4 * k))
            for r in range(0, rows, step):
                n = min(step, rows - r)
                a[r : r + n] = native.quantize(
                    getattr(native.GGMLType, qtype.name),
                    rng.standard_normal((n, k), dtype=np.float32) * np.float32(scale),
                )
        w.write_tensor_data(a)
        del a
    w.close()


def model_path(p: dict, cache_dir: str) -> str:
    """The cached GGUF for these parameters, written first if it is not there."""
    sys.path.insert(0, SUPPORT)
    import synth_gguf

    from superggml import models

    vocab = str(models.smollm2_path())
    tag = hashlib.sha1(json.dumps([p, os.path.basename(vocab), 2], sort_keys=True).encode()).hexdigest()[:10]
    path = os.path.join(cache_dir, f"moe_limited-{p['arch']}-{p['n_layer']}x{p['n_expert']}-{tag}.gguf")
    if not os.path.exists(path):
        os.makedirs(cache_dir, exist_ok=True)
        t = time.perf_counter()
        print(f"writing {path} ...", flush=True)
        write_model(path + ".part", p, synth_gguf.vocab_fields(vocab))
        os.replace(path + ".part", path)
        print(f"  {os.path.getsize(path) / 2**30:.2f} GiB in {time.perf_counter() - t:.0f} s", flush=True)
    return path


def stream(n: int, locality: float, seed: int) -> list[int]:
    """As bench/moe.py: each token repeats the previous one with probability `locality`."""
    rng = np.random.default_rng(seed)
    out = [int(rng.integers(100, 40000))]
    for _ in range(n - 1):
        out.append(out[-1] if rng.random() < locality else int(rng.integers(100, 40000)))
    return out


# superggml's child (bench/limited_run.py's): the decode's change of these stats, and these after it
SG_DIFF = ("expert_hits", "expert_misses", "expert_bytes_loaded")
SG_REPORT = (
    "expert_lookahead_precision",
    "expert_lookahead_recall",
    "expert_lookahead",
    "expert_lookahead_trial_ms_on",
    "expert_lookahead_trial_ms_off",
    "expert_slots",
    "expert_slot_size",
    "layers_pinned",
    "n_slots",
    "slot_size",
    "budget",
)


def sequence_memory(path: str) -> dict[int, tuple[int, int]]:
    """context -> (bytes a sequence holds: K/V of the layers with one, plus recurrent states; the same model with a
    K/V cache in every block), at 4096 and 32768 tokens."""
    import dataclasses

    from superggml import native
    from superggml.arch import get_architecture
    from superggml.runtime.plan.memory_plan import kv_bytes

    f = native.GGUFFile(path)
    try:
        arch = get_architecture(f.metadata(), [t[0] for t in f.tensors()])
    finally:
        f.close()
    hp = arch.hp
    n_rec = sum(arch.is_recurrent(il) for il in range(hp.n_layer))
    states = 4 * n_rec * sum(arch.state_sizes) if n_rec else 0
    dense = dataclasses.replace(hp, n_layer_kv=0)
    return {
        ctx: (kv_bytes(hp, ctx, "f16", "f16") + states, kv_bytes(dense, ctx, "f16", "f16")) for ctx in (4096, 32768)
    }


# ------------------------------------------------------------------------------------------------ main


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--arch",
        choices=("qwen3moe", "qwen3moe-30b", "deepseek2", "deepseek4", "qwen35moe", "minimax-m2", "kimi-linear"),
        default="qwen3moe",
    )
    ap.add_argument("--small", action="store_true", help="a small model, superggml only (a functional run)")
    ap.add_argument("--tokens", type=int, default=16, help="decoded tokens per run")
    ap.add_argument("--limit", help="the cgroup limit (default: a quarter of the file's size)")
    ap.add_argument("--overhead", default="160MiB", help="device_budget = limit - overhead")
    ap.add_argument("--direct-io", choices=("on", "off", "auto"), default="on")
    ap.add_argument(
        "--threads",
        type=int,
        default=0,
        help="superggml's n_threads (default: its own choice; llama.cpp always gets 2)",
    )
    ap.add_argument(
        "--budgets",
        help="instead of the runs above, superggml with no options but device_budget: 'auto' (none at all) or a "
        "share of the limit, comma-separated (e.g. auto,0.75,0.9)",
    )
    ap.add_argument("--localities", default="0,0.5,0.9")
    ap.add_argument(
        "--lookahead",
        default="auto",
        help="superggml runs by expert_lookahead: auto (the default: a timed trial of the first 72 "
        "decoded tokens picks on or off; 'superggml'), on, off ('sg-look-on/off'), comma-separated",
    )
    ap.add_argument(
        "--llama-localities", help="localities llama.cpp runs at ('' for none; default 0, none with --small)"
    )
    ap.add_argument("--cache-dir", default="/work/tmp")
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--json")
    a = ap.parse_args()

    import tempfile

    import gguf
    import limited_run

    from superggml.settings import parse_size

    p = MODELS[a.arch + ("-small" if a.small else "")]
    path = model_path(p, a.cache_dir)
    size = os.path.getsize(path)
    if a.small and not a.limit:  # a quarter of a small file leaves no room for the process: budget a quarter
        limit = size // 4 + parse_size(a.overhead)
    else:
        limit = parse_size(a.limit) if a.limit else size // 4
    budget = limit - parse_size(a.overhead)
    expert_total = sum(int(t.n_bytes) for t in gguf.GGUFReader(path).tensors if "_exps" in t.name)
    n_moe = p["n_layer"] - p["n_lead"]
    per_expert = expert_total // (n_moe * p["n_expert"])
    floor = n_moe * p["n_expert_used"] * per_expert
    localities = [float(x) for x in a.localities.split(",") if x]
    llama_loc = a.llama_localities if a.llama_localities is not None else ("" if a.small else "0")
    llama_at = [float(x) for x in llama_loc.split(",") if x]
    direct = {"on": True, "off": False, "auto": None}[a.direct_io]
    print(
        f"{p['arch']} synthetic {os.path.basename(path)}: {size / 2**30:.2f} GiB, {n_moe} MoE layers x "
        f"{p['n_expert']} experts of {per_expert / MiB:.2f} MiB ({expert_total / 2**30:.2f} GiB), "
        f"{p['n_expert_used']} per token; cgroup limit {limit / MiB:.0f} MiB, superggml device_budget "
        f"{budget / MiB:.0f} MiB; prompt {PROMPT}, {a.tokens} decoded tokens",
        flush=True,
    )
    rows = []
    with tempfile.TemporaryDirectory() as work:
        for loc in localities:
            toks = stream(PROMPT + a.tokens, loc, seed=int(loc * 10))
            base = dict(tokens=toks, prompt=PROMPT, locality=loc)
            runs = []
            if loc in llama_at:
                runs.append(("llama.cpp", limited_run.LLAMA, dict(base, who="llama", n_threads=2, n_ctx=256)))
            for share in a.budgets.split(",") if a.budgets else []:
                # no options but the budget: the plan's own choice ("auto") against hand budgets of the limit
                options = {} if share == "auto" else {"device_budget": int(float(share) * limit)}
                who = f"sg-{share}"
                runs.append(
                    (who, limited_run.SUPERGGML, dict(base, who=who, options=options, diff=SG_DIFF, report=SG_REPORT))
                )
            for mode in a.lookahead.split(",") if not a.budgets else []:
                who = "superggml" if mode == "auto" else f"sg-look-{mode}"
                options = dict(
                    ctx_size=256,
                    n_batch=PROMPT,
                    device_budget=budget,
                    async_prefetch=True,
                    direct_io=direct,
                    expert_lookahead={"auto": None, "on": True, "off": False}[mode],
                )
                if a.threads:
                    options["n_threads"] = a.threads
                runs.append(
                    (who, limited_run.SUPERGGML, dict(base, who=who, options=options, diff=SG_DIFF, report=SG_REPORT))
                )
            got = {}
            for who, code, req in runs:
                r = limited_run.run(code, req, path, limit, a.timeout, work, f"{req['who']}-{req['locality']}")
                got[who] = r
                row = dict(
                    who=who,
                    locality=loc,
                    limit=limit,
                    model_bytes=size,
                    tokens=a.tokens,
                    repeats=sum(x == y for x, y in zip(toks[PROMPT:], toks[PROMPT - 1 :])),
                )
                if "error" in r:
                    row["error"] = r["error"]
                else:
                    row.update(
                        tok_s=a.tokens / r["decode_s"],
                        decode_s=r["decode_s"],
                        load_s=r["load_s"],
                        maxrss=r["maxrss"],
                        argmax=[int(x) for x in r["logits"].argmax(-1)],
                        finite=bool(np.isfinite(r["logits"]).all()),
                    )
                    if who != "llama.cpp":
                        d = r["decode"]
                        hits, misses = d["expert_hits"], d["expert_misses"]
                        read = d["expert_bytes_loaded"] / a.tokens
                        row.update(
                            budget=budget,
                            direct_io=a.direct_io,
                            hit_rate=hits / max(hits + misses, 1),
                            bytes_per_token=read,
                            floor_bytes_per_token=floor,
                            read_vs_floor=read / floor,
                            precision=r["expert_lookahead_precision"],
                            recall=r["expert_lookahead_recall"],
                            lookahead=r["expert_lookahead"],
                            trial_ms_on=r["expert_lookahead_trial_ms_on"],
                            trial_ms_off=r["expert_lookahead_trial_ms_off"],
                            expert_slots=r["expert_slots"],
                            expert_cache_bytes=r["expert_slots"] * r["expert_slot_size"],
                            layers_pinned=r["layers_pinned"],
                            dense_bytes=r["n_slots"] * r["slot_size"],
                            plan=r["budget"],
                        )
                rows.append(row)
                print(
                    "  "
                    + json.dumps(
                        {k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items() if k not in ("error",)}
                        | ({"error": row["error"][:300]} if "error" in row else {})
                    ),
                    flush=True,
                )
            if "error" not in got.get("llama.cpp", {"error": 1}):
                lg, ours = got["llama.cpp"]["logits"], rows[-len(runs) :]
                for row in ours[1:]:
                    if "error" in row:
                        continue
                    sg = got[row["who"]]["logits"]
                    row["vs_llama"] = dict(
                        speedup=row["tok_s"] / ours[0]["tok_s"],
                        argmax_equal=[bool(x) for x in lg.argmax(-1) == sg.argmax(-1)],
                        max_abs_diff=float(np.abs(lg - sg).max()),
                    )
    print()
    print(
        f"{'who':>11} {'locality':>8} {'tok/s':>7} {'hit rate':>8} {'MiB/token':>9} {'vs floor':>8} "
        f"{'lookahead prec/recall':>21} {'peak RSS':>8} {'vs llama.cpp':>12}"
    )
    for r in rows:
        if "error" in r:
            print(f"{r['who']:>11} {r['locality']:8.1f}   {r['error'][:80]}")
            continue
        sg = r["who"] != "llama.cpp"
        pr = f"{r['lookahead']} {r['precision']:.2f}/{r['recall']:.2f}" if sg else "-"
        vs = f"{r['vs_llama']['speedup']:.2f}x" if "vs_llama" in r else "-"
        print(
            f"{r['who']:>11} {r['locality']:8.1f} {r['tok_s']:7.2f} "
            + (
                f"{r['hit_rate']:8.1%} {r['bytes_per_token'] / MiB:9.1f} {r['read_vs_floor']:8.2f} "
                if sg
                else f"{'-':>8} {'-':>9} {'-':>8} "
            )
            + f"{pr:>21} {r['maxrss'] / MiB:7.0f}M {vs:>12}"
        )
    print(
        f"floor: {floor / MiB:.1f} MiB of experts per token ({n_moe} x {p['n_expert_used']} x "
        f"{per_expert / MiB:.2f} MiB)"
    )
    for r in rows:
        if "vs_llama" in r:
            v = r["vs_llama"]
            print(
                f"locality {r['locality']}: {r['who']} {v['speedup']:.2f}x llama.cpp's decode tok/s; argmax of the "
                f"prompt's and the last token's logits equal: {v['argmax_equal']}, largest logit difference "
                f"{v['max_abs_diff']:.3g}"
            )
    memory = sequence_memory(path)
    for ctx, (own, dense) in memory.items():
        print(
            f"memory per sequence at {ctx} tokens (F16 K/V, as the model's hyperparameters give it): "
            f"{own / MiB:.0f} MiB, against {dense / MiB:.0f} MiB with full attention in every block"
        )
    if a.json:
        with open(a.json, "w") as f:
            json.dump(
                dict(
                    model=path,
                    params=p,
                    model_bytes=size,
                    limit=limit,
                    budget=budget,
                    rows=rows,
                    sequence_memory=memory,
                ),
                f,
                indent=1,
            )
    return 0 if rows and not any("error" in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
