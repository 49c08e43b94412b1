"""Synthetic GGUFs for the GPU check, with SmolLM2's real tokenizer (tokenizer-smollm2.gguf beside this file).

    python3 bench/gpu/synth.py timing OUTDIR [NAME...]     l8b.gguf (Llama-3-8B's shape), l1b.gguf (16 x 2048, 8192) and
                                                 m4g.gguf (a qwen3moe: 24 x 2048, 64 experts of 768, 8 per token)
    python3 bench/gpu/synth.py check OUTDIR [NAME...]      a small model per family: llama qwen3 qwen3moe gemma3 deepseek2 qwen35

SIZE=small makes small timing models (for a CPU). Every matrix is Q4_0 (norms, routers and biases F32), zero-mean.
The timing models tile a pool of random quant blocks (disk speed, rows repeat: for speed only; no superggml needed);
the check models are tests/support/synth_gguf.py's, their matrices quantized by ggml as they are written.
"""

from __future__ import annotations

import os
import sys

import gguf
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
TOKENIZER = os.path.join(HERE, "tokenizer-smollm2.gguf")
Q4_0 = gguf.GGMLQuantizationType.Q4_0
# name: (layers, n_embd, n_ff[, (experts, experts per token, n_ff per expert)]); heads of 128, n_embd / 512 K/V heads
TIMING = {
    "big": {"l8b": (32, 4096, 14336), "m4g": (24, 2048, 6144, (64, 8, 768)), "l1b": (16, 2048, 8192)},
    "small": {"l8b": (8, 512, 1536), "m4g": (4, 256, 768, (8, 2, 128)), "l1b": (4, 256, 1024)},
}


def tokenizer_fields():
    out = []
    for k, f in gguf.GGUFReader(TOKENIZER).fields.items():
        if k.startswith("tokenizer."):
            t = f.types[0]
            out.append((k, f.contents(), t, f.types[-1] if t == gguf.GGUFValueType.ARRAY else None))
    return out


