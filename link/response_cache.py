"""The gateway's response cache: a repeated request is answered from an earlier answer, for nothing.

    cache = ResponseCache(redis_url=None)                            # built in the lifespan (link/state.py)
    ticket = cache.ticket(policy.cache, policy_name, "chat", body, record)   # NO_CACHE when the policy has no cache
    hit = await ticket.lookup()          # a Hit, or None: a miss (this request calls the backend); sets record.decision["cache"]
    await ticket.keep_whole(response)    # a whole answer (or `ticket.tap(frames, record)` around a stream's SSE bytes)
    ticket.release()                     # always, at the end (idempotent): wakes requests waiting on this one

Opt-in per policy (the `cache` option, link/policies/cache_options.py); API keys carry no cache setting. The
gateway (link/routes/openai.py, `handle`) looks up after auth, the rate limit, the policy's plan and the budget
reservation, so a hit passes every check a miss passes, and then costs nothing: the reservation is settled at 0, the
request-log row records cost 0 and no tokens (the original answer's usage is in `decision.cache.usage`), and the
answer says so: `x-link-cache: hit` (`miss` when the policy caches and this request called a backend, `bypass` when
the request is not cacheable), `usage.link_cache: "hit"` beside the original answer's token counts.

What is cached. Only requests whose answer is reproducible: `temperature` 0, or a `seed` given; never with
`logprobs`/`top_logprobs` (they are not kept). The key is sha256 of the canonical JSON (sorted keys, integral
floats as integers) of [namespace, policy, endpoint, body] where the body is the request sent to the backends
without `stream`, `stream_options` and `user` (so a whole answer serves a stream and back); every other field
(messages, tools, tool_choice, response_format, sampling fields, max tokens, metadata) is part of the key. The
namespace is the API key (its id; the master key and open mode have their own) unless the policy sets `shared`.
Only answers that completed are kept (a stream that failed, was cut off or was continued by another model is not).

Exact mode: the key must match. Semantic mode: besides, a request whose every field but the last user message's
text (a completion's prompt) matches an earlier one, whose text's embedding (all-MiniLM-L6-v2, the routers'
encoder: link/policies/router.py `gateway_embedder`) has cosine similarity >= `similarity` with it, and which
passes the guard (`guard_signature`: the same multiset of numerals and of named-entity tokens) is a hit. The
semantic index is kept in process memory (each replica its own; with Redis it points at the shared answers).

Single flight: identical misses (one key) in this process make one backend call; the others wait and are served its
answer (decision `cache.kind: "coalesced"`). If that call fails or is not cacheable, they go on as misses of their
own. Storage: process memory (an LRU per policy, `max_entries` / `max_bytes`), or Redis when `LINK_REDIS_URL` is
set (link/cache_stores.py: an outage is a miss, never an error).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import re
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable

from link.cache_replay import Hit, StreamRecorder
from link.cache_stores import MemoryStore, RedisStore
from link.keys import KeyIdentity
from link.policies.cache_options import CacheOptions

logger = logging.getLogger(__name__)
NOT_KEYED = ("stream", "stream_options", "user")
# Words that open a sentence without naming anything; any other capitalized word counts as a named entity.
SENTENCE_OPENERS = frozenset("""a an the i it its this that these those there here what what's whats which who whom
whose why when where how is are was were be do does did can could would should will shall may might must please tell
give show list write explain describe summarize summarise translate find make create compute calculate name define
compare let let's if in on at for from to of and or but so as by with about my our your his her their we you he she
they me us them hi hello hey ok okay yes no not now then also just""".split())
NUMBER_WORDS = frozenset("""zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen
sixteen seventeen eighteen nineteen twenty thirty forty fifty sixty seventy eighty ninety hundred thousand million
billion trillion first second third fourth fifth sixth seventh eighth ninth tenth half dozen""".split())
_NUMERAL = re.compile(r"\d+(?:[.,:/]\d+)*")
_WORD = re.compile(r"[^\W\d_][\w'’-]*")
_SENTENCE_END = re.compile(r"[.!?:;\n]\s*$")


def _canonical(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _canonical(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_canonical(v) for v in value]
    return value


def cache_key(*parts: Any) -> str:
    """sha256 (hex) of the canonical JSON of `parts`: sorted keys, no spaces, integral floats as integers."""
    text = json.dumps(_canonical(list(parts)), sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()


def not_cacheable(endpoint: str, body: dict[str, Any]) -> str | None:
    """Why `body`'s answer may not be cached, or None when it may (module docstring)."""
    seed, temperature = body.get("seed"), body.get("temperature")
    has_seed = isinstance(seed, int) and not isinstance(seed, bool)
    if not has_seed and temperature != 0:
        return "temperature is not 0 and no seed is given"
    if body.get("logprobs") or body.get("top_logprobs") or (endpoint == "completion" and body.get("logprobs") is not None):
        return "logprobs are not cached"
    return None


