"""`superggml plot`: a timeline picture of a metrics file (matplotlib).

Top: per-layer load (worker thread) against wait and compute (executor) for
a few tokens, as a Gantt chart. Middle: memory in use and memory pressure
over time, with the scheduler's demotions and promotions marked. Bottom:
tokens per second over time.
"""

from __future__ import annotations

import json
import os
from datetime import datetime
from typing import Any

from ..errors import require_extra


def _ts(s: str) -> float:
    return datetime.strptime(s.replace("Z", "+0000"), "%Y-%m-%dT%H:%M:%S.%f%z").timestamp()


def read_metrics(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The objects of a metrics file (compact lines or --metrics-pretty output)."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    dec, out, i = json.JSONDecoder(), [], 0
    while i < len(text):
        if text[i].isspace():
            i += 1
            continue
        obj, i = dec.raw_decode(text, i)
        out.append(obj)
    return out


def plot_metrics(
    path: str | os.PathLike[str], out: str | os.PathLike[str], *, tokens: int = 3, title: str | None = None
) -> str:
    """Renders the timeline PNG of a metrics file to `out`; returns its path. Raises ValueError
    when the file has no metrics lines."""
    require_extra("plot", "superggml plot")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    lines = read_metrics(path)
    snaps = [x for x in lines if "event" not in x]
    layers = [x for x in lines if x.get("event") == "layer"]
    moves = [x for x in lines if x.get("event") in ("layer_demote", "layer_promote")]
    if not snaps and not layers:
        raise ValueError(f"{path}: no metrics lines")
    t0 = min([_ts(x["timestamp"]) for x in snaps] + [x["t_start"] for x in layers])

    fig, (ax1, ax2, ax3) = plt.subplots(3, 1, figsize=(11, 10), gridspec_kw={"height_ratios": [3, 1.3, 1.1]})
    fig.suptitle(title or f"superggml timeline: {os.path.basename(os.fspath(path))}", fontsize=13)

    _draw_passes(ax1, layers, tokens, Patch)
    if snaps:
        _draw_memory(ax2, ax3, snaps, moves, t0)
    fig.tight_layout()
    out = os.fspath(out)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def _draw_passes(ax1: Any, layers: list[dict[str, Any]], tokens: int, Patch: Any) -> None:
    """A Gantt chart of the last `tokens` forward passes: each graph's load, wait and compute."""
    toks = sorted({x["token"] for x in layers})[-tokens:]
    sel = [x for x in layers if x["token"] in toks]
    if sel:
        w0 = min(min(x["t_start"], x.get("load_start", x["t_start"])) for x in sel)
        colors = {"load": "#f4a261", "wait": "#e76f51", "block": "#2a9d8f", "embed": "#8ab17d", "head": "#264653"}
        for x in sel:
            y = x["layer"]
            if "load_start" in x:
                ax1.broken_barh(
                    [((x["load_start"] - w0) * 1e3, max(x["load_ms"], 0.05))], (y - 0.45, 0.4), color=colors["load"]
                )
            if x["wait_ms"] > 0.01:
                ax1.broken_barh([((x["t_start"] - w0) * 1e3, x["wait_ms"])], (y + 0.05, 0.4), color=colors["wait"])
            c0 = (x["t_end"] - w0) * 1e3 - x["compute_ms"]
            ax1.broken_barh([(c0, max(x["compute_ms"], 0.05))], (y + 0.05, 0.4), color=colors[x["kind"]])
        for t in toks[1:]:
            start = min(x["t_start"] for x in sel if x["token"] == t)
            ax1.axvline((start - w0) * 1e3, color="#999", lw=0.8, ls="--")
        ax1.set_ylabel("graph (embed, blocks, head)")
        ax1.set_xlabel("ms")
        ax1.invert_yaxis()
        ax1.legend(
            handles=[
                Patch(color=colors["load"], label="load (prefetch thread)"),
                Patch(color=colors["wait"], label="wait for bytes"),
                Patch(color=colors["block"], label="compute (block)"),
                Patch(color=colors["head"], label="compute (head)"),
            ],
            loc="lower right",
            fontsize=8,
        )
        ax1.set_title(f"per-layer load vs compute, tokens {toks[0]}-{toks[-1]}", fontsize=10)
    else:
        ax1.text(0.5, 0.5, "no per-layer timings in this file", ha="center", transform=ax1.transAxes)


def _draw_memory(ax2: Any, ax3: Any, snaps: list[dict[str, Any]], moves: list[dict[str, Any]], t0: float) -> None:
    """Memory used and pressure over time, the scheduler's moves, and tokens/s."""
    ts = [_ts(x["timestamp"]) - t0 for x in snaps]
    ax2.plot(ts, [x["ram_used_mb"] for x in snaps], color="#264653", label="host used (MiB)")
    if any(x["vram_total_mb"] and x["vram_used_mb"] != x["ram_used_mb"] for x in snaps):
        ax2.plot(ts, [x["vram_used_mb"] for x in snaps], color="#2a9d8f", label="device used (MiB)")
    ax2.set_ylim(0, 1.15 * max(max(x["ram_used_mb"], x["vram_used_mb"]) for x in snaps))
    ax2.set_ylabel("MiB")
    axp = ax2.twinx()
    axp.plot(ts, [x["cpu_memory_pressure"] for x in snaps], color="#e76f51", ls="--", label="pressure")
    axp.set_ylim(0, 1)
    axp.set_ylabel("pressure")
    for mv in moves:
        ax2.axvline(
            _ts(mv["timestamp"]) - t0,
            color="#e9c46a" if mv["event"] == "layer_promote" else "#d62828",
            lw=0.8,
            alpha=0.7,
        )
    ax2.legend(loc="upper left", fontsize=8)
    ax2.set_title("memory (lines: scheduler demotions red, promotions yellow)", fontsize=10)

    ax3.plot(ts, [x["tokens_per_sec"] for x in snaps], color="#8ab17d", marker=".", label="tokens/s")
    ax3.plot(ts, [x["avg_tokens_per_sec"] for x in snaps], color="#264653", label="average")
    ax3.set_xlabel("seconds")
    ax3.set_ylabel("tokens/s")
    ax3.legend(loc="lower right", fontsize=8)
