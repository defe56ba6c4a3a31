"""Mixture-of-Agents over a fake model caller: what each proposer and the aggregator are sent, dropped
proposers (failure, missed deadline), layers, sampling one model at several temperatures, streaming."""

from __future__ import annotations

import asyncio

import pytest

from routers.calls import ModelCaller, response_text
from routers.moa import SYNTHESIS_PROMPT, MixtureOfAgents, MoATrace, NoProposalError, Proposer, with_references

HI = {"messages": [{"role": "user", "content": "What is 2 + 3?"}], "max_tokens": 100, "temperature": 0.5}


def answer(model: str, text: str, prompt_tokens: int = 7, completion_tokens: int = 3) -> dict:
    return {"id": "x", "object": "chat.completion", "created": 0, "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens}}


class FakeCaller:
    """Answers per model: a text, an Exception to raise, or "hang" (waits until cancelled, noting it).
    A text containing "{n}" is formatted with the call's number for that model (1, 2, ...)."""

    def __init__(self, behaviour: dict[str, str | Exception]):
        self.behaviour = behaviour
        self.calls: list[tuple[str, dict]] = []
        self.streamed: list[tuple[str, dict]] = []
        self.cancelled: list[str] = []

    async def complete(self, model: str, body: dict) -> dict:
        self.calls.append((model, body))
        what = self.behaviour[model]
        if isinstance(what, Exception):
            raise what
        if what == "hang":
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                self.cancelled.append(model)
                raise
        number = sum(m == model for m, _ in self.calls)
        return answer(model, what.format(n=number))

    async def stream(self, model: str, body: dict):
        self.streamed.append((model, body))
        for word in ("The", " answer", " is", " 5."):
            yield {"object": "chat.completion.chunk", "model": model,
                   "choices": [{"index": 0, "delta": {"content": word}, "finish_reason": None}]}
        yield {"object": "chat.completion.chunk", "model": model, "choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 4}}


def run(coro):
    return asyncio.run(coro)


def test_the_fake_is_a_model_caller():
    assert isinstance(FakeCaller({}), ModelCaller)


def test_two_proposers_then_the_aggregator_reads_both_answers():
    caller = FakeCaller({"a": "Five.", "b": "It is 5.", "agg": "The answer is 5."})
    moa = MixtureOfAgents(["a", "b"], "agg")
    trace = MoATrace()
    body = {**HI, "n": 1, "stream": False, "tools": [{"type": "function", "function": {"name": "f"}}], "logprobs": True}
    response = run(moa.complete(caller, body, trace))
    assert response_text(response) == "The answer is 5." and response["model"] == "agg"
    proposer_calls = [c for c in caller.calls if c[0] != "agg"]
    assert sorted(m for m, _ in proposer_calls) == ["a", "b"]
    for _, sent in proposer_calls:  # the request itself, without delivery fields and output constraints
        assert sent["messages"] == HI["messages"] and sent["temperature"] == 0.5 and sent["max_tokens"] == 100
        assert not {"n", "stream", "tools", "logprobs", "model"} & set(sent)
    (model, sent), = [c for c in caller.calls if c[0] == "agg"]
    system, user = sent["messages"]
    assert user == HI["messages"][0] and system["role"] == "system"
    assert system["content"] == f"{SYNTHESIS_PROMPT}\n\nAnswer 1:\nFive.\n\nAnswer 2:\nIt is 5."
    assert sent["tools"] == body["tools"] and sent["logprobs"] is True and "stream" not in sent  # the client's request
    assert [p.text for p in trace.proposals] == ["Five.", "It is 5."] and trace.aggregator == "agg"
    logged = trace.to_dict()
    assert logged["num_dropped"] == 0 and logged["proposals"][0]["completion_tokens"] == 3
    assert {p["model"]: p["text"] for p in logged["proposals"]} == {"a": "Five.", "b": "It is 5."}


def test_a_failing_proposer_is_dropped_and_kept_in_the_trace():
    caller = FakeCaller({"a": RuntimeError("connection refused"), "b": "It is 5.", "agg": "5"})
    trace = MoATrace()
    response = run(MixtureOfAgents(["a", "b"], "agg").complete(caller, HI, trace))
    assert response_text(response) == "5"
    system = caller.calls[-1][1]["messages"][0]["content"]
    assert system.endswith("Answer 1:\nIt is 5.") and "Answer 2" not in system
    failed, ok = trace.proposals
    assert not failed.is_ok and failed.error == "RuntimeError: connection refused" and ok.is_ok
    assert trace.to_dict()["proposals"][0] == {**trace.to_dict()["proposals"][0], "ok": False, "error": failed.error}
    assert trace.to_dict()["num_dropped"] == 1


def test_a_proposer_past_its_deadline_is_cancelled_and_dropped():
    caller = FakeCaller({"slow": "hang", "fast": "5", "agg": "final"})
    trace = MoATrace()
    response = run(MixtureOfAgents(["slow", "fast"], "agg", deadline_s=0.2).complete(caller, HI, trace))
    assert response_text(response) == "final" and caller.cancelled == ["slow"]
    assert trace.proposals[0].error == "missed its deadline of 0.2 s" and trace.proposals[1].text == "5"


def test_empty_answers_are_dropped_and_all_failing_is_an_error():
    caller = FakeCaller({"a": ValueError("bad"), "b": "   ", "agg": "never"})
    with pytest.raises(NoProposalError, match="layer 1: 0 of 2 proposers answered, 1 needed") as info:
        run(MixtureOfAgents(["a", "b"], "agg").complete(caller, HI))
    assert info.value.layer == 1 and [p.error for p in info.value.proposals] == ["ValueError: bad", "empty answer"]
    assert all(m != "agg" for m, _ in caller.calls)  # the aggregator is never called
    caller = FakeCaller({"a": ValueError("bad"), "b": "5", "agg": "never"})
    with pytest.raises(NoProposalError, match="1 of 2 proposers answered, 2 needed"):
        run(MixtureOfAgents(["a", "b"], "agg", min_proposals=2).complete(caller, HI))


def test_one_model_sampled_at_several_temperatures_with_distinct_seeds():
    caller = FakeCaller({"m": "answer {n}"})
    moa = MixtureOfAgents.sampled("m", [0.2, 0.7, 1.0])
    assert moa.aggregator == "m" and moa.models == ["m"]
    run(moa.complete(caller, {**HI, "seed": 10}))
    proposals = caller.calls[:3]
    assert sorted(b["temperature"] for _, b in proposals) == [0.2, 0.7, 1.0]
    assert sorted(b["seed"] for _, b in proposals) == [10, 11, 12]
    aggregator = caller.calls[3][1]
    assert aggregator["temperature"] == 0.5 and aggregator["seed"] == 10  # the client's own settings
    assert aggregator["messages"][0]["content"].count("Answer ") == 3


def test_later_layers_see_the_previous_layers_answers():
    caller = FakeCaller({"a": "a{n}", "b": "b{n}", "agg": "done"})
    trace = MoATrace()
    run(MixtureOfAgents(["a", "b"], "agg", layers=2).complete(caller, HI, trace))
    assert [(p.layer, p.text) for p in trace.proposals] == [(1, "a1"), (1, "b1"), (2, "a2"), (2, "b2")]
    layer2 = [b for m, b in caller.calls[2:4]]
    for sent in layer2:
        assert sent["messages"][0]["content"].endswith("Answer 1:\na1\n\nAnswer 2:\nb1")
    assert caller.calls[-1][1]["messages"][0]["content"].endswith("Answer 1:\na2\n\nAnswer 2:\nb2")


def test_stream_yields_only_the_aggregators_chunks():
    caller = FakeCaller({"a": "5", "b": "five", "agg": "unused"})
    trace = MoATrace()

    async def collect():
        return [c async for c in MixtureOfAgents(["a", "b"], "agg").stream(caller, HI, trace)]

    chunks = run(collect())
    assert "".join(c["choices"][0]["delta"]["content"] for c in chunks if c["choices"]) == "The answer is 5."
    assert all(c["model"] == "agg" for c in chunks) and [m for m, _ in caller.streamed] == ["agg"]
    assert sorted(m for m, _ in caller.calls) == ["a", "b"] and len(trace.proposals) == 2 and trace.proposers_s >= 0


def test_proposer_tokens_are_capped_and_references_join_a_system_message():
    moa = MixtureOfAgents([Proposer("a", 0.9)], "agg", proposer_max_tokens=64)
    assert moa.proposer_body({**HI, "max_tokens": 500}, moa.proposers[0], 0, [])["max_tokens"] == 64
    assert moa.proposer_body({**HI, "max_tokens": 20}, moa.proposers[0], 0, [])["max_tokens"] == 20
    sent = moa.proposer_body({"messages": HI["messages"], "max_completion_tokens": 30}, moa.proposers[0], 0, [])
    assert sent["max_tokens"] == 30 and "max_completion_tokens" not in sent and sent["temperature"] == 0.9
    assert MixtureOfAgents(["a"], "agg", proposer_max_tokens=None).proposer_body({"messages": []}, Proposer("a"), 0, []) == {"messages": []}
    with_system = {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]}
    joined = with_references(with_system, ["x"], "Use these.")
    assert joined["messages"][0] == {"role": "system", "content": "Be brief.\n\nUse these.\n\nAnswer 1:\nx"}
    assert with_system["messages"][0]["content"] == "Be brief."  # the client's body is not modified
    assert with_references({"prompt": "Q: 2+3?\nA:"}, [" 5 "], "Refs.")["prompt"] == "Refs.\n\nAnswer 1:\n5\n\nQ: 2+3?\nA:"
    assert with_references({"prompt": ["p1", "p2"]}, ["r"], "I")["prompt"] == ["I\n\nAnswer 1:\nr\n\np1", "I\n\nAnswer 1:\nr\n\np2"]


@pytest.mark.parametrize("kwargs", [dict(proposers=[], aggregator="a"), dict(proposers=["a"], aggregator=""),
                                    dict(proposers=["a"], aggregator="a", layers=0),
                                    dict(proposers=["a"], aggregator="a", deadline_s=0),
                                    dict(proposers=["a"], aggregator="a", min_proposals=2),
                                    dict(proposers=["a"], aggregator="a", proposer_max_tokens=0)])
def test_invalid_mixtures_are_refused(kwargs):
    with pytest.raises(ValueError):
        MixtureOfAgents(**kwargs)
    with pytest.raises(ValueError, match="temperature"):
        Proposer("a", 3.0)
