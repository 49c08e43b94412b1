"""Per-pass placement on a device behind a link: a `superggml rpc-server` in a network namespace behind a veth link
shaped to --rate (tests/support/netlab.py), in a memory cgroup of a quarter of the model plus its own needs (as
bench/peers.py holds its peers), the model's device budget a quarter of it. The placements of its streamed blocks:

- copy: every streamed block copied to the device and computed there (placement="device");
- host: every streamed block computed on the host from the file mapping, the activations crossing the link
  (placement="host");
- auto: per pass, by the cost model (placement="auto", the default);
- split: the device holds its quarter and the host the rest, resident (devices=[RPC, CPU], tensor_split 1:3): no
  streaming at all, for reference.

    python bench/placement.py [--rate 1gbit] [--delay-ms 1] [--decode 8] [--prefill 512] [--only copy,host,auto]
    python bench/placement.py --moe qwen3moe [--prefill 64]    # a MoE: its expert cache on the device

With --moe ARCH (a bench/moe_limited.py model: qwen3moe, 2.7 GiB; qwen3moe-small, 0.3 GiB; written once under
/work/tmp), the device holds the dense part and an expert cache of a quarter of the experts (expert_cache), and
the placements are those of an expert the cache lacks: copy (loaded over the link, placement="device"), host
(computed on the host from the file mapping, placement="host") and auto; "blocks" streams whole blocks with
a device budget of a quarter of the model, placed on the host (placement="host"), for reference.

Prints, per placement, the prefill seconds for n tokens and the decode seconds per token (the page cache dropped
before each), and the auto placement's choices. The device here is a process on the same cores as the host, so
computing on it is never faster than on the host: auto can match the better pure placement, not beat it; a GPU
behind PCIe, faster than the host, is where it splits a pass (tests/runtime/test_placement.py has the model's choices).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "support"))
sys.path.insert(0, HERE)

import gguf  # noqa: E402
import memcg  # noqa: E402
import moe_limited  # noqa: E402
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
    ap.add_argument("--decode", type=int, default=8)
    ap.add_argument("--prefill", type=int, default=512)
    ap.add_argument("--only", default=None, help="placements to run (default: all)")
    ap.add_argument("--moe", default=None, help="a bench/moe_limited.py model instead (qwen3moe, qwen3moe-small)")
    a = ap.parse_args()
    if not netlab.available():
        print("network namespaces are not available here (root and iproute2 are needed)")
        return 1
    if a.moe:
        path = moe_limited.model_path(moe_limited.MODELS[a.moe], "/work/tmp")
        experts = sum(int(t.n_bytes) for t in gguf.GGUFReader(path).tensors if "_exps" in t.name)
    else:
        path, experts = a.model or str(models.qwen_path()), 0
    weights = os.path.getsize(path)
    prompt = [int(x) for x in np.random.default_rng(0).integers(100, 30000, a.prefill)]
    cgroup = weights // 4 + (384 << 20)  # the device's quarter, its compute buffers and the server process
    with netlab.Lab(1, rate=a.rate, delay_ms=a.delay_ms) as lab:
        host = lab.hosts[0]
        ep, _ = host.serve(
            50300,
            [sys.executable, "-m", "superggml", "rpc-server", "--host", "{host}", "-p", "{port}", "-t", "2"],
            memory=cgroup,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        netlab.wait_port(host, 50300)
        time.sleep(3)  # the forwarder answers first; the server behind it takes a moment to listen
        dev = f"RPC[{ep}]"
        budget = weights // 4
        placements = {
            "copy": dict(devices=[dev], device_budget=budget, placement="device"),
            "host": dict(devices=[dev], device_budget=budget, placement="host"),
            "auto": dict(devices=[dev], device_budget=budget, placement="auto"),
            "split": dict(devices=[dev, "CPU"], tensor_split=(1, 3)),
        }
        if a.moe:
            cache = dict(devices=[dev], expert_cache=experts // 4)
            placements = {
                "copy": dict(cache, placement="device"),
                "host": dict(cache, placement="host"),
                "auto": dict(cache, placement="auto"),
                "blocks": dict(devices=[dev], device_budget=budget, placement="host"),
            }
        print(
            f"{os.path.basename(path)}: {weights / 2**20:.0f} MiB; link {a.rate}, {a.delay_ms} ms each way; "
            f"server cgroup {cgroup >> 20} MiB, device budget {budget >> 20} MiB"
        )
        print(f"{'placement':<10} {'prefill s':>9} {'decode s/token':>14}")
        for name in a.only.split(",") if a.only else placements:
            memcg.drop_page_cache(path)
            with Model(path, ctx_size=a.prefill + a.decode + 16, n_batch=a.prefill, **placements[name]) as m:
                prefill, decode = timed(m, prompt, a.decode)
                placer = m.runtime.placer
                table = placer.lines() if placer is not None and name == "auto" else []
                st = m.stats()
                if "expert_hits" in st:
                    table.append(
                        f"experts: {st['expert_hits']} hits, {st['expert_misses']} loaded on use, "
                        f"{st['expert_prefetches']} loaded ahead, {st['expert_host_misses']} on the host"
                    )
            print(f"{name:<10} {prefill:9.2f} {decode:14.3f}", flush=True)
            for line in table:
                print("    " + line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
