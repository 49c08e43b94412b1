"""llama.cpp (llama-cpp-python) as the reference, always in a child process.

llama-cpp-python ships its own libggml*.so with the same sonames as the
pinned ggml superggml links: loading both in one process binds one of them
to the other's symbols. So the reference runs in a subprocess:
`python llama_ref.py` reads a JSON request on stdin and writes an .npz.

Which llama.cpp: a superggml built with SUPERGGML_BUILD_LLAMA=ON carries libllama.so next to its native
module, built over the very ggml libraries superggml uses; the child then runs llama-cpp-python's own Python
package from the source cache (ggml/fetch.py --python) with LLAMA_CPP_LIB_PATH at that libllama ("built").
Otherwise the pip-installed llama-cpp-python with its own libllama and ggml ("pip"). SUPERGGML_REFERENCE=pip or
=built forces one (built fails where it cannot be had); unset or auto takes built where it is there.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import ctypes
import importlib.util
import json
import os
import select
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

_FETCH = Path(__file__).resolve().parents[2] / "ggml" / "fetch.py"


def superggml_libllama() -> Path | None:
    """The libllama.so the superggml that the tests import carries (next to its native module), if any."""
    spec = importlib.util.find_spec("superggml")
    if spec is None or not spec.submodule_search_locations:
        return None
    lib = Path(list(spec.submodule_search_locations)[0]) / "libllama.so"
    return lib if lib.is_file() else None


def cached_llama_cpp(fetch: bool = False) -> Path | None:
    """The directory holding llama-cpp-python's Python package in the source cache (ggml/fetch.py --python); with
    `fetch`, fetched where missing (the sdist, hash-checked), else None where the cache has no such entry."""
    if not _FETCH.is_file():
        return None
    if fetch:
        r = subprocess.run([sys.executable, str(_FETCH), "--python"], capture_output=True, text=True, timeout=1800)
        if r.returncode != 0:
            raise RuntimeError(f"ggml/fetch.py --python failed:\n{r.stderr[-2000:]}")
        return Path(r.stdout.strip())
    spec = importlib.util.spec_from_file_location("superggml_fetch", _FETCH)
    assert spec is not None and spec.loader is not None
    fetch_mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fetch_mod)
    out = fetch_mod.cache_root()
    return Path(out) / "python" if fetch_mod.complete(out) else None


def reference(which: str | None = None) -> tuple[str, dict[str, str]]:
    """("built" or "pip", the environment changes of the child) for `which` (auto, pip or built; default:
    $SUPERGGML_REFERENCE, else auto)."""
    which = which or os.environ.get("SUPERGGML_REFERENCE") or "auto"
    if which not in ("auto", "pip", "built"):
        raise ValueError(f"SUPERGGML_REFERENCE={which!r}: auto, pip or built")
    if which != "pip":
        lib = superggml_libllama()
        if lib is None and which == "built":
            raise RuntimeError(
                "SUPERGGML_REFERENCE=built: the superggml under test carries no libllama.so "
                "(build it with CMAKE_ARGS=-DSUPERGGML_BUILD_LLAMA=ON)"
            )
        py = cached_llama_cpp(fetch=which == "built") if lib is not None else None
        if lib is not None and py is not None:
            path = os.pathsep.join([str(py)] + [p for p in [os.environ.get("PYTHONPATH")] if p])
            return "built", {"LLAMA_CPP_LIB_PATH": str(lib.parent), "PYTHONPATH": path}
    return "pip", {}


def no_repack() -> None:
    """llama.cpp's --no-repack in this process: the weights stay in the mapping (llama_cpp.Llama's model
    parameters with use_extra_bufts off), as superggml's streamed layout and its repack=False."""
    import llama_cpp.llama_cpp as lib  # the module llama_cpp.Llama calls

    default = lib.llama_model_default_params

    def params():
        p = default()
        p.use_extra_bufts = False
        return p

    lib.llama_model_default_params = params


