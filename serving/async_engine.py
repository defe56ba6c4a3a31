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

With `traffic` set to a `serving.traffic.TrafficRecorder`, every finished request's shape is recorded
(the configuration tuner's input); `reconfigure(config)` swaps the engine's `EngineConfig` between two
steps without losing running requests (`serving/reconfigure.py`). A request the engine stops (a token
over `EngineConfig.sample_timeout_s`, `serving.sample_budget`) raises its `SamplingTimeoutError` from
`generate`.
"""

from __future__ import annotations

import asyncio
import logging
from typing import AsyncIterator

from serving.llm_engine import LLMEngine
from serving.outputs import RequestOutput
from serving.sampling_params import SamplingParams

logger = logging.getLogger(__name__)


class AsyncLLMEngine:
    def __init__(self, engine: LLMEngine, *, step_in_thread: bool = False):
        self.engine = engine
        self.step_in_thread = step_in_thread
        self._queues: dict[str, asyncio.Queue] = {}
        self._pending: list[tuple] = []  # ("add", args) or ("abort", request_id), applied between steps
        self._wakeup: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self.errored: BaseException | None = None
        self.traffic = None  # serving.traffic.TrafficRecorder: shapes of finished requests

    @property
    def num_running(self) -> int:
        return len(self.engine.scheduler.running)

    @property
    def num_waiting(self) -> int:
        return len(self.engine.scheduler.waiting)

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
        self._pending.append(("add", (request_id, prompt_token_ids, params, prompt, priority)))
        self._wakeup.set()
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
        self._pending.append(("abort", request_id))
        if self._wakeup is not None:
            self._wakeup.set()

    def reconfigure(self, config) -> None:
        """Apply an `EngineConfig` before the next step (`serving.reconfigure.reconfigure`): running
        requests are preempted by recomputation and continue under the new settings. A configuration
        the live requests do not fit in is logged and not applied."""
        self._pending.append(("reconfigure", config))
        if self._wakeup is not None:
            self._wakeup.set()

    def _apply_pending(self) -> None:
        pending, self._pending = self._pending, []
        for kind, arg in pending:
            if kind == "reconfigure":
                from serving.reconfigure import reconfigure

                try:
                    reconfigure(self.engine, arg)
                except ValueError as exc:
                    logger.warning("engine configuration not applied: %s", exc)
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
                outputs = await asyncio.to_thread(self.engine.step) if self.step_in_thread else self.engine.step()
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
