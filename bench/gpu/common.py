"""What check.py and bench.py share: the device superggml runs on, the model's sizes, and llama.cpp (found, and
run in a child process)."""

import glob
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

import superggml
from superggml import native

HERE = os.path.dirname(os.path.abspath(__file__))
THREADS = os.cpu_count() or 1
SITE = os.environ.get("SUPERGGML_SITE")  # run.sh's build: never another superggml this python may have
if SITE and not os.path.abspath(superggml.__file__).startswith(os.path.abspath(SITE) + os.sep):
    sys.exit(f"superggml imported from {superggml.__file__}, not from this run's build in {SITE}")


def device_kw():
    """superggml's device: CUDA0 where this build lists it, else its default (the CPU)."""
    return {"devices": ["CUDA0"]} if any(d["name"] == "CUDA0" for d in native.devices()) else {}


def device_name():
    devs = native.devices()
    d = next((d for d in devs if d["name"] == "CUDA0"), devs[0])
    return f"{d['name']} ({d['description']})"


def sizes(path):
    """(bytes of every weight, bytes of the largest block)."""
    f = native.GGUFFile(path)
    try:
        t = f.tensors()
    finally:
        f.close()
    blocks = {}
    for name, _, _, _, nb in t:
        if name.startswith("blk."):
            blocks[name.split(".")[1]] = blocks.get(name.split(".")[1], 0) + int(nb)
    return sum(int(x[4]) for x in t), max(blocks.values())


def reference():
    """llama.cpp: the libllama and llama-bench built beside superggml against the same ggml, with the llama_cpp
    package kept in the ggml source cache; else the llama_cpp (and its own libllama) this python has."""
    pkg = os.path.dirname(superggml.__file__)
    lib = sorted(glob.glob(os.path.join(pkg, "**", "libllama.so"), recursive=True))
    bench = sorted(glob.glob(os.path.join(pkg, "**", "llama-bench"), recursive=True))
    cache = os.environ.get("SUPERGGML_CACHE") or os.path.expanduser("~/.cache/superggml")
    py = sorted(
        glob.glob(os.path.join(cache, "ggml-src", "llama-cpp-python-*", "**", "llama_cpp", "llama.py"), recursive=True)
    )
    env = dict(os.environ)
    if lib:
        env["LLAMA_CPP_LIB_PATH"] = os.path.dirname(lib[0])
        env["LD_LIBRARY_PATH"] = ":".join([os.path.dirname(lib[0]), pkg] + env.get("LD_LIBRARY_PATH", "").split(":"))
    py = py if lib else []  # the cached package only with the libllama built beside superggml
    if py:
        env["PYTHONPATH"] = os.path.dirname(os.path.dirname(py[0])) + ":" + env.get("PYTHONPATH", "")
    return {
        "lib": lib[0] if lib else "pip's llama_cpp",
        "llama_cpp": os.path.dirname(py[0]) if py else "pip's",
        "llama_bench": bench[0] if bench else None,
        "env": env,
    }


def run_ref(ref, req, timeout):
    """ref.py's arrays for a request (in a child process)."""
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "req.json"), "w") as f:
            json.dump({"threads": THREADS, **req}, f)
        p = subprocess.run(
            [sys.executable, os.path.join(HERE, "ref.py"), f.name, os.path.join(d, "out.npz")],
            env=ref["env"],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if p.returncode:
            raise RuntimeError(f"ref.py rc {p.returncode}: {p.stderr[-1500:]}")
        with np.load(os.path.join(d, "out.npz")) as z:
            return {k: z[k] for k in z.files}


def error(e):
    return f"{type(e).__name__}: {str(e)[-600:]}"
