"""What each replica routing can gain from prefix caching, without timing: the benchmark's prompts replayed one at a
time through the gateway's real router and N of the engine's real block managers.

    python -m benchmarks.link_bench.replica_cache_replay --replicas 2 --requests 400 --num-blocks 364
    replay_prefix_cache(token_ids, groups_texts, num_replicas=2, num_blocks=364)   # -> {routing: {...}}

Each prompt is rendered and tokenized as the engine renders a one-message chat (`workload.prompt_renderer`: the
model's chat template and tokenizer), then routed: `cache_aware` by `link.replica_routing.CacheAwareRouter` over the
request body the benchmark sends (every replica idle, so the load bound never binds and the longest remembered
prefix wins), `fewest_outstanding` in turn (what the gateway's pool does when every replica is idle: ties in
rotation). On the chosen replica a `serving.engine.block_manager.BlockManager` of `num_blocks` blocks of
`block_size` tokens (the engine's default 256 MiB holds 364 blocks of 16 SmolLM2 tokens: 5,824 tokens) allocates
the prompt, reusing its cached prefix blocks, marks it computed and frees it: the engine's own bookkeeping, with
its least-recently-used eviction of free cached blocks.

Why: it separates what routing could save (prompt tokens served from the cache, the prefill that is skipped) from
the machine's speed and noise. Requests one at a time are the best case for the cache: under load, running
sequences hold blocks too and fewer prefixes stay cached. Printed per routing: the prefix-cache hit rate (cached
prompt tokens / prompt tokens), the prompt tokens left to prefill per request, and each replica's share of requests.
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path
from typing import Sequence

from benchmarks.link_bench.replica_load import chat_body
from benchmarks.link_bench.replica_workloads import WORKLOADS, workload_prompts


def replay_prefix_cache(token_ids: Sequence[list[int]], texts: Sequence[str], num_replicas: int, num_blocks: int,
                        block_size: int = 16, min_match_chunks: int = 1) -> dict[str, dict]:
    """Replay requests (`token_ids[i]` as the engine sees prompt i, `texts[i]` as the gateway sees it) one at a time
    under each routing (see the module docstring); {routing: {"prefix_hit_rate", "prompt_tokens",
    "prefilled_tokens_per_request", "replica_request_shares"}}. `min_match_chunks` > 1 replays a variant of the
    cache-aware rule (not the gateway's): a remembered prefix shorter than that many chunks on every replica counts as
    none, so the choice falls back to the fewest in flight (in turn here).

    Raises:
        ValueError: `token_ids` and `texts` differ in length, or non-positive sizes.
    """
    from link.replica_routing import CacheAwareRouter
    from serving.engine.block_manager import BlockManager
    from serving.engine.sequence import Sequence as EngineSequence

    if len(token_ids) != len(texts) or min(num_replicas, num_blocks, block_size) < 1:
        raise ValueError("one text per prompt, and positive replicas, blocks and block size")
    results = {}
    for routing in ("cache_aware", "fewest_outstanding"):
        managers = [BlockManager(num_blocks, block_size) for _ in range(num_replicas)]
        router, turn = CacheAwareRouter(block_size=block_size), itertools.cycle(range(num_replicas))
        counts = [0] * num_replicas
        for seq_id, (ids, text) in enumerate(zip(token_ids, texts)):
            if routing == "cache_aware":
                hashes = router.prefix_hashes(chat_body("m", text, 1))
                is_long = max(router.index.matched(hashes).values(), default=0) >= min_match_chunks
                chosen = router.choose(hashes if is_long else [], [(str(r), 0) for r in range(num_replicas)])
                router.record(hashes, str(chosen))
            else:
                chosen = next(turn)
            counts[chosen] += 1
            manager, seq = managers[chosen], EngineSequence(seq_id, list(ids))
            manager.allocate(seq)
            seq.num_computed_tokens = seq.num_tokens
            manager.mark_computed(seq)
            manager.free(seq)
        hits, queries = sum(m.prefix_cache_hits for m in managers), sum(m.prefix_cache_queries for m in managers)
        results[routing] = {"prefix_hit_rate": hits / queries, "prompt_tokens": queries,
                            "prefilled_tokens_per_request": (queries - hits) / len(token_ids),
                            "replica_request_shares": [c / len(token_ids) for c in counts]}
    return results


def main(argv: list[str] | None = None) -> None:
    """Replay each workload's prompts (`--requests`, seed `--seed`) and print the results as JSON."""
    from benchmarks.link_bench.replicas import tagged
    from benchmarks.link_bench.workload import default_data_dir, prompt_renderer

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--num-blocks", type=int, default=364, help="KV blocks per replica (the engine's 256 MiB: 364)")
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--workload", action="append", choices=WORKLOADS)
    parser.add_argument("--min-match-chunks", type=int, default=1,
                        help="cache_aware variant: ignore remembered prefixes shorter than this many 64-character chunks "
                             "(1: the gateway's rule)")
    args = parser.parse_args(argv)
    _, render = prompt_renderer(args.model)
    data_dir = Path(args.data_dir) if args.data_dir else default_data_dir()
    out = {}
    for workload in args.workload or WORKLOADS:
        texts = tagged(workload_prompts(workload, data_dir, args.requests, args.seed), 1)
        ids = [render(text) for text in texts]
        out[workload] = {"mean_prompt_tokens": sum(map(len, ids)) / len(ids),
                         **replay_prefix_cache(ids, texts, args.replicas, args.num_blocks, min_match_chunks=args.min_match_chunks)}
    print(json.dumps({"replicas": args.replicas, "requests": args.requests, "num_blocks": args.num_blocks,
                      "min_match_chunks": args.min_match_chunks, **out}, indent=2))


if __name__ == "__main__":
    main()
