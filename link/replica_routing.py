"""Cache-aware replica routing: send a request to the replica that already holds its prompt prefix in its KV cache,
unless that replica is over a load bound.

    router = CacheAwareRouter(eps=0.25)
    hashes = router.prefix_hashes(body)                    # chained hashes of the prompt's leading chunks
    index = router.choose(hashes, [("m#0", 3), ("m#1", 1)])  # (replica id, in-flight load) -> position picked
    router.record(hashes, "m#1")                          # m#1 now holds this prefix

Why: an engine with prefix caching (serving/engine/block_manager.py, vLLM's automatic prefix caching) skips the
prefill of every full KV block whose chained hash it has cached, so a request sharing a long prefix (a system
prompt, tool schemas, few-shot examples) is cheaper on the replica that served that prefix before. llm-d and
NVIDIA Dynamo route this way.

The prefix, without a tokenizer. The gateway does not tokenize (it serves many models, and tokenizing every request
would cost more than the routing gains), so it hashes the request's text instead: the request is written in one
canonical form (`prompt_text`: tool schemas, then each message as sorted-key JSON; or the completion prompt), cut
into chunks of `block_size * CHARS_PER_TOKEN` characters (about one KV block of an English BPE tokenizer at ~4
characters per token), and each full chunk gets a hash chained over every chunk before it, as the engine chains
its block hashes. Two requests whose first k chunks hash alike share at least k * chunk characters of rendered
prompt, hence (the chat template and tokenizer being functions of the text, up to the token that straddles the
boundary) about k blocks of prompt tokens. The proxy never needs to equal the engine's hashes: it only ranks
replicas by how much of this request's prefix each was last sent, which the character count measures faithfully.

The choice is bounded-load consistent hashing (Mirrokni, Thorup and Zadimoghaddam, "Consistent Hashing with
Bounded Loads", SODA 2018): with L requests in flight over n replicas, a replica may hold at most
ceil((1 + eps) * (L + 1) / n) after taking this one, so no replica exceeds (1 + eps) times the average however
skewed the prefixes are. Among the replicas under the bound, the one with the longest remembered prefix wins (ties:
fewer in flight, then in turn), provided it remembers at least `min_gain_chunks` (default 4, about 64 tokens) more
of this prefix than the least loaded replica does; otherwise the fewest in flight wins, as without this module. The
margin keeps a short opening that all traffic shares (a chat template's wrapper, a few-shot header) from pinning
every request to the replica that happened to see it first: measured with `benchmarks/link_bench/
replica_cache_replay.py` over MMLU 5-shot prompts, without it one of 2 replicas took 100% of the requests and the
prefix-cache hit rate was 0.173 (fewest outstanding: 0.167); with it, 0.29.
The least loaded replica is always under the bound (its load is at most floor(L / n) < ceil((L + 1) / n)), so
there is always a choice.

What each replica served is remembered in a bounded LRU (`PrefixIndex`): an engine evicts its cached blocks least
recently used first too, and a prefix nobody sent for a long time is the first to be gone from both. A replica
that is ejected (a failure, a restart) is forgotten: a restarted engine's cache is empty.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from collections import OrderedDict
from collections.abc import Iterable, Sequence

CHARS_PER_TOKEN = 4  # characters per token of English text under common BPE vocabularies (OpenAI's rule of thumb)
DEFAULT_BLOCK_SIZE = 16  # tokens per KV block of our engine and vLLM, until a replica reports its own
MAX_CHUNKS = 512  # hash at most this many leading chunks (32 Ki characters at 64 per chunk): bounds the CPU per request
MIN_GAIN_CHUNKS = 4  # a remembered prefix decides only when it saves this many chunks' prefill (about 64 tokens)
DEFAULT_INDEX_SIZE = 65_536  # prefix-chain entries remembered per model (64 Ki x ~64 characters = 4 MiB of prompt text)


def prompt_text(body: dict) -> str:
    """The canonical text of a request's prompt, prefix-stable: requests that share their leading tools and
    messages share a leading part of it.

    Chat (`messages`): each tool schema, then each message, as sorted-key compact JSON, one per line; tools first, as
    chat templates render them into the system prompt. Completions (`prompt`): the string, the first of a list of
    strings, or the token ids' JSON. Anything else gives "".
    """
    def canonical(value) -> str:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)

    messages = body.get("messages")
    if isinstance(messages, list):
        return "".join(canonical(part) + "\n" for part in [*(body.get("tools") or []), *messages])
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt:
        return prompt[0] if isinstance(prompt[0], str) else canonical(prompt)
    return ""


def chunk_hashes(text: str, chunk_chars: int, max_chunks: int = MAX_CHUNKS) -> list[int]:
    """Chained 64-bit hashes of the full `chunk_chars`-character chunks of `text` (a trailing partial chunk has none):
    hash_i = BLAKE2b-64(hash_{i-1} || UTF-8 of chunk i), the first over b"root". At most `max_chunks` of them.

    Raises:
        ValueError: `chunk_chars` below 1.
    """
    if chunk_chars < 1:
        raise ValueError(f"chunk_chars must be at least 1, got {chunk_chars}")
    hashes: list[int] = []
    previous = b"root"
    for start in range(0, min(len(text) // chunk_chars, max_chunks) * chunk_chars, chunk_chars):
        digest = hashlib.blake2b(previous + text[start:start + chunk_chars].encode("utf-8", "surrogatepass"),
                                 digest_size=8).digest()
        hashes.append(int.from_bytes(digest, "little"))
        previous = digest
    return hashes


def load_bound(total_load: int, num_replicas: int, eps: float) -> int:
    """ceil((1 + eps) * (total_load + 1) / num_replicas): the most requests in flight a replica may hold once it takes
    the new one (Mirrokni et al. 2018). `total_load`: requests in flight over all `num_replicas` candidates."""
    return math.ceil((1.0 + eps) * (total_load + 1) / num_replicas - 1e-9)  # 1e-9: 1.1 * 50 is 55.00000000000001


class PrefixIndex:
    """Which replicas were sent which prefix chain: chained chunk hash -> replica ids, least recently used evicted
    past `capacity` entries.

    Raises:
        ValueError: `capacity` below 1.
    """

    def __init__(self, capacity: int = DEFAULT_INDEX_SIZE):
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        self.capacity = capacity
        self._owners: OrderedDict[int, tuple[str, ...]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._owners)

    def matched(self, hashes: Sequence[int]) -> dict[str, int]:
        """Per replica, how many leading hashes of `hashes` it was sent in a row (replicas with none are absent)."""
        matched: dict[str, int] = {}
        alive: set[str] | None = None
        for i, h in enumerate(hashes):
            owners = set(self._owners.get(h, ()))
            alive = owners if alive is None else alive & owners
            if not alive:
                break
            for replica_id in alive:
                matched[replica_id] = i + 1
        return matched

    def record(self, hashes: Iterable[int], replica_id: str) -> None:
        """Remember that `replica_id` was sent the prefix chain `hashes` (each entry becomes the most recent)."""
        for h in hashes:
            owners = self._owners.pop(h, ())
            self._owners[h] = owners if replica_id in owners else (*owners, replica_id)
        while len(self._owners) > self.capacity:
            self._owners.popitem(last=False)

    def forget(self, replica_id: str) -> None:
        """Drop `replica_id` from every entry (its engine restarted or left: its cache is gone)."""
        for h in [h for h, owners in self._owners.items() if replica_id in owners]:
            rest = tuple(r for r in self._owners[h] if r != replica_id)
            if rest:
                self._owners[h] = rest
            else:
                del self._owners[h]

    def num_entries(self, replica_id: str) -> int:
        """Prefix-chain entries that name `replica_id`."""
        return sum(replica_id in owners for owners in self._owners.values())


class CacheAwareRouter:
    """The cache-aware choice among one model's replicas (see the module docstring).

    Args:
        eps: the load bound's slack, >= 0: a replica may hold ceil((1 + eps) * average) requests in flight.
        capacity: prefix-chain entries remembered (`PrefixIndex`).
        block_size: the engines' KV block size in tokens (a chunk is block_size * CHARS_PER_TOKEN characters);
            `set_block_size` changes it once a replica reports its own.
        min_gain_chunks: the fewest chunks the prefix-holding replica must remember beyond what the least loaded
            replica remembers for the prefix to decide (module docstring).
    Raises:
        ValueError: a negative `eps`, or `capacity` / `block_size` / `min_gain_chunks` below 1.
    """

    def __init__(self, eps: float = 0.25, capacity: int = DEFAULT_INDEX_SIZE, block_size: int = DEFAULT_BLOCK_SIZE,
                 min_gain_chunks: int = MIN_GAIN_CHUNKS):
        if eps < 0 or block_size < 1 or min_gain_chunks < 1:
            raise ValueError(f"eps must be >= 0, block_size and min_gain_chunks >= 1, got eps={eps}, "
                             f"block_size={block_size}, min_gain_chunks={min_gain_chunks}")
        self.eps = eps
        self.min_gain_chunks = min_gain_chunks
        self.block_size = block_size
        self.index = PrefixIndex(capacity)
        self._turn = itertools.count()  # rotates ties
        self.num_routed = self.num_prefix_routed = 0  # choices made; of those, by a remembered prefix

    @property
    def chunk_chars(self) -> int:
        return self.block_size * CHARS_PER_TOKEN

    def set_block_size(self, block_size: int) -> None:
        """Hash in chunks of `block_size` tokens from now on; a change forgets every prefix (its hashes would differ)."""
        if block_size >= 1 and block_size != self.block_size:
            self.block_size = block_size
            self.index = PrefixIndex(self.index.capacity)

    def prefix_hashes(self, body: dict) -> list[int]:
        """The chained chunk hashes of `body`'s prompt (`prompt_text`, `chunk_hashes`)."""
        return chunk_hashes(prompt_text(body), self.chunk_chars)

    def choose(self, hashes: Sequence[int], candidates: Sequence[tuple[str, int]]) -> int:
        """The position in `candidates` ((replica id, requests in flight) of each replica in rotation) to send a request
        with prefix chain `hashes` to: the longest remembered prefix among those under the load bound (ties: fewer in
        flight, then in turn) when it beats the least loaded replica's by `min_gain_chunks` or more, else the fewest in
        flight (ties in turn).

        Raises:
            ValueError: no candidates.
        """
        if not candidates:
            raise ValueError("no replica to choose from")
        n = len(candidates)
        start = next(self._turn) % n
        order = [(start + k) % n for k in range(n)]  # ties go to the first in this rotated order
        self.num_routed += 1
        least_loaded = min(order, key=lambda i: candidates[i][1])
        matched = self.index.matched(hashes) if hashes else {}
        if matched:
            bound = load_bound(sum(load for _, load in candidates), n, self.eps)
            under = [i for i in order if candidates[i][1] + 1 <= bound and matched.get(candidates[i][0], 0) > 0]
            if under:
                best = max(under, key=lambda i: (matched[candidates[i][0]], -candidates[i][1]))
                gain = matched[candidates[best][0]] - matched.get(candidates[least_loaded][0], 0)
                if best == least_loaded or gain >= self.min_gain_chunks:
                    self.num_prefix_routed += 1
                    return best
        return least_loaded

    def record(self, hashes: Sequence[int], replica_id: str) -> None:
        """Remember that `replica_id` took the request with prefix chain `hashes`."""
        self.index.record(hashes, replica_id)

    def forget(self, replica_id: str) -> None:
        self.index.forget(replica_id)