def _serve(req: dict[str, Any]) -> dict[str, Any]:
    import llama_cpp

    if req.get("repack") is False:
        no_repack()
    kind = req["kind"]
    if kind == "decode":
        return _decode(req)
    if kind == "sysinfo":
        return {"sysinfo": np.array(llama_cpp.llama_print_system_info().decode())}
    if kind == "libs":  # which llama_cpp, and the libllama and ggml libraries this process mapped
        with open("/proc/self/maps") as f:
            paths = sorted({line.split(None, 5)[5].strip() for line in f if len(line.split(None, 5)) == 6})
        libs = [p for p in paths if os.path.basename(p).startswith(("libllama", "libggml"))]
        return {"llama_cpp": np.array(llama_cpp.__file__), "libs": np.array(libs)}
    kw = dict(
        model_path=req["model"],
        verbose=False,
        n_threads=req.get("n_threads", 2),
        n_threads_batch=req.get("n_threads", 2),
        n_ctx=req.get("n_ctx", 512),
        n_batch=req.get("n_batch", 512),
        n_ubatch=req.get("n_batch", 512),
        flash_attn=req.get("flash_attn", False),
        # llama.cpp's own default (common.h): the GGUF's YaRN betas; llama_cpp would pass 32 and 1 over them
        yarn_beta_fast=-1.0,
        yarn_beta_slow=-1.0,
    )
    if req.get("kv_type") == "f32":
        kw.update(type_k=0, type_v=0)
    if kind == "kv_types":  # per config (type_k, type_v, flash_attn): the prompt's logits, then greedy steps
        out = {}
        for i, (tk, tv, fa) in enumerate(req["configs"]):
            llm = llama_cpp.Llama(logits_all=True, **{**kw, "type_k": tk, "type_v": tv, "flash_attn": fa})
            llm.eval(req["prompt"])
            rows = [np.array(llm.scores[: llm.n_tokens], dtype=np.float32)]
            for _ in range(req["n_decode"]):
                llm.eval([int(np.argmax(rows[-1][-1]))])
                rows.append(np.array(llm.scores[llm.n_tokens - 1 : llm.n_tokens], dtype=np.float32))
            out[f"logits{i}"] = np.concatenate(rows)
            llm.close()
        return out
    if kind == "tokenize":
        llm = llama_cpp.Llama(vocab_only=True, **kw)
        out = {}
        for i, (text, add_special, parse_special) in enumerate(req["items"]):
            ids = llm.tokenize(text.encode("utf-8"), add_bos=add_special, special=parse_special)
            out[f"ids{i}"] = np.asarray(ids, dtype=np.int64)
        return out
    if kind == "loads":  # each model loaded and run in a forked child: a clean error and a crash told apart
        return _loads(req, kw)
    if kind == "tail":  # a long prompt's last logits, then greedy steps': no logits kept for the other rows
        llm = llama_cpp.Llama(**kw)
        n_vocab = llm.n_vocab()

        def last() -> np.ndarray:
            return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(n_vocab,)).copy()

        llm.eval(req["prompt"])
        rows = [last()]
        for _ in range(req["n_decode"]):
            llm.eval([int(np.argmax(rows[-1]))])
            rows.append(last())
        return {"logits": np.stack(rows)}
    if kind == "logits":
        llm = llama_cpp.Llama(logits_all=True, **kw)
        out = {}
        for i, toks in enumerate(req["prompts"]):
            llm.reset()
            split = req.get("split", 0)  # a prefix in one batch first
            if split:
                llm.eval(toks[:split])
            if req.get("one_by_one"):
                for t in toks[split:]:
                    llm.eval([t])
            else:
                llm.eval(toks[split:])
            out[f"logits{i}"] = np.array(llm.scores[: len(toks)], dtype=np.float32)
        return out
    if kind == "embed":  # llama.cpp's embeddings: the final norm's output, pooled (mean 1, last 3)
        llm = llama_cpp.Llama(embedding=True, pooling_type={"mean": 1, "last": 3}[req["pooling"]], **kw)
        return {
            f"emb{i}": np.asarray(llm.embed(t, normalize=True), dtype=np.float64) for i, t in enumerate(req["texts"])
        }
    if kind == "generate":
        llm = llama_cpp.Llama(**kw)
        out = {}

        def fresh():  # each run from an empty memory (Llama.reset keeps the cells)
            llm.reset()
            llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(llm.ctx), True)

        for i, prompt in enumerate(req["prompts"]):
            # llama-cpp-python's own text, where it has one: its create_completion skips the max_tokens check
            # after a token whose text ends like a UTF-8 lead byte, and may run into the end of the context
            fresh()
            try:
                r = llm.create_completion(
                    prompt, max_tokens=req["max_tokens"], temperature=0.0, top_k=1, repeat_penalty=1.0
                )
                out[f"text{i}"] = np.array(r["choices"][0]["text"])
            except RuntimeError:
                pass
            # the greedy ids, and their text through llama.cpp's own llama_detokenize: llama-cpp-python's
            # detokenize drops pieces longer than its 32-byte buffer (random weights pick such tokens)
            fresh()
            ids = []
            for t in llm.generate(llm.tokenize(prompt.encode()), top_k=1, temp=0.0, repeat_penalty=1.0):
                if (
                    llama_cpp.llama_vocab_is_eog(llama_cpp.llama_model_get_vocab(llm.model), t)
                    or len(ids) == req["max_tokens"]
                ):
                    break
                ids.append(t)
            buf = ctypes.create_string_buffer(1 << 16)
            arr = (llama_cpp.llama_token * len(ids))(*ids)
            n = llama_cpp.llama_detokenize(
                llama_cpp.llama_model_get_vocab(llm.model), arr, len(ids), buf, len(buf), False, False
            )
            out[f"ids{i}"] = np.array(ids, dtype=np.int64)
            out[f"piece_text{i}"] = np.array(buf.raw[:n].decode("utf-8", errors="ignore"))
            llm.reset()
        return out
    if kind == "mtp":
        return _mtp(req, kw)
    if kind == "batch":
        return _batch(req, kw)
    if kind == "bodies":  # a ported llama-cpp-python test body (llama_cpp_bodies.py) on llama_cpp itself
        import llama_cpp_bodies

        return {"json": np.array(json.dumps(llama_cpp_bodies.BODIES[req["body"]](llama_cpp, req["model"])))}
    if kind == "bench":
        llm = llama_cpp.Llama(**kw)
        toks = req["prompt_tokens"] if "prompt_tokens" in req else llm.tokenize(req["prompt"].encode())
        res = {}
        for rep in range(req.get("repeats", 1)):
            llm.reset()
            t0 = time.perf_counter()
            llm.eval(toks)
            t1 = time.perf_counter()
            tok = int(np.argmax(last_logits(llm)))
            for _ in range(req["n_decode"]):
                llm.eval([tok])
                tok = int(np.argmax(last_logits(llm)))
            t2 = time.perf_counter()
            res.setdefault("prefill_s", []).append(t1 - t0)
            res.setdefault("decode_s", []).append(t2 - t1)
        return {k: np.asarray(v) for k, v in res.items()}
    raise ValueError(f"unknown request kind {kind!r}")


