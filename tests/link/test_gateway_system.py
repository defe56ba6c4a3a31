"""The gateway's `/health`, `/metrics` and model cards, over real HTTP (a mock backend, an unreachable one and
a local model that is never asked to generate).

/health is a 503 listing the models with no replica in rotation (a lazy local model counts as healthy);
/metrics needs the master key unless LINK_METRICS_PUBLIC=true; GET /v1/models reports a local model's
configured context until its engine is loaded, then the engine's (capped by its KV cache).
"""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
from sqlmodel import Session

from link.db import make_db_engine
from link.keys import create_key
from tests.link.gateway_launch import MASTER_KEY, gateway_settings, mock_deployment, start_gateway_thread
from tests.link.mock_launch import refused_url

AUTH = {"Authorization": f"Bearer {MASTER_KEY}"}
LOCAL = "smollm2-135m-instruct"


@pytest.fixture(scope="module")
def gateway(mock, new_database_url, tmp_path_factory):
    from link.config import parse_config

    config = parse_config({"models": [mock_deployment("up", mock.api_base), mock_deployment("down", refused_url()),
                                      {"name": LOCAL, "kind": "local", "local": LOCAL, "context_length": 8192}]})
    settings = gateway_settings(new_database_url("sqlite"), tmp_path_factory.mktemp("home"))
    with start_gateway_thread(settings, config) as server:
        yield server


def test_health_is_503_while_a_model_has_no_replica_in_rotation(gateway):
    deadline = time.monotonic() + 10
    while (response := httpx.get(gateway.url + "/health")).status_code != 503 and time.monotonic() < deadline:
        time.sleep(0.05)  # the first health round ejects the unreachable replica
    body = response.json()
    assert response.status_code == 503 and body["status"] == "degraded" and body["unavailable_models"] == ["down"]
    assert body["models"]["up"][0]["healthy"] and not body["models"]["down"][0]["healthy"]
    assert body["models"][LOCAL][0]["healthy"]  # not loaded yet: healthy (200 when all are: test_gateway_contract.py)


def test_metrics_need_the_master_key(gateway):
    assert httpx.get(gateway.url + "/metrics").status_code == 401
    engine = make_db_engine(gateway.state.settings.database_url)
    try:
        with Session(engine) as session:
            _, plaintext = create_key(session, "not-admin")
    finally:
        engine.dispose()
    assert httpx.get(gateway.url + "/metrics", headers={"Authorization": f"Bearer {plaintext}"}).status_code == 403
    allowed = httpx.get(gateway.url + "/metrics", headers=AUTH)
    assert allowed.status_code == 200 and "link_requests_total" in allowed.text


def test_metrics_public_setting_opens_them(mock, new_database_url, tmp_path):
    from link.app import create_app
    from link.config import parse_config

    settings = gateway_settings(new_database_url("sqlite"), tmp_path, metrics_public=True)
    app = create_app(settings, parse_config({"models": [mock_deployment("up", mock.api_base)]}))

    async def scrape() -> httpx.Response:
        async with app.router.lifespan_context(app), httpx.AsyncClient(transport=httpx.ASGITransport(app),
                                                                       base_url="http://gateway") as client:
            return await client.get("/metrics")

    assert asyncio.run(scrape()).status_code == 200


@pytest.mark.slow
def test_models_report_the_effective_context_of_a_loaded_local_model(gateway, smollm2):
    def card(name: str) -> dict:
        return httpx.get(f"{gateway.base_url}/models/{name}", headers=AUTH).json()

    assert card(LOCAL)["max_model_len"] == 8192  # not loaded: the configured context
    assert "max_model_len" not in card("up")  # a remote model without context_length: unknown
    # Load it as the gateway's engine pool does, with the default 256 MiB KV cache: 5,824 tokens fit.
    gateway.state.engine_pool.add_loaded(LOCAL, smollm2.loaded)
    assert card(LOCAL)["max_model_len"] == 5824
    listed = {m["id"]: m for m in httpx.get(gateway.base_url + "/models", headers=AUTH).json()["data"]}
    assert listed[LOCAL]["max_model_len"] == 5824


def test_unknown_model_names_share_one_metrics_label(gateway):
    """Labels name only served models and policies: 200 made-up names add no series after the first one made the
    "unknown" bucket, and a served model keeps its own label."""
    import random
    import string

    def scrape() -> str:
        response = httpx.get(gateway.url + "/metrics", headers=AUTH)
        assert response.status_code == 200
        return response.text

    def ask(model: str) -> httpx.Response:
        return httpx.post(gateway.base_url + "/chat/completions", headers=AUTH, timeout=30,
                          json={"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})

    assert ask("up").status_code == 200
    assert ask("made-up-first").status_code == 404
    before = scrape().splitlines()
    rng = random.Random(0)
    names = ["".join(rng.choices(string.ascii_letters + string.digits, k=rng.randint(20, 200))) for _ in range(200)]
    for name in names:
        assert ask(name).status_code == 404
    after = scrape()

    def series(lines) -> set[str]:  # every series but the background kernel tuner's, which come as it works
        return {line.rsplit(" ", 1)[0] for line in lines if not line.startswith(("link_kernel_", "# HELP link_kernel_",
                                                                                   "# TYPE link_kernel_"))}

    assert series(after.splitlines()) == series(before)
    assert not any(name in after for name in names)
    requests = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in after.splitlines()
                if line.startswith("link_requests_total{")}
    assert requests['link_requests_total{model="",policy="unknown",status="invalid_request"}'] == 201
    assert requests['link_requests_total{model="up",policy="up",status="ok"}'] >= 1
