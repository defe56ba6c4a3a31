"""Gateway targets: a model or policy served by the TogetherLink gateway, reached with the official `openai` client.

    async with in_process_gateway(settings, config) as gateway:     # create_app + lifespan, no port
        target = GatewayTarget("smollm2-135m-instruct", gateway.client, prices=Prices(0, 0))
        completion = await target.chat([{"role": "user", "content": "2+2?"}], temperature=0, max_tokens=16)
    async with remote_gateway("http://127.0.0.1:8000/v1", api_key="sk-...") as gateway:   # --base-url
        ...

Cost of a call: the gateway's `x-link-cost-usd` response header when present; else `usage.link_billed.cost_usd`
(a policy of several calls: MoA, cascade); else the prices of the model that answered (`x-link-model`, from the
gateway's config); else the target's own prices; else 0. Tokens: what the call was billed for, so
`usage.link_billed` when present (a multi-call policy's `usage` is its answer's own call alone).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

import httpx
import openai

from evals.target_errors import target_error
from evals.targets import CallBound, Completion, Prices, TargetError, token_logprobs_of, top_logprobs_of

COST_HEADER = "x-link-cost-usd"
MODEL_HEADER = "x-link-model"
# The `openai` client needs some key; a server without keys (open mode, a mock) ignores it.
OPEN_MODE_KEY = "sk-link-eval-open-mode"


def billed_tokens(billed: dict | None) -> tuple[int, int] | None:
    """(prompt, completion) tokens of a gateway answer's `usage.link_billed` (every call of a MoA or cascade), or
    None when absent or not counts."""
    if not billed:
        return None
    prompt, completion = billed.get("prompt_tokens"), billed.get("completion_tokens")
    if isinstance(prompt, int) and isinstance(completion, int):
        return prompt, completion
    return None


class GatewayTarget:
    """A model or policy name served by the gateway (or any OpenAI-compatible server).

    Args:
        name: the `model` sent with every request.
        client: an `openai.AsyncOpenAI` pointing at the gateway's /v1.
        prices: the highest prices this target's calls can be charged (None: unknown); used for --max-cost.
        model_prices: prices by model name, charged for the model named in `x-link-model` when the response
            carries no cost header.
        call_bound: for a policy making several calls per request (its card's cost_bound), used for --max-cost.
    Raises (from chat/complete):
        TargetError: the call failed; `retryable` for timeouts, connection errors, 429 and 5xx.
    """

    def __init__(self, name: str, client: openai.AsyncOpenAI, *, prices: Prices | None = None,
                 model_prices: dict[str, Prices] | None = None, call_bound: CallBound | None = None):
        self.name, self.client, self.prices, self.call_bound = name, client, prices, call_bound
        self.model_prices = dict(model_prices or {})

    def __repr__(self) -> str:
        return f"GatewayTarget({self.name!r}, base_url={str(self.client.base_url)!r})"

    async def chat(self, messages: list[dict[str, Any]], **params: Any) -> Completion:
        """POST /v1/chat/completions (not streamed); `params` are OpenAI body fields."""
        return await self._call("chat", {"messages": messages}, params)

    async def complete(self, prompt: str, **params: Any) -> Completion:
        """POST /v1/completions (not streamed), for base models; `params` are OpenAI body fields."""
        return await self._call("completion", {"prompt": prompt}, params)

    async def _call(self, kind: str, request: dict[str, Any], params: dict[str, Any]) -> Completion:
        params = {k: v for k, v in params.items() if k != "stream"}
        api = self.client.chat.completions if kind == "chat" else self.client.completions
        start = time.perf_counter()
        try:
            raw = await api.with_raw_response.create(model=self.name, **request, extra_body=params)
            response = raw.parse()
        except Exception as exc:  # noqa: BLE001  (every client error becomes a TargetError)
            raise target_error(exc) from exc
        latency = time.perf_counter() - start
        if not response.choices:
            raise TargetError(f"{self.name}: the response has no choices")
        choice = response.choices[0]
        if kind == "chat":
            text = choice.message.content or ""
            calls = [c.model_dump() for c in choice.message.tool_calls] if choice.message.tool_calls else None
        else:
            text, calls = choice.text or "", None
        usage = response.usage
        billed = getattr(usage, "link_billed", None) if usage else None
        billed = billed if isinstance(billed, dict) else None
        prompt_tokens, completion_tokens = billed_tokens(billed) or ((usage.prompt_tokens, usage.completion_tokens)
                                                                     if usage else (0, 0))
        served = unquote(raw.headers.get(MODEL_HEADER) or "") or response.model or self.name   # percent-encoded
        return Completion(text=text, tool_calls=calls, finish_reason=choice.finish_reason, model=served,
                          prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                          cost_usd=self._cost(raw.headers, billed, served, prompt_tokens, completion_tokens),
                          latency_s=latency, top_logprobs=top_logprobs_of(choice, kind),
                          token_logprobs=token_logprobs_of(choice, kind))

    def _cost(self, headers: httpx.Headers, billed: dict | None, served: str, prompt_tokens: int,
              completion_tokens: int) -> float:
        for value in (headers.get(COST_HEADER), (billed or {}).get("cost_usd")):
            try:
                if value is not None and value != "":
                    return max(0.0, float(value))
            except (TypeError, ValueError):
                pass
        prices = self.model_prices.get(served) or self.model_prices.get(self.name) or self.prices
        return prices.cost_usd(prompt_tokens, completion_tokens) if prices else 0.0


@dataclass
class GatewayConnection:
    """An open connection to a gateway.

    Attributes:
        client: `openai.AsyncOpenAI` for /v1.
        cards: GET /v1/models, model and policy cards by id.
        config: the gateway's `LinkConfig` when it runs in-process (None for --base-url).
        prices: per-model prices from that config (empty for --base-url: the cost header is used).
    """

    client: openai.AsyncOpenAI
    cards: dict[str, dict[str, Any]]
    config: Any = None
    prices: dict[str, Prices] = field(default_factory=dict)

    def chat_format(self, name: str) -> str | None:
        """"template" / "in-context" of a served local model when known (card, config or registry), else None."""
        link = (self.cards.get(name) or {}).get("link") or {}
        if link.get("chat_format") or self.config is None:
            return link.get("chat_format")
        deployments = self.config.deployments(name)
        if not deployments or deployments[0].kind != "local":
            return None
        deployment = deployments[0]
        if deployment.chat_format or deployment.is_local_path:
            return deployment.chat_format or "template"
        from serving.registry import default_registry

        try:
            return default_registry().get(deployment.local).chat_format
        except Exception:  # noqa: BLE001  (an unknown registry name: the gateway reports it on first use)
            return None

    def style_for(self, name: str) -> str:
        """"completion" when `name` (a model, or every model of a policy) is a base model whose chat format is
        "in-context"; else "chat"."""
        link = (self.cards.get(name) or {}).get("link") or {}
        models = link.get("models") if link.get("type") == "policy" else None
        formats = [self.chat_format(m) for m in (models or [name])]
        return "completion" if formats and all(f == "in-context" for f in formats) else "chat"


async def _cards(client: openai.AsyncOpenAI) -> dict[str, dict[str, Any]]:
    try:
        page = await client.models.list()
    except Exception as exc:  # noqa: BLE001
        raise target_error(exc) from exc
    return {m.id: m.model_dump() for m in page.data}


@asynccontextmanager
async def in_process_gateway(settings: Any = None, config: Any = None, *,
                             api_key: str | None = None) -> AsyncIterator[GatewayConnection]:
    """Build `link.app.create_app(settings, config)`, run its lifespan, and talk to it over ASGI (no port).

    Args:
        settings: `link.settings.Settings` (default: the LINK_* environment); its database is migrated.
        config: `link.config.LinkConfig` (default: settings.config, else the embedded two local models).
        api_key: the key sent. Default: a random master key made for this app alone (a settings override,
            never stored or printed), so the run works in open mode and once keys exist alike.
    Raises:
        link.config.ConfigError, pydantic.ValidationError: invalid config or settings.
    """
    from pydantic import SecretStr

    from link.app import create_app
    from link.config import load_config
    from link.settings import get_settings

    settings = settings or get_settings()
    config = config or load_config(settings.config)
    key = api_key
    if key is None:
        key = "sk-link-eval-" + secrets.token_urlsafe(24)
        settings = settings.model_copy(update={"master_key": SecretStr(key)})
    app = create_app(settings, config)
    prices = {d.name: Prices(d.input_cost_per_million, d.output_cost_per_million) for d in config.models}
    async with app.router.lifespan_context(app):
        http = httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://link.local", timeout=None)
        client = openai.AsyncOpenAI(base_url="http://link.local/v1", api_key=key, http_client=http, max_retries=0)
        try:
            yield GatewayConnection(client, await _cards(client), config, prices)
        finally:
            await client.close()


@asynccontextmanager
async def remote_gateway(base_url: str, api_key: str | None = None, *,
                         timeout_s: float = 600.0) -> AsyncIterator[GatewayConnection]:
    """A running gateway or any OpenAI-compatible server at `base_url` (".../v1"), over real HTTP.

    Raises:
        TargetError: listing /v1/models failed: "cannot reach URL: connection refused" (no status), or the
            server's answer, e.g. status 401 when it refuses the key (None sends a placeholder).
    """
    client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key or OPEN_MODE_KEY, timeout=timeout_s, max_retries=0)
    try:
        try:
            cards = await _cards(client)
        except TargetError as exc:  # name the URL the user gave, not the /models endpoint
            message = f"cannot reach {base_url}: {exc.reason}" if exc.reason else f"{base_url}: {exc}"
            raise TargetError(message, retryable=exc.retryable, status=exc.status) from exc
        yield GatewayConnection(client, cards)
    finally:
        await client.close()


__all__ = ["GatewayTarget", "GatewayConnection", "in_process_gateway", "remote_gateway", "target_error"]
