"""Model architectures, by the name GGUF and `ModelConfig` use."""

from __future__ import annotations

from serving.config import ModelConfig
from serving.errors import UnsupportedArchitectureError
from serving.models.base import CausalLM


def model_class(architecture: str) -> type[CausalLM]:
    """The `CausalLM` subclass implementing `architecture` ("llama", "qwen2" or "gemma3").

    Qwen2 is Llama with q/k/v biases (`ModelConfig.qkv_bias`), so one class runs both.
    """
    if architecture in ("llama", "qwen2"):
        from serving.models.llama import LlamaForCausalLM

        return LlamaForCausalLM
    if architecture == "gemma3":
        from serving.models.gemma3 import Gemma3ForCausalLM

        return Gemma3ForCausalLM
    raise UnsupportedArchitectureError(f"no implementation for architecture {architecture!r}; supported: llama, qwen2, gemma3")


def build_model(cfg: ModelConfig, dtype) -> CausalLM:
    """An uninitialised model of `cfg`'s architecture, its parameters in `dtype`, in eval mode."""
    return model_class(cfg.architecture)(cfg).to(dtype).eval()