LOAD_OK, LOAD_ERROR, LOAD_CRASH = 0, 1, 2
LOAD_HANG_S = 15  # a load and one prompt of a small file past this is counted a crash (LOAD_CRASH)


def _load_one(kw: dict[str, Any], path: str, prompt: list[int], dst: str) -> None:
    """A forked child's work for _loads: exits LOAD_OK with the logits saved at dst, or LOAD_ERROR. Its aborts
    leave no core file: where cores are on, each would be the size of the child's memory."""
    import resource

    import llama_cpp

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    try:
        llm = llama_cpp.Llama(logits_all=True, **{**kw, "model_path": path})
        llm.eval(prompt)
        np.save(dst, np.array(llm.scores[: len(prompt)], dtype=np.float32))
    except Exception:
        sys.exit(LOAD_ERROR)
    sys.exit(LOAD_OK)


def _loads(req: dict[str, Any], kw: dict[str, Any]) -> dict[str, Any]:
    """For each of req["models"], in a child forked for it: load it and evaluate req["prompt"] (every row's
    logits). "status": LOAD_OK, LOAD_ERROR (llama_cpp raised: the loader refused the file) or LOAD_CRASH (the
    child died, an abort, or hung past LOAD_HANG_S); "logits{i}" for each model that ran."""
    import multiprocessing

    import llama_cpp  # noqa: F401  (imported once, before the forks)

    fork = multiprocessing.get_context("fork")
    out: dict[str, Any] = {}
    status = []
    with tempfile.TemporaryDirectory() as d:
        for i, path in enumerate(req["models"]):
            dst = os.path.join(d, f"{i}.npy")
            child = fork.Process(target=_load_one, args=(kw, path, req["prompt"], dst))
            child.start()
            child.join(LOAD_HANG_S)
            if child.is_alive():  # a hang (llama.cpp spins on some files): a crash as far as a user can tell
                child.kill()
                child.join()
            code = child.exitcode
            status.append(code if code in (LOAD_OK, LOAD_ERROR) else LOAD_CRASH)
            if status[-1] == LOAD_OK:
                out[f"logits{i}"] = np.load(dst)
    out["status"] = np.array(status)
    return out


