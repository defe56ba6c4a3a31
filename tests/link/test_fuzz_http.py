"""The whole HTTP surface fuzzed from the gateway's own OpenAPI schema (schemathesis, tests/link/fuzz_http.py).

Every operation in `/openapi.json` gets a bounded number of generated requests, valid by the schema and
breaking it, sent with the admin key over real HTTP to a gateway in front of the mock provider: no answer is a
5xx, none takes longer than the bound (no hang), and every `/v1` request leaves exactly one request-log row.
Generation is derandomized: a run is repeatable. `LINK_FUZZ_EXAMPLES` raises the budget for a longer hunt.
"""

from __future__ import annotations

import os

import httpx
import pytest

from tests.link.fuzz_http import fuzz_gateway
from tests.link.gateway_launch import MASTER_KEY, gateway_settings, mock_deployment, start_gateway_thread

AUTH = {"Authorization": f"Bearer {MASTER_KEY}"}
EXAMPLES = int(os.environ.get("LINK_FUZZ_EXAMPLES", "25"))


@pytest.fixture(scope="module")
def gateway(mock, new_database_url, tmp_path_factory):
    from link.config import parse_config

    config = parse_config({"models": [mock_deployment("mock-a", mock.api_base)],
                           "policies": [{"name": "fixed-a", "type": "fixed", "models": ["mock-a"]}]})
    settings = gateway_settings(new_database_url("sqlite"), tmp_path_factory.mktemp("home"))
    with start_gateway_thread(settings, config) as server:
        yield server


def test_fuzzing_every_operation_finds_no_5xx_no_hang_and_no_lost_row(gateway):
    report = fuzz_gateway(gateway.url, headers=AUTH, max_examples=EXAMPLES, models=("mock-a", "fixed-a"))
    print(report.summary())
    assert not report.failures, "\n".join(map(str, report.failures[:10]))
    operations = {f"{method.upper()} {path}" for path, ops in httpx.get(f"{gateway.url}/openapi.json").json()["paths"].items()
                  for method in ops}
    assert set(report.examples) == operations                      # every operation was reached
    # the two bodies that matter most are documented well enough that generated requests get past validation
    answered = {op: sum(n for (o, status), n in report.statuses.items() if o == op and status == 200)
                for op in ("POST /v1/chat/completions", "POST /v1/completions")}
    assert all(n > 0 for n in answered.values()), answered
    gateway.flush_log()
    rows = httpx.get(f"{gateway.url}/api/requests", params={"limit": 1000}, headers=AUTH).json()
    # every POST of a model-calling route logs one row (GET/DELETE of a stored response log none)
    posts = sum(report.examples.get(f"POST {path}", 0)
                for path in ("/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/responses"))
    assert len(rows) == posts
