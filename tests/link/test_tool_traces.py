"""Tool-call traces (link/traces.py, GET /api/traces, migration 0003): a real gateway on loopback over the mock
OpenAI server, called with the official `openai` client; the migration on SQLite and PostgreSQL.

    .venv/bin/python -m pytest -q tests/link/test_tool_traces.py

The mock answers a request with `tools` by calling the first tool with {"text": "You said: <last message>"}
(id "call_mock_0", finish "tool_calls"), so the expected trace is written out here by hand.
"""

from __future__ import annotations

import json
import time
from datetime import datetime, timedelta, timezone

import httpx
import openai
import pytest
from alembic import command
from sqlalchemy import inspect, text
from sqlmodel import Session

from link.db import make_db_engine, upgrade
from link.db.migrate import alembic_config, current_revision, head_revision
from link.db.models import ToolTrace
from link.traces import StreamAssembler, TraceRecorder, assistant_message, fine_tuning_example, query_traces
from tests.link.gateway_launch import MASTER_KEY, gateway_settings, mock_deployment, start_gateway_thread
from tests.link.mock_launch import start_mock_thread

AUTH = {"Authorization": f"Bearer {MASTER_KEY}"}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}},
         {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}]


def _messages(question: str) -> list[dict]:
    return [{"role": "system", "content": "You are a weather assistant."}, {"role": "user", "content": question}]


def _expected_answer(question: str) -> dict:
    """The mock's answer to `question` with TOOLS, as the trace stores it."""
    arguments = json.dumps({"text": f"You said: {question}"})
    return {"role": "assistant", "tool_calls": [{"id": "call_mock_0", "type": "function",
                                                 "function": {"name": "get_weather", "arguments": arguments}}]}


