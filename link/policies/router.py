"""`router`: a trained router file picks the model: argmax of predicted quality - lambda * expected cost.

    - name: link/auto
      type: router
      models: [smollm2-135m-instruct, gemma-3-270m]     # the candidates (a subset of the router's models)
      options:
        path: routers/trained/link-auto.safetensors     # written by `link router train` (routers.base.save_router)
        cost_penalty: 200          # optional: lambda in quality points per USD, in [0, 1e9] (default: the
                                   #   file's calibrated one)
        max_cost_usd: 0.01         # optional: skip models expected to cost more per request, in [0, 1e6]
        encoder: auto              # optional: the prompt encoder, auto|onnx-int8|onnx|torch (below)

The plan is [the chosen model, then the other candidates by the same objective] (fallbacks before the
first byte). The decision (each model's predicted quality and expected cost, lambda, the chosen model)
goes into the request log. A request may override the knobs in its OpenAI `metadata` (string values):
`{"link_cost_penalty": "50"}` and `{"link_max_cost_usd": "0.001"}`; a key that is nearly one of these (a
misspelling, another case) is refused, the client's other tags pass. When every candidate is expected to cost
more than the ceiling, the cheapest answers and the decision says `over_max_cost` (the answer's header
`x-link-over-max-cost: true`).

The file is read when the policy is built (at gateway start), in a daemon thread that also scores one
warm-up request (loading the embedding model takes seconds); a request arriving before that waits for it.
Each decision (one embedding, milliseconds of CPU) runs in a worker thread; its prompt is encoded on the
embedder's own one-thread worker, and loading a router limits numpy's BLAS to one thread for the process
(routers/threads.py says why). A relative `path` is relative to the gateway's working directory.

The encoder (`encoder` option) of the prompt, all-MiniLM-L6-v2: "onnx-int8" runs its int8 graph through
ONNX Runtime (routers/onnx_encoder.py), "onnx" its float32 graph (the very vectors the router was trained
on), "torch" PyTorch (bfloat16 where the CPU multiplies it natively); "auto", the default, is "onnx-int8"
with PyTorch float32 after a failed export or probe check (logged). Measured on 1,000 real prompts with
link/auto's router on one core of the 2-core AMD EPYC (benchmarks/routing_latency.py): decision p50 8.9 ms
int8, 17.7 ms float32 ONNX, 18.9 ms PyTorch bf16; int8 made the float32 encoder's choice for 97.2% of
them, with a mean regret of 0.0004 quality points (the flips are near-ties). The graphs are exported once
per LINK_HOME, in a child process.
"""

from __future__ import annotations

import asyncio
import difflib
import logging
import math
import threading
import time
from pathlib import Path
from typing import Any

from link.config import PolicyConfig
from link.policies.base import Plan, Policy, PolicyError, PolicyRequest
from link.policies.options import number_option, str_option
from link.schemas import OpenAIError
from routers.request import RoutingRequest   # stdlib only: importing it loads no model or numpy

logger = logging.getLogger(__name__)
# Per-request overrides in the OpenAI `metadata` (values are strings there): key -> what it sets.
METADATA_COST_PENALTY = "link_cost_penalty"
METADATA_MAX_COST = "link_max_cost_usd"
MAX_COST_PENALTY = 1e9   # lambda, quality points per USD (a calibrated one is in the hundreds or thousands)
MAX_COST_USD = 1e6       # a per-request ceiling above this excludes nothing


def nonnegative_number(value: Any, name: str, param: str) -> float | None:
    """A non-negative finite number (a string too) or None. Raises PolicyError naming `param`."""
    if value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise PolicyError(f"{name} must be a number, got {value!r}", param=param) from None
    if not math.isfinite(number) or number < 0:
        raise PolicyError(f"{name} must be a finite number >= 0, got {value!r}", param=param)
    return number


ENCODERS = ("auto", "onnx", "onnx-int8", "torch")


def encoder_option(options: dict[str, Any]) -> str:
    """The `encoder` option (default "auto"). Raises PolicyError naming it for another value."""
    encoder = str_option(options, "encoder", "auto")
    if encoder not in ENCODERS:
        raise PolicyError(f"options.encoder must be one of {ENCODERS}, got {encoder!r}", param="options.encoder")
    return encoder


def gateway_embedder(encoder: str = "auto"):
    """The `routers.embedding.Embedder` of a router policy's `encoder` option (module docstring)."""
    from routers.embedding import Embedder

    if encoder == "torch":
        return Embedder(dtype="auto", backend="torch")
    if encoder == "auto":
        return Embedder(dtype="float32", backend="onnx-int8", fallback_to_torch=True)
    return Embedder(dtype="float32", backend=encoder)


