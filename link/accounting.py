"""Usage and cost of one gateway request, from its budget reservation to its request-log row.

    record = RequestRecord(endpoint="chat")
    await accounting.reserve(record, max_request_cost("chat", body, deployments))   # 429 insufficient_quota
    ... record.model, record.deployment, record.add_usage(response["usage"]) ...
    await accounting.finish(record)       # settle the real cost, count tokens, write the log row, metrics

Cost = prompt_tokens * input_cost_per_million / 1e6 + completion_tokens * output_cost_per_million / 1e6
(USD) at the prices of the deployment that answered, with the token counts the backend reported (checked as
they are read, link/backends/usage.py: a count that is not one is replaced by the estimate below): a
streamed and a whole answer to the same request account identically. When a backend reported no usage
(a stream that died midway), the prompt is estimated and each content chunk counts as one token, and
the decision records `"usage": "estimated"`.

A plan that makes several model calls (a Mixture-of-Agents, a cascade: `Plan.executor`) adds each call with
`add_call`: its tokens at the prices of the deployment that served it. The record's tokens and cost are then
the sums over every call, and `decision["calls"]` lists them.
"""

from __future__ import annotations

import json
import logging
import math
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import anyio

from link.auth import caller_of
from link.backends import BackendError, BackendTimeout
from link.blocking_calls import BlockingCalls
from link.config import ModelDeployment
from link.db.models import utcnow
from link.keys import KeyIdentity
from link.budgets import LedgerUnavailable
from link.limits import BudgetExceeded, BudgetLedger, RateLimiter, Reservation
from link.metrics import GatewayMetrics
from link.redact import Redactor
from link.request_log import RequestLogWriter
from link.schemas import OpenAIError

logger = logging.getLogger(__name__)
# Completion tokens reserved for a request that sets no max_tokens on a model of unknown context length.
DEFAULT_MAX_COMPLETION_TOKENS = 4096
# The estimate must not undershoot, or a key's spend passes its budget (a fresh-user trial saw 157%):
# code and non-English text run near 2 characters per token, each message adds its role markers, and a
# chat format may add a fixed preamble (Gemma's in-context transcript is about 70 tokens).
CHARS_PER_TOKEN = 2
TOKENS_PER_MESSAGE = 8
CHAT_FORMAT_TOKENS = 128
RETRY_AFTER_IN_FLIGHT_S = 1  # Retry-After of a budget refusal that in-flight reservations cause


def estimate_prompt_tokens(endpoint: str, body: dict[str, Any]) -> int:
    """Prompt tokens of a request, estimated from its characters (no tokenizer for remote models).

    Chat: every message's content, tool calls and the tool schemas, ceil(chars / 2) plus 8 per message plus
    128 for the chat format's preamble.
    Completion: the prompt's characters (a token-id prompt counts its ids).
    """
    if endpoint == "chat":
        messages = body.get("messages") or []
        text = json.dumps([m.get("content") for m in messages if isinstance(m, dict)]) + json.dumps(body.get("tools") or "")
        text += json.dumps([m.get("tool_calls") for m in messages if isinstance(m, dict) and m.get("tool_calls")])
        return math.ceil(len(text) / CHARS_PER_TOKEN) + TOKENS_PER_MESSAGE * len(messages) + CHAT_FORMAT_TOKENS
    prompt = body.get("prompt")
    prompts = prompt if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int) else [prompt]
    total = 0
    for p in prompts:
        total += len(p) if isinstance(p, list) else math.ceil(len(str(p or "")) / CHARS_PER_TOKEN) + 1
    return total


def estimate_completion_tokens(num_chars: int) -> int:
    """Completion tokens of an answer of `num_chars` characters (text, tool calls), at CHARS_PER_TOKEN."""
    return math.ceil(num_chars / CHARS_PER_TOKEN)


def num_sequences(endpoint: str, body: dict[str, Any]) -> int:
    """Completions generated: n per prompt (a completion request may carry several prompts)."""
    prompt = body.get("prompt")
    num_prompts = len(prompt) if endpoint == "completion" and isinstance(prompt, list) and prompt and not isinstance(prompt[0], int) else 1
    return int(body.get("n") or 1) * num_prompts


def max_request_cost(endpoint: str, body: dict[str, Any], deployments: list[ModelDeployment], *,
                     extra_prompt_tokens: int = 0) -> float:
    """The most a request can cost (USD) on the priciest of the deployments that may answer it.

    Completion tokens: max_completion_tokens / max_tokens, else the context length minus the prompt,
    else DEFAULT_MAX_COMPLETION_TOKENS; times `num_sequences`. `extra_prompt_tokens` are added to the
    estimated prompt (e.g. the proposers' answers an aggregator will read).
    """
    prompt_tokens = estimate_prompt_tokens(endpoint, body) + extra_prompt_tokens
    requested = body.get("max_completion_tokens") or body.get("max_tokens")
    worst = 0.0
    for d in deployments:
        if not (d.input_cost_per_million or d.output_cost_per_million):
            continue
        limit = requested or (max(d.context_length - prompt_tokens, 1) if d.context_length else DEFAULT_MAX_COMPLETION_TOKENS)
        worst = max(worst, d.cost_usd(prompt_tokens, limit * num_sequences(endpoint, body)))
    return worst


