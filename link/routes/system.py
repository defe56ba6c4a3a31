"""`/health` (the gateway and each model's replicas) and `/metrics` (Prometheus text format).

    GET /health    200 {"status": "ok", "models": {name: [replica status, ...]}}: a replica's "healthy" is false while
                   it is out of rotation or cannot serve at all (then its "problem" says why, as under "problems")
                   503 {"status": "degraded", "unavailable_models": [...], "models": {...}} while some model has
                   no replica in rotation (each one ejected after failures or a failed health check: a local
                   model's engine loop that died or stalled, `link.backends.local.EnginePool.is_healthy`); a
                   local model that is not loaded yet counts as healthy. No key needed.
                   With start-up problems (link/readiness.py: a key variable unset, a model file missing) the
                   status is "degraded" and "problems" lists them ({model, deployment_id, problem}), still a 200:
                   every replica of the gateway shares the config and environment, so a load balancer dropping
                   this one would take down the models it can serve and gain nothing. Only when no model can
                   serve is it a 503 ("unready_models" names those that cannot).
                   While `link serve` drains after SIGTERM (protocol/drain.py) it is a 503 {"status": "draining"}.
    GET /health/live  liveness: 200 {"status": "ok"} while the process answers HTTP, draining included (a model
                   without a replica is no reason to restart the gateway). No key needed.
    GET /metrics   the master key (`Authorization: Bearer`) when one is configured, unless LINK_METRICS_PUBLIC=true.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from link.deps import StateDep
from link.readiness import unready_models, with_readiness

router = APIRouter(tags=["system"])


@router.get("/health")
async def health(state: StateDep) -> JSONResponse:
    """See the module docstring; a replica's status is {deployment_id, healthy, outstanding, served, ejected_for_s}
    and, for a deployment that cannot serve, its "problem"."""
    models = {name: with_readiness(pool.status(), state.readiness) for name, pool in state.pools.items()}
    unavailable = [name for name, pool in state.pools.items() if not pool.healthy_replicas]
    body: dict = {"status": "degraded" if unavailable or state.readiness else "ok"}
    if unavailable:
        body["unavailable_models"] = unavailable
    if state.readiness:
        body["unready_models"] = unready_models(state.config, state.readiness)
        body["problems"] = [p.to_dict() for p in state.readiness]
    serves_none = bool(state.pools) and len(body.get("unready_models", ())) == len(state.pools)
    return JSONResponse({**body, "models": models}, status_code=503 if unavailable or serves_none else 200)


@router.get("/health/live")
async def live() -> dict:
    """Liveness (see the module docstring): the event loop answers."""
    return {"status": "ok"}


@router.get("/metrics")
async def metrics(request: Request, state: StateDep) -> Response:
    """The gateway's Prometheus metrics. Raises OpenAIError 401/403 without the master key (see the module docstring)."""
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    if state.settings.master_key is not None and not state.settings.metrics_public:
        await state.auth.require_admin(request.headers.get("authorization"))
    return Response(generate_latest(state.metrics.registry), media_type=CONTENT_TYPE_LATEST)
