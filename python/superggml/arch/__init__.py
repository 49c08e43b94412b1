"""Per-layer graphs of the supported model families.

An architecture sees ggml tensors and hyperparameters only: where a weight's
bytes live (mmap, resident buffer, pool slot) is not its business.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from ..errors import UnsupportedModelError
from .common import Architecture, HParams
from .bailingmoe3 import BailingMoe3Arch
from .deepseek2 import Deepseek2Arch
from .dots3note import Dots3NoteArch
from .deepseek32 import Deepseek32Arch, GlmDsaArch
from .deepseek4 import Deepseek4Arch
from .deepseek4_mtp import Deepseek4Mtp
from .ernie4_5_moe import Ernie45MoeArch
from .kimi_k3 import KimiK3Arch
from .kimi_linear import KimiLinearArch
from .llama import LlamaArch
from .mtp import MtpArch
from .lfm2 import Lfm2Arch
from .llama4 import Llama4Arch
from .minimax_m2 import MiniMaxM2Arch
from .mimo2 import Mimo2Arch
from .minimax_m3 import MiniMaxM3Arch
from .mistral3 import Mistral3Arch
from .mistral4 import Mistral4Arch
from .nemotron_h import NemotronHArch
from .qwen2 import Qwen2Arch
from .gemma2 import Gemma2Arch
from .gemma3 import Gemma3Arch
from .gemma4 import Gemma4Arch
from .glm5_next import Glm5NextArch
from .glm4moe import Glm4MoeArch
from .gpt_oss import GptOssArch
from .granitehybrid import GraniteHybridArch
from .hy_v3 import HyV3Arch
from .hy_v4 import HyV4Arch
from .olmoe import OlmoeArch
from .phi3 import Phi3Arch
from .qwen2moe import Qwen2MoeArch
from .qwen3 import Qwen3Arch
from .qwen3moe import Qwen3MoeArch
from .qwen35 import Qwen35Arch
from .qwen35moe import Qwen35MoeArch
from .qwen3next import Qwen3NextArch
from .qwen4exp import Qwen4ExpArch
from .seed_oss import SeedOssArch
from .smollm3 import SmolLM3Arch
from .step35 import Step35Arch

ARCHITECTURES: dict[str, type[Architecture]] = {
    "llama": LlamaArch,
    "qwen2": Qwen2Arch,
    "qwen3": Qwen3Arch,
    "phi3": Phi3Arch,
    "gemma2": Gemma2Arch,
    "gemma3": Gemma3Arch,
    "gemma4": Gemma4Arch,
    "qwen2moe": Qwen2MoeArch,
    "qwen3moe": Qwen3MoeArch,
    "olmoe": OlmoeArch,
    "gpt-oss": GptOssArch,
    "deepseek2": Deepseek2Arch,
    "deepseek32": Deepseek32Arch,
    "glm-dsa": GlmDsaArch,
    "deepseek4": Deepseek4Arch,
    "glm4moe": Glm4MoeArch,
    "qwen35": Qwen35Arch,
    "qwen35moe": Qwen35MoeArch,
    "qwen3next": Qwen3NextArch,
    "qwen4exp": Qwen4ExpArch,
    "smollm3": SmolLM3Arch,
    "seed_oss": SeedOssArch,
    "mistral3": Mistral3Arch,
    "ernie4_5-moe": Ernie45MoeArch,
    "minimax-m2": MiniMaxM2Arch,
    "minimax-m3": MiniMaxM3Arch,
    "mimo2": Mimo2Arch,
    "hy_v3": HyV3Arch,
    "hy_v4": HyV4Arch,
    "bailingmoe3": BailingMoe3Arch,
    "dots3note": Dots3NoteArch,
    "llama4": Llama4Arch,
    "mistral4": Mistral4Arch,
    "lfm2": Lfm2Arch,
    "granitehybrid": GraniteHybridArch,
    "nemotron_h": NemotronHArch,
    "nemotron_h_moe": NemotronHArch,
    "step35": Step35Arch,
    "kimi-k3": KimiK3Arch,
    "kimi-linear": KimiLinearArch,
    "glm5-next": Glm5NextArch,
}


def get_architecture(meta: Mapping[str, Any], names: Iterable[str] = ()) -> Architecture:
    """The architecture named in the GGUF metadata (names: its tensors, where the family has optional ones);
    UnsupportedModelError if unknown."""
    name = meta.get("general.architecture")
    if not isinstance(name, str) or name not in ARCHITECTURES:
        raise UnsupportedModelError(
            f"unsupported model architecture {name!r}; supported: {', '.join(sorted(ARCHITECTURES))}"
        )
    cls = ARCHITECTURES[name]
    own = getattr(cls, "read_hparams", None)  # a family whose common keys differ reads them its own way
    hp = own(meta, name) if own else HParams.from_metadata(meta, name, cls.rms_eps_keys, cls.kv_heads_per_layer)
    return cls(hp, meta, names)


def mtp_arch(base: Architecture) -> MtpArch:
    """`base`'s MTP block as a model of one block (UnsupportedModelError where superggml does not draft with it)."""
    return Deepseek4Mtp(base) if isinstance(base, Deepseek4Arch) else MtpArch(base)


__all__ = ["ARCHITECTURES", "Architecture", "HParams", "get_architecture", "mtp_arch"]