def guard_signature(text: str) -> tuple[Counter, Counter]:
    """(the multiset of numerals, the multiset of named-entity tokens) of `text`: two requests whose signatures
    differ never share a semantic hit.

    Numerals: digit runs with their inner separators ("3.14", "1,000", "10:30", "1/2") and the number words
    (NUMBER_WORDS: "three", "hundred", "first"), lower-cased. Entities: every word with an upper-case letter
    ("Paris", "iPhone", "NASA", "GPT-4"), except the first word of a sentence when it is a common opener
    (SENTENCE_OPENERS: "What", "Please", "Translate"...), which a paraphrase may capitalize or not. A rule that
    errs towards a miss: "capital of france" and "capital of France" differ.
    """
    numerals = Counter(_NUMERAL.findall(text))
    entities: Counter = Counter()
    for match in _WORD.finditer(text):
        word = match.group()
        lower = word.lower()
        if lower in NUMBER_WORDS:
            numerals[lower] += 1
            continue
        if word == lower:
            continue
        before = text[:match.start()]
        opens_sentence = not before.strip() or bool(_SENTENCE_END.search(before))
        if opens_sentence and lower in SENTENCE_OPENERS:
            continue
        entities[word] += 1
    return numerals, entities


def semantic_parts(endpoint: str, body: dict[str, Any]) -> tuple[dict, str] | None:
    """(the body without the text a paraphrase may change, that text), or None when the request has no such text:
    a chat request's last message when it is the user's (its text parts joined), a completion's one text prompt."""
    if endpoint == "chat":
        messages = body.get("messages") or []
        last = messages[-1] if messages and isinstance(messages[-1], dict) else {}
        if last.get("role") != "user":
            return None
        content = last.get("content")
        if isinstance(content, list):
            if not all(isinstance(p, dict) and p.get("type") == "text" for p in content):
                return None
            content = "\n".join(str(p.get("text") or "") for p in content)
        if not isinstance(content, str) or not content.strip():
            return None
        return {**body, "messages": [*messages[:-1], {**last, "content": None}]}, content
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if not isinstance(prompt, str) or not prompt.strip():
        return None
    return {**body, "prompt": None}, prompt


def namespace(options: CacheOptions, identity: KeyIdentity | None) -> str:
    if options.is_shared:
        return "shared"
    if identity is None:
        return "anonymous"
    return f"key:{identity.key_id}" if identity.key_id is not None else f"name:{identity.name}"


@dataclass
class _Indexed:
    vector: Any   # [384] float32, L2-normalised
    signature: tuple[Counter, Counter]
    expires_at: float


