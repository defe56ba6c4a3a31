"""Path and query parameters held to the same text rule as bodies (`protocol/strict_json.py`).

    app = FastAPI(dependencies=[Depends(check_url_params)])        # or include_router(..., dependencies=[...])

A NUL character (`%00`) in `/api/policies/{name}` or `/api/requests?model=` would reach a database query, and
PostgreSQL can neither store nor compare one; no name or id holds one. Each refusal is a 400 naming the
parameter (`param`: "name", "model"; None when the parameter's own name is at fault). A lone surrogate cannot
occur here (URLs are percent-decoded as UTF-8 with replacement), but the same check would name it.
"""

from __future__ import annotations

from starlette.requests import Request

from protocol.errors import ValidationProblem
from protocol.strict_json import text_problem


async def check_url_params(request: Request) -> None:
    """A FastAPI dependency. Raises ValidationProblem (400) for a path or query parameter, name or value, holding
    a NUL character or a lone surrogate."""
    for kind, items in (("path", request.path_params.items()), ("query", request.query_params.multi_items())):
        for name, value in items:
            why = text_problem(name)
            if why is not None:
                raise ValidationProblem(f"Invalid {kind} parameter name: it {why}.")
            why = text_problem(str(value))
            if why is not None:
                raise ValidationProblem(f"Invalid {kind} parameter '{name}': its value {why}.", param=name)
