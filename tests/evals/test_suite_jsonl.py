"""The JSONL suite: rows with each grader, chat and completion requests, and clear errors."""

from __future__ import annotations

import asyncio
import json

import pytest

from evals.base import Answer, make_suite
from evals.targets import Completion
from tests.evals.fakes import FakeTarget

ROWS = [
    {"id": "capital", "prompt": "Capital of France?", "reference": "Paris", "grader": "exact", "topic": "geo"},
    {"prompt": "Name a primary colour.", "reference": "red", "grader": "contains"},
    {"prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "12 * 12?"}],
     "reference": 144, "grader": "numeric", "max_tokens": 8},
    {"prompt": "Which is a fruit? A. carrot B. apple C. leek D. kale", "reference": "B", "grader": "choice"},
    {"prompt": "Give an order id.", "reference": r"^ORD-\d{3}$", "grader": "regex"},
    {"prompt": "JSON with a=1", "reference": {"a": 1}, "grader": "json"},
]
REPLIES = ["paris", "My favourite is Red.", "It is 144.", "The answer is B.", "ORD-123", '```json\n{"a": 1}\n```']
WRONG = ["Lyon", "Green.", "It is 124.", "A", "order 123", '{"a": 2}']



def write(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


@pytest.fixture()
def suite_file(tmp_path):
    return write(tmp_path / "mine.jsonl", [*ROWS[:2], "", *ROWS[2:]])  # a blank line is skipped


def grade(suite, item, text):
    return asyncio.run(suite.grade(item, Answer([Completion(text)]))).score


def test_load_and_grade(suite_file, tmp_path):
    suite = make_suite("jsonl", tmp_path, path=str(suite_file))
    items = suite.load("test")
    assert [i.id for i in items] == ["jsonl/mine/capital", "jsonl/mine/2", "jsonl/mine/4", "jsonl/mine/5",
                                     "jsonl/mine/6", "jsonl/mine/7"]  # line numbers
    assert items[0].metadata["topic"] == "geo" and items[2].prompt == "12 * 12?"
    assert [grade(suite, i, r) for i, r in zip(items, REPLIES)] == [1.0] * 6
    assert [grade(suite, i, r) for i, r in zip(items, WRONG)] == [0.0] * 6


def test_requests(suite_file, tmp_path):
    chat = make_suite("jsonl", tmp_path, path=str(suite_file))
    items = chat.load("test")
    target = FakeTarget("fake", "x")
    asyncio.run(chat.answer(items[0], target))
    asyncio.run(chat.answer(items[2], target))
    (_, first, p1), (_, second, p2) = target.requests
    assert first == [{"role": "user", "content": "Capital of France?"}] and p1["max_tokens"] == 512
    assert second == ROWS[2]["prompt"] and p2["max_tokens"] == 8
    completion = make_suite("jsonl", tmp_path, path=str(suite_file), style="completion", max_tokens=64)
    target = FakeTarget("fake", "x")
    asyncio.run(completion.answer(items[0], target))
    asyncio.run(completion.answer(items[2], target))
    (_, plain, p3), (_, transcript, _) = target.requests
    assert plain == "Capital of France?" and p3["max_tokens"] == 64
    assert transcript == "System: Be brief.\n\nUser: 12 * 12?\n\nAssistant:"


def test_relative_path_against_data_dir(tmp_path, monkeypatch):
    write(tmp_path / "mine.jsonl", ROWS[:1])
    monkeypatch.chdir(tmp_path.parent)
    assert len(make_suite("jsonl", tmp_path, path="mine.jsonl").load("test")) == 1


@pytest.mark.parametrize("rows, message", [
    ([{**ROWS[0], "grader": "fuzzy"}],
     r"mine.jsonl:1: unknown grader 'fuzzy'; available: choice, contains, exact, json, numeric, regex"),
    ([ROWS[0], {"prompt": "p", "reference": "r"}], r"mine.jsonl:2: a row needs the fields prompt, reference, grader"),
    (["{not json"], r"mine.jsonl:1: not JSON"),
    ([{**ROWS[0], "prompt": 3}], r"mine.jsonl:1: prompt must be"),
    ([ROWS[0], ROWS[0]], r"mine.jsonl:2: duplicate id 'capital'"),
    ([{**ROWS[4], "reference": "(unclosed"}], r"mine.jsonl:1: bad reference for the 'regex' grader"),
    ([{**ROWS[2], "reference": "many"}], r"mine.jsonl:1: bad reference for the 'numeric' grader"),
    ([{**ROWS[3], "reference": "B or C"}], r"mine.jsonl:1: bad reference for the 'choice' grader"),
    ([ROWS[0], {**ROWS[1], "max_tokens": 0}], r"mine.jsonl:2: max_tokens must be an integer >= 1, got 0"),
    ([{**ROWS[1], "max_tokens": "many"}], r"mine.jsonl:1: max_tokens must be an integer >= 1"),
    ([], r"no rows in .*mine.jsonl"),
    (["", "  "], r"no rows in .*mine.jsonl"),
])
def test_bad_rows(tmp_path, rows, message):
    path = write(tmp_path / "mine.jsonl", rows)
    with pytest.raises(ValueError, match=message):
        make_suite("jsonl", tmp_path, path=str(path)).load("test")


def test_missing_file_and_option(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        make_suite("jsonl", tmp_path, path=str(tmp_path / "nope.jsonl")).load("test")
    with pytest.raises(ValueError, match="pass --path FILE"):
        make_suite("jsonl", tmp_path).load("test")
    write(tmp_path / "ok.jsonl", ROWS[:1])
    with pytest.raises(ValueError, match="max_tokens option must be an integer >= 1"):
        make_suite("jsonl", tmp_path, path=str(tmp_path / "ok.jsonl"), max_tokens=0).load("test")
