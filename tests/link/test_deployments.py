"""`DeploymentPool`: balancing by outstanding requests, ejection after failures, readmission by health
checks; with fake backends for the bookkeeping and real mock servers (threads and processes) for the rest."""

from __future__ import annotations

import asyncio
import time

import pytest

from link.backends import Backend, BackendError, BackendTimeout, BackendUnavailable, make_backend
from link.config import ModelDeployment
from link.deployments import DeploymentPool, is_replica_failure
from tests.link.mock_openai import start_mock_process, start_mock_thread

CHAT = {"model": "mock-model", "messages": [{"role": "user", "content": "hello"}]}


class FakeBackend(Backend):
    """Answers after `delay_s`; `healthy` is what its health check says."""

    def __init__(self, name: str, delay_s: float = 0.0):
        super().__init__(ModelDeployment(name="m", kind="openai", api_base="http://fake", deployment_id=name))
        self.delay_s, self.healthy, self.num_health_checks = delay_s, True, 0

    async def complete(self, endpoint, body):
        await asyncio.sleep(self.delay_s)
        return {"served_by": self.deployment.deployment_id}

    async def stream(self, endpoint, body):
        yield await self.complete(endpoint, body)

    async def health(self):
        self.num_health_checks += 1
        return self.healthy


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def replica_backends(*api_bases: str) -> list[Backend]:
    return [make_backend(ModelDeployment(name="m", kind="openai", model="mock-model", api_base=base, deployment_id=f"m#{i}",
                                         timeout_s=5, first_token_timeout_s=2))
            for i, base in enumerate(api_bases)]


def test_picks_fewest_outstanding_and_rotates_ties():
    a, b, c = FakeBackend("a"), FakeBackend("b"), FakeBackend("c")
    pool = DeploymentPool("m", [a, b, c])
    picked = [pool.pick().backend for _ in range(6)]
    assert picked == [a, b, c, a, b, c]  # equal load: in turn
    pool.replicas[0].num_outstanding = 2
    pool.replicas[1].num_outstanding = 1
    assert {pool.pick().backend for _ in range(5)} == {c}


def test_acquire_counts_outstanding_and_reports_failures_by_kind():
    pool = DeploymentPool("m", [FakeBackend("a"), FakeBackend("b")], failures_to_eject=2)
    a = pool.replicas[0]

    async def go():
        async with pool.acquire() as replica:
            assert replica is a and a.num_outstanding == 1 and pool.num_outstanding == 1
        assert a.num_outstanding == 0 and a.num_served == 1
        for exc in (BackendError("bad request", status_code=400), BackendTimeout("slow"), BackendUnavailable("down")):
            pool._turn = iter([0] * 10)  # always start at replica a
            with pytest.raises(BackendError):
                async with pool.acquire():
                    raise exc
        assert a.num_outstanding == 0

    asyncio.run(go())
    assert a.num_failures == 2 and a.is_ejected  # the 400 did not count; the timeout and the refusal did
    assert not pool.replicas[1].is_ejected
    assert not is_replica_failure(BackendError("x", status_code=404)) and is_replica_failure(BackendError("x", status_code=502))


def test_an_in_process_engine_is_not_ejected_for_being_slow():
    """A local engine's timeout is its queue: the replica stays in rotation; its real failures still count."""
    engine = FakeBackend("local")
    engine.timeouts_mean_overload = True
    pool = DeploymentPool("m", [engine], failures_to_eject=1)

    async def fail_with(exc):
        with pytest.raises(BackendError):
            async with pool.acquire():
                raise exc

    for _ in range(3):
        asyncio.run(fail_with(BackendTimeout("no answer within 600 s")))
    assert not pool.replicas[0].is_ejected and pool.replicas[0].num_failures == 0
    asyncio.run(fail_with(BackendUnavailable("the engine loop failed")))
    assert pool.replicas[0].is_ejected
    assert is_replica_failure(BackendTimeout("slow")) and not is_replica_failure(BackendTimeout("slow"), engine)


