"""The MMLU suite: loading, the paper's 5-shot prompt, both styles, seeded sampling, grading."""

from __future__ import annotations

import asyncio
import csv

import pytest

from evals.base import Answer, make_suite
from evals.suites.mmlu import CHAT_INSTRUCTION
from evals.targets import Completion
from tests.evals.fakes import FakeTarget



def write_csv(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows(rows)


@pytest.fixture()
def tiny_dir(tmp_path):
    """Two subjects: 3 dev rows each, 2 test rows each (one with a comma and a newline in the question)."""
    root = tmp_path / "mmlu" / "data"
    for subject in ("high_school_physics", "virology"):
        write_csv(root / "dev" / f"{subject}_dev.csv",
                  [[f"{subject} dev {i}?", "w", "x", "y", "z", "ABC"[i]] for i in range(3)])
        write_csv(root / "test" / f"{subject}_test.csv",
                  [[f"{subject} test 0, really?\nYes.", "1", "2", "3", "4", "D"],
                   [f"{subject} test 1?", "a", "b", "c", "d", "A"]])
    return tmp_path


def test_real_data(data_dir):
    suite = make_suite("mmlu", data_dir)
    test = suite.load("test")
    assert len(test) == 14079 and len({i.metadata["subject"] for i in test}) == 57
    assert len(suite.load("dev")) == 57 * 5
    assert test[0].id == "mmlu/test/abstract_algebra/0" and test[0].reference == "B"
    sample = suite.sample(test, 500)
    assert len(sample) == 500 and len({i.metadata["subject"] for i in sample}) > 40
    assert [i.id for i in make_suite("mmlu", data_dir, seed=0).sample(test, 500)] == [i.id for i in sample]
    assert [i.id for i in make_suite("mmlu", data_dir, seed=1).sample(test, 500)] != [i.id for i in sample]


def test_completion_prompt_is_the_papers_format(tiny_dir):
    suite = make_suite("mmlu", tiny_dir, shots=2, style="completion", scoring="generate")
    item = suite.load("test")[2]  # virology test 0
    kind, payload = suite.request(item)
    expected = ("The following are multiple choice questions (with answers) about virology.\n\n"
                "virology dev 0?\nA. w\nB. x\nC. y\nD. z\nAnswer: A\n\n"
                "virology dev 1?\nA. w\nB. x\nC. y\nD. z\nAnswer: B\n\n"
                "virology test 0, really?\nYes.\nA. 1\nB. 2\nC. 3\nD. 4\nAnswer:")
    assert kind == "completion" and payload["prompt"] == expected and payload["params"]["stop"] == ["\n"]
    assert item.id == "mmlu/test/virology/0" and item.reference == "D"
    assert item.metadata["subject"] == "virology"
    assert item.prompt == "virology test 0, really?\nYes.\nA. 1\nB. 2\nC. 3\nD. 4"
    header = make_suite("mmlu", tiny_dir, shots=0).prompt_text(suite.load("test")[0])
    assert header.startswith(
        "The following are multiple choice questions (with answers) about high school physics.\n\n")


def test_default_is_five_shot_and_dev_items_skip_themselves(tiny_dir):
    suite = make_suite("mmlu", tiny_dir, style="completion")
    assert suite.shots == 5
    assert suite.prompt_text(suite.load("test")[0]).count("\nAnswer: ") == 3  # all 3 dev rows
    dev_item = suite.load("dev")[1]
    text = suite.prompt_text(dev_item)
    assert text.count("high_school_physics dev 1?") == 1 and text.count("\nAnswer: ") == 2


def test_chat_shots_are_conversation_turns(tiny_dir):
    # Hand-written: two shots, each a user turn answered by its letter, then the item; the header and the
    # instruction open the first user turn (lm-evaluation-harness's --fewshot_as_multiturn layout).
    suite = make_suite("mmlu", tiny_dir, shots=2)
    kind, payload = suite.request(suite.load("test")[2])  # virology test 0
    assert kind == "chat" and payload["messages"] == [
        {"role": "user", "content": "The following are multiple choice questions (with answers) about virology. "
                                    "Reply with the letter of the correct option (A, B, C or D) only.\n\n"
                                    "virology dev 0?\nA. w\nB. x\nC. y\nD. z\nAnswer:"},
        {"role": "assistant", "content": "A"},
        {"role": "user", "content": "virology dev 1?\nA. w\nB. x\nC. y\nD. z\nAnswer:"},
        {"role": "assistant", "content": "B"},
        {"role": "user", "content": "virology test 0, really?\nYes.\nA. 1\nB. 2\nC. 3\nD. 4\nAnswer:"},
    ]
    zero_shot = make_suite("mmlu", tiny_dir, shots=0).request(suite.load("test")[2])[1]["messages"]
    assert zero_shot == [{"role": "user", "content": payload["messages"][0]["content"].split("\n\n")[0] + "\n\n"
                          + payload["messages"][-1]["content"]}]
    dev_item = suite.load("dev")[0]  # a dev item never shows itself as a shot
    assert [m["content"] for m in suite.request(dev_item)[1]["messages"] if m["role"] == "assistant"] == ["B", "C"]


def test_chat_answer_and_grade(tiny_dir):
    suite = make_suite("mmlu", tiny_dir, shots=1, scoring="generate")
    item = suite.load("test")[0]
    target = FakeTarget("fake", "The answer is (D) because 4 is largest.")
    answer = asyncio.run(suite.answer(item, target))
    kind, messages, params = target.requests[0]
    assert kind == "chat" and [m["role"] for m in messages] == ["user", "assistant", "user"]
    assert CHAT_INSTRUCTION in messages[0]["content"] and messages[-1]["content"].endswith("D. 4\nAnswer:")
    assert params["max_tokens"] == 32 and params["temperature"] == 0.0
    grade = asyncio.run(suite.grade(item, answer))
    assert grade.score == 1.0 and grade.details == {"extracted": "D", "gold": "D", "read": "text"}


@pytest.mark.parametrize("reply, score", [(" D", 1.0), ("D", 1.0), ("d)", 1.0), ("Answer: D", 1.0),
                                          (" A", 0.0), ("I do not know", 0.0), ("", 0.0)])
def test_grade_letters(tiny_dir, reply, score):
    suite = make_suite("mmlu", tiny_dir, style="completion", scoring="generate")
    item = suite.load("test")[0]
    assert asyncio.run(suite.grade(item, Answer([Completion(reply)]))).score == score


def test_logprob_scoring_requests_one_token_with_alternatives(tiny_dir):
    completion = make_suite("mmlu", tiny_dir, style="completion")
    assert completion.scoring == "logprob"
    assert completion.request(completion.load("test")[0])[1]["params"] == {"max_tokens": 1, "logprobs": 5}
    chat = make_suite("mmlu", tiny_dir)
    assert chat.request(chat.load("test")[0])[1]["params"] == {"max_tokens": 1, "logprobs": True, "top_logprobs": 20}
    with pytest.raises(ValueError, match="'logprob' or 'generate'"):
        make_suite("mmlu", tiny_dir, scoring="vote").scoring


@pytest.mark.parametrize("text, top, extracted, read", [
    # The greedy token says A, but D is the likeliest letter among the alternatives: D is read.
    (" A", [{" A": -1.2, " D": -0.9, " The": -0.5, "B": -3.0}], "D", "logprob"),
    # "Be" and "AB" are not letters; " C" is the only one.
    (" Be", [{" Be": -0.1, "AB": -0.2, " C": -4.0}], "C", "logprob"),
    # No letter among the alternatives: the text is read instead.
    ("The answer is D", [{"The": -0.1, " I": -2.0}], "D", "text"),
    # No logprobs returned (a server without them): the text.
    ("B", None, "B", "text"),
])
def test_logprob_grade(tiny_dir, text, top, extracted, read):
    suite = make_suite("mmlu", tiny_dir)
    item = suite.load("test")[0]  # gold D
    grade = asyncio.run(suite.grade(item, Answer([Completion(text, top_logprobs=top)])))
    assert grade.details == {"extracted": extracted, "gold": "D", "read": read}
    assert grade.score == float(extracted == "D")


def test_subjects_option_and_missing_data(tiny_dir, tmp_path):
    only = make_suite("mmlu", tiny_dir, subjects=["virology"]).load("test")
    assert {i.metadata["subject"] for i in only} == {"virology"}
    with pytest.raises(FileNotFoundError, match="mmlu/data/test/anatomy_test.csv"):
        make_suite("mmlu", tiny_dir, subjects=["anatomy"]).load("test")
    with pytest.raises(FileNotFoundError, match="mmlu/data/val"):
        make_suite("mmlu", tiny_dir).load("val")
    with pytest.raises(ValueError, match="splits"):
        make_suite("mmlu", tiny_dir).load("train")
