"""`link bench replicas`: Poisson arrivals, the workloads' prefix sharing (under the gateway's own prefix hashing and
the engine's KV blocks), the cell and pooled summaries against hand-computed values, the JSON shape, the placement on
cores, the gateway config through the real config loader, the load client against real servers on loopback, and one
end-to-end run on two SmolLM2 replicas (slow)."""

from __future__ import annotations

import asyncio
import json
import re
import sys

import numpy as np
import pytest
from typer.testing import CliRunner

from benchmarks.link_bench.mock_backend import USAGE
from benchmarks.link_bench.processes import ServerProcess, free_port
from benchmarks.link_bench.replica_fleet import MASTER_KEY, gateway_config, plan_cores, start_gateway
from benchmarks.link_bench.replica_load import ChatRecord, chat_body, open_loop
from benchmarks.link_bench.replica_workloads import no_prefix_prompts, poisson_arrivals, shared_prefix_prompts
from benchmarks.link_bench.replicas import finish, routing_order, tagged
from benchmarks.link_bench.replicas_report import (check_acceptance, compute_ratios, pool_cells, repeat_fraction,
                                                   summarize_cell)
from cli.app import app
from link.config import load_config
from link.replica_routing import CacheAwareRouter

REQUIRED = ("output_tok_per_s", "ttft_p50_s", "ttft_p99_s", "prefix_hit_rate", "requests", "errors")


def _shared_chunks(a: str, b: str) -> int:
    """Leading chained prefix hashes two chat prompts share under the gateway's cache-aware router (64-char chunks)."""
    router = CacheAwareRouter()
    ha, hb = (router.prefix_hashes(chat_body("m", text, 1)) for text in (a, b))
    return next((i for i, (x, y) in enumerate(zip(ha, hb)) if x != y), min(len(ha), len(hb)))


# -- arrivals --------------------------------------------------------------------------------------------------------

