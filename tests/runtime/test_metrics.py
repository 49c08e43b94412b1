"""JSON-lines metrics: every line validates against the shipped schema; counters agree with the pager's and cache's."""

from __future__ import annotations

import io
import json
import threading

import pytest

from superggml import Model
from superggml.metrics import MetricsWriter
from superggml.commands.plot import read_metrics

from metrics_lines import valid_lines
from cli_runner import run_cli


class FakeMemory:
    def __init__(self, m: Model):
        self.high = False

    def __call__(self) -> tuple[int, int]:
        return (950 if self.high else 100) << 20, 1000 << 20


def test_metrics_lines_validate_and_agree_with_the_counters(smollm2_path, tmp_path):
    path = tmp_path / "m.jsonl"
    with Model(
        smollm2_path,
        ctx_size=256,
        n_threads=2,
        device_budget="24MiB",
        async_prefetch=True,
        dynamic_layers=True,
        paged_kv=True,
        kv_page_size=16,
        kv_device_layers=8,
        host_budget="256KiB",
        kv_spill_dir=tmp_path,
        metrics_file=path,
    ) as m:
        mem = m.scheduler.memory = FakeMemory(m)
        toks = m.tokenize("The quick brown fox")
        m.eval(toks)
        t = 100
        for i in range(12):
            mem.high = 4 <= i < 7  # pressure for a few tokens: moves to log
            m.eval([t + i])
        final = m.stats()
    lines = valid_lines(path)
    snaps = [x for x in lines if "event" not in x]
    layers = [x for x in lines if x.get("event") == "layer"]
    moves = [x for x in lines if x.get("event") in ("layer_demote", "layer_promote")]
    assert len(snaps) == 12 and [s["generated_tokens"] for s in snaps] == list(range(1, 13))
    last = snaps[-1]
    assert last["prompt_tokens"] == len(toks)
    assert last["layers_loaded"] == final["loads"] and last["layers_evicted"] == final["evictions"]
    assert last["layers_demoted"] == final["layers_demoted"] > 0
    assert last["layers_promoted"] == final["layers_promoted"] > 0
    assert last["kv_pages_cpu"] == final["kv_pages_host"] and last["kv_pages_disk"] == final["kv_pages_disk"]
    assert last["kv_pages_evicted"] == final["kv_pages_evicted"] > 0
    assert last["kv_pages_prefetched"] == final["kv_pages_prefetched"]
    assert last["prefetch_failed"] == 0 and last["avg_tokens_per_sec"] > 0
    assert len(moves) == final["layers_demoted"] + final["layers_promoted"]
    counted = {}
    for x in lines:
        if "count" in x:
            counted[x["event"]] = counted.get(x["event"], 0) + x["count"]
    assert counted["layer_load"] == final["loads"] and counted["layer_evict"] == final["evictions"]
    assert counted["kv_page_spill"] == final["kv_pages_spilled"]
    assert counted["kv_page_writeback"] == final["kv_pages_written_back"]
    blocks = [x for x in layers if x["kind"] == "block" and x["token"] == 5]
    assert len(blocks) == 30 and all(b["compute_ms"] > 0 for b in blocks)
    assert any(b["load_ms"] > 0 for b in blocks)  # streamed blocks show their load


def test_interval_pretty_and_stderr(smollm2_path, capsys, tmp_path):
    with Model(smollm2_path, ctx_size=128, n_threads=2, metrics=True, metrics_pretty=True, metrics_interval=3) as m:
        m.eval([1, 2, 3])
        for t in range(6):
            m.eval([10 + t])
    err = capsys.readouterr().err
    path = tmp_path / "err.jsonl"
    path.write_text(err)
    objs = read_metrics(path)
    snaps = [o for o in objs if "event" not in o]
    assert [s["generated_tokens"] for s in snaps] == [3, 6]
    assert "\n  \"token\"" in err  # indented


def test_writer_never_interleaves_lines():
    buf = io.StringIO()
    w = MetricsWriter(buf)
    ths = [
        threading.Thread(target=lambda k=k: [w.emit({"t": k, "i": i, "pad": "x" * 200}) for i in range(500)])
        for k in range(4)
    ]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    w.close()
    lines = buf.getvalue().splitlines()
    assert len(lines) == 2000 and all(json.loads(x)["pad"] == "x" * 200 for x in lines)


def test_cli_metrics_file(smollm2_path, tmp_path, capsys):
    path = tmp_path / "cli.jsonl"
    run_cli(
        capsys,
        "generate",
        "-m",
        smollm2_path,
        "-p",
        "Hello",
        "-n",
        "5",
        "--temp",
        "0",
        "-c",
        "128",
        "--metrics-file",
        str(path),
    )
    lines = valid_lines(path)
    assert max(x["generated_tokens"] for x in lines if "event" not in x) >= 4


def test_bad_interval(smollm2_path):
    with pytest.raises(ValueError, match="metrics_interval"):
        Model(smollm2_path, metrics=True, metrics_interval=0)


def test_plot_renders_a_timeline_png(smollm2_path, tmp_path, capsys):
    import numpy as np
    from PIL import Image

    path = tmp_path / "run.jsonl"
    with Model(
        smollm2_path, ctx_size=128, n_threads=2, device_budget="12MiB", async_prefetch=True, metrics_file=path
    ) as m:
        m.create_completion("Once upon a time", max_tokens=8, temperature=0)
    png = tmp_path / "timeline.png"
    run_cli(capsys, "plot", str(path), "-o", str(png))
    img = np.asarray(Image.open(png).convert("L"))
    assert img.shape[0] > 500 and img.shape[1] > 800
    assert img.std() > 10 and (img < 128).mean() > 0.01  # drawn, not blank
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    run_cli(capsys, "plot", str(empty), "-o", str(tmp_path / "x.png"), rc=1)
