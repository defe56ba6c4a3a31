"""`DeploymentPool`: the replicas of one public model name, balanced by outstanding requests or by cached prefix.

    pool = DeploymentPool("smollm2", [backend_a, backend_b])
    pool.start()                                   # background health checks (in the app's lifespan)
    async with pool.acquire(body) as replica:      # the healthy replica with the fewest requests in flight
        answer = await replica.backend.complete("chat", body)
    await pool.aclose()

With `replica_routing: cache_aware` on the model's (first) deployment, `acquire(body)` prefers the replica that was
sent the longest prefix of `body`'s prompt, under a load bound (link/replica_routing.py), and a second background
task polls each replica's reported load every `state_interval_s` (link/replica_state.py: our engine's
`/v1/engine/state`, vLLM's or SGLang's `/metrics`). A replica's load is then the requests this gateway has in
flight on it plus those its engine reports beyond them (other gateway replicas', as of the last poll).

A replica is ejected for `cooldown_s` after `failures_to_eject` consecutive failures (a connection
error, a timeout or a 5xx; a 4xx is the request's fault, not the replica's; a timeout of an in-process
engine is its queue, not a failure) or a failed health check.
When its cool-down is over, the health check probes it and readmits it once it answers; a failed
probe starts another cool-down. Failures escaping `acquire()` are reported automatically. When every
replica is ejected, `acquire` raises `BackendUnavailable` at once, so a fallback policy moves on
instead of waiting on a dead deployment.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import AsyncIterator, Callable

from link.backends.base import Backend, BackendError, BackendTimeout, BackendUnavailable
from link.replica_routing import CacheAwareRouter
from link.replica_state import ReplicaLoad, ReplicaStatePoller


def is_replica_failure(exc: BaseException, backend: Backend | None = None) -> bool:
    """True for errors that say the replica (not the request) is at fault: timeouts, connection errors, 5xx.
    A timeout of a backend whose `timeouts_mean_overload` (an in-process engine with a queue) is not one."""
    if isinstance(exc, BackendTimeout) and backend is not None and backend.timeouts_mean_overload:
        return False
    return isinstance(exc, (BackendTimeout, BackendUnavailable)) or (isinstance(exc, BackendError) and exc.status_code >= 500)


@dataclass
class Replica:
    """One deployment in a pool and its balancing state.

    Attributes:
        backend: the deployment's backend.
        num_outstanding: requests acquired and not yet released.
        num_failures: consecutive failures since the last success.
        ejected_until: clock time (s) when the cool-down ends; None while in rotation.
        reported: the load its engine reported at the last poll (cache-aware pools); None when unknown.
        num_external: requests its engine reported beyond this gateway's `num_outstanding` at that poll.
    """

    backend: Backend
    num_outstanding: int = 0
    num_failures: int = 0
    ejected_until: float | None = None
    num_served: int = 0
    reported: ReplicaLoad | None = None
    num_external: int = 0

    @property
    def deployment_id(self) -> str:
        return self.backend.deployment.deployment_id or self.backend.deployment.name

    @property
    def is_ejected(self) -> bool:
        return self.ejected_until is not None

    @property
    def load(self) -> int:
        """Requests in flight on it: ours plus, as last reported, others'."""
        return self.num_outstanding + self.num_external


