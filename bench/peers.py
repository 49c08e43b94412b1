"""Peers that page their own share, on a real network on one machine: 1, 2 and 3 RPC servers, each in a network
namespace behind a veth link shaped to --rate (tc tbf) and --delay-ms each way (a forwarder: this kernel has no
sch_netem), each in a memory cgroup smaller than its share of the model, each with its own copy of the file
(tests/support/netlab.py). Decode tokens/s and the bytes that crossed the links per token, for:

- superggml, peers holding the file (`superggml rpc-server --models`): only hashes, activations and graphs cross
  (and again without a memory limit: the shares resident on the peers);
- superggml, today's path: ggml's plain RPC server as the peer (the blocks' bytes cross every pass);
- llama.cpp's RPC (llama-cpp-python built with -DGGML_RPC=ON, its own ggml RPC server on the peers), with the
  same cgroups, and again without a memory limit (it holds each share in the server's memory: it cannot run in
  less).

    python bench/peers.py --llama-rpc /path/with/llama_cpp    # Qwen2.5-Coder-1.5B Q4_K_M, 1 Gbit/s, 1 ms
    python bench/peers.py --rate 100mbit --delay-ms 5 --peers 2

Bytes are the host-side veth counters (all traffic to the peers), and for superggml also the relay's own count.
The peers' files have their pages dropped from the page cache before each run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "support"))

import memcg  # noqa: E402
import netlab  # noqa: E402

import numpy as np  # noqa: E402

from superggml import Model, models, native  # noqa: E402
from superggml.commands.analyze import model_layout  # noqa: E402

PROMPT = "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"
PORT = 50052
LLAMA_CLIENT = """
import json, sys, time
sys.path.insert(0, sys.argv[1])
import ctypes, os
import numpy as np
import llama_cpp
from llama_cpp import Llama
path, servers, prompt, n = sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
# llama-cpp-python 0.3.36 has no rpc_servers: add the servers' devices as llama.cpp's --rpc does
lib = os.path.join(os.path.dirname(llama_cpp.__file__), "lib")
ggml = ctypes.CDLL(os.path.join(lib, "libggml.so.0"))
rpc = ctypes.CDLL(os.path.join(lib, "libggml-rpc.so.0"))
rpc.ggml_backend_rpc_add_server.restype = ctypes.c_void_p
rpc.ggml_backend_rpc_add_server.argtypes = [ctypes.c_char_p]
ggml.ggml_backend_register.argtypes = [ctypes.c_void_p]
for ep in servers.split(","):
    ggml.ggml_backend_register(rpc.ggml_backend_rpc_add_server(ep.encode()))
llm = Llama(model_path=path, n_gpu_layers=999, n_ctx=256, n_batch=64, n_threads=1,
            verbose=False, logits_all=False)
toks = llm.tokenize(prompt.encode())
llm.eval(toks)
print(json.dumps({"devices": llama_cpp.llama_supports_rpc()}), flush=True)
sys.stdin.readline()
out, t0 = [], time.perf_counter()
for _ in range(n):
    t = int(np.argmax(llm.scores[llm.n_tokens - 1]))
    out.append(t)
    llm.eval([t])