def last_logits(llm: Any) -> np.ndarray:
    """The logits of the last token evaluated: llm.scores stays zero without logits_all (llama-cpp-python 0.3.x),
    so they come from the context."""
    import llama_cpp

    return np.ctypeslib.as_array(llama_cpp.llama_get_logits(llm.ctx), shape=(llm.n_vocab(),)).astype(np.float32)


def _decode(req: dict[str, Any]) -> dict[str, Any]:
    """A prompt of req["prompt"] tokens in one batch, then the rest of req["tokens"] one by one, teacher-forced
    (mmap; n_batch = the prompt): the logits of the prompt's last token and of the last one, the decode's
    seconds, the load's, and the peak RSS (bytes)."""
    import resource

    import llama_cpp

    toks, n = req["tokens"], req["prompt"]
    t = time.perf_counter()
    llm = llama_cpp.Llama(
        model_path=req["model"],
        verbose=False,
        n_threads=req["n_threads"],
        n_threads_batch=req["n_threads"],
        n_ctx=req["n_ctx"],
        n_batch=n,
        n_ubatch=n,
        use_mmap=True,
    )
    logits = lambda: last_logits(llm)  # noqa: E731
    t_load = time.perf_counter() - t
    llm.eval(toks[:n])
    first = logits()
    t = time.perf_counter()
    for tok in toks[n:]:
        llm.eval([tok])
    dt = time.perf_counter() - t
    last = logits()
    return {
        "logits": np.stack([first, last]),
        "decode_s": np.array(dt),
        "load_s": np.array(t_load),
        "maxrss": np.array(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024),
    }


def _batch(req: dict[str, Any], kw: dict[str, Any]) -> dict[str, Any]:
    """llama.cpp's batch against its own sequences alone, as tests/support/batching.py's alone_and_batched: each of
    req["prompts"] alone (an empty memory, greedy for req["steps"] steps), then all of them in shared batches of
    req["n_batch"] tokens (one unified K/V), teacher-forced by the alone's tokens. "alone{i}" and "batched{i}": F32
    [steps + 1, n_vocab]."""
    import llama_cpp as L

    prompts, steps = req["prompts"], req["steps"]
    mp = L.llama_model_default_params()
    mp.use_extra_bufts = req.get("repack", True) is not False
    model = L.llama_model_load_from_file(req["model"].encode(), mp)
    n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
    cp = L.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch = kw["n_ctx"], kw["n_ctx"], kw["n_ubatch"]
    cp.n_threads = cp.n_threads_batch = kw["n_threads"]
    cp.n_seq_max, cp.kv_unified, cp.flash_attn_type = len(prompts), True, int(kw["flash_attn"])
    cp.yarn_beta_fast = cp.yarn_beta_slow = -1.0
    ctx = L.llama_init_from_model(model, cp)
    batch = L.llama_batch_init(cp.n_ctx, 0, 1)

    def decode(items: list[tuple[int, int, int, bool]]) -> list[np.ndarray]:
        """One llama_decode of (seq, pos, token, wants logits) items; the logits of those that want them."""
        batch.n_tokens = len(items)
        for j, (seq, pos, tok, out) in enumerate(items):
            batch.token[j], batch.pos[j], batch.n_seq_id[j], batch.logits[j] = tok, pos, 1, out
            batch.seq_id[j][0] = seq
        assert L.llama_decode(ctx, batch) == 0
        return [
            np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, j), shape=(n_vocab,)).astype(np.float32)
            for j, it in enumerate(items)
            if it[3]
        ]

    out: dict[str, Any] = {}
    for i, p in enumerate(prompts):
        L.llama_memory_clear(L.llama_get_memory(ctx), True)
        rows = decode([(0, j, t, j == len(p) - 1) for j, t in enumerate(p)])
        for s in range(steps):
            rows += decode([(0, len(p) + s, int(np.argmax(rows[-1])), True)])
        out[f"alone{i}"] = np.stack(rows)
    L.llama_memory_clear(L.llama_get_memory(ctx), True)
    first = decode([(i, j, t, j == len(p) - 1) for i, p in enumerate(prompts) for j, t in enumerate(p)])
    got = [[r] for r in first]
    for s in range(steps):
        step = [(i, len(p) + s, int(np.argmax(out[f"alone{i}"][s])), True) for i, p in enumerate(prompts)]
        for g, r in zip(got, decode(step)):
            g.append(r)
    for i, g in enumerate(got):
        out[f"batched{i}"] = np.stack(g)
    L.llama_batch_free(batch)
    L.llama_free(ctx)
    L.llama_model_free(model)
    return out