def test_poisson_arrivals_have_exponential_gaps_of_the_mean_rate():
    from scipy import stats

    rate, num = 2.0, 20_001
    offsets = poisson_arrivals(rate, num, seed=3)
    gaps = np.diff(offsets)
    assert offsets[0] == 0.0 and len(offsets) == num and np.all(gaps > 0)
    assert abs(gaps.mean() - 1 / rate) < 3 * (1 / rate) / np.sqrt(len(gaps))  # within 3 standard errors
    assert stats.kstest(gaps, "expon", args=(0, 1 / rate)).pvalue > 0.001
    counts = np.histogram(offsets, bins=np.arange(0, offsets[-1] // 1))[0]  # requests per 1 s window: Poisson(2)
    assert counts.var() / counts.mean() == pytest.approx(1.0, abs=0.1)
    assert poisson_arrivals(rate, 50, seed=3) == offsets[:50] and poisson_arrivals(rate, 50, seed=4) != offsets[:50]
    for bad in ((0.0, 5), (float("inf"), 5), (1.0, 0)):
        with pytest.raises(ValueError):
            poisson_arrivals(*bad)


# -- workloads -------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def shared(data_dir):
    return shared_prefix_prompts(data_dir, 600, seed=0)


def test_shared_prefix_prompts_share_their_subjects_header_and_shots(shared, data_dir):
    import csv

    assert len({p.group for p in shared}) == 57 and len({p.text for p in shared}) == 600
    by = {}
    for p in shared:
        by.setdefault(p.group, []).append(p.text)
    a, b = by["anatomy"][:2]
    with open(data_dir / "mmlu" / "data" / "dev" / "anatomy_dev.csv", encoding="utf-8", newline="") as f:
        last_shot = list(csv.reader(f))[-1]
    prefix_end = a.index(last_shot[0]) + len(last_shot[0])  # the header and all 5 shots come before this
    assert a.startswith("The following are multiple choice questions (with answers) about anatomy.")
    assert a[:prefix_end] == b[:prefix_end] and a != b
    # the gateway sees the shared few-shot prefix: every full chunk of it matches (the JSON wrapper adds 12 characters)
    assert _shared_chunks(a, b) >= (prefix_end + 12) // 64
    other = by["virology"][0]
    assert _shared_chunks(a, other) <= 1  # across subjects only the generic start of the header, within one chunk


def test_no_prefix_prompts_share_nothing_and_are_as_long(shared, data_dir):
    distinct = no_prefix_prompts(data_dir, 600, seed=0)
    first_chunks = {CacheAwareRouter().prefix_hashes(chat_body("m", text, 1))[0] for text in tagged(distinct, 1)}
    assert len(first_chunks) == 600 and len({p.group for p in distinct}) == 600
    questions = [q for p in distinct for q in re.split(r"\nAnswer:(?: [ABCD])?\n\n", p.text)[:6]]
    assert len(set(questions)) == len(questions) == 3600  # no question twice
    assert all(p.text.count("\nAnswer:") == 6 for p in distinct)
    mean_shared, mean_distinct = (np.mean([len(p.text) for p in ps]) for ps in (shared, distinct))
    assert 0.7 < mean_distinct / mean_shared < 1.3
    with pytest.raises(ValueError, match="MMLU's test split has"):
        no_prefix_prompts(data_dir, 3000)  # 18,000 questions of 13,950


def test_cell_tags_make_every_cell_start_cold_for_gateway_and_engine(shared):
    from benchmarks.link_bench.workload import prompt_renderer

    by = {}
    for p in shared:
        by.setdefault(p.group, []).append(p)
    same_subject = by["anatomy"][:2]
    cell_1, cell_2 = tagged(same_subject, 1), tagged(same_subject, 2)
    assert cell_1[0].startswith("[cell 01] ") and _shared_chunks(cell_1[0], cell_2[1]) == 0
    assert _shared_chunks(cell_1[0], cell_1[1]) > 10
    _, render = prompt_renderer("smollm2-135m-instruct")
    def shared_blocks(x: str, y: str) -> int:  # leading full 16-token KV blocks with equal token ids
        ids_x, ids_y = render(x), render(y)
        same = next((i for i, (s, t) in enumerate(zip(ids_x, ids_y)) if s != t), min(len(ids_x), len(ids_y)))
        return same // 16
    fixed = shared_blocks("[cell 01] x", "[cell 02] x")  # the chat template's system prompt, before any tag
    assert fixed <= 2
    assert shared_blocks(cell_1[0], cell_2[1]) == fixed  # another cell's same-subject prompt: nothing beyond it
    assert shared_blocks(cell_1[0], cell_1[1]) > fixed + 10  # within a cell: the few-shot prefix


def test_routing_order_alternates():
    assert [routing_order(r)[0] for r in (1, 2, 3)] == ["cache_aware", "fewest_outstanding", "cache_aware"]


# -- summaries -------------------------------------------------------------------------------------------------------

def _record(start, ttft, latency, prompt=100, out=16, error=None):
    return ChatRecord(start, start, None if error else ttft, latency, 0 if error else prompt, 0 if error else out, error)


def _state(hits, queries):
    return {"prefix_cache_hits": hits, "prefix_cache_queries": queries}


def test_cell_summary_by_hand():
    records = [_record(0.0, 1.0, 2.0), _record(1.0, 2.0, 3.0), _record(2.0, 3.0, 4.0), _record(3.0, 4.0, 5.0),
               _record(4.0, 0, 9.0, error="HTTP 503: busy")]
    cell = summarize_cell("shared_prefix", "cache_aware", 1, records, 10.0, [_state(0, 0), _state(10, 100)],
                          [_state(30, 300), _state(10, 200)], 0.4, ["a", "b", "a", "a", "c"])
    assert cell["requests"] == 5 and cell["errors"] == 1 and cell["error_samples"] == ["HTTP 503: busy"]
    assert cell["output_tok_per_s"] == pytest.approx(64 / 10.0) and cell["requests_per_s"] == pytest.approx(0.4)
    assert cell["ttft_p50_s"] == pytest.approx(2.5) and cell["ttft_p99_s"] == pytest.approx(1 + 0.99 * 3)
    assert cell["latency_p50_s"] == pytest.approx(3.5)
    assert cell["prefix_hit_rate"] == pytest.approx(30 / 400)  # (30 + 0) hits over (300 + 100) prompt tokens
    assert cell["replica_prompt_token_shares"] == pytest.approx([0.75, 0.25])
    assert cell["repeat_fraction"] == pytest.approx(2 / 5) == repeat_fraction(["a", "b", "a", "a", "c"])
    json.dumps(cell)


def _cell(workload, routing, rep, tokens, wall, ttfts, hits, queries, errors=0):
    records = [{"ttft_s": t, "latency_s": t + 1, "num_prompt_tokens": 500, "error": None} for t in ttfts]
    return {"workload": workload, "routing": routing, "repetition": rep, "requests": len(ttfts) + errors, "errors": errors,
            "offered_rate_per_s": 0.5, "duration_s": wall, "output_tokens": tokens, "output_tok_per_s": tokens / wall,
            "requests_per_s": len(ttfts) / wall, "ttft_p50_s": float(np.percentile(ttfts, 50)),
            "ttft_p99_s": float(np.percentile(ttfts, 99)), "prefix_cache_hits": hits, "prefix_cache_queries": queries,
            "prefix_hit_rate": hits / queries, "repeat_fraction": 0.5, "replica_prompt_token_shares": [0.5, 0.5],
            "records": records}


def _cells():
    cells = []
    for rep in (1, 2):
        cells += [_cell("shared_prefix", "cache_aware", rep, 160, 10.0, [1.0, 2.0], 600, 1000),
                  _cell("shared_prefix", "fewest_outstanding", rep, 160, 20.0, [3.0, 5.0], 100, 1000),
                  _cell("no_prefix", "cache_aware", rep, 160, 10.0, [2.0, 2.0], 10, 1000),
                  _cell("no_prefix", "fewest_outstanding", rep, 160, 10.0, [2.0, 2.0], 10, 1000)]
    return cells


def test_pooling_ratios_and_acceptance():
    pooled = pool_cells([c for c in _cells() if c["routing"] == "cache_aware" and c["workload"] == "shared_prefix"])
    assert pooled["requests"] == 4 and pooled["output_tok_per_s"] == pytest.approx(320 / 20.0)
    assert pooled["ttft_p50_s"] == pytest.approx(1.5) and pooled["prefix_hit_rate"] == pytest.approx(0.6)
    fewest = pool_cells([c for c in _cells() if c["routing"] == "fewest_outstanding" and c["workload"] == "shared_prefix"])
    ratios = compute_ratios(pooled, fewest)
    assert ratios["output_tok_per_s"] == pytest.approx(2.0) and ratios["ttft_p50_s"] == pytest.approx(1.5 / 4.0)
    assert ratios["per_repetition"][1] == {"repetition": 2, "output_tok_per_s": pytest.approx(2.0), "ttft_p50_s": pytest.approx(0.375)}
    even = {"output_tok_per_s": 1.0, "ttft_p50_s": 1.0}
    assert check_acceptance({"shared_prefix": {"output_tok_per_s": 1.1, "ttft_p50_s": 0.6}, "no_prefix": even}, 0)["met"]
    missed = check_acceptance({"shared_prefix": {"output_tok_per_s": 1.4, "ttft_p50_s": 0.61}, "no_prefix": even}, 0)
    assert missed["shared_prefix"] is False and missed["met"] is False
    assert check_acceptance({"shared_prefix": ratios, "no_prefix": {"output_tok_per_s": 0.89, "ttft_p50_s": 1.0}}, 0)["no_prefix"] is False
    assert check_acceptance({"shared_prefix": ratios, "no_prefix": even}, 1)["met"] is False
    assert check_acceptance({"shared_prefix": ratios}, 0) | {"targets": ""} == {
        "shared_prefix": True, "no_prefix": None, "no_errors": True, "met": False, "targets": ""}


def test_json_shape():
    result = finish({"cells": _cells(), "capacity": {"shared_prefix": {"errors": 0}, "no_prefix": {"errors": 0}}},
                    ["shared_prefix", "no_prefix"])
    data = json.loads(json.dumps(result))
    for routing in ("cache_aware", "fewest_outstanding"):
        assert all(data[routing][key] is not None for key in REQUIRED)
        assert all(key in data["no_prefix"][routing] for key in REQUIRED)
    assert data["cache_aware"]["prefix_hit_rate"] == pytest.approx(0.6)
    assert data["fewest_outstanding"]["output_tok_per_s"] == pytest.approx(320 / 40.0)
    assert data["acceptance"]["met"] is True and set(data["ratios"]) == {"shared_prefix", "no_prefix"}


# -- processes -------------------------------------------------------------------------------------------------------

def test_plan_cores():
    two = plan_cores([1, 0], 2)
    assert two.engines == [(0,), (1,)] and two.threads == 1 and two.rest == ()
    sixteen = plan_cores(range(16), 3)
    assert sixteen.engines == [(0, 1, 2, 3, 4), (5, 6, 7, 8, 9), (10, 11, 12, 13, 14)] and sixteen.threads == 5
    assert sixteen.rest == (15,)
    crowded = plan_cores([0, 1], 3)
    assert crowded.engines == [(0,), (1,), (0,)] and crowded.threads == 1
    assert plan_cores(range(8), 2, pin=False).engines == [None, None] and plan_cores(range(8), 2, pin=False).threads == 4
    with pytest.raises(ValueError):
        plan_cores([], 2)


def test_gateway_config_loads_as_replicas(tmp_path):
    import yaml

    path = tmp_path / "link.yaml"
    path.write_text(yaml.safe_dump(gateway_config("bench/m", "m", ["http://127.0.0.1:1", "http://127.0.0.1:2"], "cache_aware")))
    replicas = load_config(path).deployments("bench/m")
    assert [d.api_base for d in replicas] == ["http://127.0.0.1:1/v1", "http://127.0.0.1:2/v1"]
    assert replicas[0].replica_routing == "cache_aware" and {d.model for d in replicas} == {"m"}
    with pytest.raises(ValueError):
        gateway_config("bench/m", "m", ["http://127.0.0.1:1"], "round_robin")


@pytest.fixture(scope="module")
def mocks():
    servers = []
    for _ in range(2):
        port = free_port()
        servers.append(ServerProcess([sys.executable, "-m", "benchmarks.link_bench.mock_backend", "--port", str(port)], port))
    for server in servers:
        server.wait_healthy("/health", timeout_s=60)
    yield servers
    for server in servers:
        server.stop()


def test_open_loop_through_a_cache_aware_gateway_over_two_replicas(mocks, tmp_path):
    gateway = start_gateway(gateway_config("bench/mock", "mock-model", [m.url for m in mocks], "cache_aware"), tmp_path, None)
    try:
        gateway.wait_healthy(timeout_s=120)
        offsets = [0.0, 0.3, 0.6, 0.9]
        records, wall_s = asyncio.run(open_loop(gateway.url, {"Authorization": f"Bearer {MASTER_KEY}"}, "bench/mock",
                                                [f"question {i}" for i in range(4)], offsets, 7))
    finally:
        gateway.stop()
    assert [r.error for r in records] == [None] * 4, gateway.output()
    assert [r.num_output_tokens for r in records] == [USAGE["completion_tokens"]] * 4
    assert all(abs(r.start_s - o) < 0.25 for r, o in zip(records, offsets)) and wall_s >= 0.9
    assert all(0 < r.ttft_s <= r.latency_s for r in records)


def test_open_loop_records_failures_instead_of_raising(mocks):
    records, _ = asyncio.run(open_loop(mocks[0].url + "/nope", {}, "m", ["a"], [0.0], 4))  # the mock's 404
    assert not records[0].is_ok and records[0].error.startswith("HTTP 404")
    dead = f"http://127.0.0.1:{free_port()}"
    records, _ = asyncio.run(open_loop(dead, {}, "m", ["a", "b"], [0.0, 0.0], 4))
    assert [r.is_ok for r in records] == [False, False] and "ConnectError" in records[0].error
    with pytest.raises(ValueError):
        asyncio.run(open_loop(dead, {}, "m", ["a"], [0.0, 1.0], 4))


# -- end to end ------------------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_bench_replicas_command_on_two_smollm2_replicas(tmp_path):
    out = tmp_path / "replicas.json"
    # one capacity request per replica, and the 2 requests of a cell offered at twice that capacity: the second
    # arrives 1.07 / rate s after the first (this seed), 17 s at 0.8 x capacity on a busy 2-core machine
    result = CliRunner().invoke(app, ["bench", "replicas", "--replicas", "2", "--requests", "2", "--repetitions", "1",
                                      "--capacity-requests", "2", "--rate-fraction", "2", "--max-tokens", "2",
                                      "--workload", "shared_prefix", "--json", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    for routing in ("cache_aware", "fewest_outstanding"):
        assert data[routing]["requests"] == 2 and data[routing]["errors"] == 0
        assert data[routing]["output_tok_per_s"] > 0 and 0 <= data[routing]["prefix_hit_rate"] < 1
    assert data["kv_cache"]["block_size"] == 16 and data["pinning"]["threads_per_engine"] >= 1
    assert data["capacity"]["shared_prefix"]["requests"] == 2 and data["settings"]["rate_fraction"] == 2.0
    assert "cache_aware / fewest_outstanding" in result.output


def test_cache_replay_counts_the_engines_prefix_hits_by_hand():
    from benchmarks.link_bench.replica_cache_replay import replay_prefix_cache

    a, b = list(range(48)), list(range(100, 148))  # 3 full 16-token blocks each
    # 6 of the gateway's 64-character chunks: past the 4 a remembered prefix needs to decide (`min_gain_chunks`)
    text_a, text_b = "a" * 400, "b" * 400
    two = replay_prefix_cache([a, a, b], [text_a, text_a, text_b], num_replicas=2, num_blocks=100)
    # cache-aware sends the second `a` where the first went: its first 2 blocks hit (never the last token's block)
    assert two["cache_aware"]["prefix_hit_rate"] == pytest.approx(32 / 144)
    assert two["cache_aware"]["prefilled_tokens_per_request"] == pytest.approx((144 - 32) / 3)
    assert two["fewest_outstanding"]["prefix_hit_rate"] == 0.0  # in turn: the second `a` lands on the other replica
    assert two["fewest_outstanding"]["replica_request_shares"] == pytest.approx([2 / 3, 1 / 3])
    # one replica whose cache holds one prompt: a, b, a, b evict each other (LRU); twice the room keeps both
    alternating = ([a, b, a, b], [text_a, text_b, text_a, text_b])
    assert replay_prefix_cache(*alternating, num_replicas=1, num_blocks=3)["fewest_outstanding"]["prefix_hit_rate"] == 0.0
    assert replay_prefix_cache(*alternating, num_replicas=1, num_blocks=6)["fewest_outstanding"]["prefix_hit_rate"] == \
        pytest.approx(64 / 192)
