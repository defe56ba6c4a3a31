"""`link bench gateway`: the benchmark on tiny settings (real processes: mock backend, `link serve`, LiteLLM's
proxy when installed, the pinned load generator), its numbers checked against the raw per-request records;
the report's arithmetic on known records; the mock backend; the gateway honouring request_log/budgets off."""

from __future__ import annotations

import json
import sys

import httpx
import numpy as np
import openai
import pytest
from sqlmodel import Session, select
from typer.testing import CliRunner

from benchmarks.link_bench.gateway import GATEWAY_SYSTEMS, MODES, litellm_proxy_missing, run_gateway_benchmark
from benchmarks.link_bench.gateway_report import add_added_latency, compute_gateway_ratios, render_gateway_report, summarize_cell
from benchmarks.link_bench.mock_backend import ANSWER_TEXT, USAGE
from benchmarks.link_bench.processes import ServerProcess, free_port
from cli.app import app
from link.config import parse_config
from link.db import make_db_engine, upgrade
from link.db.models import RequestLog
from link.keys import create_key
from tests.link.gateway_launch import gateway_settings, mock_deployment, start_gateway_thread

CONCURRENCIES, NUM_REQUESTS = (1, 2), 6
HAS_LITELLM = litellm_proxy_missing() is None


@pytest.fixture(scope="module")
def result():
    return run_gateway_benchmark(concurrencies=CONCURRENCIES, num_requests=NUM_REQUESTS, num_warmup=2)


@pytest.fixture(scope="module")
def mock_backend():
    port = free_port()
    server = ServerProcess([sys.executable, "-m", "benchmarks.link_bench.mock_backend", "--port", str(port)], port)
    server.wait_healthy("/health", timeout_s=30)
    yield server
    server.stop()


def _cells(result: dict) -> dict:
    return {(c["system"], c["mode"], c["concurrency"]): c for c in result["cells"]}


def test_every_cell_is_measured(result):
    systems = [s for s in GATEWAY_SYSTEMS if HAS_LITELLM or s != "litellm"]
    assert result["errors"] == {} and result["systems"] == systems
    assert ("litellm" in result["skipped"]) == (not HAS_LITELLM)
    assert sorted(_cells(result)) == sorted((s, m, c) for s in systems for m in MODES for c in CONCURRENCIES)
    json.dumps(result)  # JSON-ready


def test_numbers_are_sane(result):
    for cell in result["cells"]:
        records = cell["requests"]
        assert cell["num_requests"] == NUM_REQUESTS == len(records) and cell["num_errors"] == 0
        assert all(r["status"] == 200 and 0 < r["ttft_s"] <= r["latency_s"] for r in records)
        assert cell["requests_per_s"] == pytest.approx(NUM_REQUESTS / cell["duration_s"]) and cell["requests_per_s"] > 0
        assert cell["duration_s"] >= max(r["latency_s"] for r in records)
        assert 0 < cell["latency_p50_s"] <= cell["latency_p99_s"]
        assert cell["cpu_s_per_request"] >= 0 and cell["rss_mb"] > 5
        if cell["mode"] == "stream":
            assert 0 < cell["ttft_p50_s"] <= cell["ttft_p99_s"]
    gateways = [c for c in result["cells"] if c["system"] != "direct"]
    assert all(c["rss_mb"] > 50 for c in gateways)  # a Python web app, not the 20 MiB mock


def test_added_latency_is_the_difference_of_percentiles_over_the_records(result):
    cells = _cells(result)
    for (system, mode, concurrency), cell in cells.items():
        if system == "direct":
            assert cell["added_p50_s"] is None and cell["added_p99_s"] is None
            continue
        direct = [r["latency_s"] for r in cells[("direct", mode, concurrency)]["requests"]]
        ours = [r["latency_s"] for r in cell["requests"]]
        for q in (50, 99):
            assert cell[f"added_p{q}_s"] == pytest.approx(np.percentile(ours, q) - np.percentile(direct, q))


@pytest.mark.skipif(not HAS_LITELLM, reason="litellm[proxy] is not installed")
def test_ratios_against_litellm(result):
    cells = _cells(result)
    assert {(r["system"], r["mode"], r["concurrency"]) for r in result["ratios"]} == {
        (s, m, c) for s in ("link", "link-lean") for m in MODES for c in CONCURRENCIES}
    for ratio in result["ratios"]:
        ours, theirs = cells[(ratio["system"], ratio["mode"], ratio["concurrency"])], cells[("litellm", ratio["mode"], ratio["concurrency"])]
        assert ratio["requests_per_s_ratio"] == pytest.approx(ours["requests_per_s"] / theirs["requests_per_s"])
        if theirs["added_p50_s"] > 0:
            assert ratio["added_p50_ratio"] == pytest.approx(ours["added_p50_s"] / theirs["added_p50_s"])
        assert isinstance(ratio["meets_target"], bool)


def test_report_names_the_pinning(result):
    from rich.console import Console

    console = Console(width=200, record=True)
    console.print(render_gateway_report(result))
    text = console.export_text()
    assert "added p50 ms" in text and "link-lean" in text
    if result["pinning"] is not None:
        assert "load generator on core 0, server under test on core 1, mock backend sharing core 0" in text


