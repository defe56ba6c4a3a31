"""Signals read from a model's own answer: its token confidence, its agreement with its own samples, its checks.

    conf = confidence(token_logprobs, top_logprobs)   # [T] floats and [T] {token: logprob}; None without logprobs
    conf.logprob_mean, conf.logprob_min, conf.entropy_mean, conf.tokens
    agreement("18", ["18", "17", "18"])              # 2/3: the share of extra samples that give the same answer
    summary = answer_signals(text, token_logprobs, top_logprobs, key="18", sample_keys=["18", "17", "18"])
    vector = signal_vector(summary)                   # [len(SIGNAL_FEATURE_NAMES)], NaN where a signal is missing

A prompt-only router sees the request alone; these need the cheap model's answer first (and the agreement
family needs k more samples of it), so each family is a cost a plan pays before it decides
(`SIGNAL_FAMILIES`). Where they come from:

- Confidence (`confidence`): the mean and the minimum natural-log probability of the tokens the model chose,
  and the mean entropy of its next-token distribution. The entropy is read from the top-k alternatives an
  OpenAI `logprobs` answer carries (k = `top_logprobs`), with the mass outside them (1 - sum p_i) counted as
  one more outcome: a lower bound of the true entropy, exact when the top-k hold all the mass. Mean token
  log-probability as a confidence for routing and cascades: e.g. Gupta et al. 2024, "Language Model Cascades:
  Token-level uncertainty and beyond" (arXiv:2404.10136).
- Agreement (`agreement`): self-consistency (Wang et al. 2023, arXiv:2203.11171) read as a confidence: the
  share of k extra samples whose answer key (a suite's normalized final answer: a number, a letter, a tool
  call) equals the greedy answer's.
- Checks (`answer_checks`): what needs no model and no code execution: whether a final answer is present,
  and how many arithmetic steps of the working re-check wrong (`routers.arithmetic.check_arithmetic`).

A backend that returns no log-probabilities (a provider) leaves the confidence family missing (NaN in
`signal_vector`), never zero: a LightGBM router reads NaN as "unknown" and still decides.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from routers.arithmetic import check_arithmetic, final_number

# name -> (columns, what a plan pays before it can read them)
SIGNAL_FAMILIES: dict[str, tuple[tuple[str, ...], str]] = {
    "confidence": (("logprob_mean", "logprob_min", "entropy_mean", "log_tokens"), "the cheap model's answer"),
    "agreement": (("agreement",), "the cheap model's answer and k more samples of it"),
    "checks": (("has_final_answer", "arithmetic_steps", "arithmetic_wrong"), "the cheap model's answer"),
}
SIGNAL_FEATURE_NAMES: tuple[str, ...] = tuple(c for columns, _ in SIGNAL_FAMILIES.values() for c in columns)


@dataclass(frozen=True)
class Confidence:
    """A generated answer's token confidence.

    Attributes:
        tokens: generated tokens with a log-probability (T >= 1).
        logprob_mean: mean natural-log probability of the chosen tokens (<= 0).
        logprob_min: the lowest one (<= logprob_mean).
        entropy_mean: mean next-token entropy in nats over the positions that carried alternatives, from the
            top-k plus the rest's mass (a lower bound, see the module docstring); None when no position had any.
    """

    tokens: int
    logprob_mean: float
    logprob_min: float
    entropy_mean: float | None


def top_k_entropy(alternatives: Mapping[str, float]) -> float:
    """Entropy in nats of one position from its top-k alternatives {token: natural-log probability}.

    The k probabilities p_i and the remaining mass r = max(0, 1 - sum p_i) are the outcomes:
    H = -sum p_i ln p_i - r ln r (0 ln 0 = 0). A lower bound of the full distribution's entropy.
    Raises:
        ValueError: no alternatives.
    """
    if not alternatives:
        raise ValueError("top_k_entropy needs at least one alternative")
    probs = [math.exp(lp) for lp in alternatives.values() if lp > -math.inf]
    rest = max(0.0, 1.0 - sum(probs))
    return -sum(p * math.log(p) for p in (*probs, rest) if p > 0.0)


def confidence(token_logprobs: Sequence[float] | None,
               top_logprobs: Sequence[Mapping[str, float]] | None = None) -> Confidence | None:
    """The confidence of one answer, or None when it carries no log-probabilities.

    Args:
        token_logprobs: [T] natural-log probability of each chosen token (an OpenAI chat answer's
            `logprobs.content[i].logprob`); -inf is clamped to -1e4 so that the mean stays finite.
        top_logprobs: [T] {token: logprob} alternatives per position (`top_logprobs`), or None.
    """
    if not token_logprobs:
        return None
    values = [max(float(v), -1e4) for v in token_logprobs]
    entropies = [top_k_entropy(alt) for alt in (top_logprobs or []) if alt]
    return Confidence(tokens=len(values), logprob_mean=sum(values) / len(values), logprob_min=min(values),
                      entropy_mean=sum(entropies) / len(entropies) if entropies else None)


def agreement(key: str | None, sample_keys: Sequence[str | None]) -> float | None:
    """The share of `sample_keys` equal to `key` (self-consistency), in [0, 1].

    None when there are no samples or the answer has no key (no final answer to agree on): missing, not 0.
    A sample without a key counts as a disagreement.
    """
    if key is None or not sample_keys:
        return None
    return sum(k == key for k in sample_keys) / len(sample_keys)


def answer_checks(text: str) -> dict[str, float]:
    """Checks of an answer's text that need no model: `has_final_answer` (1.0 when a final number is found),
    `arithmetic_steps` and `arithmetic_wrong` (the working's "a op b = c" steps, and how many re-check wrong)."""
    steps, wrong = check_arithmetic(text or "")
    return {"has_final_answer": float(final_number(text or "") is not None), "arithmetic_steps": float(steps),
            "arithmetic_wrong": float(wrong)}


def answer_signals(text: str, token_logprobs: Sequence[float] | None = None,
                   top_logprobs: Sequence[Mapping[str, float]] | None = None, *, key: str | None = None,
                   sample_keys: Sequence[str | None] | None = None, sample_scores: Sequence[float] | None = None,
                   samples_cost_usd: float | None = None) -> dict[str, Any]:
    """One answer's signal summary, a JSON-able dict (the `signals` column of an outcome row).

    Keys: the confidence fields (absent without log-probabilities), the checks, `key` (the answer's
    normalized final answer, or None), and with samples `sample_keys`, `sample_scores` (each extra sample's
    graded score), `agreement` and `samples_cost_usd` (USD of the extra samples).
    """
    out: dict[str, Any] = {"key": key, **answer_checks(text)}
    conf = confidence(token_logprobs, top_logprobs)
    if conf is not None:
        out.update(asdict(conf))
    if sample_keys is not None:
        out["sample_keys"] = list(sample_keys)
        out["agreement"] = agreement(key, sample_keys)
    if sample_scores is not None:
        out["sample_scores"] = [float(s) for s in sample_scores]
    if samples_cost_usd is not None:
        out["samples_cost_usd"] = float(samples_cost_usd)
    return out


def response_logprobs(response: Mapping[str, Any]) -> tuple[list[float] | None, list[dict[str, float]] | None]:
    """(token log-probabilities [T], alternatives [T] {token: logprob}) of an OpenAI chat completion dict's first
    choice (`choices[0].logprobs.content[i].logprob` / `.top_logprobs`), (None, None) when it carries none."""
    choices = response.get("choices") or [{}]
    content = ((choices[0] or {}).get("logprobs") or {}).get("content") or []
    if not content:
        return None, None
    tokens = [float(p["logprob"]) for p in content if p.get("logprob") is not None]
    alternatives = [{t["token"]: float(t["logprob"]) for t in (p.get("top_logprobs") or [])} for p in content]
    return tokens or None, alternatives if any(alternatives) else None


def signal_vector(signals: Mapping[str, Any] | None) -> np.ndarray:
    """[len(SIGNAL_FEATURE_NAMES)] float64 features of a signal summary; NaN for every signal it lacks."""
    signals = signals or {}
    tokens = signals.get("tokens")
    values = {**signals, "log_tokens": math.log1p(tokens) if isinstance(tokens, (int, float)) else None}
    return np.array([np.nan if values.get(name) is None else float(values[name]) for name in SIGNAL_FEATURE_NAMES],
                    dtype=np.float64)
