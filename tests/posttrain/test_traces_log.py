"""posttrain/traces_log.py: the gateway's recorded tool-call traces read back as `Trace`s equal to what was sent,
with filters and clear errors. A real gateway on loopback over the mock OpenAI server (SQLite); PostgreSQL is
covered by tests/link/test_tool_traces.py.

    .venv/bin/python -m pytest -q tests/posttrain/test_traces_log.py
"""

from __future__ import annotations

import json
import re
import time
from datetime import datetime, timedelta, timezone

import httpx
import openai
import pytest

from link.db import upgrade
from posttrain.errors import PosttrainDataError
from posttrain.traces import Trace, check_trace, check_traces
from posttrain.traces_log import read_request_log
from tests.link.gateway_launch import MASTER_KEY, gateway_settings, mock_deployment, start_gateway_thread
from tests.link.mock_launch import start_mock_thread

TOOLS = [{"type": "function", "function": {"name": "lookup_order", "description": "An order's status",
                                           "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}},
                                                          "required": ["order_id"]}}}]


def _messages(question: str) -> list[dict]:
    return [{"role": "system", "content": "You answer order questions."}, {"role": "user", "content": question}]


def _answer(question: str) -> dict:
    """The mock's answer (its first tool, arguments {"text": "You said: <question>"}), written out by hand."""
    return {"role": "assistant", "tool_calls": [{"id": "call_mock_0", "type": "function", "function": {
        "name": "lookup_order", "arguments": json.dumps({"text": f"You said: {question}"})}}]}


@pytest.fixture(scope="module")
def logged(tmp_path_factory):
    """(database URL, key ids {"on", "off"}, [(request id, question, stream, policy, key)] sent, time before)."""
    from link.config import parse_config

    home = tmp_path_factory.mktemp("home")
    url = f"sqlite:///{home / 'link.db'}"
    before = datetime.now(timezone.utc) - timedelta(seconds=1)
    sent = []
    with start_mock_thread() as mock:
        config = parse_config({"models": [mock_deployment("m1", mock.api_base)], "policies": [
            {"name": "harness", "type": "fixed", "models": ["m1"], "options": {"capture_traces": True}}]})
        with start_gateway_thread(gateway_settings(url, home), config) as gateway:
            auth = {"Authorization": f"Bearer {MASTER_KEY}"}
            keys = {name: httpx.post(gateway.url + "/api/keys", json={"name": name, "capture_traces": name == "on"},
                                     headers=auth).json() for name in ("on", "off")}
            for key, model, question, stream in (("on", "m1", "where is order 17", False),
                                                 ("on", "m1", "and order 18", True),
                                                 ("off", "m1", "not recorded", False),
                                                 ("off", "harness", "recorded by the policy", True)):
                client = openai.OpenAI(base_url=gateway.base_url, api_key=keys[key]["key"], max_retries=0)
                request = dict(model=model, messages=_messages(question), tools=TOOLS)
                if stream:
                    with client.chat.completions.with_streaming_response.create(**request, stream=True) as raw:
                        request_id = raw.headers["x-link-request-id"]
                        list(raw.parse())
                else:
                    request_id = client.chat.completions.with_raw_response.create(**request).headers["x-link-request-id"]
                sent.append((request_id, question, stream, model, keys[key]["id"]))
            time.sleep(0.2)
            assert gateway.state.traces.flush(10)
    return url, {k: v["id"] for k, v in keys.items()}, sent, before


def test_traces_equal_what_was_sent(logged):
    url, key_ids, sent, _ = logged
    traces = read_request_log(url)
    recorded = [s for s in sent if s[1] != "not recorded"]
    assert [t.id for t in traces] == [s[0] for s in recorded]  # oldest first
    for trace, (request_id, question, stream, policy, key_id) in zip(traces, recorded):
        assert isinstance(trace, Trace)
        assert trace.messages == [*_messages(question), _answer(question)] and trace.tools == TOOLS
        assert trace.meta["source"] == "log" and trace.meta["category"] == policy == trace.meta["policy"]
        assert (trace.meta["api_key_id"], trace.meta["model"], trace.meta["stream"]) == (key_id, "m1", stream)
        assert trace.meta["finish_reason"] == "tool_calls"
        check_trace(trace)  # a logged conversation is one post-training can learn from
    check_traces(traces, "the request log")


def test_filters(logged):
    url, key_ids, sent, before = logged
    assert [t.id for t in read_request_log(url, api_key_ids=[key_ids["on"]])] == [sent[0][0], sent[1][0]]
    assert [t.id for t in read_request_log(url, policies=["harness"])] == [sent[3][0]]
    assert [t.id for t in read_request_log(url, api_key_ids=[key_ids["off"]], policies=["harness", "m1"])] == [sent[3][0]]
    naive_before = before.replace(tzinfo=None)  # naive datetimes are UTC
    assert len(read_request_log(url, since=naive_before, until=datetime.now(timezone.utc) + timedelta(seconds=5))) == 3


def test_no_traces_for_the_filters_is_a_clear_error(logged):
    url, key_ids, _, before = logged
    with pytest.raises(PosttrainDataError, match=r"no tool-call traces for api_key_ids=\[999\], policies=\['nobody'\]"
                                                 r".*capture_traces") as info:
        read_request_log(url, api_key_ids=[999], policies=["nobody"])
    assert "link keys create --capture-traces" in str(info.value)
    with pytest.raises(PosttrainDataError, match=re.escape(f"for until={before.isoformat()};")):
        read_request_log(url, until=before)


def test_a_database_without_the_table_is_a_clear_error(tmp_path):
    url = f"sqlite:///{tmp_path / 'old.db'}"
    upgrade(url, "0002")
    with pytest.raises(PosttrainDataError, match="no tool_trace table.*link serve"):
        read_request_log(url)