def knob_options(options: dict[str, Any]) -> tuple[float | None, float | None]:
    """(cost_penalty, max_cost_usd) of a router or hybrid policy's options, None where unset: numbers in
    [0, MAX_COST_PENALTY] and [0, MAX_COST_USD]. Raises PolicyError naming the option."""
    return (number_option(options, "cost_penalty", None, 0.0, MAX_COST_PENALTY),
            number_option(options, "max_cost_usd", None, 0.0, MAX_COST_USD))


def request_overrides(body: dict[str, Any]) -> tuple[float | None, float | None]:
    """(cost penalty, max cost in USD) a request sets in `metadata`, None where not set.

    Raises:
        OpenAIError: 400 naming `metadata.<key>` for a value that is not a number in [0, MAX_COST_PENALTY] or
            [0, MAX_COST_USD], or for a key that is nearly one of the two (a misspelt knob would be ignored;
            the client's other tags pass).
    """
    metadata = body.get("metadata") if isinstance(body.get("metadata"), dict) else {}
    limits = {METADATA_COST_PENALTY: MAX_COST_PENALTY, METADATA_MAX_COST: MAX_COST_USD}
    for key in metadata:
        if isinstance(key, str) and key not in limits:
            near = difflib.get_close_matches(key.lower(), list(limits), n=1, cutoff=0.85)
            if near:
                raise OpenAIError(400, f"metadata key {key!r} is not one a routing policy reads: did you mean {near[0]!r}? "
                                  f"({METADATA_COST_PENALTY}: lambda, quality points per USD; {METADATA_MAX_COST}: USD "
                                  "per request)", param=f"metadata.{key}", log_status="invalid_request")
    values = []
    for key, high in limits.items():
        try:
            value = nonnegative_number(metadata.get(key), key, f"metadata.{key}")
        except PolicyError as exc:
            raise OpenAIError(400, exc.message, param=exc.param, log_status="invalid_request") from None
        if value is not None and value > high:
            raise OpenAIError(400, f"{key} must be at most {high:g}, got {metadata[key]!r}", param=f"metadata.{key}",
                              log_status="invalid_request")
        values.append(value)
    return values[0], values[1]


def require_text_prompt(body: dict[str, Any]) -> None:
    """Refuse a /v1/completions prompt of token ids (router, hybrid and cascade policies): a router or scorer
    reads the prompt's text, and ids of one model's tokenizer mean other words to another candidate's.

    Raises:
        OpenAIError: 400 (param "prompt") for a prompt of token ids (a list of ints, or of lists of ints).
    """
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and all(isinstance(p, (int, list)) and not isinstance(p, bool) for p in prompt):
        raise OpenAIError(400, "a routing policy reads the prompt's text, and token ids name different words in each "
                          "candidate's tokenizer: send the prompt as text, or send token ids to one model by name",
                          param="prompt", log_status="invalid_request")


class LazyRouter:
    """A router file loaded once, on first use, from any thread (`routers.base.load_router`).

    Args:
        path: the file; checked (its header read) at construction.
        encoder: the prompt encoder (ENCODERS; `gateway_embedder`).
    Raises:
        PolicyError: (constructor, `header`) no such file or not a router file (param "options.path").
    """

    def __init__(self, path: str | Path, encoder: str = "auto"):
        self.path = Path(path).expanduser()
        self.encoder = encoder
        self.header = self.read_header(self.path)
        self._loaded = None
        self._lock = threading.Lock()

    @staticmethod
    def read_header(path: str | Path) -> dict[str, Any]:
        from routers.base import read_header

        try:
            return read_header(path)
        except (FileNotFoundError, ValueError) as exc:
            raise PolicyError(f"options.path: {exc}", param="options.path") from None

    @property
    def models(self) -> list[str]:
        return list(self.header.get("models") or [])

    def get(self):
        """The `routers.base.LoadedRouter`, loaded now if needed and warmed by scoring one request (which loads
        the embedding model). Blocking: call it from a worker thread.

        Raises:
            FileNotFoundError, ValueError: the file went missing or is not a router (`routers.base.load_router`).
        """
        with self._lock:
            if self._loaded is None:
                from routers.base import load_router
                from routers.features import Featurizer
                from routers.threads import limit_blas_threads

                loaded = load_router(self.path)
                loaded.router.featurizer = Featurizer(gateway_embedder(self.encoder),
                                                      choice_embeddings=loaded.router.reads_choice_embeddings)
                try:
                    loaded.router.score({"messages": [{"role": "user", "content": "warm-up"}]})
                except Exception:  # noqa: BLE001 - a request will meet the same error and report it
                    logger.exception("router %s: scoring a warm-up request failed", self.path)
                # a decision's numpy products are tiny: one BLAS thread, no pool spinning on the cores the
                # encoder and a local engine need (process-wide, after the warm-up has loaded every BLAS
                # library the router uses; routers/threads.py has the measurements)
                limit_blas_threads(1)
                self._loaded = loaded
            return self._loaded

    def preload(self) -> None:
        """Start loading in a daemon thread, so the first request does not wait seconds for the embedding model."""
        def load() -> None:
            try:
                self.get()
            except Exception:  # noqa: BLE001 - the first request retries and reports it
                logger.exception("router %s: preloading failed", self.path)

        threading.Thread(target=load, name=f"router-load-{self.path.name}", daemon=True).start()


