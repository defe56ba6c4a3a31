"""Gateway settings: one pydantic-settings class read from `LINK_*` environment variables.

    settings = get_settings()                 # LINK_HOME, LINK_CONFIG, LINK_DATABASE_URL, ...
    settings = get_settings(port=9000)        # explicit values win over the environment

Nothing is read at import time; the app builds one `Settings` in its lifespan (or the CLI does and
passes it down). Outside `environment="development"` a placeholder master key ("changeme",
"sk-1234", ...) or a short one is refused, so a demo key never guards a real deployment.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from protocol.boundary import MAX_JSON_DEPTH_CEILING, BodyLimits

# Lower-cased master keys that are copied from examples and tutorials; refused outside development.
PLACEHOLDER_KEYS = frozenset({
    "changeme", "change-me", "change_me", "secret", "password", "admin", "master", "masterkey", "master-key",
    "test", "example", "sk-test", "sk-master", "sk-admin", "sk-changeme", "your-key", "your-master-key",
})
_PLACEHOLDER_PATTERN = re.compile(r"^(sk-)?(1234\d*|0+|x+|123456789\d*|abc\d*)$")
MIN_MASTER_KEY_LENGTH = 16


def is_placeholder_key(key: str) -> bool:
    """True for keys like "changeme", "sk-1234", "sk-xxxx" or any key shorter than 16 characters."""
    k = key.strip().lower()
    return k in PLACEHOLDER_KEYS or bool(_PLACEHOLDER_PATTERN.match(k)) or len(k) < MIN_MASTER_KEY_LENGTH


class Settings(BaseSettings):
    """Process settings of the gateway (`link serve`); every field reads `LINK_<FIELD>` from the environment.

    Attributes:
        home: state directory (database, caches, trained routers); `LINK_HOME`, default `~/.link`.
        config: path of `link.yaml`; None serves the embedded default (`LINK_CONFIG`).
        database_url: SQLAlchemy URL; default `sqlite:///{home}/link.db` (`LINK_DATABASE_URL`).
        redis_url: Redis for rate-limit counters shared by gateway replicas; None keeps them in the database.
        redis_timeout_s: seconds each Redis call may take before it counts as a failure (`LINK_REDIS_TIMEOUT_S`).
        redis_breaker_failures: Redis failures in a row after which the rate limits use the database's counters
            (`LINK_REDIS_BREAKER_FAILURES`; the circuit breaker of link/redis_breaker.py).
        redis_breaker_cooldown_s: seconds the breaker keeps Redis out before probing it (`LINK_REDIS_BREAKER_COOLDOWN_S`).
        cache_redis_prefix: the Redis key prefix of the response cache's answers (`LINK_CACHE_REDIS_PREFIX`, default
            "link:cache"; link/response_cache.py), so that gateways of different deployments can share one Redis.
        master_key: the admin key (`LINK_MASTER_KEY`); placeholders are refused outside development.
        environment: "development" or "production".
        host, port: where `link serve` listens.
        request_log: write one request-log row per request.
        budgets: enforce per-key budgets.
        datasets_dir: benchmark and routing data; default `{home}/datasets` (`LINK_DATASETS_DIR`).
        health_interval_s: seconds between health checks of every deployment.
        eject_cooldown_s: seconds a failing deployment stays out of rotation before it is probed again.
        replica_state_interval_s: seconds between polls of each replica's reported load by models with
            `replica_routing: cache_aware` (`LINK_REPLICA_STATE_INTERVAL_S`, default 2; link/replica_state.py).
        local_dtype: weights and KV cache dtype of in-process local engines (`LINK_LOCAL_DTYPE`): "auto" (bf16
            on a GPU or a CPU with native bf16 such as AVX512_BF16, else fp32), "float32" or "bfloat16".
        local_weights: how local engines keep a GGUF file's quantized matrices (`LINK_LOCAL_WEIGHTS`): "auto" (packed
            where the C++ GGUF module builds), "packed" (as blocks, float32 activations) or "float" (dequantized).
        local_auto_tune: tune local engines' kernels in their idle gaps and install the winners between steps
            (`LINK_LOCAL_AUTO_TUNE`, `link serve --no-auto-tune`); a link.yaml entry's `engine: {auto_tune: false}` wins.
        instance_id: a stable name of this gateway replica (`LINK_INSTANCE_ID`, e.g. its host or pod name): its budget
            reservations carry it, and at start-up it releases those a previous process of the same name left (one
            killed before settling them). Two running replicas must never share one. None: a fresh id per process,
            whose holds are released once its lease expires (link/budget_leases.py).
        budget_lease_s: seconds a gateway process's budget reservations outlive its last heartbeat (renewed every
            third of it); after that any replica releases them (`LINK_BUDGET_LEASE_S`).
        metrics_public: serve `/metrics` without a key (`LINK_METRICS_PUBLIC=true`); by default it needs the
            master key whenever one is set (a Prometheus scraper sends it as a bearer token).
        max_body_bytes: the largest request body, in bytes (`LINK_MAX_BODY_BYTES`, default 16 MiB, at least 1 KiB);
            a larger one is a 413 (protocol/boundary.py).
        drain_timeout_s: the longest graceful drain after SIGTERM, in seconds (`LINK_DRAIN_TIMEOUT_S`, default 30):
            requests and streams in flight get this long to finish (protocol/drain.py).
        workers: gateway processes sharing the port (`LINK_WORKERS`, `link serve --workers N`, default 1, at most
            64; link/workers.py); worker i's instance id is "<instance_id>-w<i>".
        max_json_depth: the deepest nesting of arrays and objects in a JSON body (`LINK_MAX_JSON_DEPTH`, default
            64, 8 to 128); a deeper one is a 400.
        otel_enabled: export OpenTelemetry traces over OTLP/HTTP (`LINK_OTEL_ENABLED`, default false; link/tracing.py).
        otel_endpoint: the OTLP collector's base URL, e.g. "http://collector:4318" ("/v1/traces" is appended), which
            also turns tracing on (`LINK_OTEL_ENDPOINT`, else the standard `OTEL_EXPORTER_OTLP_ENDPOINT`).
        otel_service_name: the traces' `service.name` (`LINK_OTEL_SERVICE_NAME`, else the standard
            `OTEL_SERVICE_NAME`, default "togetherlink").
    """

    model_config = SettingsConfigDict(env_prefix="LINK_", extra="ignore", validate_default=True)

    home: Path = Field(default_factory=lambda: Path.home() / ".link")
    config: Path | None = None
    database_url: str | None = None
    redis_url: str | None = None
    redis_timeout_s: float = Field(0.25, gt=0, le=30)
    redis_breaker_failures: int = Field(3, ge=1, le=1000)
    redis_breaker_cooldown_s: float = Field(5.0, gt=0, le=3600)
    cache_redis_prefix: str = Field("link:cache", min_length=1, max_length=200)
    master_key: SecretStr | None = None
    environment: Literal["development", "production"] = "development"
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=1, le=65535)
    request_log: bool = True
    budgets: bool = True
    datasets_dir: Path | None = None
    health_interval_s: float = Field(5.0, gt=0)
    eject_cooldown_s: float = Field(10.0, ge=0)
    replica_state_interval_s: float = Field(2.0, gt=0, le=3600)
    metrics_public: bool = False
    instance_id: str | None = Field(None, min_length=1, max_length=128)
    budget_lease_s: float = Field(30.0, gt=0, le=3600)
    local_dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    local_weights: Literal["auto", "packed", "float"] = "auto"
    local_auto_tune: bool = True
    max_body_bytes: int = Field(16 * 2**20, ge=1024)
    max_json_depth: int = Field(64, ge=8, le=MAX_JSON_DEPTH_CEILING)
    drain_timeout_s: float = Field(30.0, ge=0, le=3600)
    workers: int = Field(1, ge=1, le=64)
    # OpenTelemetry traces (link/tracing.py): on with LINK_OTEL_ENABLED=true or an OTLP endpoint
    otel_enabled: bool = False
    otel_endpoint: str | None = Field(None, validation_alias=AliasChoices(
        "link_otel_endpoint", "otel_endpoint", "otel_exporter_otlp_endpoint"))
    otel_service_name: str = Field("togetherlink", min_length=1, validation_alias=AliasChoices(
        "link_otel_service_name", "otel_service_name"))

    @model_validator(mode="after")
    def _derive_and_check(self) -> Settings:
        self.home = self.home.expanduser()
        if self.database_url is None:
            self.database_url = f"sqlite:///{self.home / 'link.db'}"
        if self.datasets_dir is None:
            self.datasets_dir = self.home / "datasets"
        if self.instance_id is not None and len(self.instance_id) + len(f"-w{self.workers - 1}") > 128:
            raise ValueError(f"LINK_INSTANCE_ID is too long for {self.workers} workers: each worker's id adds "
                             f"-w<index> and must stay within 128 characters")
        if self.master_key is not None and self.environment != "development":
            if is_placeholder_key(self.master_key.get_secret_value()):
                raise ValueError(
                    f"LINK_MASTER_KEY looks like a placeholder (or is shorter than {MIN_MASTER_KEY_LENGTH} characters); "
                    "set a random key, e.g. `python -c 'import secrets; print(\"sk-\" + secrets.token_urlsafe(32))'`, "
                    "or set LINK_ENVIRONMENT=development for local testing"
                )
        return self

    @property
    def is_production(self) -> bool:
        return self.environment == "production"

    @property
    def body_limits(self) -> BodyLimits:
        """The request boundary's limits (`max_body_bytes`, `max_json_depth`)."""
        return BodyLimits(max_body_bytes=self.max_body_bytes, max_json_depth=self.max_json_depth)


def get_settings(**overrides) -> Settings:
    """Build the settings from `LINK_*` variables; keyword arguments override them.

    Raises:
        pydantic.ValidationError: an invalid value, or a placeholder master key outside development.
    """
    return Settings(**overrides)
