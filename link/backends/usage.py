"""A provider's `usage`, checked where the gateway reads a backend's answer, before anything trusts it.

    response = checked_response(await backend.complete(...), deployment, estimate)   # link/proxy.py
    chunks = checked_stream(backend.stream(...), deployment, estimate)               # usage chunks checked
    estimate(num_answer_chars) -> (prompt_tokens, completion_tokens)                 # the gateway's own estimate

The gateway bills the key, counts tokens per minute, writes the request-log row and the /metrics counters from
the token counts a backend reports, so one count that is not a count poisons all of them: 1e30 tokens overflows
the log's INTEGER column, a negative count would decrement a Prometheus counter, a string fails `int()`.

A count is kept when it is a whole number (an int, or a float such as 12.0) in [0, MAX_USAGE_TOKENS]. Anything
else (a string, an object, a bool, a fraction, NaN, +-inf, a negative or absurd number) is replaced by the
gateway's estimate, and a warning names the deployment, its provider model and the field. `total_tokens` is
always prompt + completion. The token details (`prompt_tokens_details`, `completion_tokens_details`) keep their
valid counts only. A `usage` that is not an object is wholly estimated; an absent (null) one is left to the
request's accounting (link/accounting.py estimates a stream that died before its usage chunk).
"""

from __future__ import annotations

import logging
import math
from typing import Any, AsyncIterator, Callable

from link.config import ModelDeployment

logger = logging.getLogger(__name__)

# 10 million tokens: five times the longest context window offered today (2M). Anything above is no count of a
# real request; and a multi-call plan's sum (a MoA makes at most 4 x 16 + 1 = 65 calls) stays within PostgreSQL's
# INTEGER (2**31 - 1), the request log's token columns.
MAX_USAGE_TOKENS = 10_000_000
COUNT_FIELDS = ("prompt_tokens", "completion_tokens")
DETAIL_FIELDS = ("prompt_tokens_details", "completion_tokens_details")

# answer characters -> (prompt tokens, completion tokens), the gateway's estimate of one call
Estimate = Callable[[int], tuple[int, int]]


def token_count(value: Any) -> int | None:
    """`value` as a token count: a whole number in [0, MAX_USAGE_TOKENS] (int, or an integral float), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
        return None
    return int(value) if 0 <= value <= MAX_USAGE_TOKENS else None


def _source(deployment: ModelDeployment) -> str:
    return f"deployment {deployment.deployment_id or deployment.name} (provider model {deployment.provider_model!r})"


def checked_usage(usage: Any, deployment: ModelDeployment, estimate: Callable[[], tuple[int, int]]) -> dict[str, Any]:
    """`usage` with every count checked (see the module docstring); its other fields are kept as they are.

    Args:
        usage: the provider's `usage` (anything JSON can hold), not None.
        deployment: the deployment that answered (named in the warnings).
        estimate: () -> (prompt_tokens, completion_tokens), called only when a count must be replaced.
    Returns:
        a new dict: `prompt_tokens`, `completion_tokens` (ints in [0, MAX_USAGE_TOKENS]), their `total_tokens`.
    """
    if not isinstance(usage, dict):
        logger.warning("%s reported usage %.200r, not an object; using the gateway's estimate", _source(deployment), usage)
        usage = {}
    counts = {name: token_count(usage.get(name)) for name in COUNT_FIELDS}
    bad = [name for name, count in counts.items() if count is None]
    if bad:
        estimated = dict(zip(COUNT_FIELDS, estimate()))
        for name in bad:
            counts[name] = min(estimated[name], MAX_USAGE_TOKENS)
            reported = f"{usage[name]!r:.200}" if name in usage else "nothing"
            logger.warning("%s reported usage.%s = %s, not a token count in [0, %d]; using the gateway's estimate %d",
                           _source(deployment), name, reported, MAX_USAGE_TOKENS, counts[name])
    checked = {**usage, **counts, "total_tokens": counts["prompt_tokens"] + counts["completion_tokens"]}
    for name in DETAIL_FIELDS:
        if checked.get(name) is not None:
            checked[name] = _checked_details(checked[name], f"usage.{name}", deployment)
    return checked


def _checked_details(details: Any, field: str, deployment: ModelDeployment) -> dict[str, int] | None:
    """A details object ({"cached_tokens": 3, ...}) without its fields that are neither a token count nor null;
    None when it is not an object."""
    if not isinstance(details, dict):
        logger.warning("%s reported %s = %.200r, not an object; dropped", _source(deployment), field, details)
        return None
    counts = {k: token_count(v) for k, v in details.items()}
    dropped = [k for k, v in counts.items() if v is None and details[k] is not None]
    if dropped:
        logger.warning("%s reported %s with fields %s that are not token counts; dropped", _source(deployment), field, dropped)
    return {k: v for k, v in counts.items() if k not in dropped}


def answer_chars(answer: dict[str, Any]) -> int:
    """Characters of the generated answer in a response or a chunk: every choice's text or content, refusal, and
    tool calls' names and arguments (what the completion tokens paid for)."""
    total = 0
    for choice in answer.get("choices") or ():
        if not isinstance(choice, dict):
            continue
        message = choice.get("message") or choice.get("delta")
        message = message if isinstance(message, dict) else {}
        parts = [choice.get("text"), message.get("content"), message.get("refusal")]
        for call in message.get("tool_calls") or ():
            function = call.get("function") if isinstance(call, dict) else None
            if isinstance(function, dict):
                parts += [function.get("name"), function.get("arguments")]
        total += sum(len(p) for p in parts if isinstance(p, str))
    return total


def checked_response(response: dict[str, Any], deployment: ModelDeployment, estimate: Estimate) -> dict[str, Any]:
    """A whole answer with its `usage` checked in place (see the module docstring); returns `response`."""
    if response.get("usage") is not None:
        response["usage"] = checked_usage(response["usage"], deployment, lambda: estimate(answer_chars(response)))
    return response


async def checked_stream(chunks: AsyncIterator[dict], deployment: ModelDeployment, estimate: Estimate) -> AsyncIterator[dict]:
    """Re-yield `chunks` with each chunk's `usage` checked; a replaced completion count is estimated from the
    answer's characters streamed so far. Closing this generator closes `chunks` (which aborts the backend call)."""
    num_chars = 0
    try:
        async for chunk in chunks:
            num_chars += answer_chars(chunk)
            if chunk.get("usage") is not None:
                chunk["usage"] = checked_usage(chunk["usage"], deployment, lambda: estimate(num_chars))
            yield chunk
    finally:
        aclose = getattr(chunks, "aclose", None)
        if aclose is not None:
            await aclose()
