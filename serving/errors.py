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


class SamplingTimeoutError(ServingError):
    """Choosing one token of a request took longer than the engine allows (`EngineConfig.sample_timeout_s`):
    the engine stops that request, and the others in the step go on. `param` names the request field behind
    the work (`response_format`, `tools`), or None.

    Raised inside guided decoding as the deadline passes (`serving.guided.automaton.JsonAutomaton.feed`), then by
    the engine with the message the client gets (`serving.engine.sample_budget.choose_token`).
    """

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param