def test_report_arithmetic_on_known_records():
    def records(latencies):
        return [{"start_s": 0.0, "latency_s": x, "ttft_s": x / 2, "status": 200} for x in latencies]

    direct = summarize_cell("direct", "whole", 1, records([0.001, 0.002, 0.003]), wall_s=0.01, cpu_s=0.003, rss_mb=20)
    ours = summarize_cell("link-lean", "whole", 1, records([0.002, 0.004, 0.006]), wall_s=0.02, cpu_s=0.006, rss_mb=120)
    theirs = summarize_cell("litellm", "whole", 1, records([0.011, 0.012, 0.013]), wall_s=0.1, cpu_s=0.03, rss_mb=300)
    add_added_latency([direct, ours, theirs])
    assert ours["requests_per_s"] == pytest.approx(150) and ours["cpu_s_per_request"] == pytest.approx(0.002)
    assert ours["added_p50_s"] == pytest.approx(0.002) and theirs["added_p50_s"] == pytest.approx(0.010)
    [ratio] = compute_gateway_ratios([direct, ours, theirs])
    assert ratio["added_p50_ratio"] == pytest.approx(0.2) and ratio["requests_per_s_ratio"] == pytest.approx(5.0)
    assert ratio["meets_target"] is True  # <= 0.5x added latency at p50 and p99, >= 2x requests/s


@pytest.mark.parametrize(("mode", "cpu_s", "wall_s", "met"), [
    ("whole", 0.0012, 0.01, True),    # 0.4 ms CPU per request, 30 req/s vs LiteLLM's 3/s: 10x
    ("whole", 0.0018, 0.01, False),   # 0.6 ms: over the 0.5 ms whole-answer target at c=1
    ("stream", 0.0027, 0.01, True),   # 0.9 ms: within the streamed 1.0 ms
    ("stream", 0.0027, 0.011, False),  # 27.3 req/s: 9.1x, under 10x
])
def test_the_default_configuration_targets_cpu_and_ten_times_litellms_rate(mode, cpu_s, wall_s, met):
    def cell(system, wall, cpu):
        return summarize_cell(system, mode, 1, [{"start_s": 0.0, "latency_s": 0.001, "ttft_s": 0.0005, "status": 200}] * 3,
                              wall_s=wall, cpu_s=cpu, rss_mb=100)

    [ratio] = compute_gateway_ratios([cell("link", wall_s, cpu_s), cell("litellm", 0.1, 0.03)])
    assert ratio["cpu_ms_per_request"] == pytest.approx(cpu_s / 3 * 1000) and ratio["meets_target"] is met


@pytest.mark.parametrize("stream", [False, True])
def test_mock_backend_speaks_openai(mock_backend, stream):
    client = openai.OpenAI(base_url=mock_backend.url + "/v1", api_key="unused")
    messages = [{"role": "user", "content": "Say hello."}]
    if not stream:
        response = client.chat.completions.create(model="mock-model", messages=messages)
        assert response.choices[0].message.content == ANSWER_TEXT and response.usage.total_tokens == USAGE["total_tokens"]
        return
    chunks = list(client.chat.completions.create(model="mock-model", messages=messages, stream=True,
                                                 stream_options={"include_usage": True}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == ANSWER_TEXT
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == USAGE["completion_tokens"]
    assert httpx.get(mock_backend.url + "/nope").status_code == 404


def test_gateway_honours_request_log_and_budgets_off(mock_backend, tmp_path):
    url = f"sqlite:///{tmp_path / 'link.db'}"
    upgrade(url)
    engine = make_db_engine(url, pool_size=1)
    with Session(engine) as session:
        _, key = create_key(session, "broke", budget_usd=0.0)  # every priced request exceeds it
    config = parse_config({"models": [mock_deployment("mock-model", mock_backend.url + "/v1")]})
    settings = gateway_settings(url, tmp_path, request_log=False, budgets=False)
    with start_gateway_thread(settings, config) as gateway:
        assert gateway.state.log_writer is None and gateway.state.accounting.ledger is None
        client = openai.OpenAI(base_url=gateway.base_url, api_key=key)
        for _ in range(3):
            reply = client.chat.completions.create(model="mock-model", messages=[{"role": "user", "content": "hi"}])
            assert reply.choices[0].message.content == ANSWER_TEXT
    with Session(engine) as session:
        assert session.exec(select(RequestLog)).all() == []
    engine.dispose()
    with start_gateway_thread(gateway_settings(url, tmp_path), config) as gateway:  # the control: budgets on
        with pytest.raises(openai.RateLimitError, match="exceeded your budget"):
            openai.OpenAI(base_url=gateway.base_url, api_key=key, max_retries=0).chat.completions.create(
                model="mock-model", messages=[{"role": "user", "content": "hi"}])


runner = CliRunner()


def test_bench_gateway_command_writes_json(tmp_path):
    out = tmp_path / "gateway.json"
    result = runner.invoke(app, ["bench", "gateway", "--system", "direct", "--concurrency", "1", "--requests", "3",
                                 "--warmup", "1", "--mode", "whole", "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert "added p50 ms" in result.output
    saved = json.loads(out.read_text())
    assert [(c["system"], c["mode"], c["concurrency"]) for c in saved["cells"]] == [("direct", "whole", 1)]


def test_bench_gateway_command_rejects_an_unknown_system():
    result = runner.invoke(app, ["bench", "gateway", "--system", "vllm"])
    assert result.exit_code == 2 and "vllm" in result.output
