"""superggml.tokenizer against llama.cpp (llama-cpp-python 0.3.36 as the reference).

The comparisons with llama.cpp skip when llama_cpp is not installed (``pip install
superggml[reference]``); the self-contained tests always run.
"""

from __future__ import annotations

import copy
import importlib.util
import itertools
import json
import os
import random
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from superggml.errors import GGUFError, UnsupportedModelError
from superggml.tokenizer import TokenAttr, Tokenizer


def _load_corpus() -> list[str]:
    spec = importlib.util.spec_from_file_location(
        "tokenizer_corpus", Path(__file__).resolve().parents[1] / "data" / "tokenizer_corpus.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.CORPUS


CORPUS = _load_corpus()

META_KEYS = ("general.architecture", "general.name")


def read_tokenizer_meta(path: str) -> dict:
    """The tokenizer.* keys (and general.architecture/name) of a GGUF, read by superggml's core."""
    from superggml import native

    f = native.GGUFFile(path)
    try:
        meta = f.metadata()
    finally:
        f.close()
    return {
        k: v
        for k, v in meta.items()
        if (k.startswith("tokenizer.") and k != "tokenizer.chat_template") or k in META_KEYS
    }


@pytest.fixture(scope="session")
def smollm2_meta(smollm2_path):
    return read_tokenizer_meta(smollm2_path)


@pytest.fixture(scope="session")
def qwen_meta(qwen_path):
    return read_tokenizer_meta(qwen_path)


# llama.cpp runs in a child process: llama_cpp's bundled libggml clashes with the libggml that
# superggml.native has already loaded into this one.
_REFERENCE_SCRIPT = r"""
import ctypes, json, sys
import llama_cpp

SPECIAL = 8 | 16 | 1  # CONTROL | USER_DEFINED | UNKNOWN


def run(job):
    llm = llama_cpp.Llama(model_path=job["path"], vocab_only=True, verbose=False)
    vocab = llm._model.vocab
    n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)

    def detok(ids, remove_special, unparse_special):
        arr = (llama_cpp.llama_token * max(1, len(ids)))(*ids)
        size = 1024 + 256 * len(ids)
        buf = ctypes.create_string_buffer(size)
        n = llama_cpp.llama_detokenize(vocab, arr, len(ids), buf, size, remove_special,
                                       unparse_special)
        assert n >= 0
        return buf.raw[:n].hex()

    def piece(tid, special, lstrip):
        buf = ctypes.create_string_buffer(1024)
        n = llama_cpp.llama_token_to_piece(vocab, tid, buf, 1024, lstrip, special)
        assert n >= 0
        return buf.raw[:n].hex()

    out = {"n_vocab": n_vocab, "tokenize": {}, "detokenize": {}}
    for text in job["corpus"]:
        data = bytes.fromhex(text) if job.get("hex") else text.encode("utf-8")
        toks = {f"{int(a)}{int(p)}": llm.tokenize(data, add_bos=a, special=p)
                for a, p in job["flags"]}
        out["tokenize"][text] = toks
        if job.get("detokenize"):
            ids = llm.tokenize(data, add_bos=True, special=True)
            out["detokenize"][text] = {"ids": ids, **{
                f"{int(r)}{int(u)}": detok(ids, r, u)
                for r, u in ((False, True), (True, False), (False, False))}}
    if job.get("vocab"):
        attrs = [llama_cpp.llama_vocab_get_attr(vocab, t) for t in range(n_vocab)]
        out["attrs"] = attrs
        out["eog"] = [t for t in range(n_vocab) if llama_cpp.llama_vocab_is_eog(vocab, t)]
        step = job["vocab"]
        sample = sorted({*range(0, n_vocab, step), *(t for t in range(n_vocab)
                                                     if attrs[t] & SPECIAL),
                         *out["eog"], n_vocab - 1})
        out["pieces"] = {t: [piece(t, True, 0), piece(t, False, 0), piece(t, True, 1)]
                         for t in sample}
        out["special"] = {name: getattr(llama_cpp, f"llama_vocab_{name}")(vocab) for name in (
            "bos", "eos", "eot", "pad", "fim_pre", "fim_suf", "fim_mid", "fim_pad", "fim_rep",
            "fim_sep")}
        out["add_bos"] = bool(llama_cpp.llama_vocab_get_add_bos(vocab))
        out["add_eos"] = bool(llama_cpp.llama_vocab_get_add_eos(vocab))
    return out


json.dump([run(job) for job in json.load(sys.stdin)], sys.stdout)
"""


def require_reference() -> None:
    # not imported here: its libggml must not be loaded next to superggml's
    if importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("llama-cpp-python (the reference) is not installed")


def run_reference(jobs: list[dict]) -> list[dict]:
    """Run llama.cpp (llama-cpp-python, vocab only) on ``jobs`` in a child process.

    A job: {"path": gguf, "corpus": [str], "flags": [(add_special, parse_special)],
    "detokenize": bool, "vocab": piece sampling step or 0, "hex": corpus given as hex}.
    """
    require_reference()
    proc = subprocess.run(
        [sys.executable, "-c", _REFERENCE_SCRIPT], input=json.dumps(jobs), capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        pytest.fail(f"llama.cpp reference failed:\n{proc.stderr[-3000:]}")
    return [_decode_result(res) for res in json.loads(proc.stdout)]


def _decode_result(res: dict) -> dict:
    if "pieces" in res:
        res["pieces"] = {int(k): [bytes.fromhex(x) for x in v] for k, v in res["pieces"].items()}
    for entry in res["detokenize"].values():
        for k in ("01", "10", "00"):
            entry[k] = bytes.fromhex(entry[k])
    res["special"] = {k: (None if v < 0 else v) for k, v in res.get("special", {}).items()}
    return res


ALL_FLAGS = [(a, p) for a in (True, False) for p in (True, False)]


def encode_mismatches(tok: Tokenizer, ref: dict, corpus, flags=ALL_FLAGS):
    bad = []
    for s in corpus:
        for add_special, parse_special in flags:
            want = ref["tokenize"][s][f"{int(add_special)}{int(parse_special)}"]
            got = tok.encode(s, add_special=add_special, parse_special=parse_special)
            if got != want:
                bad.append((s, add_special, parse_special, want, got))
    return bad


MODELS = ["smollm2", pytest.param("qwen", marks=pytest.mark.slow)]


@pytest.fixture(scope="session")
def _loaded():
    return {}


@pytest.fixture(params=MODELS)
def model(request, _loaded):
    """{"name", "tok": Tokenizer, "path"} per real model, built once per session (plus "ref",
    llama.cpp's results, once reference_of computed them)."""
    name = request.param
    if name not in _loaded:
        meta = request.getfixturevalue(f"{name}_meta")
        path = request.getfixturevalue("smollm2_path" if name == "smollm2" else "qwen_path")
        _loaded[name] = {"name": name, "tok": Tokenizer.from_metadata(meta), "path": path}
    return _loaded[name]


def reference_of(entry: dict) -> dict:
    if "ref" not in entry:
        entry["ref"] = run_reference(
            [{"path": entry["path"], "corpus": CORPUS, "flags": ALL_FLAGS, "detokenize": True, "vocab": 37}]
        )[0]
    return entry["ref"]


# ---------------------------------------------------------------------------- the real models


def test_corpus_is_broad():
    assert len(CORPUS) >= 200
    assert len(set(CORPUS)) == len(CORPUS)
    assert "" in CORPUS and any("<|im_start|>" in s for s in CORPUS)


def test_metadata(model):
    name, tok = model["name"], model["tok"]
    assert tok.model == "gpt2"
    assert tok.pre == {"smollm2": "smollm", "qwen": "qwen2"}[name]
    assert tok.n_vocab == len(tok) == {"smollm2": 49152, "qwen": 151936}[name]
    assert tok.add_bos is False and tok.add_eos is False
    im_end = tok.token_id("<|im_end|>")
    assert im_end is not None and tok.is_eog(im_end) and tok.is_eog(tok.eos_id)
    assert tok.is_eog(tok.token_id("<|endoftext|>"))
    assert not tok.is_eog(tok.token_id("<|im_start|>"))
    assert not tok.is_eog(tok.encode("hello", add_special=False)[0])


def test_encode_matches_llama_cpp(model):
    tok, ref = model["tok"], reference_of(model)
    assert len(ref["tokenize"]) == len(CORPUS) >= 200
    bad = encode_mismatches(tok, ref, CORPUS)
    assert not bad, f"{len(bad)} of {4 * len(CORPUS)} differ, first: {bad[:3]}"


def test_special_token_parsing(model):
    tok = model["tok"]
    im_start, im_end = tok.token_id("<|im_start|>"), tok.token_id("<|im_end|>")
    text = "<|im_start|>user\nhi<|im_end|>"
    ids = tok.encode(text, add_special=False, parse_special=True)
    assert ids[0] == im_start and ids[-1] == im_end
    plain = tok.encode(text, add_special=False, parse_special=False)
    assert im_start not in plain and im_end not in plain
    assert tok.decode(ids) == tok.decode(plain) == text
    assert tok.decode(ids, skip_special=True) == "user\nhi"


@pytest.mark.slow
def test_user_defined_tokens_always_split(qwen_meta):
    tok = Tokenizer.from_metadata(qwen_meta)
    call = tok.token_id("<tool_call>")
    assert tok.token_attr(call) & TokenAttr.USER_DEFINED
    for parse_special in (False, True):
        assert tok.encode("a<tool_call>b", add_special=False, parse_special=parse_special)[1] == call


def test_decode_round_trips(model):
    tok = model["tok"]
    # bytes without a token are dropped (SmolLM2 has none for 0x1d, for instance)
    single = {p[0] for p in map(tok.token_to_piece, range(tok.n_vocab)) if len(p) == 1}
    checked = [s for s in CORPUS if set(s.encode("utf-8")) <= single]
    assert len(checked) >= len(CORPUS) - 5
    bad = []
    for s in checked:
        for parse_special in (False, True):
            ids = tok.encode(s, add_special=False, parse_special=parse_special)
            if tok.decode(ids) != s:
                bad.append((s, parse_special))
    assert not bad, f"{len(bad)} strings do not round-trip, first: {bad[:3]}"


def test_detokenize_matches_llama_cpp(model):
    tok, ref = model["tok"], reference_of(model)
    bad = []
    for s in CORPUS:
        want = ref["detokenize"][s]
        ids = want["ids"]
        for remove_special, unparse_special in ((False, True), (True, False), (False, False)):
            got = tok.detokenize(ids, remove_special=remove_special, unparse_special=unparse_special)
            if got != want[f"{int(remove_special)}{int(unparse_special)}"]:
                bad.append((s, remove_special, unparse_special))
        if tok.decode(ids) != want["01"].decode("utf-8", "replace"):
            bad.append((s, "decode"))
        if tok.decode(ids, skip_special=True) != want["10"].decode("utf-8", "replace"):
            bad.append((s, "decode skip_special"))
    assert not bad, f"{len(bad)} differ, first: {bad[:3]}"


def test_token_to_piece_matches_llama_cpp(model):
    tok, ref = model["tok"], reference_of(model)
    pieces = ref["pieces"]
    assert set(tok.special_ids) <= set(pieces) and len(pieces) >= tok.n_vocab // 37
    bad = []
    for tid, (special, plain, lstrip) in pieces.items():
        got = (tok.token_to_piece(tid), tok.token_to_piece(tid, special=False), tok.token_to_piece(tid, lstrip=1))
        if got != (special, plain, lstrip):
            bad.append((tid, got, (special, plain, lstrip)))
    assert not bad, f"{len(bad)} of {len(pieces)} differ, first: {bad[:5]}"
    with pytest.raises(IndexError):
        tok.token_to_piece(tok.n_vocab)


def test_attrs_eog_and_special_ids_match_llama_cpp(model):
    tok, ref = model["tok"], reference_of(model)
    assert ref["n_vocab"] == tok.n_vocab
    assert [tok.token_attr(t) for t in range(tok.n_vocab)] == ref["attrs"]
    assert sorted(tok.eog_ids) == ref["eog"]
    for name, tid in ref["special"].items():
        if name != "eot":  # llama.cpp picks the EOT among candidates in hash-map order
            assert getattr(tok, f"{name}_id") == tid, name
    assert tok.add_bos == ref["add_bos"] and tok.add_eos == ref["add_eos"]


# ------------------------------------------- other pre-tokenizers, on SmolLM2's vocabulary


@pytest.fixture(scope="session")
def smollm2_fields(smollm2_path):
    """SmolLM2's metadata as [(key, value, type, array item type)], tensors left out."""
    import gguf

    fields = []
    for key, field in gguf.GGUFReader(smollm2_path).fields.items():
        if key.startswith("GGUF."):
            continue
        vtype = field.types[0]
        sub_type = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        fields.append((key, field.contents(), vtype, sub_type))
    return fields


def write_gguf(path: Path, fields, overrides: dict, drop=()):
    """A tensor-less GGUF with ``fields``' metadata, ``overrides`` (key -> (value, type, subtype))
    replacing or adding keys: llama.cpp loads it with vocab_only=True."""
    import gguf

    arch = next(value for key, value, *_ in fields if key == "general.architecture")
    w = gguf.GGUFWriter(str(path), arch)
    for key, value, vtype, sub_type in fields:
        if key == "general.architecture" or key in overrides or key in drop:
            continue
        w.add_key_value(key, value, vtype, sub_type=sub_type)
    for key, (value, vtype, sub_type) in overrides.items():
        w.add_key_value(key, value, vtype, sub_type=sub_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


# one name per distinct regex list / flag set in llama-vocab.cpp
PRE_TYPES = [
    "default",
    "llama-bpe",
    "qwen2",
    "deepseek-coder",
    "deepseek-llm",
    "deepseek-v3",
    "starcoder",
    "falcon",
    "gpt-2",
    "tekken",
    "gpt-4o",
    "qwen35",
    "poro-chat",
    "viking",
    "chameleon",
    "bailingmoe",
    "seed-coder",
    "exaone-moe",
    "jais-2",
    "minicpm5",
    "laguna",
    "youtu",
    "spark2_5",
    "chatglm-bpe",
    "granite-embed-multi-97m",
    "ufakzeka",
    "megrez",
]
PRE_CORPUS = CORPUS[::3]


def with_string_kv(base: bytes, key: str, value: str) -> bytes:
    """``base``, a tensor-less GGUF whose last key/value is the string ``key``, with that value
    replaced (much faster than writing the file again)."""
    kb = key.encode()
    head = len(kb).to_bytes(8, "little") + kb + (8).to_bytes(4, "little")  # 8: STRING
    cut = base.rindex(head)
    vb = value.encode()
    out = base[:cut] + head + len(vb).to_bytes(8, "little") + vb
    return out + b"\0" * (-len(out) % 32)


def run_reference_parallel(jobs: list[dict], processes: int = 2) -> list[dict]:
    require_reference()
    chunks = [jobs[i::processes] for i in range(processes)]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _REFERENCE_SCRIPT],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in chunks
    ]
    outputs = [proc.communicate(json.dumps(chunk)) for proc, chunk in zip(procs, chunks)]
    for proc, (_, err) in zip(procs, outputs):
        if proc.returncode != 0:
            pytest.fail(f"llama.cpp reference failed:\n{err[-3000:]}")
    results: list[dict] = [{}] * len(jobs)
    for i, (out, _) in enumerate(outputs):
        results[i::processes] = [_decode_result(r) for r in json.loads(out)]
    return results


@pytest.fixture(scope="session")
def pre_type_results(smollm2_fields, tmp_path_factory):
    """llama.cpp's results for SmolLM2's vocabulary re-labelled with each of PRE_TYPES."""
    require_reference()
    import gguf

    folder = tmp_path_factory.mktemp("pre")
    base = Path(
        write_gguf(folder / "base.gguf", smollm2_fields, {"tokenizer.ggml.pre": ("x", gguf.GGUFValueType.STRING, None)})
    )
    data = base.read_bytes()
    jobs = []
    for pre in PRE_TYPES:
        path = folder / f"{pre}.gguf"
        path.write_bytes(with_string_kv(data, "tokenizer.ggml.pre", pre))
        jobs.append(
            {"path": str(path), "corpus": PRE_CORPUS, "flags": [(True, True), (False, False)], "detokenize": True}
        )
    return dict(zip(PRE_TYPES, run_reference_parallel(jobs)))


@pytest.mark.parametrize("pre", PRE_TYPES)
def test_pre_tokenizer_matches_llama_cpp(pre, smollm2_meta, pre_type_results):
    ref = pre_type_results[pre]
    tok = Tokenizer.from_metadata({**smollm2_meta, "tokenizer.ggml.pre": pre})
    bad = encode_mismatches(tok, ref, PRE_CORPUS, [(True, True), (False, False)])
    for s in PRE_CORPUS:
        want = ref["detokenize"][s]
        if tok.detokenize(want["ids"], remove_special=True) != want["10"]:
            bad.append(("detokenize", s))
    assert not bad, f"{len(bad)} differ, first: {bad[:3]}"


# ------------------------------------------------------------------- SentencePiece ("llama")


def spm_vocab_from_bpe(meta) -> tuple[list[str], list[float], list[int]]:
    """A SentencePiece-style vocabulary made from a byte-level BPE one: <unk> <s> </s>, the 256
    byte tokens, a few control/user-defined tokens, then every BPE token that is whole UTF-8 text
    (spaces as "▁"), scored by rank."""
    byte_level = {}
    n = 0
    for b in range(256):
        if 0x21 <= b <= 0x7E or 0xA1 <= b <= 0xAC or 0xAE <= b:
            byte_level[chr(b)] = b
        else:
            byte_level[chr(256 + n)] = b
            n += 1
    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256)), "<|im_start|>", "<|im_end|>", "<tool>"]
    types = [2, 3, 3, *[6] * 256, 3, 3, 4]
    scores = [0.0] * len(tokens)
    seen = set(tokens)
    for text, ttype in zip(meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.token_type"]):
        if ttype != 1:
            continue
        try:
            piece = bytes(byte_level[c] for c in text).decode("utf-8").replace(" ", "\u2581")
        except (KeyError, UnicodeDecodeError):
            continue
        if piece and piece not in seen:
            seen.add(piece)
            tokens.append(piece)
            scores.append(-float(len(scores)))
            types.append(1)
    return tokens, scores, types


@pytest.fixture(scope="session")
def spm_case(smollm2_meta, smollm2_fields, tmp_path_factory):
    import gguf

    tokens, scores, types = spm_vocab_from_bpe(smollm2_meta)
    T = gguf.GGUFValueType
    overrides = {
        "tokenizer.ggml.model": ("llama", T.STRING, None),
        "tokenizer.ggml.tokens": (tokens, T.ARRAY, T.STRING),
        "tokenizer.ggml.scores": (scores, T.ARRAY, T.FLOAT32),
        "tokenizer.ggml.token_type": (types, T.ARRAY, T.INT32),
        "tokenizer.ggml.bos_token_id": (1, T.UINT32, None),
        "tokenizer.ggml.eos_token_id": (2, T.UINT32, None),
        "tokenizer.ggml.unknown_token_id": (0, T.UINT32, None),
        "llama.vocab_size": (len(tokens), T.UINT32, None),
    }
    drop = (
        "tokenizer.ggml.merges",
        "tokenizer.ggml.pre",
        "tokenizer.ggml.add_bos_token",
        "tokenizer.ggml.add_space_prefix",
        "tokenizer.ggml.padding_token_id",
    )
    path = write_gguf(tmp_path_factory.mktemp("spm") / "spm.gguf", smollm2_fields, overrides, drop)
    meta = {k: v[0] for k, v in overrides.items() if k.startswith("tokenizer.")}
    meta["general.architecture"] = "llama"
    return Tokenizer.from_metadata(meta), path


def spm_mismatches(tok: Tokenizer, ref: dict, corpus=CORPUS) -> list:
    """Everything in which ``tok`` differs from llama.cpp's results ``ref`` (a reference job with
    all flags, detokenize and vocab=1): ids, detokenized bytes, pieces, attributes, EOG tokens."""
    bad: list = encode_mismatches(tok, ref, corpus)
    for s in corpus:
        want = ref["detokenize"][s]
        for remove_special, unparse_special in ((False, True), (True, False), (False, False)):
            got = tok.detokenize(want["ids"], remove_special=remove_special, unparse_special=unparse_special)
            if got != want[f"{int(remove_special)}{int(unparse_special)}"]:
                bad.append(("detokenize", s, remove_special, unparse_special))
    for tid, pieces in ref["pieces"].items():
        if pieces != [
            tok.token_to_piece(tid),
            tok.token_to_piece(tid, special=False),
            tok.token_to_piece(tid, lstrip=1),
        ]:
            bad.append(("piece", tid))
    if [tok.token_attr(t) for t in range(tok.n_vocab)] != ref["attrs"]:
        bad.append("attrs")
    if sorted(tok.eog_ids) != ref["eog"]:
        bad.append(("eog", sorted(tok.eog_ids), ref["eog"]))
    for name, tid in ref["special"].items():
        if name != "eot" and getattr(tok, f"{name}_id") != tid:
            bad.append((name, getattr(tok, f"{name}_id"), tid))
    if (tok.add_bos, tok.add_eos) != (ref["add_bos"], ref["add_eos"]):
        bad.append(("add_bos/add_eos", tok.add_bos, tok.add_eos))
    return bad


def test_spm_matches_llama_cpp(spm_case):
    tok, path = spm_case
    assert tok.model == "llama" and tok.add_bos and tok.add_space_prefix
    ref = run_reference([{"path": path, "corpus": CORPUS, "flags": ALL_FLAGS, "detokenize": True, "vocab": 1}])[0]
    bad = spm_mismatches(tok, ref)
    assert not bad, f"{len(bad)} differ, first: {bad[:3]}"


def tiny_spm_meta():
    normal = [
        "\u2581",
        "h",
        "e",
        "l",
        "o",
        "w",
        "r",
        "d",
        "\u2581h",
        "he",
        "ll",
        "\u2581he",
        "llo",
        "\u2581hello",
        "\u2581w",
        "or",
        "\u2581wor",
        "ld",
        "\u2581world",
    ]
    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256)), *normal, "<|x|>"]
    types = [2, 3, 3, *[6] * 256, *[1] * len(normal), 3]
    scores = [0.0] * 259 + [-float(i) for i in range(len(normal), 0, -1)] + [0.0]
    return {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": scores,
        "tokenizer.ggml.token_type": types,
    }


