"""Keys: create (the key is shown once), list with budgets and spend, revoke (through /api/keys).

    GET  /console/keys               the list and the create form (and, once, a key just created)
    POST /console/keys               create: name, budget_usd, rpm_limit, tpm_limit (empty = unlimited); then a
                                     redirect to the list (Post/Redirect/Get: a reload creates nothing), which
                                     shows the new key's plaintext once (a flash in the server-side session)
    POST /console/keys/budget        key_id=N, budget_usd (empty = unlimited)
    POST /console/keys/revoke        key_id=N
Numbers are checked here only as far as JSON needs (finite); their ranges are the API's, whose errors name the
field shown beside it.
"""

from __future__ import annotations

import asyncio
import math
from typing import Annotated

from fastapi import APIRouter, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from web.pages.base import PREFIX, ApiDep, CsrfDep, api_error, db_engine, path_segment, render
from web.session import SESSION_ID, pop_flash, push_flash

router = APIRouter(prefix="/keys")
NUMBER_FIELDS = {"budget_usd": float, "rpm_limit": int, "tpm_limit": int}
CREATED = "created_key"  # the flash holding a new key (its public fields and plaintext)


class FieldError(ValueError):
    """A form value that is not a number: {"message", "param"} for the page."""

    def __init__(self, message: str, param: str | None):
        super().__init__(message)
        self.error = {"message": message, "param": param}


def parse_number(text: str, kind: type, label: str, param: str | None) -> float | int | None:
    """A form field -> a finite float or an int (None when empty). Raises FieldError (its message starting with
    `label`, naming the form field `param`, None for the page's own message): not a number, NaN or infinite
    ("inf", "1e309")."""
    text = text.strip()
    if not text:
        return None
    try:
        value = kind(text)
    except ValueError:
        raise FieldError(f"{label} must be {'a number' if kind is float else 'a whole number'}", param) from None
    if isinstance(value, float) and not math.isfinite(value):
        raise FieldError(f"{label} must be a finite number, got {text!r}", param)
    return value


async def _page(request: Request, api, *, values: dict | None = None, error: dict | None = None,
                created: dict | None = None, status_code: int = 200) -> HTMLResponse:
    keys = await api.get_json("/api/keys")
    return render(request, "keys.html", status_code=status_code, section="keys", keys=keys, values=values or {},
                  error=error, error_field=(error or {}).get("param"), created=created)


@router.get("", response_class=HTMLResponse)
async def page(request: Request, api: ApiDep) -> Response:
    flash = await asyncio.to_thread(pop_flash, db_engine(request), request.session.get(SESSION_ID)) or {}
    return await _page(request, api, created=flash.get(CREATED))


@router.post("", response_class=HTMLResponse, dependencies=[CsrfDep])
async def create(request: Request, api: ApiDep, name: Annotated[str, Form()] = "",
                 budget_usd: Annotated[str, Form()] = "", rpm_limit: Annotated[str, Form()] = "",
                 tpm_limit: Annotated[str, Form()] = "") -> Response:
    values = {"name": name, "budget_usd": budget_usd, "rpm_limit": rpm_limit, "tpm_limit": tpm_limit}
    body: dict = {"name": name.strip()}
    try:
        for field, kind in NUMBER_FIELDS.items():
            number = parse_number(values[field], kind, field, param=field)
            if number is not None:
                body[field] = number
    except FieldError as exc:
        return await _page(request, api, values=values, error=exc.error, status_code=400)
    response = await api.call("POST", "/api/keys", json=body)
    if response.status_code != 201:
        return await _page(request, api, values=values, error=api_error(response), status_code=400)
    await asyncio.to_thread(push_flash, db_engine(request), request.session.get(SESSION_ID), {CREATED: response.json()})
    return RedirectResponse(f"{PREFIX}/keys", status_code=303)


@router.post("/budget", response_class=HTMLResponse, dependencies=[CsrfDep])
async def set_budget(request: Request, api: ApiDep, key_id: Annotated[int, Form()],
                     budget_usd: Annotated[str, Form()] = "") -> Response:
    try:
        budget = parse_number(budget_usd, float, f"key {key_id}: the budget (USD)", param=None)
    except FieldError as exc:
        return await _page(request, api, error=exc.error, status_code=400)
    response = await api.call("PATCH", f"/api/keys/{path_segment(key_id)}", json={"budget_usd": budget})
    if response.status_code != 200:
        error = api_error(response)
        return await _page(request, api, error={"message": f"key {key_id}: {error['message']}", "param": None},
                           status_code=400)
    return RedirectResponse(f"{PREFIX}/keys", status_code=303)


@router.post("/revoke", dependencies=[CsrfDep])
async def revoke(request: Request, api: ApiDep, key_id: Annotated[int, Form()]) -> Response:
    response = await api.call("DELETE", f"/api/keys/{path_segment(key_id)}")
    if response.status_code != 200:
        return render(request, "error.html", status_code=response.status_code, section="keys", title="Not revoked",
                      message=api_error(response)["message"])
    return RedirectResponse(f"{PREFIX}/keys", status_code=303)
