"""A hybrid model's rejected drafts: passes and bytes streamed per token, plain and speculative.

    python bench/hybrid_rollback.py [--layers 8] [--tokens 32] [--draft-k 3] [--slots 2]

A synthetic qwen35moe (tests/support/synth_gguf.py: Q8_0, SmolLM2's vocabulary) streams its blocks through `slots` pool
slots and decodes `tokens` greedy tokens, plainly and with a draft model of other weights (every draft rejected).
A rejected draft goes back into the check's pass: with the pass's record replayed (runtime/memory/recurrent.py), the
step costs one pass of the model; feeding the kept tokens again would cost two. Prints passes, the weight bytes
streamed per generated token and the replays; the texts must be equal.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "support"))

import synth_gguf  # noqa: E402
from superggml import Model, models  # noqa: E402
from superggml.commands.analyze import model_layout  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--draft-k", type=int, default=3)
    ap.add_argument("--slots", type=int, default=2)
    a = ap.parse_args()
    fields = synth_gguf.vocab_fields(str(models.smollm2_path()))
    shape = dict(synth_gguf.VARIANTS["qwen35moe-8x2-q8_0"], n_layer=a.layers)
    with tempfile.TemporaryDirectory() as d:
        path = synth_gguf.synth(os.path.join(d, "h.gguf"), fields, **shape)
        other = synth_gguf.synth(os.path.join(d, "o.gguf"), fields, **{**shape, "seed": 1})
        budget = a.slots * model_layout(path).slot_bytes
        texts = []
        print(f"qwen35moe, {a.layers} blocks streamed through {a.slots} slots, {a.tokens} greedy tokens")
        for name, kw in (("plain", {}), ("draft", dict(draft_model=other, draft_k=a.draft_k))):
            with Model(path, ctx_size=256, n_threads=2, device_budget=budget, **kw) as m:
                out = m.create_completion("The quick brown fox", max_tokens=a.tokens, temperature=0.0)
                st = m.stats()
            texts.append(out["choices"][0]["text"])
            n = max(1, out["usage"]["completion_tokens"])
            print(
                f"  {name:5s}: {st['passes']} passes, {st['bytes_loaded'] / n / 2**20:.2f} MiB streamed per token, "
                f"{st.get('state_replays', 0)} replays, drafted {st.get('draft_tokens', 0)}, "
                f"kept {st.get('draft_accepted', 0)}"
            )
    print("  texts equal:", texts[0] == texts[1])
    return 0 if texts[0] == texts[1] else 1


if __name__ == "__main__":
    sys.exit(main())
