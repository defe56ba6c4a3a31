"""Keys: create (the key is shown once), list with budgets and spend, revoke (through /api/keys).

    GET  /console/keys               the list and the create form
    POST /console/keys               create: name, budget_usd, rpm_limit, tpm_limit (empty = unlimited)
    POST /console/keys/budget        key_id=N, budget_usd (empty = unlimited)
    POST /console/keys/revoke        key_id=N
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from web.console import PREFIX, ApiDep, CsrfDep, api_error, render

router = APIRouter(prefix="/keys")
NUMBER_FIELDS = {"budget_usd": float, "rpm_limit": int, "tpm_limit": int}


async def _page(request: Request, api, *, values: dict | None = None, error: dict | None = None,
                created: dict | None = None, status_code: int = 200) -> HTMLResponse:
    keys = await api.get_json("/api/keys")
    return render(request, "keys.html", status_code=status_code, section="keys", keys=keys, values=values or {},
                  error=error, error_field=(error or {}).get("param"), created=created)


@router.get("", response_class=HTMLResponse)
async def page(request: Request, api: ApiDep) -> Response:
    return await _page(request, api)


@router.post("", response_class=HTMLResponse, dependencies=[CsrfDep])
async def create(request: Request, api: ApiDep, name: Annotated[str, Form()] = "",
                 budget_usd: Annotated[str, Form()] = "", rpm_limit: Annotated[str, Form()] = "",
                 tpm_limit: Annotated[str, Form()] = "") -> Response:
    values = {"name": name, "budget_usd": budget_usd, "rpm_limit": rpm_limit, "tpm_limit": tpm_limit}
    body: dict = {"name": name.strip()}
    for field, kind in NUMBER_FIELDS.items():
        text = values[field].strip()
        if not text:
            continue
        try:
            body[field] = kind(text)
        except ValueError:
            error = {"message": f"{field} must be {'a number' if kind is float else 'a whole number'}", "param": field}
            return await _page(request, api, values=values, error=error, status_code=400)
    response = await api.call("POST", "/api/keys", json=body)
    if response.status_code != 201:
        return await _page(request, api, values=values, error=api_error(response), status_code=400)
    return await _page(request, api, created=response.json(), status_code=201)


@router.post("/budget", response_class=HTMLResponse, dependencies=[CsrfDep])
async def set_budget(request: Request, api: ApiDep, key_id: Annotated[int, Form()],
                     budget_usd: Annotated[str, Form()] = "") -> Response:
    try:
        budget = float(budget_usd) if budget_usd.strip() else None
    except ValueError:
        return await _page(request, api, error={"message": f"key {key_id}: the budget must be a number of USD",
                                                "param": None}, status_code=400)
    response = await api.call("PATCH", f"/api/keys/{key_id}", json={"budget_usd": budget})
    if response.status_code != 200:
        error = api_error(response)
        return await _page(request, api, error={"message": f"key {key_id}: {error['message']}", "param": None},
                           status_code=400)
    return RedirectResponse(f"{PREFIX}/keys", status_code=303)


@router.post("/revoke", dependencies=[CsrfDep])
async def revoke(request: Request, api: ApiDep, key_id: Annotated[int, Form()]) -> Response:
    response = await api.call("DELETE", f"/api/keys/{key_id}")
    if response.status_code != 200:
        return render(request, "error.html", status_code=response.status_code, section="keys", title="Not revoked",
                      message=api_error(response)["message"])
    return RedirectResponse(f"{PREFIX}/keys", status_code=303)