def _mtp(req: dict[str, Any], kw: dict[str, Any]) -> dict[str, Any]:
    """llama.cpp's draft-mtp inputs and outputs for each prompt: the model's output-normed hidden rows of every
    position (unmasked nextn embeddings), then its MTP context fed the prompt's tokens each with the row before
    (zeros first): every row's logits and hidden row."""
    import llama_cpp as L

    # llama-ext.h's staging API: C++ symbols of the libllama llama_cpp loaded (the same handle: where
    # llama_cpp.llama_cpp takes it, LLAMA_CPP_LIB_PATH else its package's lib/)
    lib_dir = os.environ.get("LLAMA_CPP_LIB_PATH") or os.path.join(os.path.dirname(L.__file__), "lib")
    lib = ctypes.CDLL(os.path.join(lib_dir, "libllama.so"))
    set_nextn = lib["_Z26llama_set_embeddings_nextnP13llama_contextbb"]
    set_nextn.argtypes = [ctypes.c_void_p, ctypes.c_bool, ctypes.c_bool]
    get_nextn = lib["_Z26llama_get_embeddings_nextnP13llama_context"]
    get_nextn.argtypes, get_nextn.restype = [ctypes.c_void_p], ctypes.POINTER(ctypes.c_float)
    mp = L.llama_model_default_params()
    mp.load_mtp = True
    model = L.llama_model_load_from_file(req["model"].encode(), mp)
    # the nextn rows are n_embd_out wide (deepseek4: its 4 residual streams)
    n_embd, n_vocab = L.llama_model_n_embd_out(model), L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))

    def context(ctx_type: int) -> Any:
        cp = L.llama_context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch = kw["n_ctx"], kw["n_batch"], kw["n_batch"]
        cp.n_threads = cp.n_threads_batch = kw["n_threads"]
        cp.ctx_type, cp.flash_attn_type = ctx_type, int(kw["flash_attn"])
        return L.llama_init_from_model(model, cp)

    out = {}
    for i, toks in enumerate(req["prompts"]):
        tgt, dft = context(0), context(1)
        set_nextn(tgt, True, False)
        set_nextn(dft, True, True)
        arr = (L.llama_token * len(toks))(*toks)
        assert L.llama_decode(tgt, L.llama_batch_get_one(arr, len(toks))) == 0
        h = np.ctypeslib.as_array(get_nextn(tgt), shape=(len(toks), n_embd)).copy()
        shifted = np.ascontiguousarray(np.concatenate([np.zeros((1, n_embd), np.float32), h[:-1]]))
        batch = L.llama_batch_ext_init(dft)
        for j, t in enumerate(toks):
            idx = L.llama_batch_ext_add_token(batch, 0, t)
            row = shifted[j].ctypes.data_as(ctypes.POINTER(ctypes.c_float))
            assert L.llama_batch_ext_set_embd_token(batch, idx, L.llama_embd(row, 1, n_embd))
            assert L.llama_batch_ext_set_pos(batch, idx, ctypes.byref(L.llama_pos(j)))
            assert L.llama_batch_ext_set_output_logits(batch, idx, True)
        assert L.llama_process(dft, 1, batch) == 0
        out[f"h{i}"] = h
        out[f"logits{i}"] = np.array(
            [np.ctypeslib.as_array(L.llama_get_logits_ith(dft, j), shape=(n_vocab,)) for j in range(len(toks))],
            dtype=np.float32,
        )
        out[f"mtp_h{i}"] = np.ctypeslib.as_array(get_nextn(dft), shape=(len(toks), n_embd)).copy()
        L.llama_batch_ext_free(batch)
        L.llama_free(tgt)
        L.llama_free(dft)
    L.llama_model_free(model)
    return out


def cpu_features() -> dict[str, int]:
    """llama.cpp's CPU feature flags, e.g. {"AVX2": 1, "AVX512": 1, ...}."""
    text = str(run({"kind": "sysinfo"})["sysinfo"])
    out = {}
    for part in text.split("|"):
        if "=" in part:
            k, v = part.rsplit("=", 1)
            out[k.split(":")[-1].strip()] = int(v.strip()) if v.strip().isdigit() else 0
    return out


class ChildFailed(RuntimeError):
    """The reference's child exited with `returncode` (-9: killed, as a memory cgroup's limit kills)."""

    def __init__(self, name: str, returncode: int, stderr: str):
        self.returncode, self.stderr = returncode, stderr
        super().__init__(f"llama.cpp reference ({name}) failed: {self.exit}:\n{stderr[-4000:]}")

    @property
    def exit(self) -> str:
        return f"exit {self.returncode}" + (" (OOM-killed)" if self.returncode == -9 else "")


