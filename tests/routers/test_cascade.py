"""Cascade over a fake model caller: accept, escalate, skip on predicted quality, a failing step, streaming
only the final answer; the judge's P(yes); the offline replay; a whole answer re-chunked."""

from __future__ import annotations

import asyncio
import math

import numpy as np
import pytest

from routers.calls import chunks_from_response, response_text
from routers.cascade import Cascade, CascadeTrace, JudgeScorer, PredictedQuality, judge_probability, replay_cascade

HI = {"messages": [{"role": "user", "content": "What is 2 + 3?"}], "max_tokens": 50, "stream": True}


def answer(model: str, text: str) -> dict:
    return {"id": "r1", "object": "chat.completion", "created": 5, "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 9, "completion_tokens": 2}}


class FakeCaller:
    """Fixed answers per model (an Exception is raised); the judge says `verdict`."""

    def __init__(self, answers: dict, verdict: str = "yes"):
        self.answers, self.verdict = answers, verdict
        self.calls: list[tuple[str, dict]] = []
        self.streamed: list[str] = []

    async def complete(self, model, body):
        self.calls.append((model, body))
        if model == "judge":
            return answer("judge", self.verdict)
        if isinstance(self.answers[model], Exception):
            raise self.answers[model]
        return answer(model, self.answers[model])

    async def stream(self, model, body):
        self.streamed.append(model)
        for piece in ("strong", " answer"):
            yield {"model": model, "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": piece}}]}


def run(coro):
    return asyncio.run(coro)


def collect(cascade, caller, body, trace):
    async def go():
        return [c async for c in cascade.stream(caller, body, trace)]
    return run(go())


def test_an_accepted_cheap_answer_is_final_and_the_strong_model_is_never_called():
    caller = FakeCaller({"cheap": "5", "strong": "five"}, verdict="Yes.")
    trace = CascadeTrace()
    response = run(Cascade(["cheap", "strong"], JudgeScorer("judge", use_logprobs=False), 0.5).complete(caller, HI, trace))
    assert response_text(response) == "5" and [m for m, _ in caller.calls] == ["cheap", "judge"]
    assert "stream" not in caller.calls[0][1] and caller.calls[0][1]["max_tokens"] == 50
    judged = caller.calls[1][1]["messages"][1]["content"]
    assert "Request:\nWhat is 2 + 3?" in judged and "Answer:\n5" in judged
    assert trace.answered_by == "cheap" and trace.to_dict()["steps"][0]["score"] == 1.0


def test_a_rejected_answer_escalates_and_the_last_model_answers():
    caller = FakeCaller({"cheap": "6", "mid": "7", "strong": "5"}, verdict="no")
    trace = CascadeTrace()
    response = run(Cascade(["cheap", "mid", "strong"], JudgeScorer("judge"), [0.5, 0.9]).complete(caller, HI, trace))
    assert response_text(response) == "5"
    assert [m for m, _ in caller.calls] == ["cheap", "judge", "mid", "judge", "strong"]
    steps = trace.to_dict()["steps"]
    assert [(s["model"], s["threshold"], s["score"], s["accepted"]) for s in steps] == [
        ("cheap", 0.5, 0.0, False), ("mid", 0.9, 0.0, False), ("strong", None, None, True)]
    assert caller.calls[1][1]["logprobs"] is True and caller.calls[1][1]["top_logprobs"] == 5


def test_predicted_quality_skips_a_step_without_calling_it():
    caller = FakeCaller({"cheap": "6", "strong": "5"})
    predicted = {"cheap": 0.3, "strong": 0.9}
    trace = CascadeTrace()
    response = run(Cascade(["cheap", "strong"], PredictedQuality(lambda body: predicted), 0.5).complete(caller, HI, trace))
    assert response_text(response) == "5" and [m for m, _ in caller.calls] == ["strong"]
    assert trace.steps[0].skipped and trace.steps[0].score == 0.3 and trace.answered_by == "strong"
    predicted["cheap"] = 0.6
    caller = FakeCaller({"cheap": "6", "strong": "5"})
    assert response_text(run(Cascade(["cheap", "strong"], PredictedQuality(lambda body: predicted), 0.5)
                             .complete(caller, HI))) == "6"


def test_a_failing_step_escalates_and_a_failing_last_step_raises():
    caller = FakeCaller({"cheap": RuntimeError("down"), "strong": "5"})
    trace = CascadeTrace()
    assert response_text(run(Cascade(["cheap", "strong"], JudgeScorer("judge"), 0.5).complete(caller, HI, trace))) == "5"
    assert trace.steps[0].error == "RuntimeError: down" and not trace.steps[0].accepted
    caller = FakeCaller({"cheap": "6", "strong": RuntimeError("also down")}, verdict="no")
    with pytest.raises(RuntimeError, match="also down"):
        run(Cascade(["cheap", "strong"], JudgeScorer("judge"), 0.5).complete(caller, HI))


