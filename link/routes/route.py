"""`/api/route`: what a policy would do with one request, without calling a model (the console's "try it",
`link route` over HTTP; master key required).

    POST /api/route   a /v1/chat/completions body (`model` = a policy or model name)
        200 {"policy", "type", "models": the plan's order (or every model an executed plan calls),
             "decision": {... "scores": {model: predicted quality}, "expected_cost_usd": {model: USD},
                          "chosen": model ...} for router and hybrid policies, "executed": bool; a cascade scored
             by predicted quality also "steps" (link.policies.cascade.predicted_steps), "models" the one called}
        400 an invalid body (OpenAI error naming the field), 404 an unknown policy or model
"""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request

from link.deps import AdminDep, StateDep
from link.policies import PolicyRequest
from link.policies.base import PolicyError
from link.policies.cascade import predicted_steps
from link.schemas import OpenAIError, model_not_found, parse_json_object, validate_request

router = APIRouter(prefix="/api/route", tags=["policies"])


@router.post("", openapi_extra={"requestBody": {"required": True, "description": "a /v1/chat/completions body",
                                                "content": {"application/json": {"schema": {"type": "object"}}}}})
async def explain(request: Request, state: StateDep, _: AdminDep) -> dict:
    body = parse_json_object(await request.body())
    validate_request(body, "chat")
    policy = await state.policies.resolve(body["model"])
    if policy is None:
        raise model_not_found(body["model"], list(state.model_names))
    try:
        plan = await policy.plan(PolicyRequest("chat", body, state.model_names))
    except PolicyError as exc:
        raise OpenAIError(400, exc.message, param=exc.param, code="invalid_policy") from None
    result = {"policy": plan.policy, "type": policy.type, "models": plan.models, "decision": plan.decision,
              "executed": plan.executor is not None}
    try:
        steps = await asyncio.to_thread(predicted_steps, plan.executor, body)
    except (OSError, ValueError) as exc:   # the cascade's router file went missing or bad since the policy was built
        raise OpenAIError(400, f"the cascade's router cannot score this request: {exc}", param="model",
                          code="invalid_policy") from None
    if steps is not None:
        result["steps"] = steps
        result["models"] = [next(step["model"] for step in steps if step["status"] == "answers")]
    return result
