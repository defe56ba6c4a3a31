"""The gateway's runtime state, built in the app's lifespan and handed to routes (no module-level state).

    state = await open_gateway(settings, config)   # DB engine (migrated), writers, limiters, pools, policies
    ...
    await close_gateway(state)                     # health checks, backends, engines, log and trace writers (drained)

The `Redactor` of every configured secret (link/redact.py) is built here once and handed to the backends (their
errors), the accounting (the request-log row) and a filter on the loggers, removed again at close.
At start-up the budget ledger releases the reservations that gateway processes killed before settling them left
behind (under this replica's LINK_INSTANCE_ID, or under an expired lease), never those of a live replica; a
heartbeat task then renews this process's lease (the rule: link/budget_leases.py).
Every configured model's readiness (a key variable unset, a model file missing: link/readiness.py) is checked once
at start-up, logged one line per problem, and kept for `/health`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field

from sqlalchemy import Engine

from link.accounting import Accounting
from link.auth import Authenticator, warn_if_open
from link.backends import make_backend
from link.budget_leases import new_owner_id
from link.budgets import BudgetLedger, keep_lease
from link.config import LinkConfig
from link.db import make_db_engine, upgrade
from link.deployments import DeploymentPool
from link.limits import RateLimiter
from link.metrics import GatewayMetrics
from link.model_registration import registered_deployments, with_registered_models
from link.policies.store import PolicyStore
from link.readiness import ReadinessProblem, log_problems, readiness_problems
from link.redact import Redactor, RedactingFilter, attach_log_filter, detach_log_filter
from link.request_log import RequestLogWriter
from link.response_cache import ResponseCache
from link.settings import Settings
from link.traces import TraceRecorder

logger = logging.getLogger(__name__)
LOG_DRAIN_TIMEOUT_S = 10.0


@dataclass
class GatewayState:
    """What the routes use. `pools` maps each public model name to its replicas."""

    settings: Settings
    config: LinkConfig
    db: Engine
    auth: Authenticator
    policies: PolicyStore
    pools: dict[str, DeploymentPool]
    metrics: GatewayMetrics
    accounting: Accounting
    limiter: RateLimiter
    log_writer: RequestLogWriter | None
    engine_pool: object | None  # link.backends.local.EnginePool when a local model is configured
    created: int
    traces: TraceRecorder | None = None  # tool-call traces of opted-in keys and policies (link/traces.py)
    redactor: Redactor = field(default_factory=Redactor)  # every configured secret, out of error texts (link/redact.py)
    log_filter: RedactingFilter | None = None  # the redactor on the loggers, until close_gateway
    ledger_heartbeat: asyncio.Task | None = None  # renews the budget ledger's lease (link/budget_leases.py)
    readiness: list[ReadinessProblem] = field(default_factory=list)  # found at start-up (link/readiness.py)
    response_cache: ResponseCache = field(default_factory=ResponseCache)  # policies' `cache` option (link/response_cache.py)

    @property
    def model_names(self) -> tuple[str, ...]:
        return self.policies.model_names


def served_config(settings: Settings, config: LinkConfig) -> LinkConfig:
    """The config the gateway would serve: `config` plus the models registered in its database (migrated
    first, as `open_gateway` does). Raises sqlalchemy.exc.SQLAlchemyError when the database is unreachable."""
    upgrade(settings.database_url)
    db = make_db_engine(settings.database_url)
    try:
        return with_registered_models(config, db)
    finally:
        db.dispose()


def registered_model_names(settings: Settings) -> tuple[str, ...]:
    """The names of the models registered in the gateway's database (migrated first). Raises SQLAlchemyError."""
    upgrade(settings.database_url)
    db = make_db_engine(settings.database_url)
    try:
        return tuple(d.name for d in registered_deployments(db))
    finally:
        db.dispose()


