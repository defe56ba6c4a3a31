"""Fixtures of the engine server tests: a real uvicorn server on loopback (one per test module) and an
official `openai` client for it, over the session's SmolLM2."""

from __future__ import annotations

import openai
import pytest

from serving.api.server import create_engine_app
from tests.serving.loopback import serve_on_loopback

MODEL = "smollm2-135m-instruct"


@pytest.fixture(scope="module")
def server(smollm2):
    app = create_engine_app(MODEL, loaded=smollm2.loaded)
    with serve_on_loopback(app) as url:
        yield url, app


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server[0] + "/v1", api_key="unused", max_retries=0, timeout=120)
