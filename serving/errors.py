"""Errors the serving layer raises, each naming what the caller should fix.

All derive from `ServingError` (a `ValueError`), so the gateway can map them to OpenAI-style 4xx
error objects without catching unrelated bugs.
"""


class ServingError(ValueError):
    """Base class: bad input to the serving layer (never an internal bug)."""


class UnknownModelError(ServingError):
    """A model name that is not in the registry."""


class ModelFileError(ServingError):
    """A model file that is missing, truncated or not a valid GGUF/safetensors checkpoint."""


class UnsupportedTensorTypeError(ServingError):
    """A GGUF tensor stored in a quantization type we cannot dequantize."""


class UnsupportedArchitectureError(ServingError):
    """A checkpoint whose architecture has no implementation in `serving.models`."""


class ContextLengthError(ServingError):
    """A prompt (plus the tokens to generate) longer than the model's context window."""


class InvalidSamplingParamsError(ServingError):
    """A `SamplingParams` field out of its valid range."""