class ResponseCache:
    """The gateway's response cache (module docstring); one per gateway process, built in the lifespan.

    Args:
        redis_url: keep answers in Redis (shared by replicas); None keeps them in this process's memory.
        redis_prefix: Redis key prefix. redis_timeout_s, redis_cooldown_s: see link/cache_stores.py.
        embedder: a `routers.embedding.Embedder`-like object (`embed(texts) -> [N, 384]`); None builds the
            routers' encoder on the first semantic request (`gateway_embedder`).
        clock: monotonic seconds (TTL of the semantic index).
    """

    def __init__(self, redis_url: str | None = None, *, redis_prefix: str = "link:cache", redis_timeout_s: float = 0.25,
                 redis_cooldown_s: float = 5.0, embedder=None, clock: Callable[[], float] = time.monotonic):
        self.redis = RedisStore(redis_url, redis_prefix, timeout_s=redis_timeout_s, cooldown_s=redis_cooldown_s) if redis_url else None
        self._memory: dict[str, tuple[CacheOptions, MemoryStore]] = {}  # policy -> its store
        self._index: dict[str, OrderedDict[str, _Indexed]] = {}          # semantic group -> exact key -> vector
        self._flights: dict[str, asyncio.Future] = {}
        self._embedder = embedder
        self.clock = clock

    def ticket(self, options: CacheOptions | None, policy: str, endpoint: str, body: dict[str, Any], record) -> Ticket:
        """The cache's handle on one request (`record`: its link.accounting.RequestRecord) of a policy with the cache
        `options`: NO_CACHE when None; `ticket.skip_reason` is set when the request is not cacheable (then `lookup`
        bypasses the cache and nothing is kept)."""
        if options is None:
            return NO_CACHE
        space = namespace(options, record.identity)
        keyed = {k: v for k, v in body.items() if k not in NOT_KEYED}
        reason = not_cacheable(endpoint, body)
        ticket = Ticket(self, options, policy, endpoint, cache_key(space, policy, endpoint, keyed), skip_reason=reason)
        record.decision["cache"] = ticket.decision
        if reason is None and options.is_semantic and (parts := semantic_parts(endpoint, keyed)) is not None:
            ticket.group = cache_key("semantic", space, policy, endpoint, parts[0])
            ticket.text = parts[1]
        return ticket

    def _store(self, policy: str, options: CacheOptions) -> MemoryStore:
        held = self._memory.get(policy)
        if held is None or held[0] != options:  # a policy edited since: a fresh store at its new bounds
            held = self._memory[policy] = (options, MemoryStore(options.max_entries, options.max_bytes))
        return held[1]

    async def get(self, ticket: Ticket, key: str) -> dict | None:
        raw = await self.redis.get(key) if self.redis is not None else self._store(ticket.policy, ticket.options).get(key)
        try:
            return json.loads(raw) if raw is not None else None
        except ValueError:
            return None

    async def put(self, ticket: Ticket, entry: dict) -> bool:
        raw = json.dumps(entry, separators=(",", ":")).encode()
        if self.redis is not None:
            if len(raw) > ticket.options.max_bytes // 4:
                return False
            return await self.redis.put(ticket.key, raw, ticket.options.ttl_s)
        return self._store(ticket.policy, ticket.options).put(ticket.key, raw, ticket.options.ttl_s)

    def embedder(self):
        if self._embedder is None:
            from link.policies.router import gateway_embedder

            self._embedder = gateway_embedder("auto")
        return self._embedder

    async def semantic_match(self, ticket: Ticket) -> tuple[str, float] | None:
        """(the exact key of the closest indexed request that passes the guard, its similarity), or None."""
        group = self._index.get(ticket.group)
        if not group:
            return None
        now = self.clock()
        for key in [k for k, item in group.items() if item.expires_at <= now]:
            del group[key]
        vector = await ticket.vector()
        signature = guard_signature(ticket.text)
        best: tuple[str, float] | None = None
        for key, item in group.items():
            similarity = float(item.vector @ vector)
            if similarity >= ticket.options.similarity and item.signature == signature and (best is None or similarity > best[1]):
                best = (key, similarity)
        return best

    async def index(self, ticket: Ticket) -> None:
        group = self._index.setdefault(ticket.group, OrderedDict())
        group[ticket.key] = _Indexed(await ticket.vector(), guard_signature(ticket.text), self.clock() + ticket.options.ttl_s)
        group.move_to_end(ticket.key)
        while len(group) > ticket.options.max_entries:
            group.popitem(last=False)

    def close(self) -> None:
        if self.redis is not None:
            self.redis.close()