class DeploymentPool:
    """The replicas of one public model name.

    Args:
        name: the public model name.
        backends: one backend per replica (at least one).
        cooldown_s: seconds an ejected replica stays out before it is probed again.
        health_interval_s: seconds between health-check rounds of the background task.
        health_timeout_s: a health check slower than this counts as failed.
        failures_to_eject: consecutive failures that eject a replica.
        state_interval_s: cache-aware pools: seconds between polls of the replicas' reported load.
        clock: monotonic time in seconds (injectable for tests).
    Raises:
        ValueError: no backends, or non-positive intervals.
    """

    def __init__(self, name: str, backends: list[Backend], *, cooldown_s: float = 10.0, health_interval_s: float = 5.0,
                 health_timeout_s: float = 5.0, failures_to_eject: int = 1, state_interval_s: float = 2.0,
                 clock: Callable[[], float] = time.monotonic):
        if not backends:
            raise ValueError(f"model {name!r} needs at least one deployment")
        if cooldown_s < 0 or health_interval_s <= 0 or health_timeout_s <= 0 or failures_to_eject < 1 or state_interval_s <= 0:
            raise ValueError("cooldown_s >= 0, health_interval_s > 0, health_timeout_s > 0, failures_to_eject >= 1 and "
                             "state_interval_s > 0 are required")
        self.name = name
        self.replicas = [Replica(b) for b in backends]
        self.cooldown_s, self.health_interval_s, self.health_timeout_s = cooldown_s, health_interval_s, health_timeout_s
        self.failures_to_eject = failures_to_eject
        self.clock = clock
        self._turn = itertools.count()  # rotates ties, so equal load spreads over replicas
        self._task: asyncio.Task | None = None
        first = backends[0].deployment
        self.router = CacheAwareRouter(first.replica_load_eps) if first.replica_routing == "cache_aware" else None
        self.state_interval_s = state_interval_s
        self._poller: ReplicaStatePoller | None = None
        self._state_task: asyncio.Task | None = None

    @property
    def healthy_replicas(self) -> list[Replica]:
        return [r for r in self.replicas if not r.is_ejected]

    @property
    def num_outstanding(self) -> int:
        return sum(r.num_outstanding for r in self.replicas)

    def pick(self, body: dict | None = None) -> Replica:
        """The replica in rotation with the fewest outstanding requests (ties taken in turn); in a cache-aware pool
        given the request `body`, the one sent the longest prefix of its prompt under the load bound
        (`CacheAwareRouter.choose`), which is then remembered to hold that prefix.

        Raises:
            BackendUnavailable: every replica is ejected.
        """
        healthy = self.healthy_replicas
        if not healthy:
            soonest = min(r.ejected_until for r in self.replicas) - self.clock()
            raise BackendUnavailable(f"{self.name}: all {len(self.replicas)} deployments are ejected after failures; "
                                     f"the next health probe is in {max(soonest, 0):.1f} s", code="no_healthy_deployment")
        if self.router is not None and body is not None:
            hashes = self.router.prefix_hashes(body)
            replica = healthy[self.router.choose(hashes, [(r.deployment_id, r.load) for r in healthy])]
            self.router.record(hashes, replica.deployment_id)
            return replica
        start = next(self._turn) % len(healthy)
        rotated = healthy[start:] + healthy[:start]
        return min(rotated, key=lambda r: r.num_outstanding)

    @asynccontextmanager
    async def acquire(self, body: dict | None = None) -> AsyncIterator[Replica]:
        """Pick a replica (`pick(body)`) and count the request as outstanding on it until the block exits.

        A replica failure (see `is_replica_failure`) escaping the block is reported; a clean exit reports success.
        Raises:
            BackendUnavailable: every replica is ejected.
        """
        replica = self.pick(body)
        replica.num_outstanding += 1
        try:
            yield replica
        except BaseException as exc:
            if is_replica_failure(exc, replica.backend):
                self.report_failure(replica)
            raise
        else:
            self.report_success(replica)
        finally:
            replica.num_outstanding -= 1

    def report_failure(self, replica: Replica) -> None:
        """Count a failure; eject the replica for `cooldown_s` once `failures_to_eject` are consecutive. A cache-aware
        pool forgets the prefixes it sent there, so the request's retry is balanced by load."""
        replica.num_failures += 1
        if self.router is not None:
            self.router.forget(replica.deployment_id)
        if replica.num_failures >= self.failures_to_eject:
            self._eject(replica)

    def report_success(self, replica: Replica) -> None:
        replica.num_failures = 0
        replica.num_served += 1

    def _eject(self, replica: Replica) -> None:
        replica.ejected_until = self.clock() + self.cooldown_s
        if self.router is not None:  # it may come back restarted, its prefix cache empty
            self.router.forget(replica.deployment_id)

    def _readmit(self, replica: Replica) -> None:
        replica.ejected_until = None
        replica.num_failures = 0

    async def _probe(self, replica: Replica) -> bool:
        try:
            async with asyncio.timeout(self.health_timeout_s):
                return bool(await replica.backend.health())
        except Exception:  # a health check never takes the pool down
            return False

    async def check_health(self) -> None:
        """One round: probe replicas in rotation (eject on failure) and ejected ones whose cool-down is over
        (readmit on success, else another cool-down)."""
        now = self.clock()
        due = [r for r in self.replicas if not r.is_ejected or r.ejected_until <= now]
        results = await asyncio.gather(*(self._probe(r) for r in due))
        for replica, ok in zip(due, results):
            if ok and replica.is_ejected:
                self._readmit(replica)
            elif not ok:
                self._eject(replica)

    async def _health_loop(self) -> None:
        while True:
            await self.check_health()
            await asyncio.sleep(self.health_interval_s)

    async def poll_state(self) -> None:
        """One round: read each replica's reported load (`ReplicaStatePoller.poll`); a replica reporting its own KV
        block size sets the router's chunk size. Needs `start()` (or a poller) first."""
        if self._poller is None:
            self._poller = ReplicaStatePoller()
        loads = await asyncio.gather(*(self._poller.poll(r.backend.deployment) for r in self.replicas))
        for replica, load in zip(self.replicas, loads):
            replica.reported = load
            replica.num_external = max(load.num_queued - replica.num_outstanding, 0) if load is not None else 0
        block_sizes = [load.block_size for load in loads if load is not None and load.block_size]
        if block_sizes and self.router is not None:
            self.router.set_block_size(block_sizes[0])

    async def _state_loop(self) -> None:
        while True:
            await self.poll_state()
            await asyncio.sleep(self.state_interval_s)

    def start(self) -> None:
        """Start the background health checks (and, in a cache-aware pool, the load polls) on the running loop
        (idempotent)."""
        loop = asyncio.get_running_loop()
        if self._task is None or self._task.done():
            self._task = loop.create_task(self._health_loop(), name=f"health-{self.name}")
        if self.router is not None and (self._state_task is None or self._state_task.done()):
            self._state_task = loop.create_task(self._state_loop(), name=f"replica-state-{self.name}")

    async def stop(self) -> None:
        """Stop the background tasks."""
        for task in (self._task, self._state_task):
            if task is not None:
                task.cancel()
                try:
                    await task
                except asyncio.CancelledError:
                    pass
        self._task = self._state_task = None
        if self._poller is not None:
            await self._poller.aclose()
            self._poller = None

    async def aclose(self) -> None:
        """Stop health checks and close every backend."""
        await self.stop()
        for replica in self.replicas:
            await replica.backend.aclose()

    def status(self) -> list[dict]:
        """Per replica: deployment id, in rotation or not, outstanding and served counts (for /api/models); in a
        cache-aware pool also "engine", its last reported load (`ReplicaLoad.to_dict`, None when unknown)."""
        now = self.clock()
        rows = [{"deployment_id": r.deployment_id, "healthy": not r.is_ejected, "outstanding": r.num_outstanding,
                 "served": r.num_served, "ejected_for_s": max(r.ejected_until - now, 0.0) if r.is_ejected else 0.0}
                for r in self.replicas]
        if self.router is not None:
            for row, replica in zip(rows, self.replicas):
                row["engine"] = replica.reported.to_dict() if replica.reported is not None else None
        return rows
