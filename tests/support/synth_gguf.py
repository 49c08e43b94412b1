"""Small GGUFs of every supported family with random weights, laid out as llama.cpp's converter writes them
(the gguf package's tensor names and keys), with a real vocabulary taken from another GGUF. The tests compare
superggml with llama.cpp on them; bench/ makes larger ones.

    python tests/support/synth_gguf.py VARIANT OUT.gguf [--vocab-from SOME.gguf]     (VARIANT: see VARIANTS)
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import functools
import hashlib
import os
import pickle
import shutil
import struct
import sys
import tempfile

import gguf
import numpy as np

from superggml import gguf as sg
from superggml import native

N_EMBD, N_HEAD, N_HEAD_KV, N_FF, N_LAYER = 64, 4, 2, 96, 2


@functools.lru_cache(maxsize=4)
def vocab_fields(path):
    """The tokenizer.* keys of a GGUF, as (key, value, type, element type) for GGUFWriter.add_key_value; read once
    per path (the reader takes seconds over a 49k-token vocabulary), so callers must not change the list."""
    fields = []
    for key, f in gguf.GGUFReader(path).fields.items():
        if key.startswith("tokenizer.") and key != "tokenizer.chat_template":
            vtype = f.types[0]
            sub = f.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
            fields.append((key, f.contents(), vtype, sub))
    return fields


def family_parser(doc, wtype=True):
    """The command line of a family's synthetic model (synth_<family>.py): the output path, --vocab-from and, with
    `wtype`, --wtype; the family adds its own options."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--vocab-from", help="GGUF whose vocabulary to use, cut to 1024 tokens (default: SmolLM2)")
    if wtype:
        ap.add_argument("--wtype", default="f32", choices=("f32", "f16", "q8_0", "q4_0"))
    return ap


def family_fields(args):
    """The vocabulary fields family_parser's arguments ask for: --vocab-from's (else SmolLM2's), cut to 1024 tokens."""
    from superggml import models

    return small_vocab_fields(vocab_fields(args.vocab_from or str(models.smollm2_path())), 1024)


def small_vocab_fields(fields, n):
    """`fields` cut to the first n tokens: their types and scores, the merges of those tokens into those tokens;
    the special ids must lie below n. A file of 1024 tokens loads in a fraction of a 49k-token file's time."""
    tokens = next(v for k, v, *_ in fields if k == "tokenizer.ggml.tokens")[:n]
    known = set(tokens)
    out = []
    for key, value, vtype, sub in fields:
        if key in ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.scores"):
            value = value[:n]
        elif key == "tokenizer.ggml.merges":
            kept = []
            for m in value:
                a, _, b = m.partition(" ")
                if a in known and b in known and a + b in known:
                    kept.append(m)
            value = kept or value[:1]
        elif key.endswith("_token_id"):
            assert value < n, (key, value)
        out.append((key, value, vtype, sub))
    return out


class _Cache:
    """The files synth() has written, by their arguments, in a directory of their own: a second call with the same
    arguments copies the first's file instead of drawing and quantizing its weights again, and a call under
    keys_left_out(drop=...) cuts the keys out of the cached file. Off until enable_cache(); bounded in bytes."""

    def __init__(self):
        self.dir: str | None = None
        self.limit = 0
        self.entries: dict[bytes, tuple[str, list[str], object]] = {}  # insertion order: least recently used first

    def enable(self, limit: int) -> None:
        if self.dir is None:
            self.dir = tempfile.mkdtemp(prefix="superggml-synth-")
            atexit.register(shutil.rmtree, self.dir, True)
        self.limit = limit

    def key(self, fields, arch, kw) -> bytes | None:
        try:
            blob = pickle.dumps((id(fields), len(fields), arch, sorted(kw.items())), protocol=4)
        except (pickle.PicklingError, TypeError, AttributeError):
            return None
        return hashlib.sha256(blob).digest()

    def get(self, key: bytes):
        entry = self.entries.pop(key, None)
        if entry is not None:
            self.entries[key] = entry
        return entry

    def put(self, key: bytes, path: str, keys: list[str], fields) -> None:
        assert self.dir is not None
        dst = os.path.join(self.dir, key.hex()[:32] + ".gguf")
        shutil.copyfile(path, dst)
        self.entries[key] = (dst, keys, fields)  # fields held, so that their id is not reused
        total = sum(os.path.getsize(p) for p, _, _ in self.entries.values())
        while total > self.limit and len(self.entries) > 1:
            old = next(iter(self.entries))
            victim = self.entries.pop(old)[0]
            total -= os.path.getsize(victim)
            os.unlink(victim)


_CACHE = _Cache()
_ADD_KEY_VALUE = gguf.GGUFWriter.add_key_value
_LEFT_OUT: list[tuple[frozenset[str], list[str] | None]] = []  # keys_left_out's, innermost last
_LAYOUT_CHANGED: list[bool] = []  # layout_changes active: synth() writes its files itself


def enable_cache(limit: int = 2 << 30) -> None:
    """Makes synth() keep up to `limit` bytes of the files it writes, for the rest of the process (the tests')."""
    _CACHE.enable(limit)


@contextlib.contextmanager
def layout_changes(arrays=(), flatten=(), values=None):
    """While active, synth() writes its file itself (no cache) with each metadata key in `arrays` as an array of
    its value per block (block_count copies), each tensor in `flatten` without its last dimension of 1 (ggml's
    order: numpy's first), as some converters write them, and each key in `values` with that value instead (an
    array's: a list, of its element type)."""
    values = values or {}
    add_kv, add_tensor = gguf.GGUFWriter.add_key_value, gguf.GGUFWriter.add_tensor
    n_block = [0]

    def add_kv_arrays(self, key, val, vtype, sub_type=None):
        if key.endswith(".block_count"):
            n_block[0] = int(val)
        if key in values:
            val = values[key]
        if key in arrays and vtype != gguf.GGUFValueType.ARRAY:
            assert n_block[0], f"{key} written before block_count"
            return add_kv(self, key, [val] * n_block[0], gguf.GGUFValueType.ARRAY, sub_type=vtype)
        return add_kv(self, key, val, vtype, sub_type)

    def add_tensor_flat(self, name, tensor, raw_shape=None, raw_dtype=None, **kw):
        if name in flatten:
            if raw_shape is not None and len(raw_shape) > 1 and raw_shape[0] == 1:
                raw_shape = raw_shape[1:]
            elif raw_shape is None and tensor.ndim > 1 and tensor.shape[0] == 1:
                tensor = tensor.reshape(tensor.shape[1:])
        return add_tensor(self, name, tensor, raw_shape=raw_shape, raw_dtype=raw_dtype, **kw)

    gguf.GGUFWriter.add_key_value, gguf.GGUFWriter.add_tensor = add_kv_arrays, add_tensor_flat
    _LAYOUT_CHANGED.append(True)
    try:
        yield
    finally:
        gguf.GGUFWriter.add_key_value, gguf.GGUFWriter.add_tensor = add_kv, add_tensor
        _LAYOUT_CHANGED.pop()


def synth(path, fields, arch="llama", **kw):
    """A random-weight GGUF of `arch` laid out as llama.cpp's converter writes it: deepseek2 (multi-head latent
    attention) by synth_deepseek2, glm4moe by synth_glm4moe, every other family by _synth (see each for the keyword
    arguments). Where enable_cache() was called, a file with the same arguments is copied from the cache."""
    key = _CACHE.key(fields, arch, kw) if _CACHE.dir is not None and not _LAYOUT_CHANGED else None
    if key is None:
        return _synth_any(path, fields, arch, **kw)
    entry = _CACHE.get(key)
    if entry is None:
        full = os.path.join(_CACHE.dir, "writing.gguf")
        keys: list[str] = []
        active, gguf.GGUFWriter.add_key_value = gguf.GGUFWriter.add_key_value, _ADD_KEY_VALUE  # every key written
        try:
            with keys_left_out(seen=keys, outer=False):
                _synth_any(full, fields, arch, **kw)
        finally:
            gguf.GGUFWriter.add_key_value = active
        _CACHE.put(key, full, keys, fields)
        os.unlink(full)
        entry = _CACHE.get(key)
    cached, keys, _ = entry
    drop = frozenset().union(*(d for d, _ in _LEFT_OUT))
    for _, seen in _LEFT_OUT:
        if seen is not None:
            seen.extend(keys)
    if drop & set(keys):
        without_keys(cached, path, drop)
    else:
        shutil.copyfile(cached, path)
    return str(path)


def _synth_any(path, fields, arch="llama", **kw):
    if arch in ("deepseek2", "mistral4", "deepseek32", "glm-dsa"):
        return synth_deepseek2(path, fields, arch=arch, **kw)
    if arch == "glm4moe":
        return synth_glm4moe(path, fields, **kw)
    if arch == "lfm2":
        return synth_lfm2(path, fields, **kw)
    if arch == "granitehybrid":
        return synth_granitehybrid(path, fields, **kw)
    if arch in ("nemotron_h", "nemotron_h_moe"):
        return synth_nemotron_h(path, fields, arch, **kw)
    if arch == "step35":
        return synth_step35(path, fields, **kw)
    if arch == "gemma4":
        return synth_gemma4(path, fields, **kw)
    if arch == "deepseek4":
        from synth_deepseek4 import synth_deepseek4  # it imports this module's writers

        return synth_deepseek4(path, fields, **kw)
    if arch == "kimi-k3":
        from synth_kimi_k3 import synth_kimi_k3

        return synth_kimi_k3(path, fields, **kw)
    if arch == "kimi-linear":
        from synth_kimi_linear import synth_kimi_linear

        return synth_kimi_linear(path, fields, **kw)
    if arch == "minimax-m3":
        from synth_minimax_m3 import synth_minimax_m3

        return synth_minimax_m3(path, fields, **kw)
    if arch == "mimo2":
        from synth_mimo2 import synth_mimo2

        return synth_mimo2(path, fields, **kw)
    if arch == "hy_v3":
        from synth_hy_v3 import synth_hy_v3

        return synth_hy_v3(path, fields, **kw)
    if arch == "hy_v4":
        from synth_hy_v4 import synth_hy_v4

        return synth_hy_v4(path, fields, **kw)
    if arch == "bailingmoe3":
        from synth_bailingmoe3 import synth_bailingmoe3

        return synth_bailingmoe3(path, fields, **kw)
    if arch == "dots3note":
        from synth_dots3note import synth_dots3note

        return synth_dots3note(path, fields, **kw)
    if arch == "glm5-next":
        from synth_glm5_next import synth_glm5_next

        return synth_glm5_next(path, fields, **kw)
    if arch == "qwen4exp":
        from synth_qwen4exp import synth_qwen4exp

        return synth_qwen4exp(path, fields, **kw)
    if arch in ("qwen35", "qwen35moe", "qwen3next"):
        return synth_qwen35(path, fields, arch, **kw)
    return _synth(path, fields, arch, **kw)


