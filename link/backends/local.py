"""`LocalBackend`: our engine in-process, and `EnginePool`, which owns one engine per local model.

The pool loads a model on its first request (in a worker thread, so the event loop keeps serving),
starts one `AsyncLLMEngine` for it and shares it between every deployment naming the same model. The
request path is the standalone server's (`serving/frontend/responses.py`: `plan_chat`/`plan_completion`,
`whole_response`, `stream_events`), so a local answer through the gateway equals `link engine serve`'s.
The first-chunk and whole-request timeouts start once the model is loaded. Requests with `tools` use
the deployment's harness format (link.yaml `tool_format:`, `serving.tools.formats`). A request the engine
stops (`SamplingTimeoutError`) is a 400 that leaves the replica in rotation; an engine whose loop failed
or stalled (`AsyncLLMEngine.problem`) fails its health check, so the gateway's /health lists the model.

    pool = EnginePool()                       # owned by the app; `await pool.aclose()` in its lifespan
    backend = make_backend(deployment, engine_pool=pool)
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import uuid
from typing import AsyncIterator

from pydantic import ValidationError

from link.backends.base import Backend, BackendError, BackendUnavailable, Endpoint, guard_stream, with_timeout
from link.config import ModelDeployment
from protocol.errors import ValidationProblem
from protocol.openai import ChatCompletionRequest, CompletionRequest
from serving.errors import ContextLengthError, SamplingTimeoutError, ServingError
from serving.frontend.responses import RequestPlan, plan_chat, plan_completion, stream_events, whole_response
from serving.registry import ModelRegistry, ModelSpec, default_registry
from serving.tuning.auto_kernels import start_auto_tune
from serving.tuning.traffic import TrafficRecorder, save_mix, traffic_path

logger = logging.getLogger(__name__)

# A local file's context when the config gives none: large, so the file's own value caps it.
_UNCAPPED_CONTEXT = 1 << 20


class EnginePool:
    """Local model name (or file path) -> a loaded model and its running `AsyncLLMEngine`, created on first use.

    Args:
        registry: where registry names resolve (default: `serving.registry.default_registry()`).
        dtype: weights dtype, "float32" or "bfloat16".
        weights: a GGUF file's quantized matrices "auto", "packed" or "float" (`serving.model_loader.load_model`).
        engine_config: `serving.engine.llm_engine.EngineConfig` for every engine whose deployment sets no `engine`
            options (default: its defaults).
        auto_tune: background kernel tuning of every engine whose deployment does not set `engine.auto_tune`
            (`serving.tuning.auto_kernels`; idle means no engine of the pool has work).
    """

    def __init__(self, registry: ModelRegistry | None = None, *, dtype: str = "float32", weights: str = "auto",
                 engine_config=None, auto_tune: bool = True):
        self.registry = registry or default_registry()
        self.dtype, self.weights = dtype, weights
        self.engine_config = engine_config
        self.auto_tune = auto_tune
        self._states: dict[str, object] = {}  # key -> serving.frontend.state.EngineState
        self._locks: dict[str, asyncio.Lock] = {}
        self.load_errors: dict[str, str] = {}
        self._tuners: list = []  # kernels.background.BackgroundTuner / AutoTuner per model

    def spec_for(self, deployment: ModelDeployment) -> ModelSpec:
        """The `ModelSpec` of a local deployment, its `context_length` applied as a cap.

        Raises:
            UnknownModelError: `local` is neither a registry name nor a file path.
        """
        if deployment.is_local_path:
            spec = ModelSpec(name=deployment.name, source=deployment.local, architecture=deployment.architecture,
                             chat_format=deployment.chat_format or "template",
                             context_length=deployment.context_length or _UNCAPPED_CONTEXT)
        else:
            spec = self.registry.get(deployment.local)
        if deployment.context_length and deployment.context_length < spec.context_length:
            spec = dataclasses.replace(spec, context_length=deployment.context_length)
        return spec

    def add_loaded(self, key: str, loaded) -> None:
        """Serve an already loaded model (`serving.model_loader.LoadedModel`) under `key` (a `local` value)."""
        self._states[key] = self._make_state(key, loaded)

    def _make_state(self, key: str, loaded, deployment: ModelDeployment | None = None):
        from serving.engine.async_engine import AsyncLLMEngine
        from serving.engine.llm_engine import EngineConfig, LLMEngine
        from serving.frontend.state import EngineState

        options = deployment.engine if deployment is not None else None
        config = options.engine_config() if options is not None else self.engine_config or EngineConfig()
        if options is None or (options.auto_tune is None and not options.compile_tune):
            config = dataclasses.replace(config, auto_tune=config.auto_tune and self.auto_tune)
        _record_shapes()
        if options is not None and options.compile_tune:
            self._start_tuner(loaded, options)
        engine = AsyncLLMEngine(LLMEngine(loaded, config), step_in_thread=True)
        engine.traffic = TrafficRecorder()  # request shapes, saved in `aclose` for `link compile tune-config`
        state = EngineState(key, loaded, engine)
        state.auto_tuner = start_auto_tune(engine, is_busy=self.has_work)
        if state.auto_tuner is not None:
            self._tuners.append(state.auto_tuner)
        return state

    def has_work(self) -> bool:
        """Whether any engine of the pool has requests or queued work (the background tuners' idle probe)."""
        return any(state.engine.has_work for state in list(self._states.values()))

    def _start_tuner(self, loaded, options) -> None:
        """Background kernel tuning of one model (link.yaml `engine: {compile_tune: true}`); stopped in `aclose`."""
        from kernels.candidates import register_candidates
        from kernels.background import BackgroundTuner
        from kernels.tuner import Tuner
        from kernels.winners import WinnerTable

        register_candidates()
        import kernels

        tuner = Tuner(WinnerTable(), loaded.spec.name, model=loaded.model)
        background = BackgroundTuner(tuner, kernels.recorder(), options.compile_budget_s, options.compile_interval_s)
        background.start()
        self._tuners.append(background)

    async def get(self, deployment: ModelDeployment):
        """The running engine state of a local deployment, loading the model on first use.

        Raises:
            BackendError: the model cannot be loaded (unknown name, missing or corrupt file); status 500.
        """
        key = deployment.local
        state = self._states.get(key)
        if state is None:
            async with self._locks.setdefault(key, asyncio.Lock()):
                state = self._states.get(key)
                if state is None:
                    state = await self._load(key, deployment)
        state.engine.start()
        return state

    async def _load(self, key: str, deployment: ModelDeployment):
        from serving.model_loader import load_model

        try:
            dtype = deployment.engine.dtype if deployment.engine is not None and deployment.engine.dtype else self.dtype
            weights = deployment.engine.weights if deployment.engine is not None and deployment.engine.weights else self.weights
            loaded = await asyncio.to_thread(load_model, self.spec_for(deployment), dtype, None, weights)
        except ServingError as exc:
            self.load_errors[key] = str(exc)
            raise BackendError(f"{deployment.name}: cannot load local model {key!r}: {exc}", status_code=500,
                               retryable=True, code="model_load_failed") from exc
        self.load_errors.pop(key, None)
        state = self._states[key] = self._make_state(key, loaded, deployment)
        return state

    def is_healthy(self, key: str) -> bool:
        """False when the model failed to load or its engine loop died or stalled (`AsyncLLMEngine.problem`);
        True when loaded and fine, or not loaded yet."""
        state = self._states.get(key)
        if state is None:
            return key not in self.load_errors
        problem = state.engine.problem
        if problem is not None:
            logger.warning("local model %s is unhealthy: %s", key, problem)
        return problem is None

    async def aclose(self) -> None:
        """Stop every engine loop and background tuner; save each model's recorded traffic mix to
        $LINK_HOME/compile/traffic/<model>.jsonl (`serving.tuning.traffic.traffic_path`)."""
        for tuner in self._tuners:
            await asyncio.to_thread(tuner.stop)
        for state in self._states.values():
            await state.engine.shutdown()
            save_traffic(state)


def save_traffic(state) -> None:
    """Write an engine's recorded request shapes (if any) where `link compile tune-config` finds them."""
    recorder = getattr(state.engine, "traffic", None)
    shapes = recorder.shapes() if recorder is not None else []
    if shapes:
        try:
            save_mix(shapes, traffic_path(state.loaded.spec.name))
        except OSError as exc:  # a read-only home must not fail the shutdown
            logger.warning("could not save the traffic mix of %s: %s", state.loaded.spec.name, exc)


def _record_shapes() -> None:
    """Attach a `ShapeRecorder` to the dispatch (once per process): /metrics shows its counts, tuners read them."""
    import kernels

    if kernels.recorder() is None:
        kernels.attach_recorder(kernels.ShapeRecorder())


def _problem(exc: Exception, name: str) -> BackendError:
    """A request the engine refuses -> a 4xx BackendError carrying an OpenAI error object."""
    if isinstance(exc, ValidationProblem):
        error = {"message": exc.message, "type": exc.type, "param": exc.param, "code": exc.code}
        return BackendError(exc.message, status_code=exc.status_code, code=exc.code, error=error)
    if isinstance(exc, ValidationError):
        first = exc.errors()[0]
        param = ".".join(str(p) for p in first.get("loc", ())) or None
        message = f"{param or 'body'}: {first.get('msg', 'invalid request')}"
        return BackendError(message, status_code=400, error={"message": message, "type": "invalid_request_error", "param": param, "code": None})
    if isinstance(exc, SamplingTimeoutError):  # the engine stopped this request; the replica is fine (4xx)
        code, param = "sampling_timeout", exc.param
    else:
        code, param = ("context_length_exceeded" if isinstance(exc, ContextLengthError) else None), "messages"
    return BackendError(str(exc), status_code=400, code=code,
                        error={"message": str(exc), "type": "invalid_request_error", "param": param, "code": code})


async def _close(streams: list) -> None:
    """Close engine streams now, which aborts unfinished requests and frees their KV blocks."""
    for s in streams:
        try:
            await s.aclose()
        except RuntimeError:  # still being iterated by a task that is being cancelled; it aborts on its own
            pass


class LocalBackend(Backend):
    """A local model served by the shared `EnginePool` (kind "local")."""

    needs = ("engine_pool",)
    timeouts_mean_overload = True  # the engine is in-process: a slow answer is a queue, not a dead replica

    def __init__(self, deployment: ModelDeployment, engine_pool: EnginePool):
        super().__init__(deployment)
        self.pool = engine_pool
        self.tool_format = deployment.harness_format

    async def _start(self, endpoint: Endpoint, body: dict):
        """Load the model if needed, plan the request and queue it: (plan, engine streams, state)."""
        state = await self.pool.get(self.deployment)
        engine = state.engine
        try:
            if endpoint == "chat":
                plan: RequestPlan = plan_chat(ChatCompletionRequest.model_validate(body), state.loaded, engine.engine.max_model_len,
                                                  self.tool_format)
            else:
                plan = plan_completion(CompletionRequest.model_validate(body), state.loaded, engine.engine.max_model_len)
            vocab = state.loaded.config.vocab_size  # as serving/api/server.py checks it, for equal 400s
            out_of_vocab = [tid for tid, _ in plan.params.logit_bias if tid >= vocab]
            if out_of_vocab:
                raise ValidationProblem(f"logit_bias token ids must be in [0, {vocab}); got {out_of_vocab[:5]}", param="logit_bias")
            for ids in plan.prompts:
                engine.engine.check_request(ids, plan.params)
        except (ValidationProblem, ValidationError, ServingError) as exc:
            raise _problem(exc, self.deployment.name) from exc
        if engine.errored is not None:
            raise BackendUnavailable(f"{self.deployment.name}: the engine loop failed: {engine.errored}")
        base_id = uuid.uuid4().hex
        streams = [engine.generate(f"{base_id}-{i}", ids, plan.params) for i, ids in enumerate(plan.prompts)]
        return plan, streams, state

    async def complete(self, endpoint: Endpoint, body: dict) -> dict:
        """The whole response, exactly as `link engine serve` answers. Raises BackendError (see `Backend`)."""
        plan, streams, state = await self._start(endpoint, body)
        try:
            return await with_timeout(whole_response(plan, streams, state), self.deployment)
        except RuntimeError as exc:  # the engine loop died
            raise BackendUnavailable(f"{self.deployment.name}: {exc}") from exc
        except ServingError as exc:  # the engine stopped the request (SamplingTimeoutError)
            raise _problem(exc, self.deployment.name) from exc
        finally:
            await _close(streams)

    async def stream(self, endpoint: Endpoint, body: dict) -> AsyncIterator[dict]:
        """The chunks `link engine serve` streams (a usage chunk last when asked). Raises BackendError."""
        plan, streams, state = await self._start(endpoint, body)
        num_chunks = 0
        try:
            async for chunk in guard_stream(stream_events(plan, streams, state), self.deployment):
                num_chunks += 1
                yield chunk
        except RuntimeError as exc:
            raise BackendUnavailable(f"{self.deployment.name}: the engine failed after {num_chunks} chunks: {exc}") from exc
        except ServingError as exc:  # the engine stopped the request (SamplingTimeoutError): one error event
            raise _problem(exc, self.deployment.name) from exc
        finally:
            await _close(streams)

    async def health(self) -> bool:
        """True unless the model failed to load or its engine loop died or stalled (see `EnginePool.is_healthy`)."""
        return self.pool.is_healthy(self.deployment.local)