@dataclass
class RequestRecord:
    """Everything the request log and the metrics need about one request, filled in as it proceeds."""

    endpoint: str
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    started: float = field(default_factory=time.monotonic)
    identity: KeyIdentity | None = None
    policy: str | None = None
    model: str | None = None
    deployment: ModelDeployment | None = None
    decision: dict[str, Any] = field(default_factory=dict)
    body: dict[str, Any] | None = None
    stream: bool = False
    prompt_tokens: int = 0
    completion_tokens: int = 0
    has_usage: bool = False
    num_content_chunks: int = 0
    ttft_s: float | None = None
    status: str = "error"
    http_status: int | None = None
    error: str | None = None
    reservation: Reservation | None = None
    is_finished: bool = False
    is_executed: bool = False  # a plan of several calls: tokens and cost are the sums of `add_call`
    calls_cost_usd: float = 0.0

    def add_usage(self, usage: dict | None) -> None:
        """Take the token counts of an OpenAI `usage` object (ignored when None)."""
        if usage:
            self.prompt_tokens = int(usage.get("prompt_tokens") or 0)
            self.completion_tokens = int(usage.get("completion_tokens") or 0)
            self.has_usage = True

    def add_call(self, model: str, deployment: ModelDeployment, prompt_tokens: int, completion_tokens: int, *,
                 estimated: bool = False) -> float:
        """Account one model call of an executed plan; returns its cost (USD, at `deployment`'s prices)."""
        cost = deployment.cost_usd(prompt_tokens, completion_tokens)
        self.is_executed = True
        self.prompt_tokens += prompt_tokens
        self.completion_tokens += completion_tokens
        self.calls_cost_usd += cost
        self.has_usage = True
        call = {"model": model, "deployment": deployment.deployment_id, "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens, "cost_usd": cost}
        if estimated:
            call["usage"] = "estimated"
        self.decision.setdefault("calls", []).append(call)
        return cost

    def mark_first_token(self) -> None:
        if self.ttft_s is None:
            self.ttft_s = time.monotonic() - self.started

    def fail(self, exc: BaseException) -> None:
        """Record a failure: an OpenAIError, a BackendError or anything else (a 500)."""
        if isinstance(exc, OpenAIError):
            self.status, self.http_status, self.error = exc.log_status, exc.status_code, exc.message
        elif isinstance(exc, BackendError):
            self.status = "timeout" if isinstance(exc, BackendTimeout) else ("invalid_request" if exc.status_code < 500 else "error")
            self.http_status, self.error = exc.status_code, exc.message
        else:
            self.status, self.http_status, self.error = "error", 500, f"{type(exc).__name__}: {exc}"

    @property
    def cost_usd(self) -> float:
        if self.is_executed:
            return self.calls_cost_usd
        return self.deployment.cost_usd(self.prompt_tokens, self.completion_tokens) if self.deployment else 0.0

    def estimate_missing_usage(self) -> None:
        """A backend that answered but reported no usage: estimate it (see the module docstring)."""
        if self.has_usage or self.is_executed or self.deployment is None or self.body is None:
            return
        if self.num_content_chunks or self.status == "ok":
            self.prompt_tokens = estimate_prompt_tokens(self.endpoint, self.body)
            self.completion_tokens = self.num_content_chunks
            self.decision["usage"] = "estimated"


class Accounting:
    """Budgets, token counts, request-log rows and metrics of finished requests.

    Args:
        metrics: the app's Prometheus metrics.
        writer: the request-log writer (None when `LINK_REQUEST_LOG=false`).
        ledger: the budget ledger (None when `LINK_BUDGETS=false`).
        limiter: the rate limiter (tokens per minute are counted after each request).
        redactor: cleans the log row's error and decision of secrets (link/redact.py); default: the token shapes only.
        instance: the gateway process that serves, its log rows' `instance` (the budget ledger's owner id:
            LINK_INSTANCE_ID, "-w<i>" for worker i of `link serve --workers N`; else an id fresh per process).
    """

    def __init__(self, metrics: GatewayMetrics, writer: RequestLogWriter | None, ledger: BudgetLedger | None,
                 limiter: RateLimiter | None, *, redactor: Redactor | None = None, instance: str | None = None):
        self.metrics, self.writer, self.ledger, self.limiter = metrics, writer, ledger, limiter
        self.redactor = redactor or Redactor()
        self.instance = instance
        # the ledger's two blocking calls per request run here rather than through asyncio.to_thread: same semantics,
        # a third less CPU for the ledger's share (link/blocking_calls.py)
        self.calls = BlockingCalls("accounting")

    async def reserve(self, record: RequestRecord, max_cost_usd: float) -> None:
        """Hold the request's maximum cost (USD) in its key's budget before any backend call.

        While the ledger's database is unreachable, a key with a budget is refused (fail closed: nothing could stop it
        overspending) and a key without one goes on with a reservation that holds nothing, whose spend is added once
        the database answers again (link/budgets.py).

        Raises:
            OpenAIError: 429 `insufficient_quota` when it does not fit in what is left of the budget (with
                `Retry-After` when it would fit once the reservations of requests in flight are settled); 503
                `budget_ledger_unavailable` (with `Retry-After`) for a key with a budget while the ledger is unreachable.
        """
        identity = record.identity
        if self.ledger is None or identity is None or identity.key_id is None:
            return
        try:
            record.reservation = await self.calls.run(self.ledger.reserve, identity.key_id, max_cost_usd)
        except BudgetExceeded as exc:
            # It would fit once the requests in flight settle (they usually cost less than they hold): say when
            # to retry. A budget spent for good gets no Retry-After: retrying cannot help.
            fits_later = exc.spend_usd + exc.max_cost_usd <= exc.budget_usd
            raise OpenAIError(429, f"You exceeded your budget: {exc}" + ("; requests in flight hold the rest, retry shortly"
                                                                         if fits_later else ""),
                              type_="insufficient_quota", code="insufficient_quota", log_status="budget_exceeded",
                              headers={"Retry-After": str(RETRY_AFTER_IN_FLIGHT_S)} if fits_later else None) from None
        except LedgerUnavailable as exc:
            if identity.has_budget:
                raise OpenAIError(503, f"API key {identity.name!r} has a budget, and {exc}, so its requests are refused "
                                  "until the database answers again; retry shortly.", type_="server_error",
                                  code="budget_ledger_unavailable", headers={"Retry-After": str(RETRY_AFTER_IN_FLIGHT_S)},
                                  log_status="error") from None
            record.reservation = Reservation.unheld(identity.key_id)
            record.decision["budget"] = "ledger_unavailable"

    def _settle(self, record: RequestRecord, cost_usd: float) -> None:
        if record.reservation is not None and record.reservation.is_open:
            self.ledger.settle(record.reservation, cost_usd)
        if self.limiter is not None and record.identity is not None:
            self.limiter.record_tokens(record.identity, record.prompt_tokens + record.completion_tokens)

    async def finish(self, record: RequestRecord) -> None:
        """Settle the budget, count tokens, write the log row and observe metrics; once per record, never raises."""
        if record.is_finished:
            return
        record.is_finished = True
        latency_s = time.monotonic() - record.started
        record.estimate_missing_usage()
        cost = record.cost_usd
        with anyio.CancelScope(shield=True):  # a client that left must not cancel the bookkeeping
            needs_db = record.reservation is not None or (record.identity is not None and record.identity.tpm_limit)
            if needs_db:
                try:
                    await self.calls.run(self._settle, record, cost)
                except Exception:
                    logger.exception("request %s: settling its cost failed", record.request_id)
        if self.writer is not None:
            self._write_row(record, cost, latency_s)
        self.metrics.observe(model=record.model or "", policy=record.policy or "", status=record.status,
                             prompt_tokens=record.prompt_tokens, completion_tokens=record.completion_tokens,
                             cost_usd=cost, latency_s=latency_s, ttft_s=record.ttft_s)

    def _write_row(self, record: RequestRecord, cost: float, latency_s: float) -> None:
        # The row's columns built directly (RequestLogWriter.write_values): the values are the gateway's own, typed
        # as the columns take them, so a RequestLogCreate's validation and model_dump per request buy nothing.
        body = record.body or {}
        user, metadata, identity = body.get("user"), body.get("metadata"), record.identity
        try:
            self.writer.write_values({
                "id": record.request_id, "created_at": utcnow(), "api_key_id": identity.key_id if identity else None,
                "caller": caller_of(identity), "policy": (record.policy or "")[:128] or None, "model": record.model,
                "deployment": record.deployment.deployment_id if record.deployment else None,
                "decision": self.redactor.redact_json(record.decision) or None,
                "prompt_tokens": record.prompt_tokens, "completion_tokens": record.completion_tokens, "cost_usd": cost,
                "ttft_ms": None if record.ttft_s is None else record.ttft_s * 1000, "latency_ms": latency_s * 1000,
                "status": record.status, "http_status": record.http_status, "error": self.redactor.redact(record.error),
                "stream": bool(record.stream), "instance": self.instance, "user": user[:256] if isinstance(user, str) else None,
                "metadata": metadata if isinstance(metadata, dict) else None})
        except Exception:
            logger.exception("request %s: its log row could not be queued", record.request_id)
