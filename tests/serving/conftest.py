"""Fixtures of the engine server tests: a real uvicorn server on loopback (one per test module) and an
official `openai` client for it, over the session's SmolLM2.

The server's engine runs with `tuned_kernels=False`, which also leaves background kernel tuning off: the
kernels the session's first engine installed stay in effect (the dispatch table is process-wide), no tuner
times variants beside the tests' requests, and none writes winners into $LINK_HOME that every later engine of
the run would warm up again. Background tuning has tests of its own (tests/serving/api/test_auto_tune_serve.py).
"""

from __future__ import annotations

import openai
import pytest

from serving.api.server import create_engine_app
from serving.engine.llm_engine import EngineConfig
from tests.serving.loopback import serve_on_loopback

MODEL = "smollm2-135m-instruct"


@pytest.fixture(scope="module")
def server(smollm2):
    app = create_engine_app(MODEL, loaded=smollm2.loaded, engine_config=EngineConfig(tuned_kernels=False))
    with serve_on_loopback(app) as url:
        yield url, app


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server[0] + "/v1", api_key="unused", max_retries=0, timeout=120)