def test_stream_assembler_joins_pieces_as_openai_streams_them():
    """Two parallel calls whose arguments arrive in pieces (OpenAI's delta format), a second choice ignored."""
    def chunk(delta, finish=None, index=0):
        return {"choices": [{"index": index, "delta": delta, "finish_reason": finish}]}

    assembler = StreamAssembler()
    for c in [chunk({"role": "assistant", "content": None}),
              chunk({"tool_calls": [{"index": 0, "id": "call_a", "type": "function",
                                     "function": {"name": "get_weather", "arguments": ""}}]}),
              chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"city": '}}]}),
              chunk({"content": "ignored"}, index=1),
              chunk({"tool_calls": [{"index": 1, "id": "call_b", "type": "function",
                                     "function": {"name": "get_time", "arguments": "{}"}}]}),
              chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]}),
              chunk({}, "tool_calls"), {"choices": [], "usage": {"prompt_tokens": 3}}]:
        assembler.add(c)
    assert assembler.message() == {"role": "assistant", "tool_calls": [
        {"id": "call_a", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
        {"id": "call_b", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}]}
    assert assembler.finish_reason == "tool_calls"
    text = StreamAssembler()
    for c in [chunk({"role": "assistant", "content": ""}), chunk({"content": "No tool "}), chunk({"content": "fits."}, "stop")]:
        text.add(c)
    assert text.message() == {"role": "assistant", "content": "No tool fits."} and text.finish_reason == "stop"
    assert assistant_message(None, []) == {"role": "assistant", "content": ""}


@pytest.fixture(scope="module")
def gateway(new_database_url, tmp_path_factory):
    from link.config import parse_config

    url = new_database_url("sqlite")
    with start_mock_thread() as mock:
        config = parse_config({"models": [mock_deployment("m1", mock.api_base)], "policies": [
            {"name": "harness", "type": "fixed", "models": ["m1"], "options": {"capture_traces": True}},
            {"name": "plain", "type": "fixed", "models": ["m1"]}]})
        with start_gateway_thread(gateway_settings(url, tmp_path_factory.mktemp("home")), config) as server:
            yield server


@pytest.fixture(scope="module")
def keys(gateway):
    """{"on": (id, plaintext), "off": (id, plaintext)}: a key with capture_traces and one without."""
    out = {}
    for name, body in (("on", {"name": "trace-on", "capture_traces": True}), ("off", {"name": "trace-off"})):
        created = httpx.post(gateway.url + "/api/keys", json=body, headers=AUTH)
        assert created.status_code == 201, created.text
        assert created.json()["capture_traces"] is (name == "on")
        out[name] = (created.json()["id"], created.json()["key"])
    return out


def _client(gateway, plaintext: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.base_url, api_key=plaintext, max_retries=0)


def _chat(client: openai.OpenAI, model: str, question: str, **extra) -> tuple[str, dict]:
    """(request id, the answer's message as a trace stores it) of a whole request."""
    raw = client.chat.completions.with_raw_response.create(model=model, messages=_messages(question), **extra)
    message = raw.parse().choices[0].message
    calls = [c.model_dump() for c in message.tool_calls or []]
    return raw.headers["x-link-request-id"], assistant_message(message.content, calls)


def _stream(client: openai.OpenAI, model: str, question: str, **extra) -> tuple[str, dict]:
    """(request id, the streamed answer's message assembled from the chunks the client received)."""
    assembler = StreamAssembler()
    with client.chat.completions.with_streaming_response.create(model=model, messages=_messages(question),
                                                                stream=True, **extra) as raw:
        request_id = raw.headers["x-link-request-id"]
        for chunk in raw.parse():
            assembler.add(chunk.model_dump())
    return request_id, assembler.message()


def _rows(gateway, *request_ids: str) -> dict[str, ToolTrace]:
    """The trace rows of these requests (a streamed request's row is queued after its last byte: poll briefly)."""
    deadline = time.monotonic() + 5
    while True:
        assert gateway.state.traces.flush(10)
        with Session(gateway.state.db) as session:
            rows = {r.id: r for r in query_traces(session) if r.id in request_ids}
        if len(rows) == len(request_ids) or time.monotonic() > deadline:
            return rows
        time.sleep(0.05)


def test_a_key_that_opted_in_records_whole_and_streamed_requests(gateway, keys):
    key_id, plaintext = keys["on"]
    client = _client(gateway, plaintext)
    whole_id, whole_answer = _chat(client, "m1", "weather in Paris please", tools=TOOLS)
    stream_id, stream_answer = _stream(client, "m1", "and in Rome", tools=TOOLS)
    assert whole_answer == _expected_answer("weather in Paris please")  # what the client received
    assert stream_answer == _expected_answer("and in Rome")
    rows = _rows(gateway, whole_id, stream_id)
    assert set(rows) == {whole_id, stream_id}
    for request_id, question, is_stream in ((whole_id, "weather in Paris please", False), (stream_id, "and in Rome", True)):
        row = rows[request_id]
        assert row.messages == _messages(question) and row.tools == TOOLS
        assert row.response == _expected_answer(question) and row.finish_reason == "tool_calls"
        assert (row.api_key_id, row.policy, row.model, row.stream) == (key_id, "m1", "m1", is_stream)


def test_no_trace_without_opt_in_without_tools_or_with_tool_choice_none(gateway, keys):
    off = _client(gateway, keys["off"][1])
    on = _client(gateway, keys["on"][1])
    ids = [_chat(off, "m1", "not opted in", tools=TOOLS)[0], _stream(off, "plain", "policy without capture", tools=TOOLS)[0],
           _chat(on, "m1", "no tools here")[0], _stream(on, "m1", "no tools streamed")[0],
           _chat(on, "m1", "tools offered but none allowed", tools=TOOLS, tool_choice="none")[0]]
    time.sleep(0.2)  # a stream's row would be queued just after its last byte
    assert _rows(gateway, *ids) == {}


def test_a_policy_that_opted_in_records_every_key(gateway, keys):
    key_id, plaintext = keys["off"]
    client = _client(gateway, plaintext)
    whole_id, _ = _chat(client, "harness", "policy whole", tools=TOOLS)
    stream_id, _ = _stream(client, "harness", "policy streamed", tools=TOOLS)
    master_id, _ = _chat(_client(gateway, MASTER_KEY), "harness", "the master key", tools=TOOLS)
    rows = _rows(gateway, whole_id, stream_id, master_id)
    assert {r.policy for r in rows.values()} == {"harness"} and len(rows) == 3
    assert rows[whole_id].api_key_id == key_id and rows[master_id].api_key_id is None
    assert rows[stream_id].response == _expected_answer("policy streamed")


def test_stored_policy_option_is_validated_and_applied(gateway, keys):
    api = httpx.Client(base_url=gateway.url + "/api", headers=AUTH)
    bad = api.post("/policies", json={"name": "bad-capture", "type": "fixed", "models": ["m1"],
                                      "options": {"capture_traces": "yes"}})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "options.capture_traces", bad.text
    made = api.post("/policies", json={"name": "db-harness", "type": "fixed", "models": ["m1"],
                                       "options": {"capture_traces": True}})
    assert made.status_code == 201, made.text
    request_id, _ = _chat(_client(gateway, keys["off"][1]), "db-harness", "stored policy", tools=TOOLS)
    assert _rows(gateway, request_id)[request_id].policy == "db-harness"


def test_key_flag_is_updated_over_the_api(gateway):
    created = httpx.post(gateway.url + "/api/keys", json={"name": "toggle"}, headers=AUTH).json()
    assert created["capture_traces"] is False
    on = httpx.patch(f"{gateway.url}/api/keys/{created['id']}", json={"capture_traces": True}, headers=AUTH)
    assert on.status_code == 200 and on.json()["capture_traces"] is True and on.json()["name"] == "toggle"
    null = httpx.patch(f"{gateway.url}/api/keys/{created['id']}", json={"capture_traces": None}, headers=AUTH)
    assert null.status_code == 400 and null.json()["error"]["param"] == "capture_traces"
    assert httpx.get(f"{gateway.url}/api/keys/{created['id']}", headers=AUTH).json()["capture_traces"] is True


def test_api_traces_exports_fine_tuning_jsonl_to_the_admin_only(gateway, keys):
    key_id, plaintext = keys["on"]
    client = _client(gateway, plaintext)
    first, _ = _chat(client, "m1", "export one", tools=TOOLS)
    second, _ = _stream(client, "m1", "export two", tools=TOOLS)
    _rows(gateway, first, second)
    url = gateway.url + "/api/traces"
    assert httpx.get(url).status_code == 401
    assert httpx.get(url, headers={"Authorization": f"Bearer {plaintext}"}).status_code == 403

    answer = httpx.get(url, params={"api_key_id": key_id, "limit": 100}, headers=AUTH)
    assert answer.status_code == 200 and answer.headers["content-type"].startswith("application/jsonl")
    lines = [json.loads(line) for line in answer.text.splitlines()]
    assert int(answer.headers["x-link-trace-count"]) == len(lines)
    expected = {"messages": [*_messages("export two"), _expected_answer("export two")], "tools": TOOLS}
    assert lines[-1] == expected  # oldest first: the last request is the last line
    assert lines[-2] == {"messages": [*_messages("export one"), _expected_answer("export one")], "tools": TOOLS}
    assert all(set(line) == {"messages", "tools"} for line in lines)

    limited = httpx.get(url, params={"api_key_id": key_id, "limit": 1}, headers=AUTH).text.splitlines()
    assert [json.loads(x) for x in limited] == lines[:1]
    future = (datetime.now(timezone.utc) + timedelta(days=1)).isoformat()
    assert httpx.get(url, params={"since": future}, headers=AUTH).text == ""
    assert httpx.get(url, params={"until": future, "policy": "harness"}, headers=AUTH).headers["x-link-trace-count"] != "0"
    assert httpx.get(url, params={"policy": "nobody"}, headers=AUTH).text == ""
    off = httpx.get(url, params={"api_key_id": keys["off"][0]}, headers=AUTH)
    both = httpx.get(url, params=[("api_key_id", key_id), ("api_key_id", keys["off"][0])], headers=AUTH)
    assert int(both.headers["x-link-trace-count"]) == len(lines) + int(off.headers["x-link-trace-count"])
    assert httpx.get(url, params={"limit": 0}, headers=AUTH).status_code == 400
    schema = httpx.get(gateway.url + "/openapi.json").json()["paths"]["/api/traces"]["get"]
    assert set(schema["responses"]["200"]["content"]["application/jsonl"]["schema"]["properties"]) == {"messages", "tools"}


def test_a_failed_trace_write_never_fails_the_request(gateway, keys, new_database_url):
    """The recorder points at a database without the table: the write fails (logged), the answer is a 200."""
    broken = TraceRecorder(make_db_engine(new_database_url("sqlite")))
    working, gateway.state.traces = gateway.state.traces, broken
    try:
        request_id, answer = _chat(_client(gateway, keys["on"][1]), "m1", "still answered", tools=TOOLS)
        stream_id, streamed = _stream(_client(gateway, keys["on"][1]), "m1", "still streamed", tools=TOOLS)
        assert answer == _expected_answer("still answered") and streamed == _expected_answer("still streamed")
        assert broken.flush(30) and broken.num_failed == 2 and broken.num_written == 0
    finally:
        gateway.state.traces = working
        broken.close()
        broken.engine.dispose()


def test_cli_creates_a_key_that_captures_traces(new_database_url):
    from typer.testing import CliRunner

    from cli.app import app
    from link.keys import verify_key

    url, runner = new_database_url("sqlite"), CliRunner()
    created = runner.invoke(app, ["keys", "create", "harness-cli", "--capture-traces", "--database-url", url])
    plain = runner.invoke(app, ["keys", "create", "plain-cli", "--database-url", url])
    assert created.exit_code == 0 and plain.exit_code == 0, created.output + plain.output
    engine = make_db_engine(url)
    with Session(engine) as session:
        assert verify_key(session, created.stdout.strip().splitlines()[-1]).capture_traces is True
        assert verify_key(session, plain.stdout.strip().splitlines()[-1]).capture_traces is False
    engine.dispose()
    listed = runner.invoke(app, ["keys", "list", "--database-url", url]).stdout
    header = next(line for line in listed.splitlines() if line.lstrip().startswith("id "))
    name_at, key_at, traces_at = header.index(" name ") + 1, header.index(" key "), header.index(" traces") + 1
    rows = {line[name_at:key_at].strip(): line[traces_at:].strip() for line in listed.splitlines() if "-cli" in line}
    assert rows == {"harness-cli": "on", "plain-cli": "-"}


# --- migration 0003 ----------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_migration_0003_adds_the_table_and_keeps_keys(backend, new_database_url):
    url = new_database_url(backend)
    upgrade(url, "0002")
    engine = make_db_engine(url)
    try:
        with engine.begin() as connection:  # a key made before 0003
            connection.execute(text("INSERT INTO api_key (name, key_hash, key_prefix, created_at, spend_nusd, reserved_nusd) "
                                    "VALUES ('old', 'h', 'p', :t, 0, 0)"), {"t": datetime.now(timezone.utc)})
        assert "tool_trace" not in inspect(engine).get_table_names()
        upgrade(url, "0003")
        assert current_revision(engine) == "0003"
        columns = {c["name"] for c in inspect(engine).get_columns("tool_trace")}
        assert columns == {"id", "created_at", "api_key_id", "policy", "model", "stream", "messages", "tools", "response",
                           "finish_reason"}
        with engine.connect() as connection:
            old = connection.execute(text("SELECT capture_traces FROM api_key WHERE name = 'old'")).scalar()
        assert old is not None and not old  # false (SQLite: 0)

        recorder = TraceRecorder(engine)  # a row written and read back through the same code the gateway uses
        values = {"id": f"req-{backend}", "created_at": datetime(2030, 1, 2, tzinfo=timezone.utc), "api_key_id": 1,
                  "policy": "p", "model": "m", "stream": True, "messages": _messages("ünïcode ok"), "tools": TOOLS,
                  "response": _expected_answer("x"), "finish_reason": "tool_calls"}
        recorder.write(values)
        recorder.close(30)
        assert recorder.num_written == 1
        with Session(engine) as session:
            (row,) = query_traces(session, api_key_ids=[1])
        assert (row.messages, row.tools, row.response, row.stream) == (values["messages"], TOOLS, values["response"], True)

        from posttrain.traces_log import read_request_log  # the posttrain reader on this database too

        (trace,) = read_request_log(url, policies=["p"])
        assert trace.id == f"req-{backend}" and trace.messages == [*values["messages"], values["response"]]

        with engine.begin() as connection:  # and back down: the table and the key column go
            command.downgrade(alembic_config(connection), "0002")
        assert "tool_trace" not in inspect(engine).get_table_names()
        assert "capture_traces" not in {c["name"] for c in inspect(engine).get_columns("api_key")}
    finally:
        engine.dispose()


def test_an_agent_loops_earlier_answers_are_context_not_learned():
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    earlier = {"role": "assistant", "content": None, "tool_calls": [call]}
    result = {"role": "tool", "tool_call_id": "c1", "content": "18 C"}
    answer = {"role": "assistant", "content": "It is 18 C in Paris."}
    row = ToolTrace(id="r1", messages=[*_messages("Weather in Paris?"), earlier, result], tools=[], response=answer)
    example = fine_tuning_example(row)
    assert example["messages"] == [*_messages("Weather in Paris?"), {**earlier, "weight": 0}, result, answer]
    assert row.messages[2] == earlier  # the row itself is not changed