def timing_model(path, n_layer, n_embd, n_ff, moe, fields, seed=7):
    """A llama-shaped Q4_0 GGUF whose matrices tile a pool of 65536 random blocks (nibbles 1..15: zero-mean); with
    `moe` (experts, experts per token, n_ff per expert) a qwen3moe of that shape instead (F32 routers and Q/K
    norms, every block's FFN its experts)."""
    rng = np.random.default_rng(seed)
    n_head, n_head_kv, hd = n_embd // 128, max(1, n_embd // 512), 128
    n_vocab = next(len(v) for k, v, *_ in fields if k == "tokenizer.ggml.tokens")
    pool = np.empty((1 << 16, 18), np.uint8)
    nibbles = rng.integers(1, 16, (2, 1 << 16, 16), dtype=np.uint8)
    pool[:, 2:] = nibbles[0] | (nibbles[1] << 4)
    arch = "qwen3moe" if moe else "llama"
    w = gguf.GGUFWriter(path, arch)
    w.add_name("synthetic-" + arch)
    w.add_block_count(n_layer)
    w.add_context_length(8192)
    w.add_embedding_length(n_embd)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_rope_freq_base(5e5)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_0)
    w.add_rope_dimension_count(hd)
    if moe:
        w.add_expert_count(moe[0])
        w.add_expert_used_count(moe[1])
        w.add_expert_feed_forward_length(moe[2])
    for k, v, t, sub in fields:
        w.add_key_value(k, v, t, sub_type=sub)
    plan = [
        ("token_embd.weight", (n_vocab, n_embd)),
        ("output_norm.weight", (n_embd,)),
        ("output.weight", (n_vocab, n_embd)),
    ]
    for i in range(n_layer):
        p = f"blk.{i}."
        plan += [
            (p + "attn_norm.weight", (n_embd,)),
            (p + "attn_q.weight", (n_head * hd, n_embd)),
            (p + "attn_k.weight", (n_head_kv * hd, n_embd)),
            (p + "attn_v.weight", (n_head_kv * hd, n_embd)),
            (p + "attn_output.weight", (n_embd, n_head * hd)),
            (p + "ffn_norm.weight", (n_embd,)),
        ]
        if moe:
            e, _, fe = moe
            plan += [
                (p + "attn_q_norm.weight", (hd,)),
                (p + "attn_k_norm.weight", (hd,)),
                (p + "ffn_gate_inp.weight", (e, n_embd)),
                (p + "ffn_gate_exps.weight", (e, fe, n_embd)),
                (p + "ffn_up_exps.weight", (e, fe, n_embd)),
                (p + "ffn_down_exps.weight", (e, n_embd, fe)),
            ]
        else:
            plan += [
                (p + "ffn_gate.weight", (n_ff, n_embd)),
                (p + "ffn_up.weight", (n_ff, n_embd)),
                (p + "ffn_down.weight", (n_embd, n_ff)),
            ]

    def f32(name, shape):
        return len(shape) == 1 or "ffn_gate_inp" in name

    for name, shape in plan:
        if f32(name, shape):
            w.add_tensor_info(name, shape, np.dtype(np.float32), int(np.prod(shape)) * 4)
        else:
            raw = (*shape[:-1], shape[-1] // 32 * 18)
            w.add_tensor_info(name, raw, np.dtype(np.uint8), int(np.prod(raw)), raw_dtype=Q4_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for name, shape in plan:
        if len(shape) == 1:
            w.write_tensor_data((1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32))
            continue
        if f32(name, shape):  # a router: zero-mean, so the tokens spread over the experts
            w.write_tensor_data((rng.standard_normal(shape) * shape[-1] ** -0.5).astype(np.float32))
            continue
        rows = int(np.prod(shape[:-1]))
        pool[:, :2] = np.array([shape[-1] ** -0.5 / 4.32], np.float16).view(np.uint8)  # std 1/sqrt(row length)
        blocks = np.resize(np.roll(pool, int(rng.integers(1 << 16)), axis=0), (rows * shape[-1] // 32, 18))
        w.write_tensor_data(blocks.reshape(*shape[:-1], shape[-1] // 32 * 18))
    w.close()


class Q4Writer(gguf.GGUFWriter):
    """A GGUFWriter that writes F32 matrices as Q4_0 (ggml's quantizer; rows of whole blocks; routers, the conv
    kernel and biases stay F32), as a Q4_0 model has them."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_0)

    def add_tensor(self, name, tensor, *args, **kw):
        if (
            tensor.dtype == np.float32
            and tensor.ndim >= 2
            and tensor.shape[-1] % 32 == 0
            and not args
            and not kw
            and "ffn_gate_inp" not in name
            and "ssm_conv1d" not in name
            and not name.endswith(".bias")
        ):
            from superggml import native

            q = native.quantize(native.GGMLType.Q4_0, np.ascontiguousarray(tensor.reshape(-1, tensor.shape[-1])))
            return super().add_tensor(name, q.reshape(*tensor.shape[:-1], q.shape[-1]), raw_dtype=Q4_0)
        return super().add_tensor(name, tensor, *args, **kw)


def check_models(out, names=()):
    """tests/support/synth_gguf.py's models (those named, else all), each written through Q4Writer."""
    sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "support"))
    import common  # noqa: F401  (refuses a superggml that is not run.sh's build)
    import synth_gguf as sg

    fields = sg.vocab_fields(TOKENIZER)
    specs = {
        "llama": dict(arch="llama", tied=False),
        "qwen3": dict(arch="qwen3", tied=False),
        "qwen3moe": dict(arch="qwen3moe", tied=False, n_expert=8, n_expert_used=2, n_ff_exp=64),
        "gemma3": sg.VARIANTS["gemma3-swa16-linear8"],  # a sliding window shorter than the prompt
        "deepseek2": sg.VARIANTS["deepseek2-lite"],
        "qwen35": sg.VARIANTS["qwen35-interval2"],
    }
    gguf.GGUFWriter = Q4Writer  # the writer synth_gguf's generators make
    for name, kw in specs.items():
        if names and name not in names:
            continue
        path = sg.synth(os.path.join(out, name + ".gguf"), fields, **kw)
        print(name, os.path.getsize(path), flush=True)


def main():
    what, out, names = sys.argv[1], sys.argv[2], sys.argv[3:]
    os.makedirs(out, exist_ok=True)
    if what == "check":
        check_models(out, names)
        return
    fields = tokenizer_fields()
    for name, shape in TIMING[os.environ.get("SIZE", "big")].items():
        if names and name not in names:
            continue
        path = os.path.join(out, name + ".gguf")
        timing_model(path, *shape[:3], shape[3] if len(shape) > 3 else None, fields)
        print(name, os.path.getsize(path), flush=True)


if __name__ == "__main__":
    main()