def test_spm_tiny_vocab():
    tok = Tokenizer.from_metadata(tiny_spm_meta())
    ids = lambda *texts: [tok.token_id(t) for t in texts]  # noqa: E731
    assert tok.bos_id == 1 and tok.eos_id == 2 and tok.unk_id == 0 and tok.add_bos
    assert tok.encode("hello world") == [1, *ids("\u2581hello", "\u2581world")]
    assert tok.encode("hello", add_special=False) == ids("\u2581hello")
    # unknown characters fall back to their UTF-8 bytes
    assert tok.encode("hé", add_special=False) == [*ids("\u2581h"), 3 + 0xC3, 3 + 0xA9]
    # the space prefix is added again after a special token
    assert tok.encode("<|x|>hello", add_special=False, parse_special=True) == ids("<|x|>", "\u2581hello")
    # llama_detokenize drops the leading space of the first token, unless it removed a BOS
    assert tok.decode(tok.encode("hello world", add_special=False)) == "hello world"
    assert tok.decode(tok.encode("hello world")) == "<s> hello world"
    assert tok.decode(tok.encode("hello world"), skip_special=True) == " hello world"
    assert tok.decode(tok.encode("hé", add_special=False)) == "hé"
    assert tok.token_to_piece(tok.token_id("\u2581hello")) == b" hello"
    assert tok.token_to_piece(3 + 0x41) == b"A"
    assert tok.token_to_piece(1, special=False) == b""
    assert tok.is_eog(2) and not tok.is_eog(1)
    assert tok.encode("") == [1] and tok.encode("", add_special=False) == []