async def open_gateway(settings: Settings, config: LinkConfig) -> GatewayState:
    """Migrate the database and build every long-lived object; health checks start on the running loop. Models
    registered in the database (link/model_registration.py) are served besides the config's.

    Raises:
        link.policies.base.PolicyError: a config policy of an unknown type or over unknown models.
        sqlalchemy.exc.OperationalError: the database is unreachable.
    """
    await asyncio.to_thread(upgrade, settings.database_url)
    redactor = Redactor.from_config(settings, config)
    db = make_db_engine(settings.database_url)
    log_writer = RequestLogWriter(db) if settings.request_log else None
    limiter = RateLimiter(db, settings.redis_url, redis_timeout_s=settings.redis_timeout_s,
                          breaker_failures=settings.redis_breaker_failures,
                          breaker_cooldown_s=settings.redis_breaker_cooldown_s)
    engine_pool = None
    pools: dict[str, DeploymentPool] = {}
    ledger = BudgetLedger(db, owner=settings.instance_id, lease_s=settings.budget_lease_s) if settings.budgets else None
    try:
        if ledger is not None:
            await asyncio.to_thread(ledger.open)  # holds of processes that died are released before any request
        config = await asyncio.to_thread(with_registered_models, config, db)  # models registered in the database
        policies = PolicyStore(db, config)
        await asyncio.to_thread(policies.reload)
        if any(d.kind == "local" for d in config.models):
            from link.backends.local import EnginePool  # imports torch: only when a local model is configured

            engine_pool = EnginePool(dtype=settings.local_dtype, weights=settings.local_weights, auto_tune=settings.local_auto_tune)
        for name in config.model_names:
            backends = [make_backend(d, redactor=redactor, engine_pool=engine_pool) for d in config.deployments(name)]
            pools[name] = DeploymentPool(name, backends, cooldown_s=settings.eject_cooldown_s,
                                         health_interval_s=settings.health_interval_s,
                                         state_interval_s=settings.replica_state_interval_s)
            pools[name].start()
        registry = engine_pool.registry if engine_pool is not None else None
        readiness = await asyncio.to_thread(readiness_problems, config, registry)
        log_problems(readiness)
        auth = Authenticator(db, settings)
        await warn_if_open(auth)
    except BaseException:
        await _close_parts(pools, engine_pool, limiter, log_writer, db)
        raise
    metrics = GatewayMetrics(policies.is_served)  # labels: served names only, any other under "unknown"
    heartbeat = asyncio.create_task(keep_lease(ledger, ledger.lease_s / 3)) if ledger is not None else None
    return GatewayState(settings=settings, config=config, db=db, auth=auth, policies=policies,
                        pools=pools, metrics=metrics,
                        accounting=Accounting(metrics, log_writer, ledger, limiter, redactor=redactor,
                                              instance=ledger.owner if ledger is not None else
                                              settings.instance_id or new_owner_id()),
                        limiter=limiter, log_writer=log_writer, engine_pool=engine_pool, created=int(time.time()),
                        traces=TraceRecorder(db), redactor=redactor, log_filter=attach_log_filter(redactor),
                        ledger_heartbeat=heartbeat, readiness=readiness,
                        response_cache=ResponseCache(settings.redis_url, redis_prefix=settings.cache_redis_prefix,
                                                     redis_timeout_s=settings.redis_timeout_s,
                                                     redis_cooldown_s=settings.redis_breaker_cooldown_s))


async def _close_parts(pools, engine_pool, limiter, log_writer, db, log_timeout_s: float = LOG_DRAIN_TIMEOUT_S) -> None:
    for pool in pools.values():
        try:
            await pool.aclose()
        except Exception:
            logger.exception("closing the deployments of %s failed", pool.name)
    if engine_pool is not None:
        await engine_pool.aclose()
    if log_writer is not None:
        await asyncio.to_thread(log_writer.close, log_timeout_s)
        if log_writer.num_pending:
            logger.warning("request log: %d rows still unwritten after %.0f s", log_writer.num_pending, log_timeout_s)
    limiter.close()
    db.dispose()


async def close_gateway(state: GatewayState, *, log_timeout_s: float = LOG_DRAIN_TIMEOUT_S) -> None:
    """Stop health checks, close backends and engines, drain the request log and the tool-call traces (at most
    `log_timeout_s` s each)."""
    if state.traces is not None:
        await asyncio.to_thread(state.traces.close, log_timeout_s)
    ledger = state.accounting.ledger
    if state.ledger_heartbeat is not None:
        state.ledger_heartbeat.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await state.ledger_heartbeat
    if ledger is not None:
        try:
            await asyncio.to_thread(ledger.close)
        except Exception:
            logger.exception("budget ledger %s: releasing its holds at shutdown failed (its lease will expire)",
                             ledger.owner)
    await _close_parts(state.pools, state.engine_pool, state.limiter, state.log_writer, state.db, log_timeout_s)
    state.response_cache.close()
    if state.log_filter is not None:
        detach_log_filter(state.log_filter)
