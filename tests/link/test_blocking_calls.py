"""link.blocking_calls.BlockingCalls: asyncio.to_thread's semantics (result, exception, contextvars, a cancelled await)
on threads that start on demand up to a cap, end when idle, and never leave a queued call without a thread, however
calls and idle endings interleave.

    LINK_HOME=.link .venv/bin/python -m pytest -q tests/link/test_blocking_calls.py
"""

from __future__ import annotations

import asyncio
import contextvars
import random
import threading
import time

import pytest

from link.blocking_calls import BlockingCalls

REQUEST_ID: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="none")


def test_result_exception_thread_and_context_are_those_of_to_thread():
    calls = BlockingCalls("t-basic")

    async def main():
        REQUEST_ID.set("r-17")
        seen = await calls.run(lambda a, b: (a + b, threading.current_thread().name, REQUEST_ID.get()), 2, 3)
        with pytest.raises(ZeroDivisionError):
            await calls.run(lambda: 1 / 0)
        return seen, await calls.run(threading.get_ident)

    (total, name, request_id), ident = asyncio.run(main())
    assert (total, request_id) == (5, "r-17") and name.startswith("t-basic-")
    assert ident != threading.get_ident()   # off the event loop's thread
    assert calls.num_threads == 1           # one call at a time: one thread, reused
    calls.close()


def test_calls_run_in_parallel_up_to_the_cap_and_the_rest_wait():
    cap, num_calls, hold_s = 3, 12, 0.05
    calls = BlockingCalls("t-cap", max_threads=cap)
    lock, running, peak = threading.Lock(), [0], [0]

    def work(i: int) -> int:
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(hold_s)
        with lock:
            running[0] -= 1
        return i * i

    async def main():
        return await asyncio.gather(*(calls.run(work, i) for i in range(num_calls)))

    started = time.monotonic()
    assert asyncio.run(main()) == [i * i for i in range(num_calls)]
    elapsed = time.monotonic() - started
    assert peak[0] == cap and calls.num_threads == cap
    assert elapsed >= (num_calls / cap) * hold_s * 0.9   # four rounds of three, not one round of twelve
    calls.close()


def test_idle_threads_end_and_new_calls_start_new_ones():
    calls = BlockingCalls("t-idle", idle_s=0.05)

    async def burst(n: int) -> list[int]:
        return await asyncio.gather(*(calls.run(lambda i=i: (time.sleep(0.01), i)[1]) for i in range(n)))

    assert asyncio.run(burst(4)) == [0, 1, 2, 3]
    assert calls.num_threads >= 2
    deadline = time.monotonic() + 5
    while calls.num_threads and time.monotonic() < deadline:
        time.sleep(0.02)
    assert calls.num_threads == 0
    assert asyncio.run(burst(3)) == [0, 1, 2]
    calls.close()


def test_no_call_is_stranded_while_threads_come_and_go():
    """Property: with threads ending after 2 ms idle and calls arriving in random bursts and pauses around that time,
    every call still completes (a call queued just as the last thread decides to end must get a thread)."""
    rng = random.Random(38)
    calls = BlockingCalls("t-churn", max_threads=4, idle_s=0.002)

    async def main() -> int:
        done = 0
        for _ in range(300):
            burst = [calls.run(time.sleep, rng.choice([0, 0, 0.0005])) for _ in range(rng.randint(1, 6))]
            await asyncio.wait_for(asyncio.gather(*burst), timeout=10)
            done += len(burst)
            await asyncio.sleep(rng.choice([0, 0.001, 0.002, 0.003]))
        return done

    assert asyncio.run(main()) > 300
    calls.close()


def test_a_cancelled_await_lets_the_call_finish_and_the_next_calls_run():
    calls = BlockingCalls("t-cancel", max_threads=1)
    finished = threading.Event()

    def slow() -> str:
        time.sleep(0.1)
        finished.set()
        return "late"

    async def main():
        task = asyncio.create_task(calls.run(slow))
        await asyncio.sleep(0.02)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return await calls.run(lambda: "next")

    assert asyncio.run(main()) == "next" and finished.is_set()
    calls.close()


def test_close_runs_what_is_queued_then_refuses():
    calls = BlockingCalls("t-close")

    async def main():
        first = await calls.run(lambda: 1)
        calls.close()
        with pytest.raises(RuntimeError, match="closed"):
            await calls.run(lambda: 2)
        return first

    assert asyncio.run(main()) == 1
    deadline = time.monotonic() + 5
    while calls.num_threads and time.monotonic() < deadline:
        time.sleep(0.01)
    assert calls.num_threads == 0


def test_arguments_are_checked():
    with pytest.raises(ValueError, match="max_threads"):
        BlockingCalls("bad", max_threads=0)
    with pytest.raises(ValueError, match="idle_s"):
        BlockingCalls("bad", idle_s=0)
