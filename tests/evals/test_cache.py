"""evals.cache (EvalStore, CachedTarget) and the eval tables, on SQLite and PostgreSQL.

    .venv/bin/python -m pytest -q tests/evals/test_cache.py     # PostgreSQL at 127.0.0.1:5432, else those skip
"""

from __future__ import annotations

import asyncio
from dataclasses import asdict

import pytest
from sqlalchemy import inspect

from evals.cache import CachedTarget, EvalStore, cache_key
from evals.outcomes import Outcome, OutcomeTable
from evals.targets import Completion
from link.db.migrate import current_revision, head_revision
from tests.evals.fakes import FakeTarget


def test_migration_creates_the_eval_tables(eval_db_url):
    store = EvalStore(eval_db_url)
    assert {"eval_run", "eval_cache", "eval_report"} <= set(inspect(store.engine).get_table_names())
    assert current_revision(store.engine) == head_revision() == "0008"
    EvalStore(eval_db_url).close()  # a second open is a no-op migration
    store.close()


def test_cache_round_trip_and_first_writer_wins(eval_db_url):
    store = EvalStore(eval_db_url)
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    completion = Completion(text="héllo", tool_calls=[call],
                            finish_reason="tool_calls", model="m", prompt_tokens=3, completion_tokens=1, cost_usd=1.5e-6,
                            latency_s=0.25)
    assert store.get_cached("k" * 64) is None
    store.put_cached("k" * 64, target="m", suite="s", item_id="s/test/1", response=asdict(completion))
    store.put_cached("k" * 64, target="m", suite="s", item_id="s/test/1", response={"text": "second"})
    assert Completion(**store.get_cached("k" * 64)) == completion
    store.close()


def test_runs_and_outcomes(eval_db_url, tmp_path):
    store = EvalStore(eval_db_url)
    path = OutcomeTable([Outcome("s/test/0", "s", "q", "m", 1.0, 0.01)]).write(tmp_path / "outcomes.jsonl")
    store.save_run({"id": "run-a", "suite": "s", "split": "test", "targets": ["m"], "params": {"limit": 1}})
    store.save_run({"id": "run-b", "suite": "s", "targets": ["m", "n"]})
    store.save_run({"id": "run-a", "status": "finished", "totals": {"m": {"score": 1.0}}, "outcomes_path": path})
    run = store.get_run("run-a")
    assert run["status"] == "finished" and run["totals"] == {"m": {"score": 1.0}} and run["params"] == {"limit": 1}
    assert run["created_at"].tzinfo is not None
    assert {r["id"] for r in store.list_runs()} == {"run-a", "run-b"}
    table = store.load_run_outcomes("run-a")
    assert [(r.prompt_id, r.model, r.score) for r in table] == [("s/test/0", "m", 1.0)]
    with pytest.raises(KeyError, match="no eval run"):
        store.load_run_outcomes("missing")
    with pytest.raises(FileNotFoundError):
        store.load_run_outcomes("run-b")
    with pytest.raises(ValueError, match="status"):
        store.save_run({"id": "run-a", "status": "done"})
    store.close()


def test_reports_keep_their_bytes(eval_db_url):
    store = EvalStore(eval_db_url)
    png = bytes(range(256)) * 4
    report_id = store.save_report(title="gsm8k", run_ids=["a", "b"], markdown="| m | 1 |", data={"rows": [1, 2]}, png=png)
    report = store.get_report(report_id)
    assert report["png"] == png and report["run_ids"] == ["a", "b"] and report["data"] == {"rows": [1, 2]}
    assert store.get_report("nope") is None
    store.close()


def test_cache_key_is_canonical_and_covers_every_field():
    base = ("m", "gsm8k", "gsm8k/test/1", "chat", [{"role": "user", "content": "q"}], {"temperature": 0, "max_tokens": 5})
    key = cache_key(*base)
    assert len(key) == 64 and key == cache_key(*base[:5], {"max_tokens": 5, "temperature": 0})  # param order is irrelevant
    variants = [("n",) + base[1:], base[:1] + ("mmlu",) + base[2:], base[:2] + ("gsm8k/test/2",) + base[3:],
                base[:3] + ("completion",) + base[4:], base[:4] + ([{"role": "user", "content": "q2"}],) + base[5:],
                base[:5] + ({"temperature": 0.7, "max_tokens": 5},)]
    assert len({cache_key(*v) for v in variants} | {key}) == len(variants) + 1


def test_cached_target_serves_hits_without_calling(sqlite_url):
    store = EvalStore(sqlite_url)
    backend = FakeTarget("m", "reply", cost_usd=0.25)
    messages = [{"role": "user", "content": "hello"}]

    async def go():
        first = CachedTarget(backend, store, "s", "s/test/0")
        a = await first.chat(messages, max_tokens=5)
        second = CachedTarget(backend, store, "s", "s/test/0")
        b = await second.chat(messages, max_tokens=5)
        c = await second.chat(messages, max_tokens=6)  # other params: a miss
        d = await second.complete("hello", max_tokens=5)  # other kind: a miss
        return first, second, a, b, c, d

    first, second, a, b, c, d = asyncio.run(go())
    assert a == b and b.cost_usd == 0.25 and b.text == "reply"
    assert (first.hits, first.misses, second.hits, second.misses) == (0, 1, 1, 2)
    assert len(backend.requests) == 3


def test_default_store_follows_link_settings(link_home):
    store = EvalStore()
    assert store.database_url == f"sqlite:///{link_home / 'link.db'}" and (link_home / "link.db").exists()
    store.close()
