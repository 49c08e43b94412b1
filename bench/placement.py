"""The two pure placements of issue 49 on a device behind a link: a `superggml rpc-server` in a network namespace
behind a veth link shaped to --rate (tests/netlab.py), its device budget a quarter of the model.

- copy: every streamed block is copied to the device and computed there (devices=[RPC], device_budget=1/4);
- host: the device holds its quarter of the blocks, and the host computes the rest where their bytes are
  (devices=[RPC, CPU], tensor_split 1:3), the activations crossing the link.

    python bench/placement.py [--rate 1gbit] [--delay-ms 1] [--decode 4] [--prefill 512]

Prints decode seconds per token and prefill seconds for n tokens, per placement. The per-pass choice between them
(the issue's automatic placement) is not built: this measures the trade-off it would settle. The device here is a
process on the same cores as the host, so computing on it is never faster; a GPU behind PCIe would be.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

import netlab  # noqa: E402

from superggml import Model, models  # noqa: E402


def timed(m: Model, prompt: list[int], decode: int) -> tuple[float, float]:
    """(prefill seconds of `prompt`, decode seconds per token over `decode` teacher-forced tokens)."""
    t = time.perf_counter()
    m.eval(prompt)
    prefill = time.perf_counter() - t
    t = time.perf_counter()
    for tok in prompt[:decode]:
        m.eval([tok])
    return prefill, (time.perf_counter() - t) / max(decode, 1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="a GGUF (default: Qwen2.5-Coder-1.5B Q4_K_M)")
    ap.add_argument("--rate", default="1gbit")
    ap.add_argument("--delay-ms", type=float, default=1.0)
    ap.add_argument("--decode", type=int, default=4)
    ap.add_argument("--prefill", type=int, default=512)
    a = ap.parse_args()
    if not netlab.available():
        print("network namespaces are not available here (root and iproute2 are needed)")
        return 1
    path = a.model or str(models.qwen_path())
    weights = os.path.getsize(path)
    prompt = [int(x) for x in np.random.default_rng(0).integers(100, 30000, a.prefill)]
    with netlab.Lab(1, rate=a.rate, delay_ms=a.delay_ms) as lab:
        host = lab.hosts[0]
        ep, _ = host.serve(
            50300,
            [sys.executable, "-m", "superggml", "rpc-server", "--host", "{host}", "-p", "{port}", "-t", "2"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        netlab.wait_port(host, 50300)
        time.sleep(3)  # the forwarder answers first; the server behind it takes a moment to listen
        dev = f"RPC[{ep}]"
        placements = {
            "copy": dict(devices=[dev], device_budget=weights // 4),
            "host": dict(devices=[dev, "CPU"], tensor_split=(1, 3)),
        }
        print(f"{os.path.basename(path)}: {weights / 2**20:.0f} MiB; link {a.rate}, {a.delay_ms} ms each way")
        print(f"{'placement':<10} {'prefill s':>9} {'decode s/token':>14}")
        for name, options in placements.items():
            with Model(path, ctx_size=a.prefill + a.decode + 16, n_batch=a.prefill, **options) as m:
                prefill, decode = timed(m, prompt, a.decode)
            print(f"{name:<10} {prefill:9.2f} {decode:14.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