# ------------------------------------------- SentencePiece models trained with sentencepiece

DATA = Path(__file__).resolve().parents[1] / "data"


def _proto_fields(buf: bytes):
    """(field number, value) of a protobuf message: ints for varints, bytes for length-delimited
    and fixed-size fields."""
    pos = 0

    def varint() -> int:
        nonlocal pos
        value = shift = 0
        while True:
            b = buf[pos]
            pos += 1
            value |= (b & 0x7F) << shift
            shift += 7
            if b < 0x80:
                return value

    while pos < len(buf):
        key = varint()
        wire = key & 7
        if wire == 0:
            value = varint()
        elif wire == 2:
            size = varint()
            value, pos = buf[pos : pos + size], pos + size
        elif wire in (1, 5):
            size = 8 if wire == 1 else 4
            value, pos = buf[pos : pos + size], pos + size
        else:
            raise ValueError(f"protobuf wire type {wire}")
        yield key >> 3, value


def read_spm_model(path) -> tuple[list[tuple[str, float, int]], bool]:
    """The (piece, score, type) list of a sentencepiece ModelProto and its normalizer's
    add_dummy_prefix, read without the sentencepiece package."""
    pieces = []
    add_dummy_prefix = True
    for field, value in _proto_fields(Path(path).read_bytes()):
        if field == 1:  # SentencePiece
            piece, score, ptype = "", 0.0, 1
            for f, v in _proto_fields(value):
                if f == 1:
                    piece = v.decode("utf-8")
                elif f == 2:
                    score = struct.unpack("<f", v)[0]
                elif f == 3:
                    ptype = v
            pieces.append((piece, score, ptype))
        elif field == 3:  # NormalizerSpec
            for f, v in _proto_fields(value):
                if f == 3:
                    add_dummy_prefix = bool(v)
    return pieces, add_dummy_prefix


