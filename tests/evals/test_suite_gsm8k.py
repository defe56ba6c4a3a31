"""The GSM8K suite: loading, gold numbers, few-shot prompts in both styles, grading."""

from __future__ import annotations

import asyncio
import json

import pytest

from evals.base import Answer, make_suite
from evals.suites.gsm8k import CHAT_INSTRUCTION, clean_solution, gold_number
from evals.targets import Completion
from tests.evals.fakes import FakeTarget



@pytest.fixture()
def tiny_dir(tmp_path):
    """A GSM8K folder with 4 train and 2 test rows."""
    folder = tmp_path / "gsm8k"
    folder.mkdir()
    train = [{"question": f"Train question {i}?", "answer": f"Step <<{i}+1={i + 1}>>{i + 1}.\n#### {i + 1}"}
             for i in range(4)]
    test = [{"question": "What is 1,000 + 234?", "answer": "1,000 + 234 = 1,234\n#### 1,234"},
            {"question": "Debt?", "answer": "It is -5.\n#### -5"}]
    for name, rows in (("train", train), ("test", test)):
        (folder / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return tmp_path


def test_real_data(data_dir):
    suite = make_suite("gsm8k", data_dir)
    test, train = suite.load("test"), suite.load("train")
    assert (len(test), len(train)) == (1319, 7473)
    assert test[17].id == "gsm8k/test/17"
    for item in test:  # the gold number, computed independently of the suite's parser
        raw = item.metadata["solution"].split("####")[-1].strip().replace(",", "")
        assert item.reference == float(raw)
    assert train[0].reference == 72  # Natalia's clips


def test_gold_and_cleaning():
    assert gold_number("so 2 + 2 = 4\n#### 4") == 4
    assert gold_number("#### 1,234") == 1234
    with pytest.raises(ValueError, match="####"):
        gold_number("no marker 5")
    assert clean_solution("48/2 = <<48/2=24>>24 clips\n#### 24") == "48/2 = 24 clips\n#### 24"


def test_completion_prompt(tiny_dir):
    suite = make_suite("gsm8k", tiny_dir, shots=2, style="completion", seed=3)
    item = suite.load("test")[0]
    kind, payload = suite.request(item)
    prompt = payload["prompt"]
    assert kind == "completion" and payload["params"]["stop"] == ["\n\nQuestion:", "\nQuestion:"]
    blocks = prompt.split("\n\n")
    assert len(blocks) == 3 and blocks[-1] == "Question: What is 1,000 + 234?\nAnswer:"
    for block in blocks[:2]:
        q, a = block.split("\nAnswer: ")
        i = int(q.removeprefix("Question: Train question ").rstrip("?"))
        assert a == f"Step {i + 1}.\n#### {i + 1}"  # calculator annotation removed
    assert suite.request(item) == (kind, payload)  # the same shots every time
    assert make_suite("gsm8k", tiny_dir, shots=0, style="completion").request(item)[1]["prompt"] == \
        "Question: What is 1,000 + 234?\nAnswer:"


def test_shots_exclude_the_item_and_depend_on_the_seed(tiny_dir):
    suite = make_suite("gsm8k", tiny_dir, shots=3, style="completion")
    for item in suite.load("train"):
        shot_questions = [q for q, _ in suite.shots_for(item)]
        assert len(shot_questions) == 3 and item.prompt not in shot_questions
    test_item = suite.load("test")[0]
    draws = {tuple(q for q, _ in make_suite("gsm8k", tiny_dir, shots=2, seed=s).shots_for(test_item))
             for s in range(20)}
    assert len(draws) > 1


def test_chat_request_and_grade(tiny_dir):
    suite = make_suite("gsm8k", tiny_dir, shots=1)
    item = suite.load("test")[0]
    target = FakeTarget("fake", "1,000 plus 234 is 1,234.\n#### 1,234")
    answer = asyncio.run(suite.answer(item, target))
    kind, messages, params = target.requests[0]
    assert kind == "chat" and [m["role"] for m in messages] == ["user", "assistant", "user"]
    assert messages[-1]["content"] == f"{CHAT_INSTRUCTION}\n\nWhat is 1,000 + 234?"
    assert messages[1]["content"].endswith("#### " + messages[1]["content"].rsplit("#### ", 1)[1])
    assert params == {"temperature": 0.0, "max_tokens": 320}
    grade = asyncio.run(suite.grade(item, answer))
    assert grade.score == 1.0 and grade.details == {"extracted": 1234.0, "gold": 1234.0}


@pytest.mark.parametrize("reply, score", [
    ("It is -5.\n#### -5", 1.0),
    ("The debt is $-5", 1.0),
    ("The debt is -$5", 1.0),
    ("It went from 10-5", 0.0),  # a hyphen after a digit is not a minus sign: the last number is 5
    ("The answer is -5.00.", 1.0),
    ("The answer is 5.", 0.0),
    ("", 0.0),
])
def test_grade_negative(tiny_dir, reply, score):
    suite = make_suite("gsm8k", tiny_dir)
    item = suite.load("test")[1]
    assert asyncio.run(suite.grade(item, Answer([Completion(reply)]))).score == score


def test_missing_data(tmp_path):
    with pytest.raises(FileNotFoundError, match="gsm8k/test.jsonl"):
        make_suite("gsm8k", tmp_path).load("test")
    with pytest.raises(ValueError, match="splits"):
        make_suite("gsm8k", tmp_path).load("val")


def test_base_models_get_four_shots_by_default(tiny_dir):
    # A base model needs worked examples to learn the "#### n" format; a chat model gets the instruction.
    assert make_suite("gsm8k", tiny_dir, style="completion").shots == 4
    assert make_suite("gsm8k", tiny_dir, style="chat").shots == 0
    assert make_suite("gsm8k", tiny_dir, style="completion", shots=0).shots == 0
