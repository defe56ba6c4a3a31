"""OpenAPI request bodies of routes that read their JSON themselves (to refuse unknown fields in OpenAI's words).

    @router.post("/v1/chat/completions", openapi_extra=json_body(ChatCompletionRequest))

Both servers use it: the gateway's routes (link/routes/) and the engine server (serving/api/server.py).

The body is documented in `/openapi.json` (and `/docs`) as the pydantic model's JSON Schema with its `$defs`
written in place: a route's `openapi_extra` cannot add shared components, and a `#/$defs/...` reference would
resolve against the whole OpenAPI document (ReDoc refuses such a document: "Invalid reference token: $defs").
The schema is for readers and for fuzzing the API from it; the route's own parser stays the judge of what it
accepts.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel


def _inline(node: Any, defs: dict[str, Any], seen: tuple[str, ...] = ()) -> Any:
    """`node` with every `{"$ref": "#/$defs/X"}` replaced by X's schema (a self-referencing model is left as
    `{}`, any value, at its second occurrence)."""
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            name = ref.removeprefix("#/$defs/")
            return {} if name in seen else _inline(defs[name], defs, seen + (name,))
        return {key: _inline(value, defs, seen) for key, value in node.items() if key != "$defs"}
    if isinstance(node, list):
        return [_inline(item, defs, seen) for item in node]
    return node


def json_body(model: type[BaseModel], description: str | None = None,
              properties: dict[str, Any] | None = None) -> dict:
    """The `openapi_extra` of a route whose required JSON body is `model` (a pydantic model class).

    Args:
        properties: schemas that replace the model's own for these fields (where the model types a field
            loosely and the route checks it by hand, e.g. chat `messages` as a list of any objects).
    """
    schema = model.model_json_schema()
    schema = _inline(schema, schema.get("$defs", {}))
    for name, field_schema in (properties or {}).items():
        schema["properties"][name] = field_schema
    body: dict[str, Any] = {"required": True, "content": {"application/json": {"schema": schema}}}
    if description:
        body["description"] = description
    return {"requestBody": body}