def test_read_spm_model_matches_sentencepiece():
    spm = pytest.importorskip("sentencepiece")
    for name in ("spm-bpe", "spm-unigram"):
        pieces, add_dummy_prefix = read_spm_model(DATA / f"{name}.model")
        sp = spm.SentencePieceProcessor(model_file=str(DATA / f"{name}.model"))
        assert len(pieces) == sp.vocab_size()
        for tid, (piece, score, ptype) in enumerate(pieces):
            assert piece == sp.IdToPiece(tid) and score == sp.GetScore(tid)
            assert (ptype == 2, ptype == 3, ptype == 5, ptype == 6) == (
                sp.IsUnknown(tid),
                sp.IsControl(tid),
                sp.IsUnused(tid),
                sp.IsByte(tid),
            )
        assert add_dummy_prefix == (name == "spm-bpe")


def looks_special(text: str) -> bool:
    """convert_hf_to_gguf's does_token_look_special."""
    return (
        text in ("<pad>", "<mask>", "<2mass>", "[@BOS@]")
        or (text.startswith("<|") and text.endswith("|>"))
        or (text.startswith("<unused") and text.endswith(">"))
    )


def spm_vocab(model: str, n_vocab: int | None = None, added: dict | None = None):
    """tokens, scores and token types the way convert_hf_to_gguf's _create_vocab_sentencepiece
    makes them from ``tests/data/<model>.model``: ``n_vocab`` (the model config's vocab_size)
    pads with UNUSED "[PADi]" tokens; ``added`` is tokenizer_config.json's added_tokens_decoder
    as {id: (content, special)}."""
    pieces, _ = read_spm_model(DATA / f"{model}.model")
    n = n_vocab or len(pieces)
    tokens = [f"[PAD{i}]" for i in range(n)]
    scores = [-10000.0] * n
    types = [5] * n
    for tid, (piece, score, ptype) in enumerate(pieces):
        tokens[tid], scores[tid] = piece, score
        # sentencepiece's USER_DEFINED pieces stay NORMAL: the converter does not ask for them
        types[tid] = ptype if ptype in (2, 3, 5, 6) else 1
    for tid, (content, special) in (added or {}).items():
        if special or looks_special(content):
            types[tid] = 3
        else:
            content = content.replace("\u2581", " ")
            types[tid] = 4
        tokens[tid], scores[tid] = content, -1000.0
    return tokens, scores, types


