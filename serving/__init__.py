"""The inference engine for local models.

Loading (GGUF through the `gguf` package, Hugging Face safetensors), model architectures written in
PyTorch (`serving.models`: Llama, Gemma 3), tokenizer and chat formatting, sampling, and generation
with vLLM's interface (`LLM`, `SamplingParams`). Heavy modules load lazily: `import serving` is cheap.
"""

from serving.errors import (
    ContextLengthError,
    InvalidSamplingParamsError,
    ModelFileError,
    ServingError,
    UnknownModelError,
    UnsupportedArchitectureError,
    UnsupportedTensorTypeError,
)
from serving.sampling.params import SamplingParams

__all__ = [
    "LLM", "SamplingParams", "RequestOutput", "CompletionOutput", "ModelRegistry", "ModelSpec", "default_registry",
    "ServingError", "UnknownModelError", "ModelFileError", "UnsupportedTensorTypeError",
    "UnsupportedArchitectureError", "ContextLengthError", "InvalidSamplingParamsError",
]


def __getattr__(name: str):
    if name == "LLM":
        from serving.llm import LLM

        return LLM
    if name in ("RequestOutput", "CompletionOutput"):
        from serving.engine import outputs

        return getattr(outputs, name)
    if name in ("ModelRegistry", "ModelSpec", "default_registry"):
        from serving import registry

        return getattr(registry, name)
    raise AttributeError(f"module 'serving' has no attribute {name!r}")
