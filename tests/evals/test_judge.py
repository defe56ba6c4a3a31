"""evals.judge: verdict parsing on the real recorded GPT-4 judgments, hand cases, prompts, both-order pairwise.

    LINK_DATASETS_DIR=../shared/data .venv/bin/python -m pytest -q tests/evals/test_judge.py
"""

from __future__ import annotations

import asyncio
import json

import pytest

from evals.judge import (compare_both_orders, multi_turn_messages, pairwise_messages, parse_rating, parse_verdict,
                         rate, single_answer_messages)
from tests.evals.fakes import FakeTarget

JUDGMENT_FILES = ("routellm/routellm/evals/mt_bench/judgements.jsonl", "routellm/benchmarks/mt-bench/gpt-4_single.jsonl")


@pytest.mark.parametrize("relative", JUDGMENT_FILES)
def test_parses_every_recorded_judgment(data_dir, relative):
    """Each recorded `judgment` text parses to its recorded `score`; a score of -1 (FastChat: unparsable) gives None."""
    rows = [json.loads(line) for line in (data_dir / relative).read_text().splitlines() if line.strip()]
    assert len(rows) == 320  # 80 questions x 2 turns x 2 models
    mismatches = []
    for row in rows:
        expected = None if row["score"] == -1 else float(row["score"])
        if parse_rating(row["judgment"]) != expected:
            mismatches.append((row["question_id"], row["turn"], row["score"], row["judgment"][-120:]))
    assert mismatches == []
    unparsable = sum(1 for r in rows if r["score"] == -1)
    assert unparsable == (1 if "gpt-4_single" in relative else 0)
    assert {float(r["score"]) for r in rows} >= {10.0, 9.0, 8.5}  # decimals occur in the real data


@pytest.mark.parametrize("text, expected", [
    ("Good answer. Rating: [[7]]", 7.0),
    ("Rating: [[8.5]]", 8.5),
    ("[[ 3 ]]", 3.0),
    ("An early [[2]] in the explanation, then the verdict.\nRating: [[9]]", 9.0),  # the last [[N]] counts
    ("Rating: 6/10", 6.0),
    ("**Rating:** 4", 4.0),
    ("I give it [5].", 5.0),
    ("Rating: [[7/10]]", 7.0),
    ("Rating: [[11]]", None),
    ("Rating: [[0]]", None),
    ("The answer is fine but I will not score it.", None),
    ("", None),
])
def test_parse_rating_hand_cases(text, expected):
    assert parse_rating(text) == expected


@pytest.mark.parametrize("text, expected", [
    ("A is more accurate. [[A]]", "A"), ("[[b]]", "B"), ("Equally good: [[C]]", "C"), ("[[tie]]", "C"),
    ("First I thought [[A]] but on reflection [[B]]", "B"), ("Response A is better.", None), ("[A]", None),
])
def test_parse_verdict_hand_cases(text, expected):
    assert parse_verdict(text) == expected


def test_prompts_carry_question_answer_and_reference():
    without = single_answer_messages("What is 2+2?", "4")
    with_ref = single_answer_messages("What is 2+2?", "5", reference="4")
    assert "[Question]\nWhat is 2+2?" in without[1]["content"] and "Reference" not in without[1]["content"]
    assert "[Reference answer]\n4" in with_ref[1]["content"] and "[Assistant's answer]\n5" in with_ref[1]["content"]
    assert "Rating: [[N]]" in without[1]["content"]
    turns = multi_turn_messages(["q1", "q2"], ["a1", "a2"], references=["r1", "r2"])[1]["content"]
    assert turns.index("q1") < turns.index("a1") < turns.index("q2") < turns.index("a2")
    assert "[Reference answer to the final question]\nr2" in turns and "r1" not in turns
    with pytest.raises(ValueError):
        multi_turn_messages(["q1", "q2"], ["a1"])
    pair = pairwise_messages("Say hi", "hello", "hey")[1]["content"]
    assert pair.index("[Response A]\nhello") < pair.index("[Response B]\nhey") and "[[C]]" in pair


def _judge(choose) -> FakeTarget:
    """A judge that reads the two responses of a pairwise prompt and answers choose(a, b)."""
    def answer(text: str) -> str:
        a = text.split("[Response A]\n")[1].split("\n\n[Response B]")[0]
        b = text.split("[Response B]\n")[1]
        return f"My comparison. {choose(a, b)}"
    return FakeTarget("judge", answer, cost_usd=0.5)