def _gemma_added(model: str) -> dict:
    """Gemma's added_tokens_decoder: the control and user-defined pieces of the model, the
    control ones marked special."""
    pieces, _ = read_spm_model(DATA / f"{model}.model")
    return {tid: (piece, ptype == 3) for tid, (piece, _, ptype) in enumerate(pieces) if ptype in (3, 4)}


_PHI3_ADDED = [
    "<|endoftext|>",
    "<|assistant|>",
    "<|placeholder1|>",
    "<|placeholder2|>",
    "<|system|>",
    "<|end|>",
    "<|user|>",
]
_GEMMA3_ADDED = ["<start_of_turn>", "<end_of_turn>", "\n", "\n\n", "\u2581\u2581\u2581", "<image_soft_token>"]

# name -> (model file, architecture, general.name, config vocab_size, added tokens, extra keys);
# ids of BOS/EOS/UNK/PAD and add_bos/add_eos as the models' GGUFs carry them
SPM_VARIANTS = {
    # Llama 2 / Mistral: BPE model, the default "▁" prefix, [INST] as control tokens
    "llama": (
        "spm-bpe",
        "llama",
        "Llama SPM test",
        None,
        {},
        {"bos": 1, "eos": 2, "unknown": 0, "add_bos_token": True, "add_eos_token": False},
    ),
    # Phi-3: the Llama tokenizer plus <|...|> tokens and padding; </s> user-defined, RSTRIP by name
    "phi3": (
        "spm-bpe",
        "phi3",
        "Phi3",
        5016,
        {
            0: ("<unk>", True),
            1: ("<s>", True),
            2: ("</s>", False),
            **{5000 + i: (t, True) for i, t in enumerate(_PHI3_ADDED)},
        },
        {"bos": 1, "eos": 5000, "unknown": 0, "padding": 5000, "add_bos_token": True, "add_eos_token": False},
    ),
    # Gemma 2: unigram model, no space prefix, <pad> <eos> <bos> <unk> first
    "gemma2": (
        "spm-unigram",
        "gemma2",
        "gemma-2 test",
        None,
        _gemma_added("spm-unigram"),
        {
            "bos": 2,
            "eos": 1,
            "unknown": 3,
            "padding": 0,
            "add_bos_token": True,
            "add_eos_token": False,
            "add_space_prefix": False,
        },
    ),
    # Gemma 3: BPE model, no space prefix, turn markers and whitespace runs as added tokens
    "gemma3": (
        "spm-bpe",
        "gemma3",
        "gemma-3 test",
        5008,
        {5000 + i: (t, t.startswith("<")) for i, t in enumerate(_GEMMA3_ADDED)},
        {
            "bos": 1,
            "eos": 2,
            "unknown": 0,
            "padding": 5007,
            "add_bos_token": True,
            "add_eos_token": False,
            "add_space_prefix": False,
        },
    ),
    # a unigram model (scores with ties) with the default "▁" prefix
    "llama-unigram": (
        "spm-unigram",
        "llama",
        "unigram test",
        None,
        {},
        {"bos": 2, "eos": 1, "unknown": 3, "add_bos_token": True, "add_eos_token": False, "add_space_prefix": True},
    ),
}


