"""Prometheus metrics of the gateway, per model and policy, in a registry owned by the app (no global state).

    metrics = GatewayMetrics(is_served=policies.is_served)
    metrics.observe(model="smollm2", policy="fallback-a", status="ok", prompt_tokens=12, completion_tokens=30,
                    cost_usd=0.0, latency_s=0.8, ttft_s=0.1)
    generate_latest(metrics.registry)      # the /metrics page

Labels name only what the gateway serves (its models and its policies, config or database); any other name a
client sends is counted under `UNKNOWN`. Every label value makes about two dozen series (counters, histogram
buckets), so labelling by the raw request would let each made-up model name grow /metrics without bound.
"""

from __future__ import annotations

from typing import Callable

from prometheus_client import CollectorRegistry, Counter, Histogram

from kernels.metrics import KernelCollector

LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
UNKNOWN = "unknown"  # the label of every name the gateway does not serve


class GatewayMetrics:
    """Counters and histograms labelled by model (the one that answered; "" when none did) and policy.

    Args:
        is_served: name -> whether the gateway serves it as a model or a policy (`PolicyStore.is_served`);
            a label that is neither is recorded as `UNKNOWN`.
    """

    def __init__(self, is_served: Callable[[str], bool]) -> None:
        self.is_served = is_served
        self.registry = CollectorRegistry()
        labels = ("model", "policy")
        r = self.registry
        self.requests = Counter("link_requests", "Gateway requests by outcome", (*labels, "status"), registry=r)
        self.errors = Counter("link_errors", "Gateway requests that failed (any status but ok)", (*labels, "status"), registry=r)
        self.prompt_tokens = Counter("link_prompt_tokens", "Prompt tokens billed", labels, registry=r)
        self.completion_tokens = Counter("link_completion_tokens", "Completion tokens billed", labels, registry=r)
        self.cost = Counter("link_cost_usd", "Cost in USD at the models' prices", labels, registry=r)
        self.latency = Histogram("link_request_latency_seconds", "Whole request latency, seconds", labels,
                                 buckets=LATENCY_BUCKETS_S, registry=r)
        r.register(KernelCollector())  # link_kernel_calls / link_kernel_winner_speedup (kernels/metrics.py)
        self.ttft = Histogram("link_time_to_first_token_seconds", "Time to first token of streamed requests, seconds",
                              labels, buckets=LATENCY_BUCKETS_S, registry=r)

    def label(self, name: str) -> str:
        """`name` as a label value: "" (none) and served names as they are, anything else `UNKNOWN`."""
        return name if not name or self.is_served(name) else UNKNOWN

    def observe(self, *, model: str, policy: str, status: str, prompt_tokens: int, completion_tokens: int,
                cost_usd: float, latency_s: float, ttft_s: float | None) -> None:
        """Record one finished request (tokens as counts, cost in USD, times in seconds); counters only grow."""
        model, policy = self.label(model), self.label(policy)
        self.requests.labels(model, policy, status).inc()
        if status != "ok":
            self.errors.labels(model, policy, status).inc()
        if prompt_tokens > 0:
            self.prompt_tokens.labels(model, policy).inc(prompt_tokens)
        if completion_tokens > 0:
            self.completion_tokens.labels(model, policy).inc(completion_tokens)
        if cost_usd > 0:
            self.cost.labels(model, policy).inc(cost_usd)
        self.latency.labels(model, policy).observe(latency_s)
        if ttft_s is not None:
            self.ttft.labels(model, policy).observe(ttft_s)
