"""Cascade: answer with a cheap model, score the answer, escalate to the next model below a threshold.

    cascade = Cascade(["smollm2-135m-instruct", "gemma-3-270m"], JudgeScorer("smollm2-135m-instruct"), threshold=0.5)
    trace = CascadeTrace()
    response = await cascade.complete(caller, body, trace)      # the accepted step's whole answer
    async for chunk in cascade.stream(caller, body, trace): ... # only the final answer's chunks
    trace.to_dict()                                             # each step: score, accepted, error

The idea is FrugalGPT's LLM cascade (Chen, Zaharia and Zou 2023, "FrugalGPT: How to Use Large Language
Models While Reducing Cost and Improving Performance", arXiv:2305.05176): models in order of cost, a scorer
judging each answer, the first answer scoring at least its step's threshold is returned. Scorers here:

    PredictedQuality   the router's predicted quality of the step's model for this request (no answer needed:
                       a step predicted below its threshold is skipped without calling its model)
    JudgeScorer        a judge model's yes/no verdict on the answer: P(yes) from its top logprobs when the
                       backend returns them, else 1.0 for a "yes" reply and 0.0 otherwise

Intermediate steps are generated whole, never streamed, so only the final answer reaches a client; an
accepted intermediate answer is streamed as chunks made from it (`chunks_from_response`). A step whose
call or scoring fails escalates (its error is kept in the trace); the last step's failure propagates.
`replay_cascade` runs the same rule offline on recorded scores and costs (for calibrating the threshold).
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable, Protocol, Sequence

import numpy as np

from routers.calls import ModelCaller, chunks_from_response, last_user_text, response_text

JUDGE_PROMPT = (
    "You check answers. You get a user's request and an assistant's answer to it. Reply with one word: "
    "yes if the answer is correct and fully does what the request asks, no if it is wrong, incomplete or unsure."
)
# Fields a cascade step never gets from the client's body: the caller streams or not as asked of it.
STEP_DROPPED = ("model", "stream", "stream_options")


class Scorer(Protocol):
    """Scores one step's answer in [0, 1]. `needs_answer` False: the score depends on the request alone, so a
    step scored below its threshold is skipped before its model is called (`response` is then None).

    Optional members a scorer may have: `step_fields` (a dict of request fields the scored step is sent, under
    the client's own: e.g. logprobs for a confidence signal; stripped from the answer again when the client did
    not ask for them) and `read_signals(response)` (the signal summary it read, recorded in the step's trace).
    """

    name: str
    needs_answer: bool

    async def score(self, caller: ModelCaller, body: dict[str, Any], model: str, response: dict[str, Any] | None) -> float: ...


class PredictedQuality:
    """The router's predicted quality of the step's model for the request.

    Args:
        predict: body -> {model: predicted quality in [0, 1]} (e.g. `routers.base.Router.score`); run in a
            worker thread (an embedding takes milliseconds of CPU).
    Raises (from score): KeyError when `predict` has no score for the model.
    """

    name = "predicted-quality"
    needs_answer = False

    def __init__(self, predict: Callable[[dict[str, Any]], dict[str, float]]):
        self.predict = predict

    async def score(self, caller: ModelCaller, body: dict[str, Any], model: str, response: dict[str, Any] | None) -> float:
        return float((await asyncio.to_thread(self.predict, body))[model])


class JudgeScorer:
    """A judge model's verdict on the answer (see the module docstring).

    Args:
        model: the judge's public model name.
        prompt: the judge's system instruction.
        use_logprobs: ask for top logprobs (P(yes) = p_yes / (p_yes + p_no) over the first token's candidates);
            turn off for a backend that refuses `logprobs`.
    """

    name = "judge"
    needs_answer = True

    def __init__(self, model: str, prompt: str = JUDGE_PROMPT, *, use_logprobs: bool = True):
        self.model, self.prompt, self.use_logprobs = model, prompt, use_logprobs

    def judge_body(self, body: dict[str, Any], answer: str) -> dict[str, Any]:
        """The judge's request: the system instruction, then the request and the answer."""
        user = f"Request:\n{last_user_text(body)}\n\nAnswer:\n{answer}\n\nIs the answer correct? Reply yes or no."
        judge = {"messages": [{"role": "system", "content": self.prompt}, {"role": "user", "content": user}],
                 "max_tokens": 2, "temperature": 0}
        return {**judge, "logprobs": True, "top_logprobs": 5} if self.use_logprobs else judge

    async def score(self, caller: ModelCaller, body: dict[str, Any], model: str, response: dict[str, Any] | None) -> float:
        verdict = await caller.complete(self.model, self.judge_body(body, response_text(response or {})))
        return judge_probability(verdict)


def judge_probability(verdict: dict[str, Any]) -> float:
    """P(yes) of a judge's answer: from its first token's top logprobs when they name "yes" or "no", else 1.0
    when its text starts with "yes" (any case, punctuation ignored) and 0.0 otherwise."""
    choice = (verdict.get("choices") or [{}])[0]
    content = ((choice.get("logprobs") or {}).get("content") or [])
    if content:
        p_yes = p_no = 0.0
        for candidate in content[0].get("top_logprobs") or [content[0]]:
            word = str(candidate.get("token", "")).strip().lower()
            if word in ("yes", "no"):
                p = math.exp(float(candidate.get("logprob", -math.inf)))
                p_yes, p_no = (p_yes + p, p_no) if word == "yes" else (p_yes, p_no + p)
        if p_yes + p_no > 0:
            return p_yes / (p_yes + p_no)
    text = response_text(verdict).strip().lower()
    return 1.0 if text[:3] == "yes" else 0.0


@dataclass
class StepOutcome:
    """One cascade step: its score (None when not scored), whether it answered the client, any error, and the
    signals its scorer read of the answer (`routers.signals`; None when it read none)."""

    model: str
    threshold: float | None
    score: float | None = None
    accepted: bool = False
    skipped: bool = False
    error: str | None = None
    latency_s: float = 0.0
    signals: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        out = {"model": self.model, "threshold": self.threshold, "score": self.score, "accepted": self.accepted,
               "skipped": self.skipped, "error": self.error, "latency_ms": round(self.latency_s * 1000, 1)}
        if self.signals is not None:
            out["signals"] = {k: round(v, 4) if isinstance(v, float) else v for k, v in self.signals.items()}
        return out


@dataclass
class CascadeTrace:
    """What one cascade run did (JSON via `to_dict`)."""

    steps: list[StepOutcome] = field(default_factory=list)
    scorer: str = ""

    @property
    def answered_by(self) -> str | None:
        return next((s.model for s in self.steps if s.accepted), None)

    def to_dict(self) -> dict[str, Any]:
        return {"scorer": self.scorer, "answered_by": self.answered_by, "steps": [s.to_dict() for s in self.steps]}


def without_logprobs(response: dict[str, Any]) -> dict[str, Any]:
    """A chat completion dict with each choice's `logprobs` set to None (the rest shared, not copied)."""
    return {**response, "choices": [{**c, "logprobs": None} for c in response.get("choices") or []]}


class Cascade:
    """Models from cheapest to strongest; each answer but the last is scored against its threshold.

    Args:
        models: public model names in escalation order; at least two.
        scorer: a `Scorer` (PredictedQuality or JudgeScorer).
        threshold: the score an answer needs to be accepted: one value for every step, or one per step but the
            last (len(models) - 1 values), each in [0, 1].
    Raises:
        ValueError: fewer than two models, or thresholds of the wrong number or outside [0, 1].
    """

    def __init__(self, models: Sequence[str], scorer: Scorer, threshold: float | Sequence[float]):
        self.models = list(models)
        if len(self.models) < 2:
            raise ValueError(f"a cascade needs at least two models, got {self.models}")
        thresholds = [float(threshold)] * (len(self.models) - 1) if isinstance(threshold, (int, float)) else [float(t) for t in threshold]
        if len(thresholds) != len(self.models) - 1 or not all(0 <= t <= 1 for t in thresholds):
            raise ValueError(f"a cascade of {len(self.models)} models needs {len(self.models) - 1} thresholds in [0, 1], "
                             f"got {thresholds}")
        self.scorer, self.thresholds = scorer, thresholds

    async def _accepted(self, caller: ModelCaller, body: dict[str, Any], step: StepOutcome) -> dict[str, Any] | None:
        """Run one intermediate step: its answer when accepted, else None (skipped, failed or scored low)."""
        started = time.monotonic()
        response = None
        try:
            if not self.scorer.needs_answer:
                step.score = await self.scorer.score(caller, body, step.model, None)
                if step.score < step.threshold:
                    step.skipped = True
                    return None
            fields = getattr(self.scorer, "step_fields", None) or {}
            response = await caller.complete(step.model, {**fields, **body})
            if self.scorer.needs_answer:
                step.score = await self.scorer.score(caller, body, step.model, response)
                read = getattr(self.scorer, "read_signals", None)
                step.signals = read(response) if read is not None else None
            if fields and not body.get("logprobs"):  # asked for the scorer only: not the client's to see
                response = without_logprobs(response)
        except Exception as exc:  # noqa: BLE001 - a cheap step that fails escalates (the module docstring)
            step.error = f"{type(exc).__name__}: {exc}"
            return None
        finally:
            step.latency_s = time.monotonic() - started
        step.accepted = step.score >= step.threshold
        return response if step.accepted else None

    async def _escalate(self, caller: ModelCaller, body: dict[str, Any], trace: CascadeTrace) -> dict[str, Any] | None:
        trace.scorer = self.scorer.name
        for model, threshold in zip(self.models, self.thresholds):
            step = StepOutcome(model, threshold)
            trace.steps.append(step)
            response = await self._accepted(caller, body, step)
            if response is not None:
                return response
        trace.steps.append(StepOutcome(self.models[-1], None, accepted=True))
        return None

    async def complete(self, caller: ModelCaller, body: dict[str, Any], trace: CascadeTrace | None = None) -> dict[str, Any]:
        """The first accepted answer, else the last model's. Raises whatever the last model's call raises."""
        trace = trace if trace is not None else CascadeTrace()
        sent = {k: v for k, v in body.items() if k not in STEP_DROPPED}
        response = await self._escalate(caller, sent, trace)
        if response is not None:
            return response
        started = time.monotonic()
        try:
            return await caller.complete(self.models[-1], sent)
        finally:
            trace.steps[-1].latency_s = time.monotonic() - started

    async def stream(self, caller: ModelCaller, body: dict[str, Any], trace: CascadeTrace | None = None) -> AsyncIterator[dict[str, Any]]:
        """The final answer's chunks: an accepted step's answer re-chunked, else the last model's stream."""
        trace = trace if trace is not None else CascadeTrace()
        sent = {k: v for k, v in body.items() if k not in STEP_DROPPED}
        response = await self._escalate(caller, sent, trace)
        if response is not None:
            for chunk in chunks_from_response(response):
                yield chunk
            return
        chunks = caller.stream(self.models[-1], sent)
        try:
            async for chunk in chunks:
                yield chunk
        finally:
            aclose = getattr(chunks, "aclose", None)
            if aclose is not None:
                await aclose()


def replay_cascade(step_scores: np.ndarray, costs: np.ndarray, thresholds: float | Sequence[float], *,
                   pays_rejected: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """The cascade rule offline: which step answers each prompt and what the prompt costs.

    Args:
        step_scores: [N, S] the scorer's score of step s's answer on prompt n (the last column is unused).
        costs: [N, S] USD of calling step s on prompt n.
        thresholds: one value, or S - 1 values (step s is accepted when its score >= thresholds[s]).
        pays_rejected: True when a rejected step was still called (a judge scores answers); False when it was
            skipped before its call (PredictedQuality).
    Returns:
        (answered [N] int step index, cost [N] USD): the accepted steps' cost plus, with `pays_rejected`, the
        rejected steps' before it.
    Raises:
        ValueError: shapes differ, fewer than two steps, or the wrong number of thresholds.
    """
    step_scores, costs = np.asarray(step_scores, dtype=np.float64), np.asarray(costs, dtype=np.float64)
    if step_scores.shape != costs.shape or step_scores.ndim != 2 or step_scores.shape[1] < 2:
        raise ValueError(f"step_scores and costs must both be [N, S>=2], got {step_scores.shape} and {costs.shape}")
    num_steps = step_scores.shape[1]
    t = np.full(num_steps - 1, float(thresholds)) if np.isscalar(thresholds) else np.asarray(thresholds, dtype=np.float64)
    if t.shape != (num_steps - 1,):
        raise ValueError(f"{num_steps} steps need {num_steps - 1} thresholds, got {t.shape[0]}")
    accepted = np.concatenate([step_scores[:, :-1] >= t, np.ones((len(costs), 1), dtype=bool)], axis=1)  # [N, S]
    answered = accepted.argmax(axis=1)  # the first accepted step
    steps = np.arange(num_steps)
    called = steps[None, :] <= answered[:, None] if pays_rejected else steps[None, :] == answered[:, None]
    return answered, np.where(called, costs, 0.0).sum(axis=1)  # a NaN cost of a step never called is not paid