def write_vocab_gguf(path: Path, meta: dict) -> str:
    """A tensor-less GGUF with ``meta`` (tokenizer and general keys) and the few hyperparameters
    llama.cpp reads before the vocabulary: enough for vocab_only=True."""
    import gguf

    T = gguf.GGUFValueType
    arrays = {
        "tokenizer.ggml.tokens": T.STRING,
        "tokenizer.ggml.scores": T.FLOAT32,
        "tokenizer.ggml.token_type": T.INT32,
    }
    fields = []
    for key, value in meta.items():
        if key in arrays:
            fields.append((key, value, T.ARRAY, arrays[key]))
        else:
            vtype = T.STRING if isinstance(value, str) else T.BOOL if isinstance(value, bool) else T.UINT32
            fields.append((key, value, vtype, None))
    arch = meta["general.architecture"]
    for key in ("context_length", "embedding_length", "block_count", "feed_forward_length", "attention.head_count"):
        fields.append((f"{arch}.{key}", 64, T.UINT32, None))
    fields.append((f"{arch}.attention.layer_norm_rms_epsilon", 1e-6, T.FLOAT32, None))
    return write_gguf(path, fields, {})


def spm_variant_meta(name: str) -> dict:
    """The GGUF metadata of SPM_VARIANTS[name], with the keys convert_hf_to_gguf writes."""
    model, arch, general_name, n_vocab, added, keys = SPM_VARIANTS[name]
    tokens, scores, types = spm_vocab(model, n_vocab, added)
    meta = {
        "general.architecture": arch,
        "general.name": general_name,
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.pre": "default",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": scores,
        "tokenizer.ggml.token_type": types,
    }
    for key, value in keys.items():
        meta[f"tokenizer.ggml.{key}" if isinstance(value, bool) else f"tokenizer.ggml.{key}_token_id"] = value
    return meta