def test_ejection_cooldown_and_readmission_by_health_check():
    clock = Clock()
    a, b = FakeBackend("a"), FakeBackend("b")
    pool = DeploymentPool("m", [a, b], cooldown_s=10, clock=clock)
    ra, rb = pool.replicas
    pool.report_failure(ra)
    assert ra.is_ejected and {pool.pick().backend for _ in range(4)} == {b}
    a.healthy = False
    a.num_health_checks = 0
    asyncio.run(pool.check_health())
    assert a.num_health_checks == 0 and ra.is_ejected  # still cooling down: not probed
    clock.now += 10
    asyncio.run(pool.check_health())
    assert a.num_health_checks == 1 and ra.is_ejected and ra.ejected_until == clock.now + 10  # failed probe: another cool-down
    a.healthy = True
    clock.now += 10
    asyncio.run(pool.check_health())
    assert not ra.is_ejected and ra.num_failures == 0
    b.healthy = False
    asyncio.run(pool.check_health())
    assert rb.is_ejected  # a replica in rotation that fails its health check leaves it
    assert pool.status()[1] == {"deployment_id": "b", "healthy": False, "outstanding": 0, "served": 0, "ejected_for_s": 10.0}


def test_all_ejected_fails_fast():
    pool = DeploymentPool("m", [FakeBackend("a")], cooldown_s=30)
    pool.report_failure(pool.replicas[0])
    start = time.monotonic()
    with pytest.raises(BackendUnavailable, match="all 1 deployments are ejected") as info:
        pool.pick()
    assert time.monotonic() - start < 0.1 and info.value.code == "no_healthy_deployment"
    with pytest.raises(ValueError):
        DeploymentPool("m", [])


def test_two_real_replicas_share_concurrent_load():
    with start_mock_thread(chunk_delay_s=0.01) as one, start_mock_thread(chunk_delay_s=0.01) as two:
        pool = DeploymentPool("m", replica_backends(one.api_base, two.api_base))

        async def request(i: int):
            async with pool.acquire() as replica:
                chunks = [c async for c in replica.backend.stream("chat", {**CHAT, "messages": [{"role": "user", "content": f"n {i}"}]})]
                return replica.deployment_id, chunks

        async def go():
            results = await asyncio.gather(*(request(i) for i in range(16)))
            peak = pool.num_outstanding
            await pool.aclose()
            return results, peak

        results, after = asyncio.run(go())
        served = [one.stats()["requests"], two.stats()["requests"]]
    assert sum(served) == 16 and min(served) >= 6, served  # fewest-outstanding spreads a burst evenly
    assert {r[0] for r in results} == {"m#0", "m#1"} and after == 0
    assert all("".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"]).endswith(f"n {i}")
               for i, (_, chunks) in enumerate(results))


def test_a_killed_replica_is_ejected_and_readmitted_after_restart():
    """A real process: killed -> its requests fail and it leaves rotation; restarted on its port -> back."""
    stable = start_mock_thread()
    flaky = start_mock_process()
    port = flaky.port
    pool = DeploymentPool("m", replica_backends(flaky.api_base, stable.api_base), cooldown_s=0.3, health_interval_s=0.1)
    restarted = None
    try:
        async def go():
            nonlocal restarted
            pool.start()
            flaky.kill()
            outcomes = []
            for _ in range(6):
                try:
                    async with pool.acquire() as replica:
                        await replica.backend.complete("chat", CHAT)
                        outcomes.append(replica.deployment_id)
                except BackendUnavailable:
                    outcomes.append("refused")
            ejected = pool.replicas[0].is_ejected
            restarted = await asyncio.to_thread(start_mock_process, port=port)
            deadline = time.monotonic() + 10
            while pool.replicas[0].is_ejected and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            readmitted = not pool.replicas[0].is_ejected
            after = []
            for _ in range(4):
                async with pool.acquire() as replica:
                    await replica.backend.complete("chat", CHAT)
                    after.append(replica.deployment_id)
            served_by_restarted = (await asyncio.to_thread(restarted.stats))["requests"]
            await pool.aclose()
            return outcomes, ejected, readmitted, after, served_by_restarted

        outcomes, ejected, readmitted, after, served_by_restarted = asyncio.run(go())
    finally:
        stable.stop()
        flaky.kill()
        if restarted is not None:
            restarted.stop()
    assert outcomes.count("refused") <= 1 and outcomes[-4:] == ["m#1"] * 4, outcomes  # at most one request hit the dead one
    assert ejected and readmitted
    assert set(after) == {"m#0", "m#1"} and served_by_restarted == after.count("m#0")  # back in rotation