@dataclass
class Ticket:
    """One request's passage through the cache (module docstring). `decision` is what the request-log row records
    under `decision.cache`."""

    cache: ResponseCache
    options: CacheOptions
    policy: str
    endpoint: str
    key: str
    skip_reason: str | None = None
    group: str | None = None         # semantic mode: the key of every field but the text (`semantic_parts`)
    text: str | None = None
    is_leader: bool = False
    is_done: bool = False
    decision: dict[str, Any] = field(default_factory=dict)
    _vector: Any = None

    @property
    def outcome(self) -> str:
        """The `x-link-cache` header: "hit", "miss" or "bypass"."""
        return self.decision.get("outcome", "bypass")

    async def vector(self):
        if self._vector is None:
            embedder = self.cache.embedder()
            self._vector = (await asyncio.to_thread(embedder.embed, [self.text]))[0]
        return self._vector

    async def lookup(self) -> Hit | None:
        """The answer that serves this request, or None (a miss: call the backend, then `keep_whole` / `tap`).
        Waits for an identical request in flight (single flight). Never raises for a cache failure."""
        if self.skip_reason is not None:
            self.decision.update(outcome="bypass", reason=self.skip_reason)
            return None
        self.decision.update(outcome="miss", mode=self.options.mode, key=self.key[:16])
        flights = self.cache._flights
        flight = flights.get(self.key)
        if flight is not None:  # an identical request is calling the backend: its answer serves this one
            entry = await asyncio.shield(flight)
            if entry is not None:
                return self._hit(entry, "coalesced")
            return None
        flights[self.key] = asyncio.get_running_loop().create_future()
        self.is_leader = True
        try:
            entry = await self.cache.get(self, self.key)
            if entry is not None:
                self._settle(entry)
                return self._hit(entry, "exact")
            if self.group is not None:
                match = await self.cache.semantic_match(self)
                if match is not None and (entry := await self.cache.get(self, match[0])) is not None:
                    self._settle(entry)
                    self.decision["similarity"] = round(match[1], 4)
                    return self._hit(entry, "semantic")
        except Exception:  # noqa: BLE001 - a cache that cannot look up only misses
            logger.exception("response cache: lookup failed")
        return None

    def _hit(self, entry: dict, kind: str) -> Hit:
        self.decision.update(outcome="hit", kind=kind, usage=entry["response"].get("usage"))
        return Hit(self.endpoint, entry, kind)

    def _settle(self, entry: dict | None) -> None:
        """Wake the requests waiting on this one with `entry` (None: they go on as misses); once."""
        if self.is_done:
            return
        self.is_done = True
        if self.is_leader:
            flight = self.cache._flights.pop(self.key, None)
            if flight is not None and not flight.done():
                flight.set_result(entry)

    def release(self) -> None:
        """End this request's part in the cache without an answer to share (idempotent)."""
        self._settle(None)

    async def keep(self, response: dict, pieces: list[list[str]] | None) -> None:
        """Keep a completed answer (usage included) and serve it to the requests waiting on this one."""
        entry = {"response": response, "pieces": pieces}
        try:
            if not response.get("choices") or any(c.get("finish_reason") is None for c in response["choices"]):
                entry = None
            elif await self.cache.put(self, entry):
                self.decision["stored"] = True
                if self.group is not None:
                    await self.cache.index(self)
        except Exception:  # noqa: BLE001 - an answer that cannot be kept is only a later miss
            logger.exception("response cache: keeping an answer failed")
        self._settle(entry)

    async def keep_whole(self, response: dict, record) -> None:
        """After a whole answer: keep it unless the request was served by a continued or estimated call."""
        if self.skip_reason is not None or _is_partial(record):
            self.release()
            return
        await self.keep(json.loads(json.dumps(response)), None)

    async def tap(self, frames: AsyncIterator[bytes], record) -> AsyncIterator[bytes]:
        """`frames` (a stream's OpenAI SSE bytes, `data: [DONE]` last) passed on; the answer is kept once the stream
        completed (`record.status` "ok"); the waiting requests are released however it ends."""
        assembler = StreamRecorder(self.endpoint) if self.skip_reason is None else None
        try:
            async for data in frames:
                if assembler is not None:
                    if data == b"data: [DONE]\n\n" and record.status == "ok" and not _is_partial(record):
                        assembled = assembler.whole({"prompt_tokens": record.prompt_tokens,
                                                     "completion_tokens": record.completion_tokens,
                                                     "total_tokens": record.prompt_tokens + record.completion_tokens})
                        if assembled is not None:
                            await self.keep(*assembled)
                    else:
                        try:
                            assembler.feed(data)
                        except ValueError:
                            assembler = None
                yield data
        finally:
            self.release()
            await frames.aclose()


def _is_partial(record) -> bool:
    decision = record.decision
    return bool(decision.get("continued") or decision.get("usage") == "estimated")


class NoCache:
    """The ticket of a request whose policy does not cache: every step passes through."""

    async def lookup(self) -> None:
        return None

    def tap(self, frames: AsyncIterator[bytes], record) -> AsyncIterator[bytes]:
        return frames

    async def keep_whole(self, response: dict, record) -> None:
        pass

    def release(self) -> None:
        pass


NO_CACHE = NoCache()  # stateless: one for every request of a policy without a cache