@pytest.fixture(scope="session")
def spm_variants(tmp_path_factory):
    """name -> (Tokenizer, llama.cpp's results, GGUF path) for every SPM_VARIANTS entry."""
    folder = tmp_path_factory.mktemp("spm-models")
    metas = {name: spm_variant_meta(name) for name in SPM_VARIANTS}
    paths = {name: write_vocab_gguf(folder / f"{name}.gguf", meta) for name, meta in metas.items()}
    refs = run_reference_parallel(
        [
            {"path": path, "corpus": CORPUS, "flags": ALL_FLAGS, "detokenize": True, "vocab": 1}
            for path in paths.values()
        ]
    )
    return {name: (Tokenizer.from_metadata(metas[name]), ref, paths[name]) for name, ref in zip(SPM_VARIANTS, refs)}


@pytest.mark.parametrize("name", list(SPM_VARIANTS))
def test_spm_models_match_llama_cpp(name, spm_variants):
    tok, ref, _ = spm_variants[name]
    assert ref["n_vocab"] == tok.n_vocab and len(ref["tokenize"]) == len(CORPUS) >= 200
    assert tok.add_space_prefix == (name not in ("gemma2", "gemma3"))

    # the corpus reaches byte fallback, control tokens (parse_special) and user-defined ones
    def strings_with(ids: set, flags: str) -> int:
        return sum(bool(ids & {*r[flags][1:]}) for r in ref["tokenize"].values())

    byte_ids = {t for t in range(tok.n_vocab) if tok.token_attr(t) & TokenAttr.BYTE}
    control = {t for t in tok.special_ids if tok.token_attr(t) & TokenAttr.CONTROL}
    user = {t for t in tok.special_ids if tok.token_attr(t) & TokenAttr.USER_DEFINED} - control
    assert strings_with(byte_ids, "10") >= 40
    assert strings_with(control, "11") >= 3 and strings_with(control, "10") == 0
    if user:
        assert strings_with(user, "10") >= 3
    bad = spm_mismatches(tok, ref)
    assert not bad, f"{len(bad)} differ, first: {bad[:3]}"
    # word by word (see tokenizer/spm.py, _INNER_SPACE) as over the whole text
    assert tok.encoder.by_word
    whole = copy.copy(tok)
    whole.encoder = copy.copy(tok.encoder)
    whole.encoder.by_word = False
    assert not encode_mismatches(whole, ref, CORPUS[::4], [(True, True)])


def test_spm_invalid_utf8_matches_llama_cpp(spm_variants):
    """SentencePiece tokenizes the bytes: a byte that is not UTF-8 starts a symbol as long as
    its lead bits say (taking the bytes after it, a space's too), and falls back to bytes."""
    raw = [
        b"ab\xffcd",
        b"\xe4\xb8",
        b"x\xc3(y",
        b"\xf0\x9f\x98",
        b"\xed\xa0\x80z",
        b"ab\xff cd",
        b"\xf0 x y",
        b"\xc3 \xa9",
        b"\xe2\x96 \x81",
        b"the \xe4 quick",
        b"\xf0\xe4\xb8\xad\xe6\x96\x87",
        b"\x80\x80 a",
        b"<s>\xff</s>",
        b"\xff<bos>x",
    ]
    names = ["llama", "gemma2"]
    jobs = [
        {
            "path": spm_variants[name][2],
            "corpus": [r.hex() for r in raw],
            "hex": True,
            "flags": [(False, False), (True, True)],
        }
        for name in names
    ]
    bad = []
    for name, ref in zip(names, run_reference(jobs)):
        tok = spm_variants[name][0]
        for r in raw:
            for add_special, parse_special in ((False, False), (True, True)):
                got = tok.encode(r, add_special=add_special, parse_special=parse_special)
                if got != ref["tokenize"][r.hex()][f"{int(add_special)}{int(parse_special)}"]:
                    bad.append((name, r, add_special, parse_special))
    assert not bad, bad


