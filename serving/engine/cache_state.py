"""What a gateway needs to route to this engine: its KV block size, prefix-cache state and queue state.

    state = engine_state(async_engine)        # an `CacheAndQueueState`, served as JSON by `GET /v1/engine/state`
    state.to_dict()["block_size"]             # 16

A gateway balancing several engine replicas (link/replica_routing.py) hashes a request's prompt prefix in chunks
scaled to `block_size`, prefers the replica that already served that prefix, and bounds each replica's load with
the queue counts below (running, waiting) and the free KV blocks. The counts are read between steps without a lock:
each is one `len()` or one integer, so a reading is at most one step stale, which a poller every second or so
never notices.

The engine's own block hashes (`serving.engine.block_manager.hash_block`, over token ids) are not reported: a
gateway does not tokenize, so it could not compare them with anything; it keeps its own map of which replica
served which prefix and uses this report for the load and the cache's size and hit rate.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class CacheAndQueueState:
    """One reading of an engine's routing state.

    Attributes:
        block_size: token positions per KV block.
        num_blocks: KV blocks in all.
        num_free_blocks: blocks no running sequence holds (cached prefix blocks among them, evictable).
        num_cached_blocks: blocks holding a full block's chained content hash: in use, or free and still findable by
            a later request with the same prefix.
        enable_prefix_caching: whether the engine reuses cached prefix blocks at all.
        prefix_cache_queries: prompt tokens of every sequence allocated so far (cumulative, prefix caching on).
        prefix_cache_hits: of those, tokens whose KV came from the cache (cumulative).
        num_running: sequences in the running batch.
        num_waiting: sequences waiting for admission.
    """

    block_size: int
    num_blocks: int
    num_free_blocks: int
    num_cached_blocks: int
    enable_prefix_caching: bool
    prefix_cache_queries: int
    prefix_cache_hits: int
    num_running: int
    num_waiting: int

    @property
    def prefix_cache_hit_rate(self) -> float:
        """prefix_cache_hits / prefix_cache_queries, in [0, 1]; 0.0 before any query."""
        return self.prefix_cache_hits / self.prefix_cache_queries if self.prefix_cache_queries else 0.0

    def to_dict(self) -> dict:
        """The JSON body of `GET /v1/engine/state`: the fields plus `prefix_cache_hit_rate`."""
        return {**asdict(self), "prefix_cache_hit_rate": self.prefix_cache_hit_rate}


def engine_state(engine) -> CacheAndQueueState:
    """Read `engine` (a `serving.engine.async_engine.AsyncLLMEngine`) into an `CacheAndQueueState`."""
    bm = engine.engine.block_manager
    return CacheAndQueueState(
        block_size=bm.block_size, num_blocks=bm.num_blocks, num_free_blocks=bm.num_free_blocks,
        num_cached_blocks=sum(block.hash is not None for block in bm.blocks),
        enable_prefix_caching=bm.enable_prefix_caching, prefix_cache_queries=bm.prefix_cache_queries,
        prefix_cache_hits=bm.prefix_cache_hits, num_running=engine.num_running,
        num_waiting=engine.num_waiting)
