"""`GET /v1/models` and `GET /v1/models/{id}`: the served models and policies as OpenAI model cards, and the
context length each model takes (`context_length`, which the completion routes check `max_tokens` against).

A model's card carries `max_model_len` (`_deployment_context`: a loaded local engine's, else the configured or
registry context) and `link` {"type": "model", "kind", "replicas"}; a policy's card `link` {"type": "policy",
...its description}. A policy whose description is not strict JSON is left out of the list (logged), never
failing it for everyone.
"""

from __future__ import annotations

import json
import logging

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from link.config import ModelDeployment
from link.deps import StateDep
from link.schemas import model_card, model_not_found
from link.state import GatewayState
from serving.errors import ServingError

logger = logging.getLogger(__name__)
router = APIRouter()


def _deployment_context(state: GatewayState, deployment: ModelDeployment) -> int | None:
    """Tokens of prompt plus output one deployment takes: a loaded local engine's `max_model_len` (the
    configured context, capped by its KV cache), else the configured `context_length` (for a registry
    model, the registry's, capped by the config); None when unknown."""
    pool = state.engine_pool
    if deployment.kind != "local" or pool is None:
        return deployment.context_length
    # EnginePool has no public accessor for a loaded engine yet; `_states` maps `local` to its EngineState.
    loaded = getattr(pool, "_states", {}).get(deployment.local)
    if loaded is not None:
        return loaded.engine.engine.max_model_len
    if deployment.is_local_path:
        return deployment.context_length
    try:
        return pool.spec_for(deployment).context_length
    except ServingError:  # not in the registry: the model cannot load; say what the config says
        return deployment.context_length


def context_length(state: GatewayState, name: str) -> int | None:
    """The smallest context of a model's replicas (a request that fits it fits each), or None if none is known."""
    known = [c for d in state.config.deployments(name) if (c := _deployment_context(state, d))]
    return min(known) if known else None


def _cards(state: GatewayState) -> list[dict]:
    cards = [model_card(name, state.created, owned_by="togetherlink", max_model_len=context_length(state, name),
                        link={"type": "model", "kind": state.config.deployments(name)[0].kind,
                              "replicas": len(state.config.deployments(name))})
             for name in state.model_names]
    for policy in [*state.policies.configured.values(), *state.policies.stored_policies()]:
        try:
            card = model_card(policy.name, state.created, owned_by="togetherlink-policy",
                              link={"type": "policy", **policy.describe()})
            json.dumps(card, allow_nan=False)
        except (TypeError, ValueError) as exc:
            # one policy that cannot be described as strict JSON must not fail the list for everyone
            logger.error("policy %r left out of /v1/models: %s", policy.name, exc)
            continue
        cards.append(card)
    return cards


@router.get("/v1/models")
async def list_models(request: Request, state: StateDep) -> JSONResponse:
    """The models and the policies (any of which can be sent as `model`); a model's card carries its
    `max_model_len` (see `_deployment_context`)."""
    await state.auth.identify(request.headers.get("authorization"))
    await state.policies.resolve("")  # refreshes the database policies when stale
    return JSONResponse({"object": "list", "data": _cards(state)})


@router.get("/v1/models/{model_id:path}")
async def retrieve_model(model_id: str, request: Request, state: StateDep) -> JSONResponse:
    """One model or policy; 404 with an OpenAI error object when unknown."""
    await state.auth.identify(request.headers.get("authorization"))
    if await state.policies.resolve(model_id) is None:
        raise model_not_found(model_id, list(state.model_names))
    return JSONResponse(next(c for c in _cards(state) if c["id"] == model_id))
