"""Policies: list, create, edit, delete (through /api/policies), and "try it" (through /api/route and
/v1/chat/completions, called by the browser with the session; web/static/console.js).

    GET  /console/policies                   the list (config policies read-only, database ones editable)
    GET  /console/policies/new               the form (the type a <select> of the registered types, each with its
                                             option names beside the options); POST creates (errors beside
                                             the field the API names)
    GET  /console/policies/edit?name=P       the form filled in; POST replaces (a new name renames)
    POST /console/policies/delete            name=P
    GET  /console/policies/try?policy=P      a prompt box: the decision, then the answer streamed
"""

from __future__ import annotations

import json
import math
from typing import Annotated
from fastapi import APIRouter, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from link.policies.base import COMMON_OPTIONS, MULTI_CALL_OPTIONS, POLICIES, policy_class
from protocol.boundary import MAX_JSON_DEPTH_CEILING
from protocol.json_depth import json_depth
from web.pages.base import PREFIX, ApiDep, CsrfDep, api_error, path_segment, render

router = APIRouter(prefix="/policies")
FORM_FIELDS = ("name", "type", "models", "options")
# The options field's placeholder: a JSON object every type accepts (each type's options are optional), where an
# example of one type's options would be refused by the others.
OPTIONS_PLACEHOLDER = "{}"


def option_hints() -> dict[str, str]:
    """Registered policy type -> the option names it accepts, as the form shows them under the options field
    ("threshold, scorer, ... or capture_traces"). A type whose class does not import, or that takes any key,
    gets a line saying so; the API still checks every definition."""
    hints = {}
    for type_ in sorted(POLICIES):
        try:
            cls = policy_class(type_)
            names = cls.OPTIONS
            common = COMMON_OPTIONS if cls.CONTINUES_STREAMS else MULTI_CALL_OPTIONS
        except Exception:  # a user's registered module that fails to import: the form still opens
            names = None
        hints[type_] = ("any keys (checked when saved)" if names is None
                        else ", ".join((*names, *common)))
    return hints


def _refuse_constant(name: str) -> None:
    raise ValueError(f"options must be JSON: {name} is not a JSON number (use a finite number)")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"options must be JSON: {text} is beyond a number's range")
    return value


def _form_body(name: str, type_: str, models: str, options: str) -> tuple[dict, dict | None]:
    """The form's fields -> an /api/policies body, or a form error {"message", "param"} for options that are not
    a JSON object of finite numbers (the one check the API cannot make: the form sends text). The name is sent as
    typed: the API refuses surrounding spaces and control characters, naming the field."""
    body = {"name": name, "type": type_.strip(), "models": [m.strip() for m in models.split(",") if m.strip()]}
    # json.loads recurses per level: bounded first, as the request boundary bounds JSON bodies (the API refuses
    # what is deeper than its own limit once the body is sent)
    if json_depth(options.encode("utf-8", "surrogatepass"), MAX_JSON_DEPTH_CEILING) > MAX_JSON_DEPTH_CEILING:
        return body, {"message": f"options nest more than {MAX_JSON_DEPTH_CEILING} levels deep", "param": "options"}
    try:
        body["options"] = (json.loads(options, parse_constant=_refuse_constant, parse_float=_finite)
                           if options.strip() else {})
    except json.JSONDecodeError as exc:
        return body, {"message": f"options must be JSON: {exc.msg} at character {exc.pos}", "param": "options"}
    except ValueError as exc:  # NaN, Infinity, 1e309: json.loads would read them, JSON has no such numbers
        return body, {"message": str(exc), "param": "options"}
    if not isinstance(body["options"], dict):
        return body, {"message": "options must be a JSON object, e.g. {\"cost_penalty\": 50}", "param": "options"}
    return body, None


def _field(param: str | None) -> str | None:
    """The form field an API error's `param` names ("models[1]" -> "models", "options.x" -> "options")."""
    if not param:
        return None
    head = param.split("[")[0].split(".")[0]
    return head if head in FORM_FIELDS else None


