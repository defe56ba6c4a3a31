"""The HumanEval suite: all canonical solutions pass, wrong ones fail, chat replies are extracted."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import pytest

from evals.base import Answer, make_suite
from evals.suites.humaneval import API_STOP, build_program, extract_code, truncate_at_stop
from evals.targets import Completion
from tests.evals.fakes import FakeTarget



@pytest.fixture(scope="module")
def items(data_dir):
    return make_suite("humaneval", data_dir).load("test")


def grade(suite, item, text):
    return asyncio.run(suite.grade(item, Answer([Completion(text)])))


def test_load(items):
    assert len(items) == 164
    assert items[0].id == "humaneval/test/0" and items[163].id == "humaneval/test/163"
    assert items[0].metadata["entry_point"] == "has_close_elements"
    assert "def check(candidate)" in items[0].reference


def test_all_canonical_solutions_pass(data_dir, items):
    suite = make_suite("humaneval", data_dir, style="completion")
    with ThreadPoolExecutor(max_workers=2) as pool:
        grades = list(pool.map(lambda item: grade(suite, item, item.metadata["canonical_solution"]), items))
    failed = [(item.id, g.details) for item, g in zip(items, grades) if g.score != 1.0]
    assert failed == []


def test_wrong_and_broken_solutions_fail(data_dir, items):
    suite = make_suite("humaneval", data_dir, style="completion")
    wrong = grade(suite, items[0], "    return not any(True for _ in numbers)\n")
    assert wrong.score == 0.0 and wrong.details["status"] == "failed" and "AssertionError" in wrong.details["stderr"]
    assert grade(suite, items[0], "    return None(\n").details["status"] == "failed"  # syntax error
    slow = make_suite("humaneval", data_dir, style="completion", timeout_s=1.0)
    assert grade(slow, items[0], "    while True:\n        pass\n").details["status"] == "timeout"


def test_completion_request(data_dir, items):
    suite = make_suite("humaneval", data_dir, style="completion")
    target = FakeTarget("fake", items[2].metadata["canonical_solution"])
    answer = asyncio.run(suite.answer(items[2], target))
    kind, prompt, params = target.requests[0]
    assert kind == "completion" and prompt == items[2].prompt
    assert params["stop"] == API_STOP and len(API_STOP) <= 4 and params["temperature"] == 0.0 and params["max_tokens"] == 384
    assert grade(suite, items[2], answer.text).score == 1.0


def test_chat_replies(data_dir, items):
    suite = make_suite("humaneval", data_dir, style="chat")
    item = items[0]  # uses `List` from the prompt's imports
    function_only = ("Sure! Here it is:\n\n```python\n"
                     "def has_close_elements(numbers: List[float], threshold: float) -> bool:\n"
                     + item.metadata["canonical_solution"] + "```\nThis runs in O(n^2).")
    assert grade(suite, item, function_only).score == 1.0
    whole = f"```python\n{item.prompt}{item.metadata['canonical_solution']}```"
    assert grade(suite, item, whole).score == 1.0
    body_only = f"```python\n{item.metadata['canonical_solution']}```"
    assert grade(suite, item, body_only).score == 1.0
    assert grade(suite, item, "I cannot write this function.").score == 0.0
    target = FakeTarget("fake", "")
    asyncio.run(suite.answer(item, target))
    kind, messages, _ = target.requests[0]
    assert kind == "chat" and item.prompt in messages[0]["content"] and "```python" in messages[0]["content"]


def test_helpers():
    assert extract_code("```python\nx = 1\n```\n```python\ndef f():\n    pass\n```", "f") == "def f():\n    pass\n"
    assert extract_code("```\ny = 2\n```", "f") == "y = 2\n"
    assert extract_code("```python\ndef f():\n    return 1", "f") == "def f():\n    return 1"  # unclosed fence
    assert extract_code("def f(): pass", "f") == "def f(): pass"
    assert extract_code("```python\ndef f():\n    return 1\n\nif __name__ == '__main__':\n    print(input())\n```", "f") == \
        "def f():\n    return 1\n\n"
    assert build_program("def f():\n", "    return 1\n", "f", "completion") == "def f():\n    return 1\n"
    assert build_program("def f():\n    '''d'''\n", "```python\ndef f():\n    return 1\n```", "f", "chat") == \
        "def f():\n    '''d'''\n\n\ndef f():\n    return 1\n"


def test_missing_data(tmp_path):
    with pytest.raises(FileNotFoundError, match="human-eval/HumanEval.jsonl.gz"):
        make_suite("humaneval", tmp_path).load("test")


def test_completion_bodies_are_cut_at_every_stop_sequence():
    """The server stops at four sequences (the API's limit); the program is cut at the fifth ("\\n#") too."""
    body = "    return x + 1\n# a trailing comment\nprint(f(1))"
    assert truncate_at_stop(body) == "    return x + 1"
    assert truncate_at_stop("    return 1\n") == "    return 1\n"
    program = build_program("def f(x):\n", body, "f", "completion")
    assert program == "def f(x):\n    return x + 1"

