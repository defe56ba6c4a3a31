"""`EngineState`: one served engine as the OpenAI frontend sees it (its name, model, engine and metrics).

The engine's HTTP server (`serving/api/server.py`) builds one in its lifespan; the gateway's local backend
(`link/backends/local.py`) one per local model. `responses.py` reads the model's tokenizer from it and records
each finished request in its metrics.
"""

from __future__ import annotations

import time

from serving.engine.async_engine import AsyncLLMEngine
from serving.frontend.metrics import EngineMetrics
from serving.model_loader import LoadedModel


class EngineState:
    """What the routes need, created in the lifespan."""

    def __init__(self, name: str, loaded: LoadedModel, engine: AsyncLLMEngine):
        self.name, self.loaded, self.engine = name, loaded, engine
        self.metrics = EngineMetrics()
        self.created = int(time.time())
        self.auto_tuner = None  # kernels.background.AutoTuner while background kernel tuning runs