def router_path(config: PolicyConfig) -> str:
    """The `path` option. Raises PolicyError when missing."""
    path = config.options.get("path")
    if not isinstance(path, str) or not path:
        raise PolicyError(f"a {config.type!r} policy needs options.path: a router file written by `link router train`",
                          param="options.path")
    return path


def routing_request(request: PolicyRequest, cost_penalty: float | None, max_cost_usd: float | None) -> RoutingRequest:
    """The request as a router or hybrid policy routes it, read once: the knobs are its `metadata` overrides,
    else the policy's options (`cost_penalty`, `max_cost_usd`; None: the router file's lambda, no ceiling).

    Raises:
        OpenAIError: 400 for a prompt of token ids (`require_text_prompt`) or a bad override (`request_overrides`).
    """
    require_text_prompt(request.body)
    penalty, max_cost = request_overrides(request.body)
    return RoutingRequest.from_body(request.body, endpoint=request.endpoint,
                                    cost_penalty=cost_penalty if penalty is None else penalty,
                                    max_cost_usd=max_cost_usd if max_cost is None else max_cost)


class RouterPolicy(Policy):
    """Routes each request with a trained router (see the module docstring)."""

    type = "router"
    OPTIONS = ("path", "cost_penalty", "max_cost_usd", "encoder")

    @classmethod
    def check(cls, config: PolicyConfig, model_names: tuple[str, ...]) -> None:
        super().check(config, model_names)
        knob_options(config.options)
        encoder_option(config.options)
        header = LazyRouter.read_header(Path(router_path(config)).expanduser())
        outside = [m for m in config.models if m not in (header.get("models") or [])]
        if outside:
            raise PolicyError(f"model(s) {outside} are not among the router's models {header.get('models')}; "
                              "train the router on them or drop them from `models`", param="models")

    def __init__(self, config: PolicyConfig, model_names: tuple[str, ...] | list[str]):
        super().__init__(config, model_names)
        self.router = LazyRouter(router_path(config), encoder_option(config.options))
        self.router.preload()
        self.cost_penalty, self.max_cost_usd = knob_options(config.options)

    def decide(self, request: RoutingRequest) -> dict[str, Any]:
        """The routing decision for one request (its knobs included), as the request log's decision dict
        (blocking; a worker thread). "order" is the plan: the chosen model, then the others by the same rule
        (`routers.decision.rank`)."""
        loaded = self.router.get()                 # waits for the file and the encoder on the first request
        started = time.perf_counter()              # routing_ms: the decision itself
        decision = loaded.decide(request, allowed=self.config.models)
        result = {"type": self.type, "router": loaded.router.type, "rule": decision.rule,
                  "scores": decision.quality, "expected_cost_usd": decision.expected_cost, "chosen": decision.chosen,
                  "order": decision.order, "excluded": decision.excluded}
        if decision.rule == "lambda":
            result["cost_penalty"] = decision.knob
            result["objective"] = decision.objective
        else:
            result["threshold"] = decision.knob
        if request.max_cost_usd is not None:
            result["max_cost_usd"] = request.max_cost_usd
            # every model was expected over the ceiling: the cheapest answers, and the answer says so
            result["over_max_cost"] = decision.over_max_cost
        result["routing_ms"] = round((time.perf_counter() - started) * 1000, 3)
        return result

    async def plan(self, request: PolicyRequest) -> Plan:
        routing = routing_request(request, self.cost_penalty, self.max_cost_usd)
        decision = await asyncio.to_thread(self.decide, routing)
        return Plan(self.name, decision.pop("order"), decision)
