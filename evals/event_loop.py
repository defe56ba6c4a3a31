"""Run a coroutine to completion from synchronous code, whether or not this thread already runs an event loop.

    result = run_sync(areplay(policy, table))

`asyncio.run` refuses to start inside a running loop ("asyncio.run() cannot be called from a running event loop"),
which is where a Jupyter notebook, an async web framework or Playwright's sync API call our synchronous functions
from. There the coroutine runs on a fresh loop in a worker thread and the caller blocks until it is done.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """`coro`'s result: `asyncio.run(coro)` in this thread when no loop runs here, else the same in a worker thread.

    In the worker thread the coroutine must not use objects bound to the caller's loop (its futures, locks or
    clients); Ctrl-C there interrupts the caller's wait, not the coroutine. Exceptions of `coro` propagate.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="run-sync") as worker:
        return worker.submit(asyncio.run, coro).result()
