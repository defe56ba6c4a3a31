"""`/health` (liveness and each model's replicas) and `/metrics` (Prometheus text format); no key needed."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response

from link.deps import StateDep

router = APIRouter(tags=["system"])


@router.get("/health")
async def health(state: StateDep) -> dict:
    """{"status": "ok", "models": {name: [{deployment_id, healthy, outstanding, served, ejected_for_s}]}}."""
    return {"status": "ok", "models": {name: pool.status() for name, pool in state.pools.items()}}


@router.get("/metrics")
async def metrics(state: StateDep) -> Response:
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    return Response(generate_latest(state.metrics.registry), media_type=CONTENT_TYPE_LATEST)