def tie_vocab_meta(seed: int) -> dict:
    """Every string of 1-4 symbols over a, b, ▁ (some left out), scored in {-3, ..., 0}: many
    pairs of equal score compete, which llama.cpp settles leftmost first."""
    rng = random.Random(seed)
    normal = [
        "".join(p) for n in range(1, 5) for p in itertools.product("ab\u2581", repeat=n) if n == 1 or rng.random() < 0.5
    ]
    return {
        "general.architecture": "llama",
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256)), *normal],
        "tokenizer.ggml.scores": [0.0] * 259 + [float(rng.randint(-3, 0)) for _ in normal],
        "tokenizer.ggml.token_type": [2, 3, 3, *[6] * 256, *[1] * len(normal)],
    }


def test_spm_equal_scores_match_llama_cpp(tmp_path):
    rng = random.Random(7)
    corpus = sorted({"".join(rng.choice("ab ") for _ in range(rng.randint(1, 12))) for _ in range(300)})
    jobs, toks = [], []
    for seed in range(3):
        meta = tie_vocab_meta(seed)
        jobs.append(
            {"path": write_vocab_gguf(tmp_path / f"tie{seed}.gguf", meta), "corpus": corpus, "flags": [(False, False)]}
        )
        toks.append(Tokenizer.from_metadata(meta))
    bad = []
    for tok, ref in zip(toks, run_reference(jobs)):
        assert not tok.encoder.by_word  # tokens like "a▁b": the text is tokenized whole
        bad += encode_mismatches(tok, ref, corpus, [(False, False)])
    assert not bad, f"{len(bad)} of {3 * len(corpus)} differ, first: {bad[:3]}"


@pytest.mark.parametrize("name", ["llama-spm", "phi-3"])
def test_llama_cpp_spm_vocab(name):
    """llama.cpp's own SentencePiece test vocabularies (Llama 2's and Phi-3's), from a llama.cpp
    source tree's models/ folder given as SUPERGGML_LLAMA_CPP_MODELS (not shipped here)."""
    folder = os.environ.get("SUPERGGML_LLAMA_CPP_MODELS")
    if not folder:
        pytest.skip("SUPERGGML_LLAMA_CPP_MODELS (llama.cpp's models/ folder) is not set")
    path = str(Path(folder) / f"ggml-vocab-{name}.gguf")
    tok = Tokenizer.from_metadata(read_tokenizer_meta(path))
    ref = run_reference([{"path": path, "corpus": CORPUS, "flags": ALL_FLAGS, "detokenize": True, "vocab": 1}])[0]
    bad = spm_mismatches(tok, ref)
    assert not bad, f"{len(bad)} differ, first: {bad[:3]}"


# ------------------------------------------------------------------------- errors and edges


def test_unsupported_models(smollm2_meta):
    for model in ("bert", "t5", "rwkv", "gemma4", "no_vocab", "nonsense"):
        with pytest.raises(UnsupportedModelError):
            Tokenizer.from_metadata({**smollm2_meta, "tokenizer.ggml.model": model})
    for pre in ("kimi-k2", "afmoe", "superbpe", "tiny_aya", "not-a-pre-tokenizer"):
        with pytest.raises(UnsupportedModelError):
            Tokenizer.from_metadata({**smollm2_meta, "tokenizer.ggml.pre": pre})


def test_malformed_metadata(smollm2_meta):
    with pytest.raises(GGUFError):
        Tokenizer.from_metadata({k: v for k, v in smollm2_meta.items() if k != "tokenizer.ggml.model"})
    with pytest.raises(GGUFError):
        Tokenizer.from_metadata({k: v for k, v in smollm2_meta.items() if k != "tokenizer.ggml.tokens"})
    with pytest.raises(GGUFError):
        Tokenizer.from_metadata({k: v for k, v in smollm2_meta.items() if k != "tokenizer.ggml.merges"})
    tokens = list(smollm2_meta["tokenizer.ggml.tokens"])
    tokens[100] = tokens[101]
    with pytest.raises(GGUFError):
        Tokenizer.from_metadata({**smollm2_meta, "tokenizer.ggml.tokens": tokens})
    assert issubclass(GGUFError, ValueError)


def test_missing_pre_is_default(smollm2_meta):
    meta = {k: v for k, v in smollm2_meta.items() if k != "tokenizer.ggml.pre"}
    tok = Tokenizer.from_metadata(meta)
    assert tok.pre == "default" and tok.clean_spaces


def test_bytes_input_and_invalid_utf8(model):
    tok = model["tok"]
    assert tok.encode("héllo".encode()) == tok.encode("héllo")
    raw = [b"ab\xffcd", b"\xe4\xb8", b"x\xc3(y", b"\xf0\x9f\x98", b"\xed\xa0\x80z"]
    ref = run_reference(
        [{"path": model["path"], "corpus": [r.hex() for r in raw], "hex": True, "flags": [(False, False)]}]
    )[0]
    for r in raw:
        assert tok.encode(r, add_special=False) == ref["tokenize"][r.hex()]["00"], r


def test_add_bos_from_metadata(smollm2_meta):
    tok = Tokenizer.from_metadata(
        {**smollm2_meta, "tokenizer.ggml.add_bos_token": True, "tokenizer.ggml.add_eos_token": True}
    )
    ids = tok.encode("hi")
    assert ids[0] == tok.bos_id == 1 and ids[-1] == tok.eos_id == 2
    assert tok.encode("") == [1, 2]
    assert tok.decode(ids, skip_special=True) == "hi"
