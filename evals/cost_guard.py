"""What the runner puts around every target call: a hard spending cap (--max-cost) and retries with backoff.

    guard = CostGuard(max_cost_usd=0.50)
    target = GuardedTarget(raw_target, guard, retries=3, backoff_s=0.5)
    completion = await target.chat(messages, max_tokens=512)   # BudgetExhausted when the call might not fit

Before a call, its cost bound is reserved: prompt characters / 2 as tokens x input price + `max_tokens` x output
price (the target's `prices`; a policy's are its priciest candidate's), times the calls one request makes
for a policy that makes several (a MoA, a cascade: the target's `call_bound`, from the policy's card, each
call's prompt also holding earlier answers). With unknown prices, the bound is the
largest cost one call of that target has had so far, and until one call has been charged only one call of
that target is in flight. A call is launched only when spend + reservations + its bound <= the cap, so the
spend stays under the cap as long as a prompt has fewer tokens than half its characters (English runs
about four characters per token). After the call the real cost replaces the reservation.
"""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any

from evals.targets import CallBound, Completion, Prices, Target, TargetError

CHARS_PER_TOKEN_BOUND = 2
# Completion tokens assumed when a request sets no max_tokens.
DEFAULT_MAX_TOKENS = 4096
MAX_BACKOFF_S = 30.0


class BudgetExhausted(Exception):
    """The next call could exceed --max-cost: the runner stops launching work."""


def cost_bound_usd(prices: Prices, request: Any, params: dict[str, Any], calls: CallBound | None = None) -> float:
    """Upper bound of a request's USD cost: len(prompt)/2 tokens at the input price + max_tokens at the output
    price; with `calls` (a multi-call policy), calls.calls times that, each call's prompt grown by
    calls.prompt_tokens_per_max_token x max_tokens + calls.extra_prompt_tokens.

    Args:
        request: chat messages (their JSON is counted, so roles and tool schemas are included) or a prompt string.
        params: OpenAI body fields; `max_tokens` / `max_completion_tokens` (else DEFAULT_MAX_TOKENS), `n`, `tools`.
    """
    text = request if isinstance(request, str) else json.dumps(request, ensure_ascii=False)
    if params.get("tools"):
        text += json.dumps(params["tools"], ensure_ascii=False)
    prompt_tokens = -(-len(text) // CHARS_PER_TOKEN_BOUND)
    max_tokens = int(params.get("max_completion_tokens") or params.get("max_tokens") or DEFAULT_MAX_TOKENS)
    completion_tokens = max_tokens * int(params.get("n") or 1)
    if calls is None:
        return prices.cost_usd(prompt_tokens, completion_tokens)
    per_call_prompt = prompt_tokens + calls.prompt_tokens_per_max_token * max_tokens + calls.extra_prompt_tokens
    return calls.calls * prices.cost_usd(per_call_prompt, completion_tokens)


class CostGuard:
    """Spend and reservations of one run against an optional cap (USD).

    Attributes:
        max_cost_usd: the cap; None = unlimited (nothing is reserved).
        spent_usd: real cost of the calls made (cache hits cost nothing).
        reserved_usd: bounds of the calls in flight.
        is_exhausted: a call was refused; no more are launched.
    """

    def __init__(self, max_cost_usd: float | None = None):
        if max_cost_usd is not None and max_cost_usd < 0:
            raise ValueError(f"max_cost_usd must be >= 0, got {max_cost_usd}")
        self.max_cost_usd = max_cost_usd
        self.spent_usd = 0.0
        self.reserved_usd = 0.0
        self.is_exhausted = False
        self._largest: dict[str, float] = {}  # target name -> largest real cost of one call
        self._probing: set[str] = set()       # targets of unknown price whose first call is in flight
        self._changed = asyncio.Condition()

    async def reserve(self, name: str, bound: float | None) -> float:
        """Reserve a call of target `name` with cost bound `bound` (None: unknown prices); returns the amount.

        Raises:
            BudgetExhausted: spend + reservations + the bound would exceed the cap (or an earlier call was refused).
        """
        if self.max_cost_usd is None:
            return 0.0
        async with self._changed:
            while bound is None and name not in self._largest and name in self._probing and not self.is_exhausted:
                await self._changed.wait()
            if self.is_exhausted:
                raise BudgetExhausted("the cost cap was reached")
            if bound is None:
                bound = self._largest.get(name, 0.0)
                if name not in self._largest:
                    self._probing.add(name)
            if self.spent_usd + self.reserved_usd + bound > self.max_cost_usd:
                self.is_exhausted = True
                self._changed.notify_all()
                raise BudgetExhausted(f"spent ${self.spent_usd:.6f} + in flight ${self.reserved_usd:.6f} + the next call's "
                                      f"bound ${bound:.6f} would exceed --max-cost ${self.max_cost_usd:.6f}")
            self.reserved_usd += bound
            return bound

    async def settle(self, name: str, reserved: float, cost_usd: float | None) -> None:
        """Replace a reservation by the call's real cost (None: the call failed and cost nothing)."""
        async with self._changed:
            self.reserved_usd = max(0.0, self.reserved_usd - reserved)
            if cost_usd is not None:
                self.spent_usd += cost_usd
                self._largest[name] = max(self._largest.get(name, 0.0), cost_usd)
            self._probing.discard(name)
            self._changed.notify_all()


class GuardedTarget:
    """`target` with a reservation before each attempt and retries of retryable `TargetError`s.

    Backoff before retry k (k = 0, 1, ...): `backoff_s * 2**k`, scaled by a random factor in [0.5, 1.5) (jitter, so
    concurrent retries spread out), at most 30 s.

    Args:
        target: the target to call. guard: the run's CostGuard. retries: extra attempts after the first.
        backoff_s: base delay in seconds. rng: jitter source (seeded in tests).
    Raises (from chat/complete):
        TargetError: the last attempt's error (non-retryable errors at once). BudgetExhausted: see CostGuard.reserve.
    """

    def __init__(self, target: Target, guard: CostGuard, *, retries: int = 3, backoff_s: float = 0.5,
                 rng: random.Random | None = None):
        self.target, self.guard, self.retries, self.backoff_s = target, guard, retries, backoff_s
        self.name = target.name
        self.prices: Prices | None = getattr(target, "prices", None)
        self.call_bound: CallBound | None = getattr(target, "call_bound", None)
        self.rng = rng or random.Random()
        self.sleep = asyncio.sleep  # replaceable in tests
        self.attempts = 0

    async def chat(self, messages: list[dict[str, Any]], **params: Any) -> Completion:
        return await self._call(self.target.chat, messages, params)

    async def complete(self, prompt: str, **params: Any) -> Completion:
        return await self._call(self.target.complete, prompt, params)

    async def _call(self, call, request: Any, params: dict[str, Any]) -> Completion:
        bound = cost_bound_usd(self.prices, request, params, self.call_bound) if self.prices is not None else None
        for attempt in range(self.retries + 1):
            reserved = await self.guard.reserve(self.name, bound)
            self.attempts += 1
            try:
                completion = await call(request, **params)
            except TargetError as exc:
                await self.guard.settle(self.name, reserved, None)
                if not exc.retryable or attempt == self.retries:
                    raise
                delay = min(MAX_BACKOFF_S, self.backoff_s * 2**attempt) * (0.5 + self.rng.random())
                await self.sleep(delay)
                continue
            except BaseException:
                await asyncio.shield(self.guard.settle(self.name, reserved, None))
                raise
            await self.guard.settle(self.name, reserved, completion.cost_usd)
            return completion
        raise AssertionError("unreachable")
