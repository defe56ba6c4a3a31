"""`/api/models`: the model registry with each deployment's state (master key required).

    GET /api/models   {"object": "list", "data": [{"name", "kind", "status", "input_cost_per_million",
                       "output_cost_per_million", "context_length", "deployments": [...], "engine": {...} | None}]}
A model's `status`: "error" when a local model failed to load or every replica is out of rotation, "loaded"
when a local engine is running, "healthy" otherwise (a remote model in rotation, or a local model not loaded
yet: it loads on its first request); `errors` says what is wrong (a load error, each replica out of rotation, each
deployment that cannot serve: its key variable unset, its model file missing; link/readiness.py).
`engine` (loaded local models): running and waiting
sequences, KV cache blocks used / total and their ratio, and generated tokens per second over the last
60 s of the request log. A deployment's `api_base` is shown without its credentials ("http://[redacted]@host").
"""

from __future__ import annotations

from datetime import timedelta

from fastapi import APIRouter
from sqlalchemy import func
from sqlmodel import select

from link.db.models import RequestLog, utcnow
from link.deps import AdminDep, SessionDep, StateDep
from link.readiness import with_readiness
from link.routes.model_cards import context_length
from link.state import GatewayState

router = APIRouter(prefix="/api/models", tags=["models"])
THROUGHPUT_WINDOW_S = 60


def _engine_state(state: GatewayState, local: str | None):
    # EnginePool has no public accessor for a loaded engine yet (see routes/model_cards.py:_deployment_context).
    return getattr(state.engine_pool, "_states", {}).get(local) if local and state.engine_pool else None


def _engine_stats(engine_state, tokens_per_s: float) -> dict:
    engine = engine_state.engine
    blocks = engine.engine.block_manager
    return {"num_running": engine.num_running, "num_waiting": engine.num_waiting,
            "kv_blocks_used": blocks.num_used_blocks, "kv_blocks_total": blocks.num_blocks,
            "kv_cache_usage": blocks.num_used_blocks / blocks.num_blocks if blocks.num_blocks else 0.0,
            "tokens_per_s": tokens_per_s}


@router.get("")
def list_models(state: StateDep, session: SessionDep, _: AdminDep) -> dict:
    since = utcnow() - timedelta(seconds=THROUGHPUT_WINDOW_S)
    generated = dict(session.exec(select(RequestLog.model, func.sum(RequestLog.completion_tokens))
                                  .where(RequestLog.created_at >= since).group_by(RequestLog.model)).all())
    data = []
    for name in state.model_names:
        deployments = state.config.deployments(name)
        replicas = {r["deployment_id"]: r for r in with_readiness(state.pools[name].status(), state.readiness)}
        first = deployments[0]
        load_errors = getattr(state.engine_pool, "load_errors", {})
        errors = [load_errors[d.local] for d in deployments if d.kind == "local" and d.local in load_errors]
        errors += [f"{r['deployment_id']} cannot serve: {r['problem']}" if "problem" in r else
                   f"{r['deployment_id']} is out of rotation after failed health checks or requests; probed again in "
                   f"{r['ejected_for_s']:.1f} s" for r in replicas.values() if not r["healthy"]]
        engines = [e for d in deployments if d.kind == "local" and (e := _engine_state(state, d.local)) is not None]
        if errors or not any(r["healthy"] for r in replicas.values()):
            status = "error"
        else:
            status = "loaded" if engines else "healthy"
        data.append({
            "name": name, "kind": first.kind, "status": status, "errors": errors,
            "input_cost_per_million": first.input_cost_per_million,
            "output_cost_per_million": first.output_cost_per_million,
            "context_length": context_length(state, name),
            "deployments": [{"deployment_id": d.deployment_id, "kind": d.kind, "target": d.local or d.model,
                             "api_base": state.redactor.redact(d.api_base), **replicas.get(d.deployment_id, {})} for d in deployments],
            "engine": _engine_stats(engines[0], (generated.get(name) or 0) / THROUGHPUT_WINDOW_S) if engines else None,
        })
    return {"object": "list", "data": data}
