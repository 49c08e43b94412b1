"""pytest-benchmark suite: superggml prefill/decode, and the ratio to llama.cpp in the same run.

python -m pytest bench -p no:cacheprovider --benchmark-columns=mean,stddev,rounds
"""

from __future__ import annotations

import numpy as np
import pytest

from compare import PROMPT, bench_llama, bench_superggml
from superggml import Model

THREADS = 2
N_PROMPT = 128
N_DECODE = 32


@pytest.fixture(scope="module")
def loaded(bench_model):
    name, path = bench_model
    m = Model(path, ctx_size=1024, n_threads=THREADS)
    toks = m.tokenize(PROMPT)[:N_PROMPT]
    m.eval(toks[:8])
    yield name, path, m, toks
    m.close()


def test_prefill(benchmark, loaded):
    name, _, m, toks = loaded

    def run():
        m.reset()
        m.eval(toks)

    benchmark.pedantic(run, rounds=3, warmup_rounds=1)
    benchmark.extra_info["tokens_per_s"] = len(toks) / benchmark.stats["min"]


def test_decode(benchmark, loaded):
    name, _, m, toks = loaded
    m.reset()
    tok = int(np.argmax(m.eval(toks)[-1]))

    def run():
        m.truncate(len(toks))
        for _ in range(N_DECODE):
            m.eval([tok])

    benchmark.pedantic(run, rounds=3, warmup_rounds=1)
    benchmark.extra_info["tokens_per_s"] = N_DECODE / benchmark.stats["min"]


def test_ratio_to_llama_cpp(bench_model, record_property):
    name, path = bench_model
    with Model(path, ctx_size=64) as m:
        toks = m.tokenize(PROMPT)[:N_PROMPT]
    sp, sd = (float(np.median(x)) for x in bench_superggml(path, toks, N_DECODE, THREADS, 5))
    lp, ld = (float(np.median(x)) for x in bench_llama(path, toks, N_DECODE, THREADS, 5))
    record_property("prefill_ratio", sp / lp)
    record_property("decode_ratio", sd / ld)
    print(
        f"\n{name}: prefill {sp:.1f} vs {lp:.1f} tok/s (x{sp / lp:.2f}); "
        f"decode {sd:.1f} vs {ld:.1f} tok/s (x{sd / ld:.2f})"
    )
    # the same kernels: anything below 0.9 is a regression of superggml's own overhead, not noise
    assert sp / lp >= 0.9 and sd / ld >= 0.9