def test_stream_sends_only_the_final_answer():
    accepted = collect(Cascade(["cheap", "strong"], JudgeScorer("judge"), 0.5), FakeCaller({"cheap": "5", "strong": "x"}),
                       HI, CascadeTrace())
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in accepted if c["choices"])
    assert text == "5" and accepted[-1]["usage"] == {"prompt_tokens": 9, "completion_tokens": 2}
    caller = FakeCaller({"cheap": "6", "strong": "x"}, verdict="no")
    escalated = collect(Cascade(["cheap", "strong"], JudgeScorer("judge"), 0.5), caller, HI, CascadeTrace())
    assert "".join(c["choices"][0]["delta"]["content"] for c in escalated) == "strong answer"
    assert caller.streamed == ["strong"] and [m for m, _ in caller.calls] == ["cheap", "judge"]


def test_judge_probability_from_logprobs_or_text():
    lp_yes, lp_no = -0.1, -2.3
    verdict = {"choices": [{"message": {"content": "Yes"}, "logprobs": {"content": [
        {"token": "Yes", "logprob": lp_yes, "top_logprobs": [{"token": "Yes", "logprob": lp_yes}, {"token": " no", "logprob": lp_no},
                                                             {"token": "Maybe", "logprob": -4.0}]}]}}]}
    assert judge_probability(verdict) == pytest.approx(math.exp(lp_yes) / (math.exp(lp_yes) + math.exp(lp_no)))
    assert judge_probability(answer("j", "yes, it is")) == 1.0 and judge_probability(answer("j", "No")) == 0.0
    unrelated = {"choices": [{"message": {"content": "YES"}, "logprobs": {"content": [{"token": "Sure", "logprob": 0.0}]}}]}
    assert judge_probability(unrelated) == 1.0  # no yes/no among the candidates: the text decides


def test_replay_cascade_hand_checked():
    scores = np.array([[0.9, 0.1, 0.0], [0.2, 0.8, 0.0], [0.1, 0.2, 0.0]])
    costs = np.array([[1.0, 10.0, 100.0], [1.0, 10.0, 100.0], [1.0, 10.0, np.nan]])
    answered, cost = replay_cascade(scores, costs, [0.5, 0.7])
    assert answered.tolist() == [0, 1, 2]
    assert np.isnan(cost[2]) and cost[:2].tolist() == [1.0, 11.0]
    answered, cost = replay_cascade(scores[:2], costs[:2], 0.5, pays_rejected=False)
    assert answered.tolist() == [0, 1] and cost.tolist() == [1.0, 10.0]
    with pytest.raises(ValueError):
        replay_cascade(scores, costs, [0.5])


def test_invalid_cascades_are_refused():
    with pytest.raises(ValueError, match="at least two"):
        Cascade(["one"], JudgeScorer("j"), 0.5)
    with pytest.raises(ValueError, match="thresholds"):
        Cascade(["a", "b", "c"], JudgeScorer("j"), [0.5])
    with pytest.raises(ValueError, match="thresholds"):
        Cascade(["a", "b"], JudgeScorer("j"), 1.5)


def test_a_whole_answer_as_chunks():
    response = answer("m", "Hello there")
    response["choices"].append({"index": 1, "message": {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}, "finish_reason": "tool_calls"})
    chunks = chunks_from_response(response)
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == "r1" and c["model"] == "m" for c in chunks)
    by_choice = {}
    for c in chunks[:-1]:
        choice = c["choices"][0]
        by_choice.setdefault(choice["index"], []).append(choice)
    assert "".join(ch["delta"].get("content") or "" for ch in by_choice[0]) == "Hello there"
    assert by_choice[0][-1]["finish_reason"] == "stop" and by_choice[1][-1]["finish_reason"] == "tool_calls"
    assert by_choice[1][1]["delta"]["tool_calls"][0] == {"index": 0, **response["choices"][1]["message"]["tool_calls"][0]}
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == response["usage"]
    text = chunks_from_response({"object": "text_completion", "model": "m", "choices": [{"index": 0, "text": "abc",
                                                                                        "finish_reason": "length"}]})
    assert text[0]["choices"][0] == {"index": 0, "text": "abc", "logprobs": None, "finish_reason": "length"}
