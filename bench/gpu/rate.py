"""The pinned host-to-device copy rate, the streamed bound's divisor: superggml's transfer_rate
(runtime/plan/devices.py), torch's pinned copy on CUDA, else (no GPU) numpy's memcpy. Its own
process (torch brings a CUDA runtime of its own).

    python3 bench/gpu/rate.py OUT.json
"""

import json
import sys
import time

import numpy as np

N = 512 << 20
out = {}
try:
    from superggml import native
    from superggml.runtime.plan.devices import transfer_rate

    dev = next((d["name"] for d in native.devices() if d["name"] == "CUDA0"), native.devices()[0]["name"])
    out["superggml"] = float(transfer_rate(dev))
except Exception as e:
    out["superggml_error"] = f"{type(e).__name__}: {e}"
try:
    import torch

    if torch.cuda.is_available():
        src = torch.empty(N, dtype=torch.uint8).pin_memory()
        dst = torch.empty(N, dtype=torch.uint8, device="cuda")
        times = []
        for _ in range(6):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            dst.copy_(src, non_blocking=True)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        out["torch_pinned"] = N / float(np.median(times[1:]))
except Exception as e:
    out["torch_error"] = f"{type(e).__name__}: {e}"
if "torch_pinned" not in out and "superggml" not in out:
    a, b = np.ones(N, np.uint8), np.empty(N, np.uint8)
    times = []
    for _ in range(4):
        t0 = time.perf_counter()
        np.copyto(b, a)
        times.append(time.perf_counter() - t0)
    out["numpy_memcpy"] = N / float(np.median(times[1:]))
out["used"] = next(k for k in ("superggml", "torch_pinned", "numpy_memcpy") if k in out)
out["bytes_per_s"] = out[out["used"]]
with open(sys.argv[1], "w") as f:
    json.dump(out, f, indent=1)
print(json.dumps(out))