ONE_SHOT = ("decode", "bench", "loads", "libs")  # timed, measured, forking, or about the process itself


class _Server:
    """A long-lived reference child: requests as JSON lines on its stdin, "ok" back once each .npz is written. A
    child that fails a request (an exception, an abort) exits; the caller sees its exit code and stderr."""

    def __init__(self, env: dict[str, str]):
        self.err = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--serve"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.err,
            env=env,
            text=True,
        )

    def request(self, name: str, request: dict[str, Any], out: str, timeout: float) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.err.seek(0)
        self.err.truncate()
        try:
            self.proc.stdin.write(json.dumps({**request, "_out": out}) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass  # it died: the read below says how
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            self.close()
            raise subprocess.TimeoutExpired(self.proc.args, timeout)
        if self.proc.stdout.readline().strip() != "ok":
            code = self.proc.wait()
            self.err.seek(0)
            stderr = self.err.read().decode(errors="replace")
            self.close()
            raise ChildFailed(name, code, stderr)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout, self.err):
            if f is not None:
                f.close()


_IDLE: dict[tuple[tuple[str, str], ...], list[_Server]] = {}  # by environment
_IDLE_LOCK = threading.Lock()


@atexit.register
def _close_servers() -> None:
    with _IDLE_LOCK:
        for servers in _IDLE.values():
            for server in servers:
                server.close()
        _IDLE.clear()


def run(
    request: dict[str, Any], timeout: float = 1800, which: str | None = None, limit: int | None = None
) -> dict[str, Any]:
    """Runs one request in a child process and returns its arrays; `which` as for `reference`. With `limit`
    (bytes), the child runs in a new memory cgroup of that size (tests/support/memcg.py), request["model"]'s pages
    dropped from the page cache first. A failed child raises ChildFailed (a RuntimeError). A request that needs a process
    of its own (a limit, ONE_SHOT kinds, repack off) gets a new child; the others go to a child kept for the next
    ones with the same environment (a Python start and llama_cpp's import spared)."""
    name, changes = reference(which)
    env = dict(os.environ)
    env.pop("LLAMA_CPP_LIB_PATH", None)
    env.update(changes)
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "out.npz")
        if limit or request["kind"] in ONE_SHOT or request.get("repack") is False:
            argv = [sys.executable, os.path.abspath(__file__), out]
            kw: dict[str, Any] = dict(
                input=json.dumps(request), text=True, capture_output=True, timeout=timeout, env=env
            )
            if limit:
                import memcg

                memcg.drop_page_cache(request["model"])
                with memcg.limited(limit) as enter:
                    proc = subprocess.run(argv, preexec_fn=enter, **kw)
            else:
                proc = subprocess.run(argv, **kw)
            if proc.returncode != 0:
                raise ChildFailed(name, proc.returncode, proc.stderr)
        else:
            env.pop("PYTEST_CURRENT_TEST", None)  # pytest's name of the running test: not the child's business
            key = tuple(sorted(env.items()))
            with _IDLE_LOCK:
                for other in [k for k in _IDLE if k != key]:  # one environment's children kept at a time
                    for stale in _IDLE.pop(other):
                        stale.close()
                idle = _IDLE.setdefault(key, [])
                server = idle.pop() if idle else None
            server = server or _Server(env)
            server.request(name, request, out, timeout)  # a failed one is closed, not kept
            with _IDLE_LOCK:
                _IDLE.setdefault(key, []).append(server)
        with np.load(out, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}


_STARTED = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="llama_ref")


def start(request: dict[str, Any], **kw: Any) -> concurrent.futures.Future:
    """run(request, **kw) in a thread: llama.cpp's child computes while the caller computes superggml's side;
    .result() gives run's arrays or raises what run raised."""
    return _STARTED.submit(run, request, **kw)


if __name__ == "__main__":
    if sys.argv[1] == "--serve":  # _Server's child: an exception ends it, with its traceback on stderr
        replies = os.fdopen(os.dup(1), "w")
        os.dup2(2, 1)  # what llama.cpp prints goes with stderr, not into the replies
        for line in sys.stdin:
            req = json.loads(line)
            np.savez(req.pop("_out"), **_serve(req))
            print("ok", file=replies, flush=True)
    else:
        req = json.loads(sys.stdin.read())
        np.savez(sys.argv[1], **_serve(req))
