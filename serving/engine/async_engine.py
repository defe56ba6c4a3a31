"""`AsyncLLMEngine`: an asyncio front for `LLMEngine` that streams tokens per request.

One background task owns the engine: it applies queued adds and aborts between steps and runs each
`step()`, either on the event loop itself (the default: the standalone engine server, whose loop has
little else to do) or in a worker thread (`step_in_thread=True`: the gateway, whose loop must keep
proxying other backends while a local model computes). On CPU the thread costs latency: every torch
call releases the GIL and must win it back from the event loop, and at concurrency 1 this convoy made
the inter-token latency of SmolLM2-135M 58 ms instead of 40 ms (`link bench serving`, bf16). Each
request gets an `asyncio.Queue` of `RequestOutput` snapshots. A consumer that stops iterating (a client
that disconnected) aborts its request, and the abort is applied before the next step, so its KV
blocks are free within one engine step.

    engine = AsyncLLMEngine(LLMEngine(load_model(spec)))
    async for output in engine.generate("r1", prompt_ids, SamplingParams(max_tokens=32)):
        print(output.outputs[0].text)

With `traffic` set to a `serving.tuning.traffic.TrafficRecorder`, every finished request's shape is recorded
(the configuration tuner's input); `call_between_steps(fn)` runs `fn(engine)` before the next step, which
is how `serving.tuning.reconfigure.reconfigure_between_steps` swaps the engine's `EngineConfig` without
losing running requests.

Health: `problem` says what is wrong, or None. The loop failed (`errored`), or it is stalled: requests
wait and no step has finished for `stall_bound_s` (`EngineConfig.stall_timeout_s`, or 3 times the slowest
recent step when the machine is that slow). Both /health routes (the engine
server's, the gateway's through `link.backends.local.EnginePool.is_healthy`) answer 503 with it. A stall
is seen only while the event loop runs, so with steps on the loop a step that never returns leaves /health
unanswered (a probe's timeout); in a worker thread /health names it. The engine itself bounds the work
a request adds to a step (`EngineConfig.sample_timeout_s`, `serving.engine.sample_budget`), and a request it
stops raises its `SamplingTimeoutError` from `generate`.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from typing import AsyncIterator, Callable

from serving.engine.llm_engine import LLMEngine
from serving.engine.outputs import RequestOutput
from serving.sampling.params import SamplingParams

logger = logging.getLogger(__name__)
RECENT_STEPS = 64  # the steps whose slowest sets the stall bound
STALL_STEP_FACTOR = 3.0


class AsyncLLMEngine:
    def __init__(self, engine: LLMEngine, *, step_in_thread: bool = False):
        self.engine = engine
        self.step_in_thread = step_in_thread
        self._queues: dict[str, asyncio.Queue] = {}
        self._pending: list[tuple] = []  # ("add", args) or ("abort", request_id), applied between steps
        self._wakeup: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self.errored: BaseException | None = None
        self.traffic = None  # serving.tuning.traffic.TrafficRecorder: shapes of finished requests
        self._last_progress = time.monotonic()  # when a step last finished, or work arrived at an idle loop
        self._recent_steps_s: collections.deque[float] = collections.deque(maxlen=RECENT_STEPS)

    @property
    def num_running(self) -> int:
        return len(self.engine.scheduler.running)

    @property
    def num_waiting(self) -> int:
        return len(self.engine.scheduler.waiting)

    @property
    def has_work(self) -> bool:
        """Requests in the engine, or adds, aborts and reconfigurations queued for the next step."""
        return bool(self._pending) or self.engine.has_unfinished_requests

    @property
    def stalled_s(self) -> float:
        """Seconds the loop has had work without finishing a step (0.0 while idle)."""
        return time.monotonic() - self._last_progress if self.has_work else 0.0

    @property
    def stall_bound_s(self) -> float:
        """Seconds without a finished step after which the loop counts as stalled: `EngineConfig.stall_timeout_s`, or
        STALL_STEP_FACTOR times the slowest of the last RECENT_STEPS steps when that is longer (a machine so busy
        that a full prefill chunk takes 15 s is slow, not stuck; a step stuck for good still passes the bound)."""
        slowest = max(self._recent_steps_s, default=0.0)
        return max(self.engine.config.stall_timeout_s, STALL_STEP_FACTOR * slowest)

    @property
    def problem(self) -> str | None:
        """Why the engine cannot serve now (its loop failed, or stalled past `stall_bound_s`), or None."""
        if self.errored is not None:
            return f"the engine loop failed: {self.errored}"
        stalled, bound = self.stalled_s, self.stall_bound_s
        if stalled > bound:
            return (f"the engine loop is stalled: no step has finished for {stalled:.0f} s (bound {bound:g} s) while "
                    f"{self.num_running + self.num_waiting} requests wait")
        return None

    def start(self) -> None:
        """Start the background loop on the running event loop (idempotent)."""
        if self._task is None or self._task.done():
            self._wakeup = asyncio.Event()
            self._task = asyncio.get_running_loop().create_task(self._loop(), name="llm-engine-loop")

    async def shutdown(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None

    async def generate(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                       prompt: str | None = None, priority: int = 0) -> AsyncIterator[RequestOutput]:
        """Yield a snapshot of the request after every step that advanced it; the last has finished=True.

        Raises:
            ServingError / ContextLengthError: invalid request (raised before anything is queued).
            SamplingTimeoutError: the engine stopped the request, a token over `EngineConfig.sample_timeout_s`.
            RuntimeError: the engine loop died (its error is chained).
        """
        self.engine.check_request(prompt_token_ids, params)
        if request_id in self._queues:
            raise ValueError(f"request id {request_id!r} is already in use")
        self.start()
        queue: asyncio.Queue = asyncio.Queue()
        self._queues[request_id] = queue
        self._enqueue(("add", (request_id, prompt_token_ids, params, prompt, priority)))
        finished = False
        try:
            while not finished:
                item = await queue.get()
                if isinstance(item, BaseException):
                    raise RuntimeError(f"engine loop failed: {item}") from item
                finished = item.finished
                if item.error is not None:
                    raise item.error
                if finished and self.traffic is not None:
                    self.traffic.observe(item, params)
                yield item
        finally:
            self._queues.pop(request_id, None)
            if not finished:
                self.abort(request_id)

    def abort(self, request_id: str) -> None:
        """Abort a request before the next step (safe from any coroutine)."""
        self._enqueue(("abort", request_id))

    def call_between_steps(self, fn: Callable[[LLMEngine], None]) -> None:
        """Run `fn(engine)` before the next step (safe from any coroutine): a change to the `LLMEngine` that
        must not land mid-step, e.g. a new `EngineConfig` (`serving.tuning.reconfigure.reconfigure_between_steps`).
        An exception `fn` raises ends the loop as a failed step does (`errored`)."""
        self._enqueue(("call", fn))

    def _enqueue(self, item: tuple) -> None:
        """Queue `item` for the loop and wake it; work reaching an idle loop restarts the stall clock."""
        if not self.has_work:
            self._last_progress = time.monotonic()
        self._pending.append(item)
        if self._wakeup is not None:
            self._wakeup.set()

    def _apply_pending(self) -> None:
        pending, self._pending = self._pending, []
        for kind, arg in pending:
            if kind == "call":
                arg(self.engine)
            elif kind == "add":
                request_id = arg[0]
                if request_id not in self._queues:  # its consumer already left
                    continue
                try:
                    self.engine.add_request(*arg[:3], prompt=arg[3], priority=arg[4])
                except Exception as exc:  # validation races (e.g. duplicate id): report to that request only
                    self._queues[request_id].put_nowait(exc)
            else:
                self.engine.abort_request(arg)

    async def _loop(self) -> None:
        try:
            while True:
                self._apply_pending()
                if not self.engine.has_unfinished_requests:
                    self._wakeup.clear()
                    if not self._pending:
                        await self._wakeup.wait()
                    continue
                started = time.monotonic()
                outputs = await asyncio.to_thread(self.engine.step) if self.step_in_thread else self.engine.step()
                self._last_progress = time.monotonic()
                self._recent_steps_s.append(self._last_progress - started)
                for output in outputs:
                    queue = self._queues.get(output.request_id)
                    if queue is not None:
                        queue.put_nowait(output)
                # Between steps: consumers, new requests and socket events. Stepping on the loop, a real
                # (1 ms) sleep is needed: with sleep(0) a client's disconnect was not seen for seconds.
                await asyncio.sleep(0 if self.step_in_thread else 0.001)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            self.errored = exc
            for queue in self._queues.values():
                queue.put_nowait(exc)
            raise
