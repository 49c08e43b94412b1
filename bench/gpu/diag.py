"""Where the host tier goes on a GPU: for each model given, the memory plan (host_cache, host_available), the pool's
host slots and decode ms/token, with the default host_cache and with one as large as the file.

    python3 bench/gpu/diag.py MODEL.gguf [MODEL.gguf ...]
"""

from __future__ import annotations

import json
import os
import sys
import time

from common import device_kw

from superggml import Model, native


def run(path: str, **kw: object) -> None:
    size = os.path.getsize(path)
    t0 = time.perf_counter()
    with Model(path, device_budget=size // 4, ctx_size=512, n_threads=os.cpu_count(), **device_kw(), **kw) as m:
        load = time.perf_counter() - t0
        m.eval(list(range(100, 132)))
        m.reset()
        t0 = time.perf_counter()
        for i in range(8):
            m.eval([100 + i])
        ms = (time.perf_counter() - t0) / 8 * 1000
        st = m.stats()
    keep = ("host_slots", "host_tier_bytes", "n_slots", "layers_pinned", "host_hits", "host_bytes", "bytes_loaded")
    print(
        json.dumps(
            {
                "model": os.path.basename(path),
                "kw": {k: str(v) for k, v in kw.items()},
                "load_s": round(load, 2),
                "decode_ms": round(ms, 1),
                "plan": st.get("budget"),
                **{k: st[k] for k in keep if k in st},
            }
        ),
        flush=True,
    )


def main() -> None:
    print(json.dumps({"host_memory": {k: int(v) for k, v in native.host_memory().items()}}), flush=True)
    for path in sys.argv[1:]:
        for kw in ({}, {"host_cache": os.path.getsize(path)}):
            try:
                run(path, **kw)
            except Exception as e:  # the next one still runs
                print(json.dumps({"model": path, "kw": str(kw), "error": repr(e)}), flush=True)


if __name__ == "__main__":
    main()
