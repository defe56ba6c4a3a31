"""Prometheus metrics of one engine server, in a registry owned by the app (no global state)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from kernels.metrics import KernelCollector

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
RATE_BUCKETS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
DRAFT_LENGTH_BUCKETS = (1, 1.5, 2, 3, 4, 5, 6, 8, 12, 16)


class EngineMetrics:
    """Counters, gauges and histograms; gauges are refreshed from the engine on each scrape."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.running = Gauge("link_engine_requests_running", "Sequences in the running batch.", registry=r)
        self.waiting = Gauge("link_engine_requests_waiting", "Sequences waiting for admission.", registry=r)
        self.kv_blocks_used = Gauge("link_engine_kv_blocks_used", "KV cache blocks in use.", registry=r)
        self.kv_blocks_total = Gauge("link_engine_kv_blocks_total", "KV cache blocks in all.", registry=r)
        self.prefix_hit_rate = Gauge("link_engine_prefix_cache_hit_rate", "Prompt tokens served from the prefix cache / prompt tokens.", registry=r)
        self.prompt_tokens = Counter("link_engine_prompt_tokens", "Prompt tokens processed.", registry=r)
        self.generation_tokens = Counter("link_engine_generation_tokens", "Tokens generated.", registry=r)
        self.tokens_per_second = Gauge("link_engine_generation_tokens_per_second", "Output tokens/s of the last finished request.", registry=r)
        self.requests = Counter("link_engine_requests", "Finished requests by finish reason.", ["finish_reason"], registry=r)
        self.ttft = Histogram("link_engine_time_to_first_token_seconds", "Time to first token.", buckets=LATENCY_BUCKETS, registry=r)
        self.itl = Histogram("link_engine_inter_token_latency_seconds", "Mean inter-token latency per request.", buckets=LATENCY_BUCKETS, registry=r)
        r.register(KernelCollector())  # link_kernel_calls / link_kernel_winner_speedup (kernels/metrics.py)
        self.e2e = Histogram("link_engine_request_latency_seconds", "Request latency, arrival to last token.", buckets=LATENCY_BUCKETS, registry=r)
        # Speculative decoding (serving/spec_decode), observed per finished request when it is on.
        self.spec_draft_tokens = Counter("link_engine_spec_draft_tokens", "Speculative draft tokens verified.", registry=r)
        self.spec_accepted_tokens = Counter("link_engine_spec_accepted_tokens", "Speculative draft tokens accepted.", registry=r)
        self.spec_acceptance_rate = Histogram("link_engine_spec_acceptance_rate", "Per request: accepted / drafted tokens.",
                                              buckets=RATE_BUCKETS, registry=r)
        self.spec_draft_length = Histogram("link_engine_spec_draft_length", "Per request: mean draft tokens per verification step.",
                                           buckets=DRAFT_LENGTH_BUCKETS, registry=r)

    def refresh(self, engine) -> None:
        """Read the engine's current state into the gauges (`engine` is an `AsyncLLMEngine`)."""
        bm = engine.engine.block_manager
        self.running.set(engine.num_running)
        self.waiting.set(engine.num_waiting)
        self.kv_blocks_used.set(bm.num_used_blocks)
        self.kv_blocks_total.set(bm.num_blocks)
        self.prefix_hit_rate.set(bm.prefix_cache_hit_rate)

    def observe_finished(self, output, elapsed: float) -> None:
        """Record a finished `RequestOutput` that took `elapsed` seconds end to end."""
        m = output.metrics
        num_out = sum(len(c.token_ids) for c in output.outputs)
        self.prompt_tokens.inc(len(output.prompt_token_ids))
        self.generation_tokens.inc(num_out)
        for c in output.outputs:
            self.requests.labels(c.finish_reason or "abort").inc()
        if "ttft_seconds" in m:
            self.ttft.observe(m["ttft_seconds"])
        if "itl_seconds" in m:
            self.itl.observe(m["itl_seconds"])
        self.e2e.observe(elapsed)
        spec = getattr(output, "speculative", None)
        if spec is not None and spec.num_draft_tokens:
            self.spec_draft_tokens.inc(spec.num_draft_tokens)
            self.spec_accepted_tokens.inc(spec.num_accepted_tokens)
            self.spec_acceptance_rate.observe(spec.acceptance_rate)
            self.spec_draft_length.observe(spec.mean_draft_length)
        if elapsed > 0:
            self.tokens_per_second.set(num_out / elapsed)
