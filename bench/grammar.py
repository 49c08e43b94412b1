"""The per-token cost of constrained decoding (llguidance masks) against free decoding, Qwen2.5-Coder-1.5B
resident (or --model), in one run.

    python bench/grammar.py [--model PATH] [--tokens 96] [--repeat 3] [--json PATH]

For each constraint (a JSON schema with nested objects, enums and arrays; JSON mode; a regex) the same prompt is
decoded greedily with the constraint until it completes (at most --tokens), then without one for as many tokens.
Timed: decoding after the prompt's pass. Reports ms/token both ways, the overhead, and the mask's own share
(computing the allowed tokens, masking the logits, advancing the matcher), each the median of --repeat runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "support"))

from superggml import Model, models  # noqa: E402
from superggml.generation.grammar import Grammar, Matcher  # noqa: E402

SCHEMA = {
    "type": "object",
    "properties": {
        "users": {
            "type": "array",
            "maxItems": 4,
            "items": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "maxLength": 24},
                    "role": {"enum": ["admin", "editor", "viewer"]},
                    "age": {"type": "integer"},
                    "address": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
                },
                "required": ["name", "role", "age", "address"],
            },
        },
    },
    "required": ["users"],
}
CASES = [
    (
        "json_schema",
        Grammar.from_json_schema(SCHEMA),
        "<|im_start|>user\nList four users of a web site as JSON.<|im_end|>\n<|im_start|>assistant\n",
    ),
    (
        "json_object",
        Grammar.json_object(),
        "<|im_start|>user\nDescribe the solar system's planets as a JSON object.<|im_end|>\n<|im_start|>assistant\n",
    ),
    (
        "regex",
        Grammar.from_regex(r"([A-Z][a-z]+ ){1,40}[A-Z][a-z]+\."),
        "<|im_start|>user\nWrite a long title.<|im_end|>\n<|im_start|>assistant\n",
    ),
]


class MaskClock:
    """Time spent in the constraint (Matcher.mask and Matcher.consume)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        Matcher.mask = self._timed(Matcher.mask)  # type: ignore[method-assign]
        Matcher.consume = self._timed(Matcher.consume)  # type: ignore[method-assign]

    def _timed(self, fn):  # type: ignore[no-untyped-def]
        def run(*args):  # type: ignore[no-untyped-def]
            t = time.perf_counter()
            try:
                return fn(*args)
            finally:
                self.seconds += time.perf_counter() - t

        return run


def decode(m: Model, toks: list[int], n: int, grammar: Grammar | None, clock: MaskClock) -> tuple[int, float, float]:
    """Greedy tokens after the prompt (the constraint's until it completes, at most n); (count, seconds, seconds
    in the constraint), the prompt's pass not timed."""
    m.reset()
    gen = m.generate(toks, temp=0, grammar=grammar)
    tok = next(gen)
    clock.seconds = 0.0
    count = 0
    t = time.perf_counter()
    while count < n and not m.tokenizer.is_eog(tok):
        tok = next(gen)
        count += 1
    dt = time.perf_counter() - t
    gen.close()
    return count, dt, clock.seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="a GGUF (default: Qwen2.5-Coder-1.5B Q4_K_M)")
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default=None, help="write the rows here")
    a = ap.parse_args()
    path = a.model or str(models.qwen_path())
    clock = MaskClock()
    rows = []
    with Model(path, ctx_size=1024, n_threads=a.threads) as m:
        m.grammar_vocab  # built once, not timed
        print(f"{os.path.basename(path)}, resident, {a.threads} threads, greedy")
        print("| constraint | tokens | free ms/token | constrained ms/token | overhead | mask ms/token |")
        print("|---|---|---|---|---|---|")
        for name, grammar, prompt in CASES:
            toks = m.tokenize(prompt, special=True)
            free, con, mask = [], [], []
            count = 0
            for _ in range(a.repeat):
                count, dt, ms = decode(m, toks, a.tokens, grammar, clock)
                con.append(dt / count)
                mask.append(ms / count)
                _, dt, _ = decode(m, toks, count, None, clock)
                free.append(dt / count)
            f, c, k = (statistics.median(x) * 1e3 for x in (free, con, mask))
            rows.append(dict(constraint=name, tokens=count, free_ms=f, constrained_ms=c, overhead=c / f - 1, mask_ms=k))
            print(f"| {name} | {count} | {f:.1f} | {c:.1f} | {100 * (c / f - 1):+.1f}% | {k:.2f} |", flush=True)
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    main()
