"""What each engine replica reports about its load and KV cache, polled by the gateway for cache-aware routing.

    poller = ReplicaStatePoller()                        # one per pool, built in the app's lifespan
    load = await poller.poll(deployment)                 # a ReplicaLoad, or None when the replica reports nothing
    await poller.aclose()

Two sources, tried in this order for a deployment of kind "openai" (`api_base` "http://host:port/v1"):

1. `GET {root}/v1/engine/state`: our engine (`link engine serve`, `serving.engine.cache_state`): block size,
   running and waiting sequences, free and cached KV blocks, prefix-cache queries and hits.
2. `GET {root}/metrics`: a Prometheus text page, read with prometheus-client's parser. vLLM's names:
   `vllm:num_requests_running`, `vllm:num_requests_waiting`, `vllm:kv_cache_usage_perc` (V1; V0's
   `vllm:gpu_cache_usage_perc`), the counters `vllm:prefix_cache_queries_total` / `vllm:prefix_cache_hits_total`
   (V1; V0's gauge `vllm:gpu_prefix_cache_hit_rate`) and the `block_size` label of `vllm:cache_config_info`.
   SGLang's: `sglang:num_running_reqs`, `sglang:num_queue_reqs`, `sglang:token_usage`, `sglang:cache_hit_rate`.
   A page with neither family of names (our gateway's, a mock's) reports nothing.

`root` is `api_base` without its trailing `/v1`. The source that answered is remembered per deployment, so a vLLM
server is not asked for our state page on every poll. Nothing here raises: an unreachable or unreadable replica
reports None and is balanced by the gateway's own count of requests in flight.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import httpx

from link.config import ModelDeployment

STATE_PATH = "/v1/engine/state"
METRICS_PATH = "/metrics"


@dataclass(frozen=True)
class ReplicaLoad:
    """One reading of a replica's load.

    Attributes:
        source: "link-engine", "vllm" or "sglang".
        num_running: requests (sequences) being decoded or prefilled.
        num_waiting: requests queued for admission.
        block_size: tokens per KV block; None when the replica does not say (SGLang: a radix cache of pages).
        kv_cache_usage: fraction of the KV cache in use, in [0, 1]; None when unknown.
        prefix_cache_hit_rate: prompt tokens served from the prefix cache / prompt tokens, cumulative; None when unknown.
    """

    source: str
    num_running: int
    num_waiting: int
    block_size: int | None = None
    kv_cache_usage: float | None = None
    prefix_cache_hit_rate: float | None = None

    @property
    def num_queued(self) -> int:
        """Requests in the engine: running plus waiting."""
        return self.num_running + self.num_waiting

    def to_dict(self) -> dict:
        return {"source": self.source, "running": self.num_running, "waiting": self.num_waiting,
                "block_size": self.block_size, "kv_cache_usage": self.kv_cache_usage,
                "prefix_cache_hit_rate": self.prefix_cache_hit_rate}


def parse_engine_state(data: dict) -> ReplicaLoad:
    """Our engine's `GET /v1/engine/state` body (`serving.engine.cache_state.CacheAndQueueState.to_dict`) -> ReplicaLoad.

    Raises:
        ValueError: a missing or non-numeric field (KeyError and TypeError are raised as ValueError).
    """
    try:
        num_blocks = int(data["num_blocks"])
        return ReplicaLoad("link-engine", int(data["num_running"]), int(data["num_waiting"]), int(data["block_size"]),
                           (num_blocks - int(data["num_free_blocks"])) / num_blocks if num_blocks else None,
                           float(data["prefix_cache_hit_rate"]))
    except (KeyError, TypeError) as exc:
        raise ValueError(f"not an engine state body: {exc!r}") from None


def _first(values: dict[str, float], *names: str) -> float | None:
    return next((values[name] for name in names if name in values), None)


def parse_prometheus_load(text: str) -> ReplicaLoad | None:
    """A vLLM or SGLang Prometheus page -> ReplicaLoad (samples of one name summed over their labels, e.g. over
    several `model_name`s); None when the page has neither's request gauges.

    Raises:
        ValueError: text that is not Prometheus exposition format.
    """
    from prometheus_client.parser import text_string_to_metric_families

    values: dict[str, float] = {}
    block_size: int | None = None
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            values[sample.name] = values.get(sample.name, 0.0) + sample.value
            if sample.name == "vllm:cache_config_info" and str(sample.labels.get("block_size", "")).isdigit():
                block_size = int(sample.labels["block_size"])
    if "vllm:num_requests_running" in values:
        queries = _first(values, "vllm:prefix_cache_queries_total", "vllm:prefix_cache_queries")
        hits = _first(values, "vllm:prefix_cache_hits_total", "vllm:prefix_cache_hits")
        hit_rate = hits / queries if queries and hits is not None else _first(values, "vllm:gpu_prefix_cache_hit_rate")
        return ReplicaLoad("vllm", round(values["vllm:num_requests_running"]), round(values.get("vllm:num_requests_waiting", 0.0)),
                           block_size, _first(values, "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"), hit_rate)
    if "sglang:num_running_reqs" in values:
        return ReplicaLoad("sglang", round(values["sglang:num_running_reqs"]), round(values.get("sglang:num_queue_reqs", 0.0)),
                           None, values.get("sglang:token_usage"), values.get("sglang:cache_hit_rate"))
    return None


class ReplicaStatePoller:
    """Reads replicas' load over HTTP (see the module docstring); one client for all the replicas of a pool.

    Args:
        timeout_s: seconds each GET may take; a slower replica reports None this round.
    """

    def __init__(self, timeout_s: float = 2.0):
        self._client = httpx.AsyncClient(timeout=timeout_s)
        self._source: dict[str, str] = {}  # deployment id -> the path that answered last

    async def poll(self, deployment: ModelDeployment) -> ReplicaLoad | None:
        """The replica's load now; None for a kind other than "openai" or a replica that reports nothing. Never raises."""
        if deployment.kind != "openai" or not deployment.api_base:
            return None
        base = deployment.api_base.rstrip("/")
        root = base.removesuffix("/v1")
        key = os.environ.get(deployment.api_key_env) if deployment.api_key_env else None
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        known = self._source.get(deployment.deployment_id)
        for path in (known,) if known else (STATE_PATH, METRICS_PATH):
            try:
                response = await self._client.get(root + path, headers=headers)
                if response.status_code != 200:
                    continue
                load = parse_engine_state(response.json()) if path == STATE_PATH else parse_prometheus_load(response.text)
            except (httpx.HTTPError, OSError, ValueError):
                continue
            if load is not None:
                self._source[deployment.deployment_id] = path
                return load
        self._source.pop(deployment.deployment_id, None)  # ask both again next round
        return None

    async def aclose(self) -> None:
        await self._client.aclose()
