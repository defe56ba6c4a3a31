"""What routing reads of one OpenAI request, parsed once: `RoutingRequest`.

    request = RoutingRequest.from_body(body, cost_penalty=50.0)   # a chat or completions body
    request.text                     # the last user turn (a completion's prompt)
    router.score(request)            # features from it; loaded.decide(request) prices it too

A policy builds one per request and hands it to the router, the cost model and the decision rule, so the
request's text is extracted once (a plain body dict is still accepted where a request is read, and is
parsed on the spot). It holds the minimum: what the features, the cost model and the rule need.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal


def _content_text(content) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):   # content parts: keep the text ones
        return "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict) and p.get("type") == "text")
    return ""


def request_text(body: dict) -> str:
    """The text a router reads of an OpenAI request: for chat, the last user message (text parts joined;
    all messages joined when there is no user message); for completions, the prompt (the first one of a
    list; "" for token ids). Matches the outcome tables, whose prompt is the user's question."""
    messages = body.get("messages")
    if messages:
        users = [m for m in messages if isinstance(m, dict) and m.get("role") == "user"]
        if users:
            return _content_text(users[-1].get("content"))
        return "\n".join(_content_text(m.get("content")) for m in messages if isinstance(m, dict))
    prompt = body.get("prompt", "")
    if isinstance(prompt, list):
        prompt = prompt[0] if prompt else ""
    return prompt if isinstance(prompt, str) else ""


def _max_output_tokens(body: dict) -> float | None:
    """`max_completion_tokens`, else `max_tokens`, when it is a number (a bool is not one)."""
    limit = body.get("max_completion_tokens")
    limit = body.get("max_tokens") if limit is None else limit
    return float(limit) if isinstance(limit, (int, float)) and not isinstance(limit, bool) else None


@dataclass(frozen=True)
class RoutingRequest:
    """One request as routing reads it.

    Attributes:
        text: what the router reads (`request_text`).
        endpoint: "chat" or "completion".
        num_user_turns: user messages (at least 1; a completion counts as one turn).
        has_tools: the request offers tools (`tools`, or legacy `functions`).
        max_output_tokens: the completion-token limit (`max_completion_tokens`, else `max_tokens`; None: none),
            which caps a priced model's expected output.
        suite: `metadata.suite` when given (offline replay labels its prompts' task), else None.
        cost_penalty: lambda in quality points per USD for this request (None: the router file's).
        max_cost_usd: the request's cost ceiling in USD (None: none).
    Raises:
        ValueError: an unknown endpoint, fewer than one user turn, or a negative knob.
    """

    text: str
    endpoint: Literal["chat", "completion"] = "chat"
    num_user_turns: int = 1
    has_tools: bool = False
    max_output_tokens: float | None = None
    suite: str | None = None
    cost_penalty: float | None = None
    max_cost_usd: float | None = None

    def __post_init__(self) -> None:
        if self.endpoint not in ("chat", "completion"):
            raise ValueError(f"endpoint must be 'chat' or 'completion', got {self.endpoint!r}")
        if self.num_user_turns < 1:
            raise ValueError(f"num_user_turns must be >= 1, got {self.num_user_turns}")
        for name in ("cost_penalty", "max_cost_usd"):
            value = getattr(self, name)
            if value is not None and not value >= 0:
                raise ValueError(f"{name} must be >= 0, got {value}")

    @classmethod
    def from_body(cls, body: dict[str, Any], *, endpoint: str | None = None, cost_penalty: float | None = None,
                  max_cost_usd: float | None = None) -> RoutingRequest:
        """Read an OpenAI chat or completions body (already validated by the gateway; offline, any dict).

        Args:
            endpoint: "chat" or "completion" (default: "chat" when the body has messages).
            cost_penalty, max_cost_usd: the knobs, as the policy resolved them (its options, the request's
                metadata overrides).
        """
        messages = body.get("messages")
        turns = sum(1 for m in messages if isinstance(m, dict) and m.get("role") == "user") if messages else 1
        suite = (body.get("metadata") or {}).get("suite")
        return cls(request_text(body), endpoint or ("chat" if messages is not None else "completion"),
                   max(turns, 1), bool(body.get("tools") or body.get("functions")), _max_output_tokens(body),
                   suite if isinstance(suite, str) and suite else None, cost_penalty, max_cost_usd)

    @classmethod
    def of(cls, request: RoutingRequest | dict[str, Any]) -> RoutingRequest:
        """`request` itself, or a body dict read by `from_body` (without knobs)."""
        return request if isinstance(request, cls) else cls.from_body(request)
