"""Models: the registry with each model's status, prices, context length and, for loaded local models,
the engine's running and waiting requests, KV cache use and tokens per second (from /api/models).

    GET /console/models          the page (its table refreshes every 5 s with htmx)
    GET /console/models/table    the table alone
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from web.pages.base import ApiDep, render

router = APIRouter(prefix="/models")


@router.get("", response_class=HTMLResponse)
async def page(request: Request, api: ApiDep) -> Response:
    return render(request, "models.html", section="models", models=(await api.get_json("/api/models"))["data"])


@router.get("/table", response_class=HTMLResponse)
async def table(request: Request, api: ApiDep) -> Response:
    return render(request, "models_table.html", models=(await api.get_json("/api/models"))["data"])