dt = time.perf_counter() - t0
print(json.dumps({"tok_s": n / dt, "text": llm.detokenize(out).decode("utf-8", "replace")}), flush=True)
"""


def tx_bytes(lab: netlab.Lab) -> int:
    return sum(int(Path(f"/sys/class/net/sgh{lab.token}{h.i}/statistics/tx_bytes").read_text()) for h in lab.hosts)


def start_peer(host: netlab.Host, kind: str, root: Path, mem: int, cgroup: int, llama_lib: Optional[str]) -> str:
    log = open(root / f"{kind}.log", "a")
    if kind == "superggml":
        argv = [
            sys.executable,
            "-m",
            "superggml",
            "rpc-server",
            "--host",
            "{host}",
            "-p",
            "{port}",
            "-t",
            "1",
            "--models",
            str(root / "models"),
        ] + (["--mem", str(mem)] if mem else [])
    else:  # ggml's own server: from superggml's ggml (today's path) or llama.cpp's
        lib = llama_lib if kind == "llama" else str(Path(native.__file__).parent)
        argv = netlab.ggml_server(str(lib))
    ep, proc = host.serve(PORT, argv, memory=cgroup, stdout=log, stderr=log)
    deadline = time.time() + 120
    while True:
        try:
            native.rpc_probe(ep, connect_timeout=2.0)
            return ep
        except Exception:
            if proc.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"peer {kind} on {host.address} did not start: see {root / (kind + '.log')}")
            time.sleep(0.2)


def run_superggml(model: str, eps: list[str], tokens: int, lab: netlab.Lab, mem: Optional[int]) -> dict[str, Any]:
    # each peer's budget is what it advertises (a plain ggml server advertises the host's memory, not its
    # cgroup's); None: none (the shares resident)
    with Model(
        model,
        ctx_size=256,
        n_batch=64,
        n_threads=1,
        devices=[f"RPC[{e}]" for e in eps],
        tensor_split=[1] * len(eps),
        device_budget=",".join([str(mem)] * len(eps)) if mem else "off",
    ) as m:
        m.eval(m.tokenize(PROMPT.encode()))
        rs0, tx0 = native.rpc_stats(), tx_bytes(lab)
        out, t0 = [], time.perf_counter()
        for _ in range(tokens):
            t = int(np.argmax(m.scores[-1]))
            out.append(t)
            m.eval([t])
        dt = time.perf_counter() - t0
        rs1, tx1 = native.rpc_stats(), tx_bytes(lab)
        st = m.stats()
    sent = sum(rs1[e]["bytes_sent"] - rs0[e]["bytes_sent"] for e in eps)
    by_peer = sum(rs1[e]["loaded_by_peer"] - rs0[e]["loaded_by_peer"] for e in eps)
    return {
        "tok_s": tokens / dt,
        "wire_bytes_per_token": (tx1 - tx0) / tokens,
        "relay_bytes_per_token": sent / tokens,
        "peer_loaded_bytes_per_token": by_peer / tokens,
        "blocks_per_device": st["blocks_per_device"],
        "text": m.detokenize(out).decode("utf-8", "replace"),
    }


def run_llama(llama_rpc: str, model: str, eps: list[str], tokens: int, lab: netlab.Lab) -> dict[str, Any]:
    p = subprocess.Popen(
        [sys.executable, "-c", LLAMA_CLIENT, llama_rpc, model, ",".join(eps), PROMPT, str(tokens)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert p.stdin and p.stdout
    line = p.stdout.readline()
    if not line:
        err = p.stderr.read() if p.stderr else ""
        p.wait()
        return {"error": f"llama.cpp exited with {p.returncode}: {err.strip().splitlines()[-1:]}"}
    tx0 = tx_bytes(lab)
    p.stdin.write("\n")
    p.stdin.flush()
    line = p.stdout.readline()
    tx1 = tx_bytes(lab)
    p.wait()
    if not line:
        return {"error": f"llama.cpp exited with {p.returncode} while decoding (a peer died?)"}
    r = json.loads(line)
    r["wire_bytes_per_token"] = (tx1 - tx0) / tokens
    return r


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="a GGUF (default: Qwen2.5-Coder-1.5B Q4_K_M)")
    ap.add_argument("--peers", default="1,2,3")
    ap.add_argument("--rate", default="1gbit")
    ap.add_argument("--delay-ms", type=float, default=1.0)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--cgroup-share", type=float, default=0.5, help="each peer's cgroup, as a part of its share")
    ap.add_argument(
        "--llama-rpc",
        default=os.environ.get("SUPERGGML_LLAMA_RPC"),
        help="a folder holding llama_cpp built with -DGGML_RPC=ON (pip install --target DIR)",
    )
    ap.add_argument("--work", default="/var/tmp/superggml-peers", help="where the peers' copies go")
    ap.add_argument(
        "--kinds",
        default="superggml,today,llama,superggml_unlimited,llama_unlimited",
        help="which runs (the llama ones need --llama-rpc)",
    )
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    if not netlab.available():
        print("network namespaces are not available here (root and iproute2 needed)", file=sys.stderr)
        return 1
    model = a.model or str(models.qwen_path())
    lay = model_layout(model)
    llama_lib = os.path.join(a.llama_rpc, "llama_cpp", "lib") if a.llama_rpc else None
    results: list[dict[str, Any]] = []
    for n in [int(x) for x in a.peers.split(",")]:
        share = lay.file_bytes // n
        cgroup = int(share * a.cgroup_share)
        mem = cgroup - (96 << 20)  # what the peer advertises: its cgroup less the server process
        kinds = [k for k in a.kinds.split(",") if llama_lib or not k.startswith("llama")]
        for kind in kinds:
            with netlab.Lab(n, rate=a.rate, delay_ms=a.delay_ms) as lab:
                roots = []
                for h in lab.hosts:
                    root = Path(a.work) / f"peer{h.i}"
                    (root / "models").mkdir(parents=True, exist_ok=True)
                    copy = root / "models" / os.path.basename(model)
                    if not copy.exists() or copy.stat().st_size != os.path.getsize(model):
                        shutil.copy(model, copy)
                    memcg.drop_page_cache(str(copy))
                    roots.append(root)
                server = {
                    "superggml": "superggml",
                    "superggml_unlimited": "superggml",
                    "today": "plain",
                    "llama": "llama",
                    "llama_unlimited": "llama",
                }[kind]
                limit = None if kind.endswith("_unlimited") else cgroup
                eps = [
                    start_peer(h, server, r, mem if limit else 0, limit, llama_lib) for h, r in zip(lab.hosts, roots)
                ]
                memcg.drop_page_cache(model)
                tokens = a.tokens if kind != "today" else max(4, a.tokens // 4)
                if kind.startswith("llama"):
                    assert a.llama_rpc
                    r = run_llama(a.llama_rpc, model, eps, tokens, lab)
                else:
                    r = run_superggml(model, eps, tokens, lab, None if limit is None else mem)
            r.update(
                peers=n,
                kind=kind,
                share_mib=share >> 20,
                cgroup_mib=(limit or 0) >> 20,
                rate=a.rate,
                delay_ms=a.delay_ms,
                tokens=tokens,
            )
            results.append(r)
            print(
                json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items() if k != "text"}),
                flush=True,
            )
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
