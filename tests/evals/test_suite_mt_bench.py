"""The MT-Bench suite on the real questions, end to end with a fake target and a fake judge.

    LINK_DATASETS_DIR=../shared/data .venv/bin/python -m pytest -q tests/evals/test_suite_mt_bench.py
"""

from __future__ import annotations

import asyncio
import collections

import pytest

from evals.base import make_suite
from evals.cache import EvalStore
from evals.runner import run_eval
from tests.evals.fakes import FakeTarget


def _reply(text: str) -> str:
    return f"reply to turn {2 if 'turn one reply' in text else 1}: turn one reply"


def _judge(turn1: int, turn2: int) -> FakeTarget:
    """Rates a first-turn judgment `turn1` and a conversation judgment `turn2`."""
    return FakeTarget("judge", lambda text: f"Fine. Rating: [[{turn2 if '(turn 2)' in text else turn1}]]", cost_usd=0.001)


def test_load_real_questions(data_dir):
    items = make_suite("mt-bench", data_dir).load("test")
    assert len(items) == 80 and items[0].id == "mt-bench/test/81"
    categories = collections.Counter(i.metadata["category"] for i in items)
    assert len(categories) == 8 and set(categories.values()) == {10}
    with_reference = [i for i in items if i.reference is not None]
    assert {i.metadata["category"] for i in with_reference} == {"math", "reasoning", "coding"}
    assert len(with_reference) == 30 and all(len(i.reference) == 2 for i in with_reference)
    assert all(len(i.metadata["turns"]) == 2 and i.prompt == i.metadata["turns"][0] for i in items)


def test_missing_data_names_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="question.jsonl"):
        make_suite("mt-bench", tmp_path).load("test")


def test_two_turns_with_history(data_dir):
    suite = make_suite("mt-bench", data_dir)
    item = suite.load("test")[0]
    target = FakeTarget("m", _reply)
    answer = asyncio.run(suite.answer(item, target))
    assert len(answer.completions) == 2 and len(target.requests) == 2
    first, second = target.requests[0][1], target.requests[1][1]
    assert first == [{"role": "user", "content": item.metadata["turns"][0]}]
    assert second == [{"role": "user", "content": item.metadata["turns"][0]},
                      {"role": "assistant", "content": answer.completions[0].text},
                      {"role": "user", "content": item.metadata["turns"][1]}]
    assert target.requests[0][2] == {"temperature": 0.0, "max_tokens": 1024}


def test_completion_style_transcript(data_dir):
    suite = make_suite("mt-bench", data_dir, style="completion")
    item = suite.load("test")[0]
    target = FakeTarget("base", "first answer")
    asyncio.run(suite.answer(item, target))
    (_, p1, params), (_, p2, _) = target.requests
    t1, t2 = item.metadata["turns"]
    assert p1 == f"### User:\n{t1}\n\n### Assistant:\n" and "stop" in params
    assert p2 == f"{p1}first answer\n\n### User:\n{t2}\n\n### Assistant:\n"


def test_grade_uses_references_and_averages_the_turns(data_dir):
    suite = make_suite("mt-bench", data_dir)
    items = suite.load("test")
    math = next(i for i in items if i.metadata["category"] == "math")
    judge = _judge(8, 5)
    answer = asyncio.run(suite.answer(math, FakeTarget("m", _reply)))
    grade = asyncio.run(suite.grade(math, answer, judge))
    assert grade.score == pytest.approx((8 + 5) / 2 / 10) and grade.details["ratings"] == [8.0, 5.0]
    assert grade.judge_cost_usd == pytest.approx(0.002)
    assert math.reference[0] in judge.requests[0][1][1]["content"]
    assert math.reference[1] in judge.requests[1][1][1]["content"]
    writing = items[0]
    judge = _judge(9, 9)
    asyncio.run(suite.grade(writing, answer, judge))
    assert "Reference" not in judge.requests[0][1][1]["content"]
    with pytest.raises(ValueError, match="judge"):
        asyncio.run(suite.grade(writing, answer, None))


def test_unparsable_judge_is_an_error(data_dir):
    suite = make_suite("mt-bench", data_dir)
    item = suite.load("test")[0]
    answer = asyncio.run(suite.answer(item, FakeTarget("m", _reply)))
    half = FakeTarget("judge", lambda text: "no rating" if "(turn 2)" in text else "Rating: [[6]]")
    assert asyncio.run(suite.grade(item, answer, half)).score == pytest.approx(0.6)
    grade = asyncio.run(suite.grade(item, answer, FakeTarget("judge", "I refuse")))
    assert grade.score == 0.0 and "no parsable rating" in grade.details["error"]


def test_end_to_end_with_cache(data_dir, tmp_path, sqlite_url):
    suite = make_suite("mt-bench", data_dir, seed=3)
    items = suite.sample(suite.load("test"), 6)
    target, judge = FakeTarget("m", _reply), _judge(7, 4)
    result = asyncio.run(run_eval(suite, items, [target], judge=judge, store=EvalStore(sqlite_url), progress=False,
                                  out_dir=tmp_path / "a"))
    totals = result.totals["m"]
    assert totals["n"] == 6 and totals["errors"] == 0 and totals["score"] == pytest.approx(0.55)
    assert totals["judge_cost_usd"] == pytest.approx(6 * 2 * 0.001) and totals["cost_usd"] == 0.0
    assert len(target.requests) == 12 and len(judge.requests) == 12
    assert [r.prompt for r in result.outcomes] == [i.prompt for i in items]
    again_target, again_judge = FakeTarget("m", _reply), _judge(1, 1)
    again = asyncio.run(run_eval(suite, items, [again_target], judge=again_judge, store=EvalStore(sqlite_url),
                                 progress=False, out_dir=tmp_path / "b"))
    assert again_target.requests == [] and again_judge.requests == []  # answers and verdicts come from the cache
    assert again.totals == result.totals
    with pytest.raises(ValueError, match="judge"):
        asyncio.run(run_eval(suite, items, [target], progress=False, out_dir=tmp_path / "c"))
