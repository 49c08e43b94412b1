"""gemma3 family, text models (llama.cpp's src/models/gemma3.cpp): the gemma2 block without the attention
soft cap, with RMS norms of every head of Q and K before RoPE. With attention.sliding_window set, five of
every six layers slide (attention.sliding_window_pattern overrides) and use their own RoPE base
(rope.freq_base_swa, 10000 when absent) with no scaling, while global layers use rope.freq_base and the
file's RoPE scaling. The final soft cap applies only when the file sets one.

Gemma 3's vision tower ships in a separate mmproj GGUF; a file that carries vision tensors is refused."""

from __future__ import annotations

from typing import Any, Callable, Mapping

from ..errors import UnsupportedModelError
from .gemma2 import Gemma2Arch

VISION_PREFIXES = ("v.", "mm.", "vision_tower.", "multi_modal_projector.")


class Gemma3Arch(Gemma2Arch):
    swa_period = 6
    big_layers = 62
    qk_norm = True

    def load_hparams(self, meta: Mapping[str, Any]) -> None:
        self.n_swa = int(self.key(meta, "attention.sliding_window", 0))
        if self.n_swa > 0:
            self.set_swa_pattern(meta, self.swa_period)
            self.rope_base_swa = float(self.key(meta, "rope.freq_base_swa", 10000.0))
            self.rope_scale_swa = 1.0
        self.final_softcap = float(self.key(meta, "final_logit_softcapping", 0.0))
        self.q_scale = self.query_scale()

    def output_tensor(self, has: Callable[[str], bool]) -> str:
        return "output.weight" if has("output.weight") else "token_embd.weight"

    def validate(self, table: Mapping[str, tuple[int, ...]]) -> None:
        vision = next((n for n in table if n.startswith(VISION_PREFIXES)), None)
        if vision is not None:
            raise UnsupportedModelError(
                f"this gemma3 GGUF carries a vision tower ('{vision}'): only text models are supported"
            )
        super().validate(table)
