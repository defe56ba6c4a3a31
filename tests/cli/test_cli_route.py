"""`link route --tools`: the tools a request offers reach the router, and a bad tools file says what to fix.

The router is a real kNN router file built here: "small" and "big" labelled on plain prompts, "tools-sft"
added from tool-calling prompts only (routers/knn.py keeps the two kinds apart). The embedder is a fake
that puts every prompt at one point, so a query's neighbours are all the bank prompts of its kind and each
predicted quality is that kind's mean score; the costs are fixed means (COSTS), lambda 50 per USD.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from cli.app import app
from tests.link.gateway_launch import mock_deployment, write_config

MODELS = ["small", "big", "tools-sft"]
COSTS = {"small": 0.001, "big": 0.01, "tools-sft": 0.0005}
PROMPT = "What is the weather in Paris?"
CITY = {"type": "object", "properties": {"city": {"type": "string"}}}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather now", "parameters": CITY}}]

runner = CliRunner()


def one_point(self, texts):
    """[N, 384] float32: every text at the same unit vector."""
    out = np.zeros((len(texts), 384), dtype=np.float32)
    out[:, 0] = 1.0
    return out


@pytest.fixture
def config(tmp_path, monkeypatch):
    """link.yaml with policy "auto": the kNN router over MODELS (dead deployments; `link route` calls none)."""
    from routers.base import save_router
    from routers.decision import CostModel
    from routers.embedding import Embedder
    from routers.features import Featurizer
    from routers.knn import KNNRouter
    from routers.offline.data import RoutingData

    monkeypatch.setattr("routers.embedding.Embedder.embed", one_point)
    featurizer = Featurizer(Embedder())
    plain = [f"plain question {i}" for i in range(4)]
    # plain prompts: small right on 3 of 4 (0.75), big on all (1.0)
    data = RoutingData([f"p{i}" for i in range(4)], plain, ["toy"] * 4, ["small", "big"],
                       [[1, 1], [1, 1], [1, 1], [0, 1]], np.full((4, 2), 0.001))
    router = KNNRouter(["small", "big"]).fit(data, featurizer.transform(plain))
    # tool prompts: tools-sft right on 3 of 4 (0.75); small and big have no tool evidence (predicted 0)
    calls = [f"call a tool {i}" for i in range(4)]
    labelled = RoutingData([f"t{i}" for i in range(4)], calls, ["bfcl"] * 4, ["tools-sft"], [[1], [1], [0], [1]],
                           np.full((4, 1), 0.0005), has_tools=[True] * 4)
    router.add_model("tools-sft", labelled, featurizer.transform(calls, labelled.has_tools))
    nan = np.full(len(MODELS), np.nan)
    costs = CostModel(MODELS, nan, nan, nan, np.array([COSTS[m] for m in MODELS]))
    path = save_router(router, tmp_path / "knn.safetensors", costs=costs,
                       decision={"rule": "lambda", "cost_penalty": 50.0})
    models = [mock_deployment(name, "http://127.0.0.1:9/v1") for name in MODELS]
    return write_config(tmp_path / "link.yaml", models,
                        [{"name": "auto", "type": "router", "models": MODELS, "options": {"path": str(path)}}])


def route(config, *args: str):
    return runner.invoke(app, ["route", PROMPT, "-p", "auto", "-c", str(config), *args])


def test_the_same_prompt_goes_to_the_tool_model_only_when_it_offers_tools(config, tmp_path):
    result = route(config, "--json")
    assert result.exit_code == 0, result.output
    plain = json.loads(result.stdout)  # stdout holds the JSON alone: the loading line goes to stderr
    assert result.stderr == (f"loading auto: router file {tmp_path / 'knn.safetensors'}, prompt encoder "
                             "all-MiniLM-L6-v2 (auto) ...\n")
    # lambda 50: small 0.75 - 0.05 = 0.70, big 1.0 - 0.5 = 0.50, tools-sft (no plain evidence) 0 - 0.025
    assert plain["decision"]["scores"] == pytest.approx({"small": 0.75, "big": 1.0, "tools-sft": 0.0})
    assert plain["decision"]["chosen"] == "small" and plain["models"] == ["small", "big", "tools-sft"]
    assert plain["tools"] == []

    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps(TOOLS))
    result = route(config, "--tools", str(tools), "--json")
    assert result.exit_code == 0, result.output
    offered = json.loads(result.stdout)
    # tools-sft 0.75 - 0.025 = 0.725; small and big have no tool evidence: 0 - 0.05 and 0 - 0.5
    assert offered["decision"]["scores"] == pytest.approx({"small": 0.0, "big": 0.0, "tools-sft": 0.75})
    assert offered["decision"]["chosen"] == "tools-sft" and offered["models"] == ["tools-sft", "small", "big"]
    assert offered["tools"] == ["get_weather"]

    body = tmp_path / "request.json"  # a saved request body: only its "tools" are read
    body.write_text(json.dumps({"model": "auto", "messages": [{"role": "user", "content": "other"}], "tools": TOOLS}))
    result = route(config, "--tools", str(body))
    assert result.exit_code == 0, result.output
    assert "the request offers tools: get_weather" in result.output
    assert "plan: tools-sft -> small -> big" in result.output


def test_explain_route_refuses_tools_on_the_completion_endpoint(config, tmp_path):
    from cli.route import explain_route

    with pytest.raises(ValueError, match="tools need the chat endpoint, not 'completion'"):
        explain_route(PROMPT, "auto", str(config), endpoint="completion", tools=TOOLS)
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps(TOOLS))
    result = route(config, "--completion", "--tools", str(tools))
    assert result.exit_code == 2 and "error: tools need the chat endpoint" in result.output


BAD_FILES = {
    "not JSON": ('[{"type": "function",\n  "function": {"name": "get_weather"},,}]',
                 "bad.json is not JSON: Expecting property name enclosed in double quotes at line 2 column 39"),  # ",,"
    "not UTF-8": (b"\xff\xfe[]", "bad.json is not UTF-8 text"),
    "an object without tools": ('{"model": "auto", "messages": []}',
                                'bad.json is a JSON object without a "tools" key; give a list of OpenAI tools'),
    "a string": ('"get_weather"', "bad.json must be a non-empty array of OpenAI tools"),
    "an empty list": ("[]", "bad.json must be a non-empty array of OpenAI tools {\"type\": \"function\", "
                            "\"function\": {\"name\": ...}}, not an empty array"),
    "a list of names": ('["get_weather"]', "bad.json[0] must be an object"),
    "a custom tool": ('[{"type": "custom", "custom": {"name": "grep"}}]',
                      'bad.json[0].type must be "function", not "custom"'),
    "no type": ('[{"function": {"name": "get_weather"}}]', 'bad.json[0].type must be "function", not null'),
    "no name": ('[{"type": "function", "function": {"description": "weather"}}]',
                "bad.json[0].function.name is missing: each tool needs"),
    "no name in a body": ('{"tools": [{"type": "function", "function": {"name": "a"}}, {"type": "function"}]}',
                          "bad.json: tools[1].function.name is missing"),
    "a name the gateway refuses": ('[{"type": "function", "function": {"name": "get weather"}}]',
                                   "Invalid 'tools[0].function.name': string does not match pattern"),
}


@pytest.mark.parametrize("case", list(BAD_FILES))
def test_each_bad_tools_file_says_what_to_fix(config, tmp_path, case):
    content, message = BAD_FILES[case]
    bad = tmp_path / "bad.json"
    bad.write_bytes(content if isinstance(content, bytes) else content.encode())
    result = route(config, "--tools", str(bad))
    assert result.exit_code == 2, result.output
    assert result.output.startswith("error: ") and result.output.count("\n") == 1, result.output
    assert message in result.output, result.output


def test_a_missing_tools_file(config, tmp_path):
    result = route(config, "--tools", str(tmp_path / "none.json"))
    assert result.exit_code == 2 and result.output == f"error: {tmp_path / 'none.json'}: no such tools file\n"


def test_route_inside_a_running_event_loop(config):
    # a notebook cell, or a test beside Playwright's sync API, runs `link route` inside a running loop
    import asyncio

    async def cell():
        return route(config, "--json")

    result = asyncio.run(cell())
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["decision"]["chosen"] == "small"