async def _form(request: Request, api, *, mode: str, values: dict, error: dict | None = None, original: str = "",
                status_code: int = 200) -> HTMLResponse:
    models = await api.get_json("/v1/models")
    names = [m["id"] for m in models["data"] if m["link"]["type"] == "model"]
    field = _field(error["param"]) if error else None
    return render(request, "policy_form.html", status_code=status_code, section="policies", mode=mode, values=values,
                  error=error, error_field=field, original=original, model_names=names, policy_types=sorted(POLICIES),
                  option_hints=option_hints(), options_placeholder=OPTIONS_PLACEHOLDER)


def _as_form_values(policy: dict) -> dict:
    return {"name": policy["name"], "type": policy["type"], "models": ", ".join(policy["models"]),
            "options": json.dumps(policy["options"], indent=2) if policy["options"] else ""}


@router.get("", response_class=HTMLResponse)
async def list_page(request: Request, api: ApiDep) -> Response:
    policies = (await api.get_json("/api/policies"))["data"]
    return render(request, "policies.html", section="policies", policies=policies)


@router.get("/new", response_class=HTMLResponse)
async def new_page(request: Request, api: ApiDep) -> Response:
    return await _form(request, api, mode="new", values={"name": "", "type": "fallback", "models": "", "options": ""})


@router.post("/new", response_class=HTMLResponse, dependencies=[CsrfDep])
async def create(request: Request, api: ApiDep, name: Annotated[str, Form()] = "", type: Annotated[str, Form()] = "",
                 models: Annotated[str, Form()] = "", options: Annotated[str, Form()] = "") -> Response:
    values = {"name": name, "type": type, "models": models, "options": options}
    body, error = _form_body(name, type, models, options)
    if error is None:
        response = await api.call("POST", "/api/policies", json=body)
        if response.status_code == 201:
            return RedirectResponse(f"{PREFIX}/policies", status_code=303)
        error = api_error(response)
    return await _form(request, api, mode="new", values=values, error=error, status_code=400)


@router.get("/edit", response_class=HTMLResponse)
async def edit_page(request: Request, api: ApiDep, name: str) -> Response:
    response = await api.call("GET", f"/api/policies/{path_segment(name)}")
    if response.status_code != 200:
        return render(request, "error.html", status_code=response.status_code, section="policies",
                      title="No such policy", message=api_error(response)["message"])
    return await _form(request, api, mode="edit", values=_as_form_values(response.json()), original=name)


@router.post("/edit", response_class=HTMLResponse, dependencies=[CsrfDep])
async def update(request: Request, api: ApiDep, original: Annotated[str, Form()], name: Annotated[str, Form()] = "",
                 type: Annotated[str, Form()] = "", models: Annotated[str, Form()] = "",
                 options: Annotated[str, Form()] = "") -> Response:
    values = {"name": name, "type": type, "models": models, "options": options}
    body, error = _form_body(name, type, models, options)
    if error is None:
        if body["name"] == original:
            del body["name"]
        response = await api.call("PUT", f"/api/policies/{path_segment(original)}", json=body)
        if response.status_code == 200:
            return RedirectResponse(f"{PREFIX}/policies", status_code=303)
        error = api_error(response)
    return await _form(request, api, mode="edit", values=values, error=error, original=original, status_code=400)


@router.post("/delete", dependencies=[CsrfDep])
async def delete(request: Request, api: ApiDep, name: Annotated[str, Form()]) -> Response:
    response = await api.call("DELETE", f"/api/policies/{path_segment(name)}")
    if response.status_code != 204:
        return render(request, "error.html", status_code=response.status_code, section="policies",
                      title="Not deleted", message=api_error(response)["message"])
    return RedirectResponse(f"{PREFIX}/policies", status_code=303)


@router.get("/try", response_class=HTMLResponse)
async def try_page(request: Request, api: ApiDep, policy: str = "") -> Response:
    models = (await api.get_json("/v1/models"))["data"]
    return render(request, "try.html", section="policies", targets=[m["id"] for m in models], selected=policy)
