"""Backends: how the gateway reaches one deployment of a model (see `base.py` for the contract).

    local           `LocalBackend`: our engine in-process (`local.py`, `EnginePool`)
    litellm         `LiteLLMBackend`: any provider LiteLLM supports (`litellm_backend.py`)
    openai          `OpenAICompatBackend`: OpenAI-compatible servers over aiohttp (`openai_compat.py`, `openai_http.py`)

Only `base` is imported here; `make_backend` imports a backend's module when it is first needed.
"""

from link.backends.base import (
    Backend,
    BackendError,
    BackendTimeout,
    BackendUnavailable,
    Endpoint,
    backend_class,
    make_backend,
    register_backend,
)

__all__ = ["Backend", "BackendError", "BackendTimeout", "BackendUnavailable", "Endpoint", "backend_class", "make_backend",
           "register_backend"]
