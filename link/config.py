"""The gateway's YAML config (`link.yaml`): the models it serves and the policies over them.

    config = load_config(Path("link.yaml"))   # or load_config(None) for the embedded default
    config.deployments("smollm2-135m-instruct")  # the replicas of one public model name

Each entry of `models` is one deployment; several entries with the same `name` are replicas of one
model that the gateway balances across. `kind` says how to reach it: "local" (our in-process engine),
"litellm" (any provider LiteLLM supports, by its model string) or "openai" (an OpenAI-compatible
server such as `link engine serve`, vLLM or SGLang, through the official `openai` client). Keys are
never written in the file: `api_key_env` names the environment variable holding the key. See
`link.example.yaml` at the repository root for a commented example.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from link.config_checks import PolicyCheck, config_problems, cross_check
from link.default_config import DEFAULT_CONFIG_YAML

BackendKind = Literal["local", "litellm", "openai"]
logger = logging.getLogger(__name__)
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/@+-]*$")


class ConfigError(ValueError):
    """An unreadable or invalid config; the message names the file, the entry and the field to fix."""


class EngineOptions(BaseModel):
    """Engine settings of one local deployment (`serving.engine.llm_engine.EngineConfig`); unset fields keep its defaults.

    Attributes:
        kv_cache_mb: KV cache memory in MiB.
        max_num_seqs: sequences decoded together at most.
        max_num_batched_tokens: tokens per engine step at most (prefill chunk size).
        enable_prefix_caching: reuse KV blocks of a shared prompt prefix across requests.
        sliding_window_pool: Gemma 3: keep only the window's blocks for sliding-window layers (less memory, no
            prefix caching); false gives one pool for all layers, with prefix caching (raise `kv_cache_mb`).
        compile_tune: tune kernels in the background for the shapes this engine records (off by default;
            `kernels.background.BackgroundTuner`): every `compile_interval_s` seconds, the buckets that were hot
            since the last round and have no verdict are verified, timed and swapped in between two steps.
        auto_tune: tune kernels in the engine's idle gaps (`serving.tuning.auto_kernels`); unset = the gateway's
            `LINK_LOCAL_AUTO_TUNE` (on unless `link serve --no-auto-tune`). Not used while `compile_tune` is on.
        compile_budget_s: CPU seconds of tuning per round at most (the round stops starting buckets after it).
        compile_interval_s: seconds between tuning rounds.
        speculative: `serving.spec_decode.SpeculativeConfig` fields (e.g. `{method: ngram}`); unset = off.
        dtype: this deployment's weights and KV cache dtype; unset = `LINK_LOCAL_DTYPE`. A tuned GGUF Llama
            decodes 2-3x faster in float32 (`kernels.native_step`); one local model's deployments share the first's.
        weights: a GGUF file's quantized matrices: "packed" (kept as blocks, float32 activations), "float" or
            "auto"; unset = `LINK_LOCAL_WEIGHTS` (`serving.model_loader.load_model`). Shared like `dtype`.
    """

    model_config = ConfigDict(extra="forbid")

    kv_cache_mb: int | None = Field(None, ge=16)
    max_num_seqs: int | None = Field(None, ge=1)
    max_num_batched_tokens: int | None = Field(None, ge=16)
    enable_prefix_caching: bool | None = None
    sliding_window_pool: bool | None = None
    compile_tune: bool = False
    auto_tune: bool | None = None
    compile_budget_s: float = Field(60.0, gt=0, le=3600)
    compile_interval_s: float = Field(300.0, ge=1, le=86400)
    speculative: dict | None = None
    dtype: Literal["auto", "float32", "bfloat16"] | None = None
    weights: Literal["auto", "packed", "float"] | None = None

    @field_validator("speculative")
    @classmethod
    def _check_speculative(cls, value: dict | None) -> dict | None:
        if value is not None:
            _speculative_config(value)
        return value

    def engine_config(self):
        """The `serving.engine.llm_engine.EngineConfig` these options give."""
        from serving.engine.llm_engine import EngineConfig

        values = self.model_dump(exclude_none=True, exclude={"compile_tune", "compile_budget_s", "compile_interval_s", "dtype",
                                                                "weights"})
        if self.compile_tune:  # the fixed rounds replace the idle-gap tuner
            values["auto_tune"] = False
        if "kv_cache_mb" in values:
            values["kv_cache_bytes"] = values.pop("kv_cache_mb") * 2**20
        if "speculative" in values:
            values["speculative"] = _speculative_config(values["speculative"])
        return EngineConfig(**values)


def _speculative_config(values: dict):
    """`SpeculativeConfig(**values)`; ValueError naming an unknown field or a bad value."""
    import dataclasses

    from serving.spec_decode.config import SpeculativeConfig

    known = {f.name for f in dataclasses.fields(SpeculativeConfig)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(f"unknown speculative field(s) {unknown}; known: {sorted(known)}")
    return SpeculativeConfig(**values)


class ModelDeployment(BaseModel):
    """One deployment (replica) of a public model name.

    Attributes:
        name: the public model name clients send in `model`.
        kind: "local", "litellm" or "openai".
        local: kind local: a registry name (`link models`) or a path to a .gguf file / safetensors folder.
        architecture, chat_format: kind local with a file path: "llama"/"qwen2"/"gemma3", "template"/"in-context".
        model: the provider's model string ("openai/gpt-4o-mini" for litellm; the remote model id for
            openai, default `name`).
        api_base: the provider's base URL, e.g. "http://127.0.0.1:8001/v1" (required for kind openai).
        api_key_env: NAME of the environment variable that holds the key (never the key).
        input_cost_per_million, output_cost_per_million: USD per 1e6 prompt / completion tokens.
        context_length: tokens of prompt plus output; None = the model's own.
        timeout_s: seconds for a whole request (or a whole stream).
        first_token_timeout_s: seconds until a stream's first chunk.
        max_connections: size of the HTTP connection pool to this deployment (remote kinds).
        engine: kind local: engine settings (`EngineOptions`); one engine serves each `local` value, set up by
            the first deployment of it that is used.
        tool_format: kind local: the tool-call harness format of requests with `tools` (a registered name such as
            "json" (default) or "xml", or a dict of `serving.tools.formats.ToolCallFormat` fields with an optional
            `base`); per deployment, so two deployments of one model may speak two harnesses.
        replica_routing: how the gateway picks among `name`'s replicas: "fewest_outstanding" (default) or
            "cache_aware" (the one sent the longest prefix of this prompt, under a load bound;
            link/replica_routing.py). Replicas of one name share the first's value.
        replica_load_eps: cache_aware: a replica holds at most ceil((1 + eps) * average) requests in flight
            (bounded-load consistent hashing, Mirrokni et al. 2018). Shared like `replica_routing`.
        deployment_id: derived, "{name}#{index among replicas}".
    """

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    kind: BackendKind
    local: str | None = None
    architecture: Literal["llama", "qwen2", "gemma3"] | None = None
    chat_format: Literal["template", "in-context"] | None = None
    model: str | None = None
    api_base: str | None = None
    api_key_env: str | None = None
    input_cost_per_million: float = Field(0.0, ge=0)
    output_cost_per_million: float = Field(0.0, ge=0)
    context_length: int | None = Field(None, ge=1)
    timeout_s: float = Field(600.0, gt=0)
    first_token_timeout_s: float = Field(60.0, gt=0)
    max_connections: int = Field(256, ge=1)
    engine: EngineOptions | None = None
    tool_format: str | dict[str, Any] | None = None
    replica_routing: Literal["fewest_outstanding", "cache_aware"] = "fewest_outstanding"
    replica_load_eps: float = Field(0.25, ge=0, le=100)
    deployment_id: str = ""

    @field_validator("name")
    @classmethod
    def _check_name(cls, value: str) -> str:
        if not _NAME.match(value):
            raise ValueError(f"{value!r}: use letters, digits and . _ - / : @ + only, no spaces")
        return value

    @field_validator("api_key_env")
    @classmethod
    def _check_key_env(cls, value: str | None) -> str | None:
        if value is not None and (value.lower().startswith("sk-") or not _ENV_NAME.match(value)):
            raise ValueError("must be the NAME of an environment variable (e.g. OPENAI_API_KEY), never the key itself")
        return value

    @field_validator("api_base")
    @classmethod
    def _check_api_base(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError(f"{value!r} must start with http:// or https://")
        return value

    @model_validator(mode="after")
    def _check_kind(self) -> ModelDeployment:
        """The checks between fields, all of them: one error listing every problem of the entry."""
        problems = []
        if self.first_token_timeout_s > self.timeout_s:
            problems.append(f"first_token_timeout_s ({self.first_token_timeout_s}) exceeds timeout_s ({self.timeout_s}); "
                            "lower it or raise timeout_s")
        if self.kind == "local":
            if not self.local:
                problems.append("kind 'local' needs `local`: a registry name (see `link models`) or a model file path")
            problems += [f"`{field}` does not apply to kind 'local'; remove it (use `local` to name the model)"
                         for field in ("model", "api_base", "api_key_env") if getattr(self, field) is not None]
            if self.is_local_path and self.architecture is None:
                problems.append(f"local model file {self.local!r} needs `architecture` ('llama', 'qwen2' or 'gemma3') and "
                                "`chat_format` ('template' or 'in-context')")
        else:
            if self.local is not None:
                problems.append(f"`local` applies only to kind 'local', not {self.kind!r}; use `model`")
            problems += [f"`{field}` applies only to kind 'local', not {self.kind!r}"
                         for field in ("engine", "tool_format") if getattr(self, field) is not None]
            if self.kind == "litellm" and not self.model:
                problems.append("kind 'litellm' needs `model`: a LiteLLM model string such as 'openai/gpt-4o-mini'")
            if self.kind == "openai" and not self.api_base:
                problems.append("kind 'openai' needs `api_base`, e.g. 'http://127.0.0.1:8001/v1'")
        if self.tool_format is not None and self.kind == "local":
            try:
                self.harness_format  # noqa: B018 - refuses a bad tool_format at load
            except ValueError as exc:
                problems.append(str(exc) if str(exc).startswith("tool_format") else f"tool_format: {exc}")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @property
    def harness_format(self):
        """kind local: the `serving.tools.formats.ToolCallFormat` of `tool_format` (the JSON default when unset).

        Raises:
            ValueError (ToolFormatError): an unknown name or invalid fields.
        """
        from serving.tools.formats import tool_format_from_config

        return tool_format_from_config(self.tool_format)

    @property
    def is_local_path(self) -> bool:
        """kind local: `local` is a file path rather than a registry name."""
        return bool(self.local) and ("/" in self.local or self.local.endswith(".gguf"))

    @property
    def provider_model(self) -> str:
        """The model string the backend sends (`model`, else the public name)."""
        return self.model or self.name

    def cost_usd(self, prompt_tokens: int, completion_tokens: int) -> float:
        """USD cost of a request: tokens times the per-million prices."""
        return (prompt_tokens * self.input_cost_per_million + completion_tokens * self.output_cost_per_million) / 1e6


class PolicyConfig(BaseModel):
    """A named policy over model names.

    Attributes:
        name: the name clients send in `model` (must differ from every model name).
        type: a registered policy type (`link.policies.register_policy`): "fixed" (exactly one model),
            "fallback" (ordered list, at least two), "router" (a trained router file), "cascade" (cheap first,
            escalate on a low score), "moa" (Mixture-of-Agents), "hybrid" (a router choosing between single
            models and a MoA plan); see link/policies/.
        models: public model names from `models` (a router's candidates, a cascade's steps, MoA proposers).
        options: type-specific settings (e.g. a router's path and cost penalty; link.example.yaml lists them).
    """

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    type: str
    models: list[str] = Field(min_length=1)
    options: dict[str, Any] = Field(default_factory=dict)

    @field_validator("type")
    @classmethod
    def _registered(cls, value: str) -> str:
        from link.policies.registry import POLICIES  # here: link/policies/__init__.py imports base.py, which imports us

        if value not in POLICIES:
            raise ValueError(f"unknown policy type {value!r}; available: {', '.join(sorted(POLICIES))}")
        return value

    @model_validator(mode="after")
    def _check_type(self) -> PolicyConfig:
        if self.type == "fixed" and len(self.models) != 1:
            raise ValueError(f"a 'fixed' policy names exactly one model, got {len(self.models)}; use 'fallback' for an ordered list")
        if self.type == "fallback" and len(self.models) < 2:
            raise ValueError("a 'fallback' policy needs at least two models in order of preference; use 'fixed' for one")
        return self


class LinkConfig(BaseModel):
    """The whole config: deployments and policies. Use `load_config` to read one."""

    model_config = ConfigDict(extra="forbid")

    models: list[ModelDeployment] = Field(default_factory=list)
    policies: list[PolicyConfig] = Field(default_factory=list)

    @model_validator(mode="after")
    def _cross_check(self) -> LinkConfig:
        seen: dict[str, int] = {}
        for i, dep in enumerate(self.models):
            index = seen.get(dep.name, 0)
            seen[dep.name] = index + 1
            self.models[i] = dep.model_copy(update={"deployment_id": f"{dep.name}#{index}"})
        problems = cross_check(set(seen), [(i, p.name, p.models) for i, p in enumerate(self.policies)])
        if problems:  # parse_config reports these from the raw data, next to the field errors
            raise ValueError("; ".join(problems))
        return self

    @property
    def model_names(self) -> list[str]:
        """Public model names in config order, each once."""
        return list(dict.fromkeys(d.name for d in self.models))

    def deployments(self, name: str) -> list[ModelDeployment]:
        """The replicas of public model `name` (empty when unknown)."""
        return [d for d in self.models if d.name == name]

    def policy(self, name: str) -> PolicyConfig | None:
        return next((p for p in self.policies if p.name == name), None)


DEFAULT_AUTO_POLICY = "link/auto"
# Where the embedded default's trained router lives: routers/trained/ inside the installed `routers` package.
DEFAULT_ROUTER_FILE = ("trained", "link-auto.safetensors")
DEFAULT_ROUTER_COMMAND = ("make link-auto (`link router train --type knn ... --out {path}` and `link router calibrate` on "
                          "the outcome files in routers/trained/link-auto/; `link eval run` measures a missing one)")


def default_router_path() -> Path:
    """The embedded default's router file (routers/trained/link-auto.safetensors); it may not exist."""
    import routers  # the package only (its __init__ imports nothing)

    return Path(routers.__file__).resolve().parent.joinpath(*DEFAULT_ROUTER_FILE)


def embedded_default() -> LinkConfig:
    """The config `link serve` runs without one: the local models, `link/moa`, and `link/auto` when its router
    file exists (else an INFO log line says how to create it; `link serve` prints it)."""
    data = yaml.safe_load(DEFAULT_CONFIG_YAML)
    path = default_router_path()
    if path.is_file():
        # The candidates: the router's models that the default serves (a router trained on another pool
        # still answers, over the models it knows; retrain it to route over all of them).
        from routers.base import read_header

        served = {m["name"] for m in data["models"]}
        candidates = [m for m in read_header(path).get("models") or [] if m in served]
        if candidates:
            data["policies"].insert(0, {"name": DEFAULT_AUTO_POLICY, "type": "router", "options": {"path": str(path)},
                                        "models": candidates})
        else:
            logger.info("%s is not served: its router file %s knows none of the default models; retrain it with: %s",
                        DEFAULT_AUTO_POLICY, path, DEFAULT_ROUTER_COMMAND.format(path=path))
    else:
        logger.info("%s is not served: its router file %s is missing; create it with: %s", DEFAULT_AUTO_POLICY, path,
                    DEFAULT_ROUTER_COMMAND.format(path=path))
    return parse_config(data, "embedded default")


def parse_config(data: Any, source: str = "link.yaml", *, check_policy: PolicyCheck | None = None,
                 served_models: tuple[str, ...] = ()) -> LinkConfig:
    """Validate already-parsed YAML/JSON data; `check_policy` (`link.policies.base.policy_entry_problems`) adds each
    policy type's option checks, against the config's models and `served_models` (those registered in the database).

    Raises:
        ConfigError: listing every problem, one line each, as "{source}: models[i].field (name 'x'): what to fix":
            invalid fields, policies over unknown models or named twice, bad policy options
            (link/config_checks.py).
    """
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: the top level must be a mapping with `models` and `policies`")
    config, error = None, None
    try:
        config = LinkConfig.model_validate(data)
    except ValidationError as exc:
        error = exc
    problems = config_problems(data, error, check_policy=check_policy, served_models=served_models) or ([str(error)] if config is None else [])
    if len(problems) == 1:
        raise ConfigError(f"invalid config: {source}: {problems[0]}")
    if problems:
        raise ConfigError(f"invalid config ({len(problems)} problems):\n  " + "\n  ".join(f"{source}: {p}" for p in problems))
    return config


def load_config(path: Path | str | None = None, **checks) -> LinkConfig:
    """Read `link.yaml` at `path`; None gives the embedded default (`embedded_default`). `checks`: `parse_config`'s
    `check_policy` and `served_models`.

    Raises:
        ConfigError: a missing file, a YAML syntax error (with its line), or every problem of its fields and
            policies (their options included), one line each.
    """
    if path is None:
        return embedded_default()
    path = Path(path).expanduser()
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read config {path}: {exc.strerror or exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(f"{path}: YAML syntax error{at}: {getattr(exc, 'problem', None) or exc}") from None
    return parse_config(data, str(path), **checks)