@pytest.mark.parametrize("choose, score, verdicts", [
    (lambda a, b: "[[A]]" if a == "MODEL" else "[[B]]", 1.0, ("A", "B")),        # the model wins in both orders
    (lambda a, b: "[[A]]", 0.5, ("A", "A")),                                     # pure position bias cancels out
    (lambda a, b: "[[C]]", 0.5, ("C", "C")),                                     # tie
    (lambda a, b: "[[B]]" if a == "MODEL" else "[[A]]", 0.0, ("B", "A")),        # the baseline wins
    (lambda a, b: "[[A]]" if a == "MODEL" else "[[C]]", 0.75, ("A", "C")),       # win + tie
    (lambda a, b: "no verdict" if a == "MODEL" else "[[B]]", 1.0, (None, "B")),  # one order unparsable: the other counts
])
def test_compare_both_orders(choose, score, verdicts):
    judge = _judge(choose)
    result = asyncio.run(compare_both_orders(judge, "Say hi", "MODEL", "BASELINE"))
    calls = 2 + verdicts.count(None)  # an order without a verdict gets one follow-up turn
    assert result.score == score and result.verdicts == verdicts and result.cost_usd == 0.5 * calls
    assert len(judge.requests) == calls and result.is_parsed


def test_an_echoed_prompt_is_not_a_verdict():
    rating_prompt = single_answer_messages("What is 2+2?", "4")[1]["content"]
    pair_prompt = pairwise_messages("Say hi", "hello", "hey")[1]["content"]
    assert parse_rating("You said: " + " ".join(rating_prompt.split())) is None
    assert parse_verdict(pair_prompt) is None
    assert parse_verdict(pair_prompt + "\nMy verdict: [[B]]") == "B"
    assert parse_rating(rating_prompt + "\nRating: [[3]]") == 3.0


def test_compare_both_orders_unparsable():
    result = asyncio.run(compare_both_orders(_judge(lambda a, b: "hmm"), "Say hi", "MODEL", "BASELINE"))
    assert result.score == 0.5 and result.verdicts == (None, None) and not result.is_parsed


def _rambling_judge(follow_up_answer: str) -> FakeTarget:
    """A judge whose judgment never states a verdict; asked again, it answers `follow_up_answer`."""
    def answer(text: str) -> str:
        return follow_up_answer if text.rstrip().endswith(("1 to 10.", "C for a tie.")) else "It is a fine answer overall."
    return FakeTarget("judge", answer, cost_usd=0.25)


@pytest.mark.parametrize("follow_up, expected", [('{"rating": 7}', 7.0), ('{"rating": 11}', None), ("seven", None)])
def test_a_judgment_without_rating_gets_a_json_follow_up(follow_up, expected):
    judge = _rambling_judge(follow_up)
    messages = single_answer_messages("What is 2+2?", "4")
    rating, completion = asyncio.run(rate(judge, messages))
    assert rating == expected
    assert len(judge.requests) == 2 and completion.cost_usd == 0.5
    assert completion.text == "It is a fine answer overall."  # the judgment is what the report shows
    _, history, params = judge.requests[1]
    assert history[: len(messages)] == messages
    assert history[len(messages)] == {"role": "assistant", "content": "It is a fine answer overall."}
    schema = params["response_format"]["json_schema"]["schema"]
    assert params["response_format"]["type"] == "json_schema"
    assert schema["properties"]["rating"]["enum"] == list(range(1, 11)) and schema["required"] == ["rating"]


def test_a_parsable_judgment_needs_no_follow_up():
    judge = FakeTarget("judge", "Correct and clear.\nRating: [[9]]")
    rating, _ = asyncio.run(rate(judge, single_answer_messages("What is 2+2?", "4")))
    assert rating == 9.0 and len(judge.requests) == 1


def test_a_pairwise_judgment_without_verdict_gets_a_json_follow_up():
    judge = _rambling_judge('{"verdict": "B"}')
    result = asyncio.run(compare_both_orders(judge, "Say hi", "MODEL", "BASELINE"))
    # B in both orders: the baseline wins as B in the first order, the model wins as B in the second.
    assert result.verdicts == ("B", "B") and result.score == 0.5 and result.cost_usd == 1.0
    assert [p["response_format"]["json_schema"]["schema"]["properties"]["verdict"]["enum"]
            for _, _, p in judge.requests if "response_format" in p] == [["A", "B", "C"]] * 2