def _synth(
    path,
    fields,
    arch="llama",
    *,
    tied=True,
    rope_freqs=False,
    scaling=None,
    head_dim=None,
    seed=0,
    extra=None,
    wtype="f32",
    n_embd=N_EMBD,
    n_ff=N_FF,
    n_layer=N_LAYER,
    n_head=N_HEAD,
    n_head_kv=N_HEAD_KV,
    keys=None,
    rope=None,
    n_ctx_train=512,
    n_expert=0,
    n_expert_used=0,
    n_ff_exp=None,
    n_ff_shexp=None,
    qkv_bias=False,
    biases=False,
    n_lead=0,
    probs_bias=False,
    moe_step=0,
):
    """A random-weight GGUF laid out as llama.cpp's converter writes `arch`; `wtype` (f32, f16, q8_0, q4_k) is
    the type of the matmul weights, as a quantized model has them (norms and the embedding stay F32).

    scaling: a linear RoPE factor; rope: ("yarn", factor, original context) or ("longrope", original
    context) (LongRoPE's long and short factor tensors and attn_factor, as phi3's converter writes them);
    keys: more "{arch}.<key>" values (sliding window, soft caps...) as (value, GGUFValueType).
    n_expert > 0: a mixture of experts (3-D ffn_{gate,up,down}_exps of n_ff_exp, a router; a shared expert of
    n_ff_shexp for qwen2moe), laid out as llama.cpp's converter writes qwen2moe, qwen3moe, olmoe and Mixtral.
    qkv_bias: Q/K/V biases for seed_oss (qwen2's always has them); biases: attn_output's and the dense FFN's
    (mistral3's optional ones). ernie4_5-moe: n_lead leading dense blocks, exp_probs_b where probs_bias, an
    ungated shared expert of n_ff_shexp. llama4: experts in every moe_step-th block, with an ungated shared
    expert of n_ff_shexp."""
    rng = np.random.default_rng(seed)
    hd = head_dim or n_embd // n_head
    n_vocab = next(len(v) for k, v, *_ in fields if k == "tokenizer.ggml.tokens")
    w, _ = start_header(path, arch, n_layer, n_ctx_train, n_embd, n_ff, n_head, n_head_kv)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    if head_dim or arch.startswith("gemma"):
        w.add_key_length(hd)
        w.add_value_length(hd)
    if n_expert:
        w.add_expert_count(n_expert)
        w.add_expert_used_count(n_expert_used)
        if n_ff_exp:
            w.add_expert_feed_forward_length(n_ff_exp)
        if arch == "ernie4_5-moe":
            w.add_interleave_moe_layer_step(1)
            w.add_leading_dense_block_count(n_lead)
            w.add_expert_shared_count(1 if n_ff_shexp else 0)
        if arch == "llama4":
            w.add_interleave_moe_layer_step(moe_step)
        elif n_ff_shexp:
            w.add_expert_shared_feed_forward_length(n_ff_shexp)
    if scaling:
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(scaling)
    if rope and rope[0] == "yarn":
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(rope[1])
        w.add_rope_scaling_orig_ctx_len(rope[2])
    if rope and rope[0] == "longrope":
        w.add_rope_scaling_orig_ctx_len(rope[1])
        w.add_rope_scaling_attn_factors(float(np.sqrt(1 + np.log(n_ctx_train / rope[1]) / np.log(rope[1]))))
    for key, (value, vtype) in (keys or {}).items():
        w.add_key_value(f"{arch}.{key}", value, vtype)
    for key, value, vtype, sub in fields:
        w.add_key_value(key, value, vtype, sub_type=sub)

    def put(name, a):
        quant = {
            "q8_0": gguf.GGMLQuantizationType.Q8_0,
            "q4_k": gguf.GGMLQuantizationType.Q4_K,
            "mxfp4": gguf.GGMLQuantizationType.MXFP4,
        }.get(wtype)
        if wtype == "mxfp4" and "_exps" not in name:  # gpt-oss ships its experts in MXFP4, the rest in Q8_0
            quant = gguf.GGMLQuantizationType.Q8_0
        matrix = (
            a.ndim >= 2
            and name != "token_embd.weight"
            and "ffn_gate_inp" not in name  # the router,
            and not name.endswith(".bias")
        )  # biases stay F32
        if matrix and wtype == "f16":
            w.add_tensor(name, a.astype(np.float16))
        elif matrix and quant is not None:  # ggml's own quantizer, row by row
            q = native.quantize(getattr(native.GGMLType, quant.name), a.reshape(-1, a.shape[-1]))
            w.add_tensor(name, q.reshape(*a.shape[:-1], q.shape[-1]), raw_dtype=quant)
        else:
            w.add_tensor(name, a)

    def t(name, *shape, scale=0.08):  # numpy shape: rows first
        put(name, (rng.standard_normal(shape) * scale).astype(np.float32))

    def norm(name, n=n_embd, spread=0.1):
        w.add_tensor(name, (1 + spread * rng.standard_normal(n)).astype(np.float32))

    t("token_embd.weight", n_vocab, n_embd, scale=1.0 if not arch.startswith("gemma") else 0.125)
    norm("output_norm.weight")
    if not tied:
        t("output.weight", n_vocab, n_embd, scale=0.2)
    if rope_freqs:
        w.add_tensor("rope_freqs.weight", np.linspace(1, 8, hd // 2).astype(np.float32))
    if rope and rope[0] == "longrope":
        w.add_tensor("rope_factors_long.weight", np.linspace(1, 12, hd // 2).astype(np.float32))
        w.add_tensor("rope_factors_short.weight", np.linspace(1, 1.5, hd // 2).astype(np.float32))
    for name, value in (extra or {}).items():
        w.add_tensor(name, value)
    for il in range(n_layer):
        p = f"blk.{il}."
        for n in ("attn_norm", "post_attention_norm" if arch in ("gpt-oss", "seed_oss") else "ffn_norm"):
            norm(p + n + ".weight")
        moe = n_expert and il >= n_lead and (not moe_step or (il + 1) % moe_step == 0)
        if moe:
            t(p + "attn_q.weight", n_head * hd, n_embd, scale=0.3)
            t(p + "attn_k.weight", n_head_kv * hd, n_embd, scale=0.3)
            t(p + "attn_v.weight", n_head_kv * hd, n_embd)
            fe = n_ff_exp or n_ff
            t(p + "ffn_gate_inp.weight", n_expert, n_embd, scale=0.5)
            if probs_bias:
                t(p + "exp_probs_b.bias", n_expert, scale=0.1)
            t(p + "ffn_gate_exps.weight", n_expert, fe, n_embd)
            t(p + "ffn_up_exps.weight", n_expert, fe, n_embd)
            t(p + "ffn_down_exps.weight", n_expert, n_embd, fe)
            if arch == "gpt-oss":  # biases everywhere, attention sinks
                t(p + "ffn_gate_inp.bias", n_expert, scale=0.5)
                t(p + "ffn_gate_exps.bias", n_expert, fe, scale=0.3)
                t(p + "ffn_up_exps.bias", n_expert, fe, scale=0.3)
                t(p + "ffn_down_exps.bias", n_expert, n_embd, scale=0.3)
                for n, rows in (("q", n_head * hd), ("k", n_head_kv * hd), ("v", n_head_kv * hd)):
                    t(p + f"attn_{n}.bias", rows, scale=0.5)
                t(p + "attn_output.bias", n_embd, scale=0.3)
                t(p + "attn_sinks.weight", n_head, scale=1.0)
            if n_ff_shexp and arch == "qwen2moe":
                t(p + "ffn_gate_inp_shexp.weight", n_embd, scale=0.3)
            if n_ff_shexp:
                t(p + "ffn_gate_shexp.weight", n_ff_shexp, n_embd)
                t(p + "ffn_up_shexp.weight", n_ff_shexp, n_embd)
                t(p + "ffn_down_shexp.weight", n_embd, n_ff_shexp)
        elif arch == "phi3":  # fused, as llama.cpp's converter writes Phi-3: Q|K|V rows, gate|up rows
            qkv = np.concatenate(
                [
                    rng.standard_normal((n_head * hd, n_embd)) * 0.3,
                    rng.standard_normal((n_head_kv * hd, n_embd)) * 0.3,
                    rng.standard_normal((n_head_kv * hd, n_embd)) * 0.08,
                ]
            )
            put(p + "attn_qkv.weight", qkv.astype(np.float32))
            t(p + "ffn_up.weight", 2 * n_ff, n_embd)
        else:
            t(p + "attn_q.weight", n_head * hd, n_embd, scale=0.3)
            t(p + "attn_k.weight", n_head_kv * hd, n_embd, scale=0.3)
            t(p + "attn_v.weight", n_head_kv * hd, n_embd)
            t(p + "ffn_gate.weight", n_ff, n_embd)
            t(p + "ffn_up.weight", n_ff, n_embd)
        t(p + "attn_output.weight", n_embd, n_head * hd)
        if not moe:
            t(p + "ffn_down.weight", n_embd, n_ff)
        if arch in ("qwen3", "gemma3", "qwen3moe"):
            for n in ("attn_q_norm", "attn_k_norm"):
                norm(p + n + ".weight", hd, 0.2)
        if arch in ("olmoe", "minimax-m2"):  # norms of the whole Q and K projections
            norm(p + "attn_q_norm.weight", n_head * hd, 0.2)
            norm(p + "attn_k_norm.weight", n_head_kv * hd, 0.2)
        if arch.startswith("gemma"):
            norm(p + "post_attention_norm.weight")
            norm(p + "post_ffw_norm.weight")
        if biases:
            t(p + "attn_output.bias", n_embd, scale=0.3)
            if not n_expert:
                t(p + "ffn_gate.bias", n_ff, scale=0.3)
                t(p + "ffn_up.bias", n_ff, scale=0.3)
                t(p + "ffn_down.bias", n_embd, scale=0.3)
        if arch in ("qwen2", "qwen2moe") or (arch == "seed_oss" and qkv_bias):
            for n, rows in (("q", n_head * hd), ("k", n_head_kv * hd), ("v", n_head_kv * hd)):
                t(p + f"attn_{n}.bias", rows, scale=0.5)
    return finish(w, path)


def start_header(path, arch, n_blocks, n_ctx_train, n_embd, n_ff, n_head, n_head_kv):
    """A writer with TextModel.set_gguf_parameters' first keys in the converter's order, and a function that writes
    "{arch}.<name>" keys by name (the installed gguf package may lack the newer add_* helpers)."""
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(n_blocks)
    w.add_context_length(n_ctx_train)
    w.add_embedding_length(n_embd)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)

    def key(name, value, vtype):
        w.add_key_value(f"{arch}.{name}", value, vtype)

    return w, key


def finish(w, path):
    """Writes the header, the keys and the tensors of w to `path`; returns the path."""
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


def tensor_writers(w, rng, wtype, n_embd):
    """put(name, array), t(name, *numpy shape, scale) (random normal) and norm(name, n, spread) (1 + noise) for the
    writer w; wtype (f32, f16, q8_0, q4_0) is the type of the matmul weights: norms, the embedding, routers and
    biases stay F32."""
    quant = {"q8_0": gguf.GGMLQuantizationType.Q8_0, "q4_0": gguf.GGMLQuantizationType.Q4_0}.get(wtype)
    assert wtype in ("f32", "f16", "q8_0", "q4_0"), wtype

    def put(name, a):
        matrix = (
            a.ndim >= 2
            and a.dtype == np.float32  # an I32 table (deepseek4's tid2eid) is written as it is
            and name != "token_embd.weight"
            and "ffn_gate_inp" not in name
            and "indexer.proj" not in name  # the converter keeps DeepSeek's indexer weights F32
            # and DeepSeek V4's hyper-connection mixers and compressor position biases
            and not any(k in name for k in ("hc_", "compressor_ape"))
            and not name.endswith(".bias")
        )
        block = gguf.GGML_QUANT_SIZES[quant][0] if quant is not None else 1
        if matrix and wtype == "f16":
            w.add_tensor(name, a.astype(np.float16))
        # a row (ggml's ne0) that is not a whole number of blocks (32 for Q8_0: attn_q_b's q_lora_rank 48)
        # cannot be quantized: that tensor stays F32 (llama.cpp's quantizer would fall back to another type)
        elif matrix and quant is not None and a.shape[-1] % block == 0:
            q = native.quantize(getattr(native.GGMLType, quant.name), a.reshape(-1, a.shape[-1]))
            w.add_tensor(name, q.reshape(*a.shape[:-1], q.shape[-1]), raw_dtype=quant)
        else:
            w.add_tensor(name, a)

    def t(name, *shape, scale=0.08):  # numpy shape: ggml's ne reversed
        put(name, (rng.standard_normal(shape) * scale).astype(np.float32))

    def norm(name, n=n_embd, spread=0.1):
        w.add_tensor(name, (1 + spread * rng.standard_normal(n)).astype(np.float32))

    return put, t, norm


def start_tensors(w, fields, rng, wtype, n_embd, tied, output_norm="output_norm.weight"):
    """The vocabulary's keys and the tensors outside the blocks (embedding, output norm, an untied output) into
    w; returns tensor_writers' put, t and norm."""
    for k, value, vtype, sub in fields:
        w.add_key_value(k, value, vtype, sub_type=sub)
    put, t, norm = tensor_writers(w, rng, wtype, n_embd)
    n_vocab = next(len(v) for k, v, *_ in fields if k == "tokenizer.ggml.tokens")
    t("token_embd.weight", n_vocab, n_embd, scale=1.0)
    norm(output_norm)
    if not tied:
        t("output.weight", n_vocab, n_embd, scale=0.2)
    return put, t, norm


def attention_tensors(t, p, n_embd, n_head, n_head_kv, head_dim):
    """Block p's Q, K, V and output projections (heads of head_dim)."""
    t(p + "attn_q.weight", n_head * head_dim, n_embd, scale=0.3)
    t(p + "attn_k.weight", n_head_kv * head_dim, n_embd, scale=0.3)
    t(p + "attn_v.weight", n_head_kv * head_dim, n_embd)
    t(p + "attn_output.weight", n_embd, n_head * head_dim)


def ffn_tensors(t, p, dense, n_embd, n_ff, n_expert, n_ff_exp, n_shared, probs_bias, fused=False):
    """Block p's FFN as deepseek2 and glm4moe lay it out: a dense one of n_ff, or a router (plus exp_probs_b),
    n_expert experts of n_ff_exp (gate and up in one ffn_gate_up_exps where fused) and n_shared shared ones
    fused into one."""
    if dense:
        t(p + "ffn_gate.weight", n_ff, n_embd)
        t(p + "ffn_up.weight", n_ff, n_embd)
        t(p + "ffn_down.weight", n_embd, n_ff)
        return
    t(p + "ffn_gate_inp.weight", n_expert, n_embd, scale=0.5)
    if probs_bias:
        t(p + "exp_probs_b.bias", n_expert, scale=0.1)
    if fused:
        t(p + "ffn_gate_up_exps.weight", n_expert, 2 * n_ff_exp, n_embd)
    else:
        t(p + "ffn_gate_exps.weight", n_expert, n_ff_exp, n_embd)
        t(p + "ffn_up_exps.weight", n_expert, n_ff_exp, n_embd)
    t(p + "ffn_down_exps.weight", n_expert, n_embd, n_ff_exp)
    if n_shared:
        t(p + "ffn_gate_shexp.weight", n_ff_exp * n_shared, n_embd)
        t(p + "ffn_up_shexp.weight", n_ff_exp * n_shared, n_embd)
        t(p + "ffn_down_shexp.weight", n_embd, n_ff_exp * n_shared)


def dense_ffn_tensors(t, p, n_embd, n_ff):
    """Block p's dense SwiGLU of n_ff (gate, up, down), each matrix scaled by 1/sqrt(its fan-in), through the
    writer t."""
    t(p + "ffn_gate.weight", n_ff, n_embd, scale=n_embd**-0.5)
    t(p + "ffn_up.weight", n_ff, n_embd, scale=n_embd**-0.5)
    t(p + "ffn_down.weight", n_embd, n_ff, scale=n_ff**-0.5)


def scaled_ffn_tensors(t, p, dense, n_embd, n_ff, n_expert, n_ff_exp, n_sh, probs_bias=True):
    """Block p's FFN as the synthetic models of the 2026 families lay it out, each matrix scaled by 1/sqrt(its
    fan-in): a dense SwiGLU of n_ff, or a router (plus exp_probs_b), n_expert experts of n_ff_exp and a shared
    expert of n_sh (0: none)."""
    if dense:
        dense_ffn_tensors(t, p, n_embd, n_ff)
        return
    t(p + "ffn_gate_inp.weight", n_expert, n_embd, scale=n_embd**-0.5)
    if probs_bias:
        t(p + "exp_probs_b.bias", n_expert, scale=0.1)  # F32, as every bias
    t(p + "ffn_gate_exps.weight", n_expert, n_ff_exp, n_embd, scale=n_embd**-0.5)
    t(p + "ffn_up_exps.weight", n_expert, n_ff_exp, n_embd, scale=n_embd**-0.5)
    t(p + "ffn_down_exps.weight", n_expert, n_embd, n_ff_exp, scale=n_ff_exp**-0.5)
    if n_sh:
        t(p + "ffn_gate_shexp.weight", n_sh, n_embd, scale=n_embd**-0.5)
        t(p + "ffn_up_shexp.weight", n_sh, n_embd, scale=n_embd**-0.5)
        t(p + "ffn_down_shexp.weight", n_embd, n_sh, scale=n_sh**-0.5)


def mtp_tensors(t, norm, p, n_embd):
    """An MTP block's own tensors (its embedding and head are the model's)."""
    t(p + "nextn.eh_proj.weight", n_embd, 2 * n_embd)
    norm(p + "nextn.enorm.weight")
    norm(p + "nextn.hnorm.weight")
    norm(p + "nextn.shared_head_norm.weight")


def echo_writers(put, t, norm, n_embd):
    """t and norm for a model whose next token depends on its last token only, and whose MTP block predicts it:
    every block adds nothing to the residual (zero attention, delta-net and FFN outputs), the MTP block passes its
    token's normed embedding on (eh_proj [I | 0], enorm of ones) and reads the model's output norm (no
    shared_head_norm of its own)."""

    def echo_t(name, *shape, scale=0.08):
        if "attn_output" in name or "ffn_down" in name or "ssm_out" in name:
            put(name, np.zeros(shape, dtype=np.float32))
        elif name.endswith("nextn.eh_proj.weight"):
            put(name, np.hstack([np.eye(n_embd), np.zeros((n_embd, n_embd))]).astype(np.float32))
        else:
            t(name, *shape, scale=scale)

    def echo_norm(name, n=n_embd, spread=0.1):
        if name.endswith("nextn.shared_head_norm.weight"):
            return
        norm(name, n, 0.0 if name.endswith("nextn.enorm.weight") else spread)

    return echo_t, echo_norm


def synth_deepseek2(
    path,
    fields,
    *,
    arch="deepseek2",
    fused=False,
    temperature=None,
    n_embd=64,
    n_head=4,
    n_layer=3,
    n_ff=96,
    n_lead_dense=1,
    q_lora_rank=0,
    kv_lora_rank=32,
    qk_rope=16,
    qk_nope=32,
    v_head=32,
    n_expert=8,
    n_expert_used=2,
    n_shared=1,
    n_ff_exp=32,
    gating=None,
    probs_bias=False,
    n_group=0,
    n_group_used=0,
    weights_norm=None,
    weights_scale=None,
    yarn=None,
    mtp=False,
    legacy=False,
    indexer=None,
    indexer_types=None,
    tied=True,
    wtype="f32",
    seed=0,
    n_ctx_train=512,
):
    """A random-weight deepseek2 GGUF (DeepSeek-V2/V3, Kimi K2, GLM-4.7-Flash: multi-head latent attention in
    the absorbed layout, attn_k_b and attn_v_b split out of kv_b_proj) laid out as llama.cpp's converter
    (DeepseekV2Model) writes it: n_lead_dense dense blocks of n_ff, then MoE blocks of n_expert routed experts
    of n_ff_exp (n_expert_used per token) and n_shared shared ones fused into one of n_ff_exp * n_shared.

    q_lora_rank 0: the "lite" single attn_q, else attn_q_a, its norm and attn_q_b. gating None: no
    expert_gating_func key (llama.cpp then softmaxes), 1 softmax, 2 sigmoid; probs_bias: the
    exp_probs_b.bias the routing adds before its top-k; n_group/n_group_used (0: no key): grouped routing;
    weights_norm/weights_scale (None: no key): the routed weights normalized, scaled; yarn: (factor,
    original context, mscale_all_dim) written as the converter writes DeepSeek's YaRN; mtp: a
    next-token-prediction block after them (nextn_predict_layers 1), as glm4moe's; legacy: the layout converters
    wrote before the absorbed one (one attn_kv_b, key/value_length per head, head_count_kv = n_head, no
    key_length_mla). arch mistral4: the same layout under Mistral 4's name; fused: the experts' gate and up in one
    ffn_gate_up_exps; temperature: (scale, length), the attention temperature's keys (Mistral-Large 3).
    wtype (f32, f16, q8_0) is the type of the matmul weights; norms, the embedding, the router and
    exp_probs_b stay F32."""
    rng = np.random.default_rng(seed)
    if indexer_types is not None:  # repeated over n_layer
        indexer_types = [indexer_types[il % len(indexer_types)] for il in range(n_layer)]
    n_vocab = next(len(v) for k, v, *_ in fields if k == "tokenizer.ggml.tokens")
    U, F, B = gguf.GGUFValueType.UINT32, gguf.GGUFValueType.FLOAT32, gguf.GGUFValueType.BOOL
    # TextModel.set_gguf_parameters, then DeepseekV2Model's; the absorbed MLA is written as MQA: one latent "head"
    n_all = n_layer + (1 if mtp else 0)
    w, key = start_header(path, arch, n_all, n_ctx_train, n_embd, n_ff, n_head, n_head if legacy else 1)
    if yarn:
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(yarn[0])
        w.add_rope_scaling_orig_ctx_len(yarn[1])
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-6)
    key("expert_count", n_expert, U)
    key("expert_used_count", n_expert_used, U)
    if n_group:
        key("expert_group_count", n_group, U)
    if n_group_used:
        key("expert_group_used_count", n_group_used, U)
    if gating is not None:
        key("expert_gating_func", gating, U)
    key("leading_dense_block_count", n_lead_dense, U)
    key("vocab_size", n_vocab, U)
    # the converter writes it only when the checkpoint has one; llama.cpp requires it unless the model has
    # 26 or 27 blocks (its "lite" guess), so written always: 0 is the single attn_q
    key("attention.q_lora_rank", q_lora_rank, U)
    key("attention.kv_lora_rank", kv_lora_rank, U)
    if legacy:
        key("attention.key_length", qk_nope + qk_rope, U)
        key("attention.value_length", v_head, U)
    else:
        key("attention.key_length", kv_lora_rank + qk_rope, U)
        key("attention.value_length", kv_lora_rank, U)
        key("attention.key_length_mla", qk_nope + qk_rope, U)
        key("attention.value_length_mla", v_head, U)
    key("expert_feed_forward_length", n_ff_exp, U)
    key("expert_shared_count", n_shared, U)
    if weights_scale is not None:
        key("expert_weights_scale", float(weights_scale), F)
    if weights_norm is not None:  # the converter writes it only when true; False here is an explicit false
        key("expert_weights_norm", bool(weights_norm), B)
    key("rope.dimension_count", qk_rope, U)
    if yarn:  # 0.1 * mscale_all_dim: llama.cpp divides the 0.1 back out
        key("rope.scaling.yarn_log_multiplier", 0.1 * yarn[2], F)
    if mtp:
        key("nextn_predict_layers", 1, U)
    if temperature:
        key("attention.temperature_scale", float(temperature[0]), F)
        key("attention.temperature_length", int(temperature[1]), U)
    if indexer:  # DeepSeek sparse attention (deepseek32, glm-dsa): (heads, head size, top k)
        key("attention.indexer.head_count", indexer[0], U)
        key("attention.indexer.key_length", indexer[1], U)
        key("attention.indexer.top_k", indexer[2], U)
        if indexer_types is not None:
            w.add_array(f"{arch}.attention.indexer.types", [bool(x) for x in indexer_types])
    _, t, norm = start_tensors(w, fields, rng, wtype, n_embd, tied)
    n_qk = qk_nope + qk_rope
    for il in range(n_all):
        p = f"blk.{il}."
        norm(p + "attn_norm.weight")
        if q_lora_rank > 0:
            t(p + "attn_q_a.weight", q_lora_rank, n_embd, scale=0.3)
            norm(p + "attn_q_a_norm.weight", q_lora_rank)
            t(p + "attn_q_b.weight", n_head * n_qk, q_lora_rank, scale=0.3)
        else:
            t(p + "attn_q.weight", n_head * n_qk, n_embd, scale=0.3)
        t(p + "attn_kv_a_mqa.weight", kv_lora_rank + qk_rope, n_embd, scale=0.3)  # latent | shared rope K
        norm(p + "attn_kv_a_norm.weight", kv_lora_rank)
        if legacy:
            t(p + "attn_kv_b.weight", n_head * (qk_nope + v_head), kv_lora_rank, scale=0.15)
        else:
            t(p + "attn_k_b.weight", n_head, kv_lora_rank, qk_nope, scale=0.15)  # ggml {qk_nope, kv_lora, n_head}
            t(p + "attn_v_b.weight", n_head, v_head, kv_lora_rank, scale=0.15)  # ggml {kv_lora, v_head, n_head}
        t(p + "attn_output.weight", n_embd, n_head * v_head)
        norm(p + "ffn_norm.weight")
        ffn_tensors(t, p, il < n_lead_dense, n_embd, n_ff, n_expert, n_ff_exp, n_shared, probs_bias, fused)
        if indexer and (indexer_types is None or il >= n_layer or indexer_types[il]):
            n_idx, d_idx, _ = indexer
            norm(p + "indexer.k_norm.weight", d_idx, 0.2)
            t(p + "indexer.k_norm.bias", d_idx, scale=0.1)
            t(p + "indexer.proj.weight", n_idx, n_embd, scale=0.5)
            t(p + "indexer.attn_k.weight", d_idx, n_embd, scale=0.3)
            t(p + "indexer.attn_q_b.weight", n_idx * d_idx, q_lora_rank, scale=0.3)
        if il >= n_layer:
            mtp_tensors(t, norm, p, n_embd)
    return finish(w, path)


def synth_glm4moe(
    path,
    fields,
    *,
    n_embd=64,
    n_head=4,
    n_head_kv=2,
    head_dim=32,
    n_layer=3,
    n_ff=96,
    n_lead_dense=1,
    n_expert=8,
    n_expert_used=2,
    n_shared=1,
    n_ff_exp=32,
    qkv_bias=True,
    qk_norm=False,
    weights_norm=True,
    weights_scale=None,
    mtp=False,
    echo=False,
    tied=False,
    wtype="f32",
    seed=0,
    n_ctx_train=512,
):
    """A random-weight glm4moe GGUF (GLM-4.5/4.6/4.7) laid out as llama.cpp's converter (Glm4MoeModel) writes it:
    RoPE over half of each head, Q/K/V biases (qkv_bias), Q/K head norms (qk_norm), post_attention_norm as the
    FFN's pre-norm, n_lead_dense dense blocks, then experts with sigmoid routing plus exp_probs_b and shared
    experts; mtp: a next-token-prediction block after them (nextn_predict_layers 1), which a forward pass skips;
    echo: see echo_writers."""
    rng = np.random.default_rng(seed)
    U, F, B = gguf.GGUFValueType.UINT32, gguf.GGUFValueType.FLOAT32, gguf.GGUFValueType.BOOL
    n_all = n_layer + (1 if mtp else 0)
    w, key = start_header(path, "glm4moe", n_all, n_ctx_train, n_embd, n_ff, n_head, n_head_kv)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    key("expert_count", n_expert, U)
    key("expert_used_count", n_expert_used, U)
    key("rope.dimension_count", head_dim // 2, U)  # partial_rotary_factor 0.5
    key("expert_feed_forward_length", n_ff_exp, U)
    key("expert_shared_count", n_shared, U)
    key("leading_dense_block_count", n_lead_dense, U)
    key("expert_gating_func", 2, U)
    if weights_scale is not None:
        key("expert_weights_scale", float(weights_scale), F)
    key("expert_weights_norm", bool(weights_norm), B)
    if mtp:
        key("nextn_predict_layers", 1, U)
    put, t, norm = start_tensors(w, fields, rng, wtype, n_embd, tied)
    if echo:
        t, norm = echo_writers(put, t, norm, n_embd)
    for il in range(n_all):
        p = f"blk.{il}."
        norm(p + "attn_norm.weight")
        for n, rows in (("q", n_head * head_dim), ("k", n_head_kv * head_dim), ("v", n_head_kv * head_dim)):
            t(p + f"attn_{n}.weight", rows, n_embd, scale=0.3 if n != "v" else 0.08)
            if qkv_bias:
                t(p + f"attn_{n}.bias", rows, scale=0.5)
        t(p + "attn_output.weight", n_embd, n_head * head_dim)
        if qk_norm:
            norm(p + "attn_q_norm.weight", head_dim, 0.2)
            norm(p + "attn_k_norm.weight", head_dim, 0.2)
        norm(p + "post_attention_norm.weight")
        ffn_tensors(t, p, il < n_lead_dense, n_embd, n_ff, n_expert, n_ff_exp, n_shared, True)
        if il >= n_layer:
            mtp_tensors(t, norm, p, n_embd)
    return finish(w, path)


def synth_lfm2(
    path,
    fields,
    *,
    layers="ccaccaca",
    l_cache=3,
    n_embd=64,
    n_head=4,
    n_head_kv=2,
    n_ff=96,
    n_swa=0,
    tied=True,
    wtype="f32",
    seed=0,
    n_ctx_train=512,
):
    """A random-weight lfm2 GGUF laid out as llama.cpp's converter (LFM2Model) writes it: `layers` names each
    block, c a short convolution (head_count_kv 0) and a attention; l_cache: the conv's kernel; n_swa > 0: a
    sliding window on the attention layers."""
    rng = np.random.default_rng(seed)
    n_vocab = next(len(v) for k, v, *_ in fields if k == "tokenizer.ggml.tokens")
    U = gguf.GGUFValueType.UINT32
    w = gguf.GGUFWriter(str(path), "lfm2")
    w.add_block_count(len(layers))
    w.add_context_length(n_ctx_train)
    w.add_embedding_length(n_embd)
    w.add_head_count(n_head)
    w.add_head_count_kv([0 if k == "c" else n_head_kv for k in layers])
    w.add_rope_freq_base(10000.0)
    if n_swa:
        w.add_sliding_window(n_swa)
    w.add_key_value("lfm2.vocab_size", n_vocab, U)
    w.add_key_value("lfm2.shortconv.l_cache", l_cache, U)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_feed_forward_length(n_ff)
    _, t, norm = start_tensors(w, fields, rng, wtype, n_embd, tied, "token_embd_norm.weight")
    hd = n_embd // n_head
    for il, kind in enumerate(layers):
        p = f"blk.{il}."
        norm(p + "ffn_norm.weight")
        t(p + "ffn_gate.weight", n_ff, n_embd)
        t(p + "ffn_up.weight", n_ff, n_embd)
        t(p + "ffn_down.weight", n_embd, n_ff)
        norm(p + "attn_norm.weight")
        if kind == "c":
            t(p + "shortconv.conv.weight", n_embd, l_cache, scale=0.5)
            t(p + "shortconv.in_proj.weight", 3 * n_embd, n_embd, scale=0.3)
            t(p + "shortconv.out_proj.weight", n_embd, n_embd)
        else:
            norm(p + "attn_q_norm.weight", hd, 0.2)
            norm(p + "attn_k_norm.weight", hd, 0.2)
            attention_tensors(t, p, n_embd, n_head, n_head_kv, hd)
    return finish(w, path)


def mamba2_keys(key, d_conv, d_state, n_group, d_inner, n_ssm_head):
    U = gguf.GGUFValueType.UINT32
    key("ssm.conv_kernel", d_conv, U)
    key("ssm.state_size", d_state, U)
    key("ssm.group_count", n_group, U)
    key("ssm.inner_size", d_inner, U)
    key("ssm.time_step_rank", n_ssm_head, U)


def mamba2_tensors(
    w, t, rng, p, n_embd, d_inner, d_state, n_ssm_head, n_group, d_conv, conv_bias=True, flat_norm=False
):
    """A Mamba-2 mixer's tensors as Mamba2Model's converter writes them (A = -exp(A_log), the conv, A, D and the
    norm kept F32); flat_norm: the norm written 1-D ([d_inner], one group), as some converters do."""
    ch = d_inner + 2 * n_group * d_state

    def f32(name, a):
        w.add_tensor(name, a.astype(np.float32))

    t(p + "ssm_in.weight", 2 * d_inner + 2 * n_group * d_state + n_ssm_head, n_embd, scale=0.15)
    f32(p + "ssm_conv1d.weight", rng.standard_normal((ch, d_conv)) * 0.4)
    if conv_bias:
        f32(p + "ssm_conv1d.bias", rng.standard_normal(ch) * 0.1)
    f32(p + "ssm_dt.bias", rng.standard_normal(n_ssm_head) * 0.5)
    f32(p + "ssm_a", -np.exp(rng.standard_normal((n_ssm_head, 1)) * 0.5))
    f32(p + "ssm_d", 1 + rng.standard_normal((n_ssm_head, 1)) * 0.1)
    norm_shape = (d_inner,) if flat_norm else (n_group, d_inner // n_group)
    f32(p + "ssm_norm.weight", 1 + rng.standard_normal(norm_shape) * 0.1)
    t(p + "ssm_out.weight", n_embd, d_inner)


def synth_granitehybrid(
    path,
    fields,
    *,
    layers="mmamma",
    n_layer=None,
    n_embd=64,
    n_head=4,
    n_head_kv=2,
    n_ff=96,
    d_state=16,
    n_ssm_head=8,
    n_group=2,
    d_conv=4,
    rope=False,
    scales=True,
    n_expert=0,
    n_expert_used=0,
    n_ff_shexp=0,
    tied=False,
    wtype="f32",
    seed=0,
    n_ctx_train=512,
    flat_norm=False,
):
    """A random-weight granitehybrid GGUF laid out as llama.cpp's converter (GraniteHybridModel) writes it:
    `layers` names each block, m a Mamba-2 mixer (head_count_kv 0: d_inner = 2 * n_embd, n_ssm_head heads,
    n_group groups of B and C of d_state) and a attention (RoPE where `rope`: Bamba's rope.scaling.finetuned);
    `scales`: Granite's embedding, residual, attention and logit scales; n_expert > 0: softmax-routed experts of
    n_ff and a shared expert of n_ff_shexp. n_layer: `layers` repeated to that many blocks."""
    rng = np.random.default_rng(seed)
    arch = "granitehybrid"
    layers = layers if n_layer is None else (layers * n_layer)[:n_layer]
    U, F = gguf.GGUFValueType.UINT32, gguf.GGUFValueType.FLOAT32
    d_inner, n_layer = 2 * n_embd, len(layers)
    kv = [0 if k == "m" else n_head_kv for k in layers]
    w, key = start_header(path, arch, n_layer, n_ctx_train, n_embd, n_ff, n_head, kv)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    if scales:
        key("attention.scale", 0.0078125 * 16, F)
        key("embedding_scale", 12.0, F)
        key("residual_scale", 0.22, F)
        key("logit_scale", 8.0, F)
    if n_expert:
        w.add_expert_count(n_expert)
        w.add_expert_used_count(n_expert_used)
        if n_ff_shexp:
            key("expert_shared_feed_forward_length", n_ff_shexp, U)
    mamba2_keys(key, d_conv, d_state, n_group, d_inner, n_ssm_head)
    key("rope.scaling.finetuned", bool(rope), gguf.GGUFValueType.BOOL)
    _, t, norm = start_tensors(w, fields, rng, wtype, n_embd, tied)
    hd = n_embd // n_head
    for il, kind in enumerate(layers):
        p = f"blk.{il}."
        norm(p + "attn_norm.weight")
        if kind == "m":
            mamba2_tensors(w, t, rng, p, n_embd, d_inner, d_state, n_ssm_head, n_group, d_conv, flat_norm=flat_norm)
        else:
            attention_tensors(t, p, n_embd, n_head, n_head_kv, hd)
        norm(p + "ffn_norm.weight")
        if n_expert:
            t(p + "ffn_gate_inp.weight", n_expert, n_embd, scale=0.5)
            t(p + "ffn_gate_exps.weight", n_expert, n_ff, n_embd)
            t(p + "ffn_up_exps.weight", n_expert, n_ff, n_embd)
            t(p + "ffn_down_exps.weight", n_expert, n_embd, n_ff)
            if n_ff_shexp:
                t(p + "ffn_gate_shexp.weight", n_ff_shexp, n_embd)
                t(p + "ffn_up_shexp.weight", n_ff_shexp, n_embd)
                t(p + "ffn_down_shexp.weight", n_embd, n_ff_shexp)
        else:
            t(p + "ffn_gate.weight", n_ff, n_embd)
            t(p + "ffn_up.weight", n_ff, n_embd)
            t(p + "ffn_down.weight", n_embd, n_ff)
    return finish(w, path)


def synth_gemma4(
    path,
    fields,
    *,
    layers="11101110",
    n_layer=None,
    n_shared=4,
    n_embd=64,
    n_head=4,
    n_head_kv=2,
    n_head_kv_full=1,
    head_dim=16,
    head_dim_full=32,
    rot_factor=0.25,
    n_ff=96,
    n_pl=16,
    n_expert=0,
    n_expert_used=2,
    n_ff_exp=32,
    fused=False,
    k_eq_v=False,
    out_scale=True,
    n_swa=16,
    softcap=30.0,
    tied=True,
    wtype="f32",
    seed=0,
    n_ctx_train=512,
):
    """A random-weight gemma4 GGUF laid out as llama.cpp's converter (Gemma4Model) writes it: `layers` flags each
    block's sliding window (heads of head_dim, n_head_kv K/V heads; the others: head_dim_full, n_head_kv_full), the
    last n_shared blocks read earlier blocks' K/V (they keep their K/V projections, unused); n_pl > 0: per-layer
    embeddings; n_expert > 0: every block's FFN is a dense MLP beside experts (a scaled router, per-expert scales;
    gate and up fused where `fused`); k_eq_v: the full blocks have no V projection (V is K's input); out_scale:
    layer_output_scale; full blocks rotate rot_factor of each head (rope_freqs of 1e30 for the rest)."""
    rng = np.random.default_rng(seed)
    if n_layer is not None:
        layers = (layers * n_layer)[:n_layer]
    arch, n_layer = "gemma4", len(layers)
    swa = [c == "1" for c in layers]
    kv = [n_head_kv if s else n_head_kv_full for s in swa]
    w, key = start_header(path, arch, n_layer, n_ctx_train, n_embd, n_ff, n_head, kv)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_key_length(head_dim_full)
    w.add_value_length(head_dim_full)
    w.add_rope_freq_base(1000000.0)
    w.add_rope_freq_base_swa(10000.0)
    w.add_sliding_window(n_swa)
    if softcap:
        w.add_final_logit_softcapping(softcap)
    w.add_shared_kv_layers(n_shared)
    w.add_embedding_length_per_layer_input(n_pl)
    w.add_sliding_window_pattern(swa)
    w.add_key_length_swa(head_dim)
    w.add_value_length_swa(head_dim)
    if n_expert:
        w.add_expert_feed_forward_length(n_ff_exp)
        w.add_expert_count(n_expert)
        w.add_expert_used_count(n_expert_used)
    w.add_rope_dimension_count(head_dim_full)
    w.add_rope_dimension_count_swa(head_dim)
    put, t, norm = start_tensors(w, fields, rng, wtype, n_embd, tied)
    n_rot = int(head_dim_full * rot_factor / 2)
    put("rope_freqs.weight", np.array([1.0] * n_rot + [1e30] * (head_dim_full // 2 - n_rot), dtype=np.float32))
    n_vocab = next(len(v) for k, v, *_ in fields if k == "tokenizer.ggml.tokens")
    if n_pl:
        t("per_layer_token_embd.weight", n_vocab, n_pl * n_layer, scale=1.0)
        t("per_layer_model_proj.weight", n_pl * n_layer, n_embd, scale=0.3)
        norm("per_layer_proj_norm.weight", n_pl)
    for il in range(n_layer):
        p = f"blk.{il}."
        hd = head_dim if swa[il] else head_dim_full
        norm(p + "attn_norm.weight")
        t(p + "attn_q.weight", n_head * hd, n_embd, scale=0.3)
        t(p + "attn_k.weight", kv[il] * hd, n_embd, scale=0.3)
        if not (k_eq_v and not swa[il]):
            t(p + "attn_v.weight", kv[il] * hd, n_embd)
        t(p + "attn_output.weight", n_embd, n_head * hd)
        norm(p + "attn_q_norm.weight", hd, 0.2)
        norm(p + "attn_k_norm.weight", hd, 0.2)
        norm(p + "post_attention_norm.weight")
        if out_scale:
            put(p + "layer_output_scale.weight", np.array([0.5 + 0.1 * il], dtype=np.float32))
        norm(p + "ffn_norm.weight")
        t(p + "ffn_gate.weight", n_ff, n_embd)
        t(p + "ffn_up.weight", n_ff, n_embd)
        t(p + "ffn_down.weight", n_embd, n_ff)
        norm(p + "post_ffw_norm.weight")
        if n_expert:
            t(p + "ffn_gate_inp.weight", n_expert, n_embd, scale=0.5)
            norm(p + "ffn_gate_inp.scale", spread=0.3)
            norm(p + "pre_ffw_norm_2.weight")
            norm(p + "post_ffw_norm_1.weight")
            norm(p + "post_ffw_norm_2.weight")
            if fused:
                t(p + "ffn_gate_up_exps.weight", n_expert, 2 * n_ff_exp, n_embd)
            else:
                t(p + "ffn_gate_exps.weight", n_expert, n_ff_exp, n_embd)
                t(p + "ffn_up_exps.weight", n_expert, n_ff_exp, n_embd)
            t(p + "ffn_down_exps.weight", n_expert, n_embd, n_ff_exp)
            norm(p + "ffn_down_exps.scale", n_expert, 0.3)
        if n_pl:
            t(p + "inp_gate.weight", n_pl, n_embd, scale=0.3)
            t(p + "proj.weight", n_embd, n_pl)
            norm(p + "post_norm.weight")
    return finish(w, path)


def synth_nemotron_h(
    path,
    fields,
    arch="nemotron_h",
    *,
    layers="M-M*-M-",
    n_embd=64,
    n_head=4,
    n_head_kv=2,
    head_dim=16,
    n_ff=96,
    d_state=16,
    n_ssm_head=8,
    ssm_head_dim=16,
    n_group=2,
    d_conv=4,
    biases=False,
    conv_bias=True,
    n_expert=0,
    n_expert_used=0,
    n_ff_shexp=48,
    n_layer=None,
    tied=False,
    wtype="f32",
    seed=0,
    n_ctx_train=512,
):
    """A random-weight nemotron_h GGUF laid out as llama.cpp's converter (NemotronHModel) writes it: `layers` is
    the hybrid_override_pattern, M a Mamba-2 mixer (d_inner = n_ssm_head * ssm_head_dim), * attention, - an MLP
    of n_ff (ReLU squared; with `biases`, up and down biases). conv_bias False: the mixers lack ssm_conv1d.bias
    (llama.cpp loads the file and aborts in its graph). nemotron_h_moe (NemotronHModel with experts): E an MLP
    block of n_expert experts of n_ff (up, ReLU squared, down; sigmoid routing with exp_probs_b) and a shared
    expert of n_ff_shexp. n_layer: `layers` repeated to that many blocks."""
    rng = np.random.default_rng(seed)
    layers = layers if n_layer is None else (layers * n_layer)[:n_layer]
    F, U = gguf.GGUFValueType.FLOAT32, gguf.GGUFValueType.UINT32
    d_inner = n_ssm_head * ssm_head_dim
    kv = [n_head_kv if k == "*" else 0 for k in layers]
    ff = [n_ff if k in "-E" else 0 for k in layers]
    w, key = start_header(path, arch, len(layers), n_ctx_train, n_embd, ff, n_head, kv)
    w.add_layer_norm_rms_eps(1e-5)
    key("attention.layer_norm_epsilon", 1e-5, F)
    mamba2_keys(key, d_conv, d_state, n_group, d_inner, n_ssm_head)
    key("rope.scaling.finetuned", False, gguf.GGUFValueType.BOOL)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    if n_expert:
        w.add_expert_used_count(n_expert_used)
        w.add_expert_feed_forward_length(n_ff)
        key("expert_shared_feed_forward_length", n_ff_shexp, U)
        w.add_expert_count(n_expert)
        key("expert_shared_count", 1, U)
        key("expert_weights_norm", True, gguf.GGUFValueType.BOOL)
        key("expert_weights_scale", 2.5, F)
    put, t, norm = start_tensors(w, fields, rng, wtype, n_embd, tied)
    for il, kind in enumerate(layers):
        p = f"blk.{il}."
        norm(p + "attn_norm.weight")
        if kind == "M":
            mamba2_tensors(w, t, rng, p, n_embd, d_inner, d_state, n_ssm_head, n_group, d_conv, conv_bias)
        elif kind == "*":
            attention_tensors(t, p, n_embd, n_head, n_head_kv, head_dim)
        elif kind == "E":
            t(p + "ffn_gate_inp.weight", n_expert, n_embd, scale=0.5)
            t(p + "exp_probs_b.bias", n_expert, scale=0.1)
            t(p + "ffn_up_exps.weight", n_expert, n_ff, n_embd, scale=0.2)
            t(p + "ffn_down_exps.weight", n_expert, n_embd, n_ff)
            t(p + "ffn_up_shexp.weight", n_ff_shexp, n_embd, scale=0.2)
            t(p + "ffn_down_shexp.weight", n_embd, n_ff_shexp)
        else:
            t(p + "ffn_up.weight", n_ff, n_embd, scale=0.2)
            t(p + "ffn_down.weight", n_embd, n_ff)
            if biases:
                put(p + "ffn_up.bias", (rng.standard_normal(n_ff) * 0.1).astype(np.float32))
                put(p + "ffn_down.bias", (rng.standard_normal(n_embd) * 0.1).astype(np.float32))
    return finish(w, path)


def synth_step35(
    path,
    fields,
    *,
    swa="0101",
    moe="0011",
    n_layer=None,
    n_embd=64,
    n_head=4,
    n_head_swa=6,
    n_head_kv=2,
    n_head_kv_swa=None,
    head_dim=16,
    n_ff=96,
    n_expert=8,
    n_expert_used=2,
    n_ff_exp=32,
    n_swa=16,
    clamps=True,
    extras=True,
    wtype="f32",
    seed=0,
    n_ctx_train=512,
):
    """A random-weight step35 GGUF laid out as llama.cpp's converter (Step3p5Model) writes it: `swa` and `moe` flag
    each block's sliding window (n_head_swa heads, whole-head RoPE) and experts (a router with exp_probs_b, a shared
    expert); `clamps`: per-layer SwiGLU clamps; `extras`: Q/K head norms and head-wise gates; n_head_kv_swa: the
    sliding blocks' K/V heads where they differ (attention.head_count_kv per layer)."""
    rng = np.random.default_rng(seed)
    if n_layer is not None:
        swa, moe = (swa * n_layer)[:n_layer], (moe * n_layer)[:n_layer]
    arch, n_layer = "step35", len(swa)
    F = gguf.GGUFValueType.FLOAT32
    heads = [n_head_swa if s == "1" else n_head for s in swa]
    kv = [n_head_kv_swa if s == "1" and n_head_kv_swa else n_head_kv for s in swa]
    w, key = start_header(path, arch, n_layer, n_ctx_train, n_embd, n_ff, heads, kv)
    w.add_rope_freq_base(100000.0)
    key("rope.freq_base_swa", 10000.0, F)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_sliding_window(n_swa)
    w.add_array(f"{arch}.attention.sliding_window_pattern", [s == "1" for s in swa])
    w.add_expert_count(n_expert)
    w.add_expert_used_count(n_expert_used)
    w.add_expert_feed_forward_length(n_ff_exp)
    key("expert_shared_feed_forward_length", n_ff_exp, gguf.GGUFValueType.UINT32)
    key("expert_weights_scale", 3.0, F)
    key("expert_weights_norm", True, gguf.GGUFValueType.BOOL)
    key("leading_dense_block_count", moe.index("1") if "1" in moe else n_layer, gguf.GGUFValueType.UINT32)
    w.add_layer_norm_rms_eps(1e-5)
    if clamps:
        w.add_array(f"{arch}.swiglu_clamp_exp", [0.6 if m == "1" else 0.0 for m in moe])
        w.add_array(f"{arch}.swiglu_clamp_shexp", [0.5, 0.0, 0.7, 0.4][:n_layer] + [0.0] * max(0, n_layer - 4))
    _, t, norm = start_tensors(w, fields, rng, wtype, n_embd, False)
    for il in range(n_layer):
        p, h = f"blk.{il}.", heads[il]
        norm(p + "attn_norm.weight")
        attention_tensors(t, p, n_embd, h, kv[il], head_dim)
        if extras:
            norm(p + "attn_q_norm.weight", head_dim, 0.2)
            norm(p + "attn_k_norm.weight", head_dim, 0.2)
            t(p + "attn_gate.weight", h, n_embd, scale=0.3)
        norm(p + "ffn_norm.weight")
        ffn_tensors(t, p, moe[il] == "0", n_embd, n_ff, n_expert, n_ff_exp, 1, True)
    return finish(w, path)


def synth_qwen35(
    path,
    fields,
    arch="qwen35",
    *,
    n_embd=64,
    n_head=4,
    n_head_kv=2,
    head_dim=32,
    n_layer=4,
    interval=2,
    n_ff=96,
    d_conv=4,
    d_state=16,
    n_v_heads=4,
    n_k_heads=2,
    n_expert=0,
    n_expert_used=0,
    n_ff_exp=32,
    n_ff_shexp=48,
    mtp=False,
    echo=False,
    tied=False,
    wtype="f32",
    seed=0,
    n_ctx_train=512,
):
    """A random-weight qwen35 (Qwen3.5), qwen35moe or qwen3next (Qwen3-Next) GGUF laid out as llama.cpp's converter
    (Qwen3_5TextModel, Qwen3_5MoeTextModel, Qwen3NextModel) writes it: every interval-th block gated full attention (heads of head_dim, a quarter
    roped in interleaved sections), the others gated delta-net (value heads of d_state, n_v_heads of them over
    n_k_heads key heads, a conv window of d_conv); qwen35moe's FFN n_expert experts of n_ff_exp plus a gated shared
    one of n_ff_shexp. qwen3next: NeoX RoPE without sections, beta and alpha in one ssm_ba. mtp: a
    next-token-prediction block after them (a full-attention block with the nextn tensors); echo: see
    echo_writers."""
    rng = np.random.default_rng(seed)
    U = gguf.GGUFValueType.UINT32
    w, key = start_header(path, arch, n_layer + (1 if mtp else 0), n_ctx_train, n_embd, n_ff, n_head, n_head_kv)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-6)
    if mtp:
        key("nextn_predict_layers", 1, U)
    n_rot = head_dim // 4  # partial_rotary_factor 0.25
    key("rope.dimension_count", n_rot, U)
    if arch != "qwen3next":  # Qwen3.5's interleaved M-RoPE; Qwen3-Next's is NeoX
        w.add_array(f"{arch}.rope.dimension_sections", [n_rot // 2 - n_rot // 4, n_rot // 8, n_rot // 8, 0])
    key("ssm.conv_kernel", d_conv, U)
    key("ssm.state_size", d_state, U)
    key("ssm.group_count", n_k_heads, U)
    key("ssm.time_step_rank", n_v_heads, U)
    key("ssm.inner_size", d_state * n_v_heads, U)
    key("full_attention_interval", interval, U)
    if n_expert:
        key("expert_count", n_expert, U)
        key("expert_used_count", n_expert_used, U)
        key("expert_feed_forward_length", n_ff_exp, U)
        key("expert_shared_feed_forward_length", n_ff_shexp, U)
    put, t, norm = start_tensors(w, fields, rng, wtype, n_embd, tied)
    if echo:
        t, norm = echo_writers(put, t, norm, n_embd)
    d_inner, ch = d_state * n_v_heads, d_state * (n_v_heads + 2 * n_k_heads)
    for il in range(n_layer + (1 if mtp else 0)):
        p = f"blk.{il}."
        norm(p + "attn_norm.weight")
        norm(p + "post_attention_norm.weight")
        if (il + 1) % interval == 0 or il >= n_layer:
            t(p + "attn_q.weight", 2 * n_head * head_dim, n_embd, scale=0.3)
            t(p + "attn_k.weight", n_head_kv * head_dim, n_embd, scale=0.3)
            t(p + "attn_v.weight", n_head_kv * head_dim, n_embd)
            t(p + "attn_output.weight", n_embd, n_head * head_dim)
            norm(p + "attn_q_norm.weight", head_dim, 0.2)
            norm(p + "attn_k_norm.weight", head_dim, 0.2)
        else:
            t(p + "attn_qkv.weight", ch, n_embd, scale=0.3)
            t(p + "attn_gate.weight", d_inner, n_embd, scale=0.3)
            w.add_tensor(p + "ssm_conv1d.weight", (rng.standard_normal((ch, d_conv)) * 0.5).astype(np.float32))
            w.add_tensor(p + "ssm_dt.bias", (rng.standard_normal(n_v_heads) * 0.5).astype(np.float32))
            w.add_tensor(p + "ssm_a", (-np.exp(rng.standard_normal(n_v_heads) * 0.5)).astype(np.float32))
            if arch == "qwen3next":  # beta and alpha fused, interleaved per key head
                t(p + "ssm_ba.weight", 2 * n_v_heads, n_embd, scale=0.3)
            else:
                t(p + "ssm_beta.weight", n_v_heads, n_embd, scale=0.3)
                t(p + "ssm_alpha.weight", n_v_heads, n_embd, scale=0.3)
            norm(p + "ssm_norm.weight", d_state)
            t(p + "ssm_out.weight", n_embd, d_inner)
        if n_expert:
            t(p + "ffn_gate_inp.weight", n_expert, n_embd, scale=0.5)
            t(p + "ffn_gate_exps.weight", n_expert, n_ff_exp, n_embd)
            t(p + "ffn_up_exps.weight", n_expert, n_ff_exp, n_embd)
            t(p + "ffn_down_exps.weight", n_expert, n_embd, n_ff_exp)
            t(p + "ffn_gate_inp_shexp.weight", n_embd, scale=0.3)
            t(p + "ffn_gate_shexp.weight", n_ff_shexp, n_embd)
            t(p + "ffn_up_shexp.weight", n_ff_shexp, n_embd)
            t(p + "ffn_down_shexp.weight", n_embd, n_ff_shexp)
        else:
            ffn_tensors(t, p, True, n_embd, n_ff, 0, 0, 0, False)
        if il >= n_layer:
            mtp_tensors(t, norm, p, n_embd)
    return finish(w, path)


U32, F32V = gguf.GGUFValueType.UINT32, gguf.GGUFValueType.FLOAT32
SWA16 = {"attention.sliding_window": (16, U32)}
# MiniMax-M2: experts of feed_forward_length with their own key, sigmoid routing with exp_probs_b
MINIMAX_M2 = dict(
    arch="minimax-m2",
    tied=False,
    n_expert=8,
    n_expert_used=2,
    probs_bias=True,
    keys={"expert_feed_forward_length": (N_FF, U32), "expert_gating_func": (2, U32)},
)
VARIANTS = {
    "llama-tied": dict(arch="llama"),
    "llama-output-ropefreqs-linear": dict(arch="llama", tied=False, rope_freqs=True, scaling=4.0),
    "llama-headdim32": dict(arch="llama", head_dim=32),
    "qwen2-bias": dict(arch="qwen2", tied=False),
    "qwen3-qknorm-headdim32": dict(arch="qwen3", head_dim=32),
    "qwen3-qknorm-output": dict(arch="qwen3", tied=False),
    "phi3-fused": dict(arch="phi3", tied=False),
    "qwen3-q8_0": dict(arch="qwen3", tied=False, wtype="q8_0"),
    "phi3-f16": dict(arch="phi3", wtype="f16"),
    "llama-q8_0": dict(arch="llama", tied=False, wtype="q8_0"),
    # a window of 16 tokens, shorter than the prompts; soft caps low enough to bite
    "gemma2-swa16-softcaps": dict(
        arch="gemma2", keys={**SWA16, "attn_logit_softcapping": (5.0, F32V), "final_logit_softcapping": (8.0, F32V)}
    ),
    "gemma2-default-caps-f16": dict(arch="gemma2", wtype="f16"),
    "gemma3-swa16-linear8": dict(arch="gemma3", n_layer=6, scaling=8.0, keys=SWA16),
    "gemma3-q4_k-output-softcap": dict(
        arch="gemma3",
        tied=False,
        wtype="q4_k",
        n_embd=256,
        n_ff=256,
        keys={
            **SWA16,
            "attention.sliding_window_pattern": (2, U32),
            "final_logit_softcapping": (10.0, F32V),
            "rope.freq_base_swa": (500.0, F32V),
        },
    ),
    "gemma3-global-only": dict(arch="gemma3"),
    "qwen3-yarn4": dict(arch="qwen3", rope=("yarn", 4.0, 64)),
    "llama-yarn2-q8_0": dict(arch="llama", wtype="q8_0", rope=("yarn", 2.0, 128)),
    "phi3-longrope-long": dict(arch="phi3", rope=("longrope", 64)),
    "phi3-longrope-short": dict(arch="phi3", rope=("longrope", 4096)),
    # mixtures of experts: 8 experts, 2 (or 1) per token
    "smollm3-tied": dict(arch="smollm3", n_layer=8),
    "smollm3-output-q8_0": dict(arch="smollm3", n_layer=4, tied=False, wtype="q8_0"),
    "seed_oss-bias-headdim32": dict(arch="seed_oss", tied=False, head_dim=32, qkv_bias=True),
    "seed_oss-nobias": dict(arch="seed_oss"),
    # Ministral 3: YaRN with a log multiplier and its own betas, the attention temperature over a short original
    # context (16: it changes within the prompt)
    "mistral3-yarn-temp-headdim32": dict(
        arch="mistral3",
        tied=False,
        head_dim=32,
        rope=("yarn", 16.0, 16),
        keys={
            "rope.scaling.yarn_log_multiplier": (1.0, F32V),
            "rope.scaling.yarn_beta_fast": (16.0, F32V),
            "rope.scaling.yarn_beta_slow": (2.0, F32V),
            "attention.temperature_scale": (0.1, F32V),
        },
    ),
    "mistral3-biases-q8_0": dict(arch="mistral3", wtype="q8_0", biases=True),
    "mistral3-moe-8x2": dict(arch="mistral3", tied=False, n_expert=8, n_expert_used=2, biases=True),
    # ERNIE 4.5 MoE: a leading dense block, exp_probs_b, a shared expert
    "ernie4_5-moe-lead-shared": dict(
        arch="ernie4_5-moe",
        tied=False,
        n_expert=8,
        n_expert_used=2,
        n_ff_exp=32,
        n_ff_shexp=48,
        n_lead=1,
        probs_bias=True,
    ),
    "ernie4_5-moe-q8_0": dict(arch="ernie4_5-moe", n_expert=8, n_expert_used=2, n_ff_exp=64, wtype="q8_0"),
    # MiniMax-M2: Q/K norms over all heads, RoPE over half of each head, sigmoid routing with exp_probs_b
    "minimax-m2-8x2": dict(MINIMAX_M2, keys={**MINIMAX_M2["keys"], "rope.dimension_count": (8, U32)}),
    "minimax-m2-8x2-q8_0-headdim32": dict(
        MINIMAX_M2, head_dim=32, wtype="q8_0", keys={**MINIMAX_M2["keys"], "rope.dimension_count": (16, U32)}
    ),
    # Llama 4: experts in every 2nd block (top 1, sigmoid, a shared expert), rope_freqs, chunked layers with their
    # own RoPE base, the 4th without RoPE
    "llama4-8x1-step2": dict(
        arch="llama4",
        tied=False,
        n_layer=4,
        n_expert=8,
        n_expert_used=1,
        n_ff_exp=32,
        n_ff_shexp=32,
        moe_step=2,
        rope_freqs=True,
        keys={"rope.freq_base_swa": (500.0, F32V)},
    ),
    # Maverick's 128 experts: no Q/K norm
    "llama4-128x1-q8_0": dict(
        arch="llama4", n_layer=4, n_expert=128, n_expert_used=1, n_ff_exp=32, n_ff_shexp=32, moe_step=1, wtype="q8_0"
    ),
    "qwen3moe-8x2": dict(arch="qwen3moe", tied=False, n_expert=8, n_expert_used=2, n_ff_exp=48),
    "qwen3moe-8x2-q8_0": dict(arch="qwen3moe", n_expert=8, n_expert_used=2, n_ff_exp=64, wtype="q8_0"),
    "qwen2moe-shared": dict(arch="qwen2moe", tied=False, n_expert=8, n_expert_used=2, n_ff_exp=32, n_ff_shexp=64),
    "olmoe-8x2-f16": dict(arch="olmoe", tied=False, n_expert=8, n_expert_used=2, wtype="f16", n_head_kv=N_HEAD),
    "mixtral-8x1": dict(arch="llama", tied=False, n_expert=8, n_expert_used=1),
    "gpt-oss-8x2-swa16-yarn": dict(
        arch="gpt-oss", tied=False, n_expert=8, n_expert_used=2, n_ff_exp=64, keys=SWA16, rope=("yarn", 4.0, 128)
    ),
    "gpt-oss-8x2-q8_0": dict(
        arch="gpt-oss", tied=False, n_expert=8, n_expert_used=2, n_ff_exp=64, wtype="q8_0", keys=SWA16
    ),
    "gpt-oss-8x2-mxfp4": dict(
        arch="gpt-oss", tied=False, n_expert=8, n_expert_used=2, n_ff_exp=64, wtype="mxfp4", keys=SWA16
    ),
    # deepseek2: multi-head latent attention (absorbed), one leading dense block, routed + shared experts
    "deepseek2-lite": dict(
        arch="deepseek2", tied=False, q_lora_rank=0, n_expert=8, n_expert_used=2, n_shared=2, weights_scale=1.0
    ),
    "deepseek2-v3-groups-yarn": dict(
        arch="deepseek2",
        q_lora_rank=48,
        n_expert=16,
        n_expert_used=4,
        n_group=4,
        n_group_used=2,
        gating=2,
        probs_bias=True,
        weights_norm=True,
        weights_scale=2.5,
        yarn=(4.0, 128, 1.0),
        n_shared=1,
        mtp=True,
    ),
    "deepseek2-kimi-q8_0": dict(
        arch="deepseek2",
        q_lora_rank=48,
        n_expert=24,
        n_expert_used=4,
        n_group=1,
        n_group_used=1,
        gating=2,
        probs_bias=True,
        weights_norm=True,
        weights_scale=2.827,
        wtype="q8_0",
        n_shared=1,
    ),
    # Q4_0 experts: llama.cpp re-lays them for ggml-cpu's repacked mul_mat_id, and so does superggml
    "deepseek2-lite-q4_0": dict(
        arch="deepseek2",
        tied=False,
        q_lora_rank=0,
        n_expert=8,
        n_expert_used=2,
        n_shared=2,
        weights_scale=1.0,
        wtype="q4_0",
    ),
    # the legacy attn_kv_b layout: plain heads of 48 (K) and 32 (V), cached per head
    "deepseek2-lite-legacy": dict(
        arch="deepseek2",
        tied=False,
        q_lora_rank=0,
        n_expert=8,
        n_expert_used=2,
        n_shared=2,
        weights_scale=1.0,
        legacy=True,
    ),
    "deepseek2-glm47flash": dict(
        arch="deepseek2",
        q_lora_rank=48,
        v_head=48,
        n_expert=8,
        n_expert_used=4,
        gating=2,
        probs_bias=True,
        weights_norm=True,
        weights_scale=1.8,
        n_group=1,
        n_group_used=1,
        n_shared=1,
    ),
    # Mistral 4: deepseek2's layout with fused gate/up experts, YaRN and the attention temperature
    "mistral4-fused-yarn-temp": dict(
        arch="mistral4",
        tied=False,
        q_lora_rank=48,
        n_expert=8,
        n_expert_used=2,
        n_shared=1,
        weights_norm=True,
        weights_scale=1.0,
        yarn=(4.0, 128, 1.0),
        fused=True,
        temperature=(0.1, 16),
    ),
    "mistral4-lite-q8_0": dict(arch="mistral4", q_lora_rank=0, n_expert=8, n_expert_used=2, wtype="q8_0", fused=True),
    # Mistral-Large 3: deepseek2 with the attention temperature, separate experts
    "deepseek2-temp": dict(arch="deepseek2", q_lora_rank=48, n_expert=8, n_expert_used=2, temperature=(0.1, 16)),
    # LFM2: short-convolution blocks beside attention ones (head_count_kv 0 marks a conv block)
    "lfm2-ccaccaca": dict(arch="lfm2", tied=True),
    "lfm2-swa16-q8_0": dict(arch="lfm2", layers="cacaca", l_cache=4, n_swa=16, wtype="q8_0", tied=False),
    # granitehybrid: Mamba-2 mixers and attention, Granite's scales; Bamba's RoPE; MoE with a shared expert
    "granitehybrid-mmamma": dict(arch="granitehybrid"),
    "granitehybrid-1group": dict(arch="granitehybrid", n_group=1),
    "granitehybrid-1group-flat-norm": dict(arch="granitehybrid", n_group=1, flat_norm=True),
    "granitehybrid-rope-tied-q8_0": dict(
        arch="granitehybrid", layers="mamam", rope=True, scales=False, tied=True, wtype="q8_0"
    ),
    "granitehybrid-8x2-shared": dict(
        arch="granitehybrid", layers="amam", n_expert=8, n_expert_used=2, n_ff=32, n_ff_shexp=64
    ),
    # nemotron_h: Mamba-2 mixers, attention without RoPE and ReLU-squared MLP blocks, one kind per block
    "nemotron_h-M-M*-M-": dict(arch="nemotron_h"),
    "nemotron_h-biases-tied-q8_0": dict(arch="nemotron_h", layers="M*-M*-", biases=True, tied=True, wtype="q8_0"),
    "nemotron_h_moe-8x2": dict(arch="nemotron_h_moe", layers="ME*EM*", n_expert=8, n_expert_used=2, n_ff=32),
    # step35: per-layer head counts, sliding layers with whole-head RoPE, head gates, experts and SwiGLU clamps
    "step35-4": dict(arch="step35", n_expert=8),
    "step35-kv-per-layer": dict(arch="step35", n_head_kv_swa=3),
    "step35-plain-q8_0": dict(arch="step35", swa="1010", moe="0101", clamps=False, extras=False, wtype="q8_0"),
    # gemma4: per-layer K/V widths, shared K/V blocks, per-layer embeddings; the MoE one: a dense MLP beside experts
    "gemma4-e-shared": dict(arch="gemma4"),
    "gemma4-plain-q8_0": dict(arch="gemma4", layers="110110", n_shared=0, n_pl=0, out_scale=False, wtype="q8_0"),
    "gemma4-8x2-kv": dict(arch="gemma4", layers="110110", n_shared=0, n_pl=0, n_expert=8, k_eq_v=True, tied=False),
    "gemma4-8x2-fused-pl": dict(arch="gemma4", layers="1101", n_shared=0, n_expert=8, fused=True, wtype="q8_0"),
    # DeepSeek sparse attention: a lightning indexer picks each query's top-k keys (fewer than the prompt's)
    "deepseek32-dsa": dict(
        arch="deepseek32", n_expert=8, q_lora_rank=48, indexer=(4, 64, 24), gating=2, probs_bias=True
    ),
    "deepseek32-yarn-q8_0": dict(
        arch="deepseek32", q_lora_rank=64, indexer=(2, 64, 16), gating=2, yarn=(4.0, 128, 1.0), wtype="q8_0"
    ),
    "glm-dsa-shared": dict(
        arch="glm-dsa", n_expert=8, q_lora_rank=48, indexer=(4, 64, 24), indexer_types=[1, 0, 1], n_layer=3
    ),
    "glm-dsa-full-mtp": dict(arch="glm-dsa", q_lora_rank=48, indexer=(2, 128, 20), probs_bias=True, mtp=True),
    # deepseek4: hyper-connections, raw sliding-window keys, CSA (ratio 4, the indexer's top 8) and HCA (ratio 128)
    "deepseek4-csa-hca": dict(arch="deepseek4"),
    # kimi-k3: KDA and nope-only MLA blocks, residual attention over banked inputs, situ, a latent MoE
    "kimi-k3-res2-latent": dict(arch="kimi-k3"),
    # minimax-m3: per-head Q/K norms, clamped SwiGLU, leading dense blocks; MSA blocks (dense without flash attention)
    "minimax-m3-dense1": dict(arch="minimax-m3"),
    "minimax-m3-fused-q8_0": dict(arch="minimax-m3", fused_qkv=True, wtype="q8_0"),
    # mimo2: K/V heads per block, narrower values, sinks in the sliding blocks, value scale
    "mimo2-swa-sinks": dict(arch="mimo2"),
    "mimo2-scaled-groups-q8_0": dict(arch="mimo2", value_scale=0.7, groups=(4, 2), sinks="all", wtype="q8_0"),
    "mimo2-fused-qkv": dict(arch="mimo2", fused_qkv=True),
    "mimo2-mtp": dict(arch="mimo2", fused_qkv=True, n_mtp=1),
    # hy_v3: dense or expert blocks by the router's presence, the suffix-less exp_probs_b, an MTP block
    "hy_v3-mtp": dict(arch="hy_v3", mtp=True),
    "hy_v3-fused-tied-q8_0": dict(arch="hy_v3", fused_gate_up=True, fused_qkv=True, tied=True, wtype="q8_0"),
    # hy_v4: independent hyper-connections over latent attention with sinks and an output gate
    "hy_v4-hc4": dict(arch="hy_v4"),
    "hy_v4-hc2-yarn-q8_0": dict(arch="hy_v4", hc=2, yarn=(4.0, 256), wtype="q8_0"),
    "hy_v4-dsa-shared": dict(arch="hy_v4", indexer=(4, 32, 16), indexer_types=(True, False)),
    # bailingmoe3: KDA (full-rank decay and gate) beside roped MLA with a per-head gate, clamped SwiGLU
    "bailingmoe3-kda-mla": dict(arch="bailingmoe3"),
    "bailingmoe3-mtp": dict(arch="bailingmoe3", mtp=True),
    "bailingmoe3-mrope-groups-q8_0": dict(
        arch="bailingmoe3",
        mrope_sections=(2, 1, 1),
        groups=(4, 2),
        swiglu_limits=(0.5, 0.7),
        q_lora_rank=24,
        wtype="q8_0",
    ),
    # dots3note: sparse attention in the full blocks, windowed MLA of other shapes in the sliding ones
    "dots3note-sparse-swa": dict(arch="dots3note"),
    "dots3note-heads-top8-q8_0": dict(arch="dots3note", swa_layers=(0, 2), n_head_swa=2, top_k=8, wtype="q8_0"),
    # qwen4exp: hyper-connections for norms, QSA (pooled-key block-sparse attention), a PLE n-gram embedding
    "qwen4exp-qsa-ple": dict(arch="qwen4exp"),
    "qwen4exp-qsa48-hc2-q8_0": dict(
        arch="qwen4exp", compress_ratios=(0, 4, 0, 8), hc=2, ple_layer=None, fused_gate_up=True, tied=True, wtype="q8_0"
    ),
    "kimi-linear-4": dict(arch="kimi-linear"),
    # glm5-next: KDA and nope-only MLA blocks, a k-pool indexer (a shared block), 4 hyper-connection streams
    "glm5-next-kpool-shared": dict(arch="glm5-next"),
    "glm5-next-6-softplus-kpool2-q8_0": dict(
        arch="glm5-next",
        n_layer=6,
        mla_layers=(0, 2, 3, 5),
        shared_indexer=(3, 5),
        gate_lower_bound=None,
        indexer=(1, 16, 4),
        kpool=2,
        n_dense=0,
        gating=None,
        norm_eps=None,
        swiglu_limit=(0.5, 0.3),
        wtype="q8_0",
    ),
    "kimi-linear-fused-q8_0": dict(arch="kimi-linear", fused_qkv=True, mla_layers=(0, 2), wtype="q8_0"),
    "kimi-k3-plain-q8_0": dict(
        arch="kimi-k3", attn_res=0, gate_lower_bound=None, latent=None, mla_gate=False, q_lora_rank=24, wtype="q8_0"
    ),
    # qwen35: gated delta-net blocks and, every second block, gated full attention with interleaved M-RoPE
    "qwen35-interval2": dict(arch="qwen35"),
    "qwen35-mtp": dict(arch="qwen35", n_layer=3, interval=3, mtp=True),
    "qwen3next-8x2": dict(arch="qwen3next", n_expert=8, n_expert_used=2),
    "qwen3next-mtp": dict(arch="qwen3next", n_expert=8, n_expert_used=2, n_layer=3, interval=3, mtp=True),
    "qwen35moe-8x2-q8_0": dict(
        arch="qwen35moe",
        n_expert=8,
        n_expert_used=2,
        wtype="q8_0",
        n_embd=128,
        d_state=32,
        head_dim=64,
        n_ff_exp=64,
        n_ff_shexp=64,
    ),
    # glm4moe: partial NeoX RoPE, one leading dense block, sigmoid routing with exp_probs_b, a shared expert
    "glm4moe-bias-mtp": dict(arch="glm4moe", qkv_bias=True, weights_scale=2.5, mtp=True),
    "glm4moe-qknorm-q8_0": dict(
        arch="glm4moe", qkv_bias=False, qk_norm=True, n_expert=16, n_expert_used=4, wtype="q8_0"
    ),
}


def expert_bytes(path):
    """The bytes of a GGUF's expert tensors (superggml's reader: gguf's reads the whole vocabulary in Python)."""
    with sg.open(path) as f:
        return sum(t.nbytes for t in f.tensors.values() if "_exps" in t.name)


def tensor_names(path):
    with sg.open(path) as f:
        return list(f.tensors)


def metadata(path):
    with sg.open(path) as f:
        return f.metadata()


def metadata_value(path, key):
    return metadata(path)[key]


# one variant per family, the one with the most keys of its own
ONE_PER_FAMILY = [
    "llama-headdim32",
    "mixtral-8x1",
    "qwen2-bias",
    "qwen3-qknorm-headdim32",
    "phi3-longrope-long",
    "gemma2-swa16-softcaps",
    "gemma3-q4_k-output-softcap",
    "qwen2moe-shared",
    "qwen3moe-8x2",
    "olmoe-8x2-f16",
    "gpt-oss-8x2-swa16-yarn",
    "deepseek2-v3-groups-yarn",
    "glm4moe-bias-mtp",
    "qwen35-interval2",
    "qwen35moe-8x2-q8_0",
    "qwen3next-8x2",
    "smollm3-tied",
    "seed_oss-bias-headdim32",
    "mistral3-yarn-temp-headdim32",
    "ernie4_5-moe-lead-shared",
    "minimax-m2-8x2",
    "llama4-8x1-step2",
    "mistral4-fused-yarn-temp",
    "lfm2-swa16-q8_0",
    "granitehybrid-8x2-shared",
    "nemotron_h-biases-tied-q8_0",
    "step35-4",
    "nemotron_h_moe-8x2",
    "gemma4-8x2-fused-pl",
    "gemma4-e-shared",
    "deepseek32-yarn-q8_0",
    "glm-dsa-shared",
    "deepseek4-csa-hca",
    "kimi-k3-res2-latent",
    "kimi-linear-4",
    "minimax-m3-dense1",
    "mimo2-swa-sinks",
    "hy_v3-mtp",
    "hy_v4-hc4",
    "bailingmoe3-kda-mla",
    "dots3note-sparse-swa",
    "qwen4exp-qsa-ple",
    "glm5-next-kpool-shared",
]


@contextlib.contextmanager
def keys_left_out(drop=(), seen=None, outer=True):
    """While active, every GGUFWriter leaves out the metadata keys in `drop`, and appends each key it is given to
    `seen` (a list) when there is one: a synth() call under it writes its family's file without those keys."""
    add = gguf.GGUFWriter.add_key_value
    if outer:
        _LEFT_OUT.append((frozenset(drop), seen))

    def add_some(self, key, val, vtype, sub_type=None):
        if seen is not None:
            seen.append(key)
        if key not in drop:
            add(self, key, val, vtype, sub_type)

    gguf.GGUFWriter.add_key_value = add_some
    try:
        yield
    finally:
        gguf.GGUFWriter.add_key_value = add
        if outer:
            _LEFT_OUT.pop()


_SCALAR = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}


def without_keys(src, dst, drop):
    """`src` (a GGUF v3 file, little-endian) written to `dst` without the metadata keys in `drop`: their bytes cut
    from the metadata, the count lowered and the tensor data realigned; everything else byte for byte."""
    with open(src, "rb") as f:
        head = f.read(24)
        magic, version, n_tensors, n_kv = struct.unpack("<4sIQQ", head)
        assert magic == b"GGUF" and version == 3, (magic, version)
        buf = bytearray(f.read(1 << 20))
        pos = 0

        def need(n):
            nonlocal buf
            while pos + n > len(buf):
                more = f.read(max(n, 1 << 20))
                assert more, "truncated GGUF"
                buf += more

        def take(fmt):
            nonlocal pos
            n = struct.calcsize(fmt)
            need(n)
            out = struct.unpack_from(fmt, buf, pos)
            pos += n
            return out[0] if len(out) == 1 else out

        def skip_value(vtype):
            nonlocal pos
            if vtype == 8:
                n = take("<Q")
                need(n)
                pos += n
            elif vtype == 9:
                sub, count = take("<IQ")
                if sub in _SCALAR:
                    n = struct.calcsize("<" + _SCALAR[sub]) * count
                    need(n)
                    pos += n
                else:
                    for _ in range(count):
                        skip_value(sub)
            else:
                take("<" + _SCALAR[vtype])

        kept, alignment = [], 32
        for _ in range(n_kv):
            start = pos
            n = take("<Q")
            need(n)
            name = bytes(buf[pos : pos + n]).decode()
            pos += n
            vtype = take("<I")
            value_at = pos
            skip_value(vtype)
            if name == "general.alignment":
                assert name not in drop
                alignment = struct.unpack_from("<I", buf, value_at)[0]
            if name not in drop:
                kept.append(bytes(buf[start:pos]))
        infos_at = pos
        for _ in range(n_tensors):
            n = take("<Q")
            need(n)
            pos += n
            dims = take("<I")
            need(8 * dims + 12)
            pos += 8 * dims + 12
        infos = bytes(buf[infos_at:pos])
        end = 24 + pos
        data_at = (end + alignment - 1) // alignment * alignment
        with open(dst, "wb") as out:
            out.write(struct.pack("<4sIQQ", magic, version, n_tensors, len(kept)))
            for kv in kept:
                out.write(kv)
            out.write(infos)
            written = 24 + sum(map(len, kept)) + len(infos)
            out.write(b"\0" * ((written + alignment - 1) // alignment * alignment - written))
            f.seek(data_at)
            shutil.copyfileobj(f, out, 1 << 22)
    return str(dst)


def dequantized_copy(src, dst):
    """`src` with every tensor dequantized to F32 by ggml's type traits (the same numbers, no quantization left),
    its metadata kept but general.file_type (ALL_F32); written tensor by tensor, never held whole."""
    r = gguf.GGUFReader(src)
    w = gguf.GGUFWriter(str(dst), r.fields["general.architecture"].contents())
    for key, f in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        vtype = f.types[0]
        if key == "general.file_type":
            w.add_key_value(key, 0, vtype)
            continue
        w.add_key_value(key, f.contents(), vtype, f.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None)
    with sg.open(src) as f:
        infos = list(f.tensors.values())
        for ti in infos:
            n = 4 * ti.shape[0] * ti.n_rows
            w.add_tensor_info(
                ti.name, tuple(reversed(ti.shape)), np.dtype(np.float32), n, raw_dtype=gguf.GGMLQuantizationType.F32
            )
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        for ti in infos:
            w.write_tensor_data(f.dequantize(ti.name).reshape(tuple(reversed(ti.shape))))
    w.close()
    return dst


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("variant", choices=sorted(VARIANTS))
    ap.add_argument("out")
    ap.add_argument("--vocab-from", help="GGUF whose vocabulary to use (default: the bundled SmolLM2)")
    a = ap.parse_args(argv)
    if a.vocab_from is None:
        from superggml import models

        a.vocab_from = str(models.smollm2_path())
    print(synth(a.out, vocab_fields(a.vocab_from), **VARIANTS[a.variant]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
