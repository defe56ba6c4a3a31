"""Evals: runs and reports of `link eval` (table and quality-cost plot), and two runs compared (from /api/evals).

    GET /console/evals                        runs and reports
    GET /console/evals/reports/{report_id}    the report's table and its plot
    GET /console/evals/compare?a=RUN&b=RUN    two runs' totals side by side, per target
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from web.pages.base import ApiDep, api_error, path_segment, render

router = APIRouter(prefix="/evals")
COMPARED = ("n", "errors", "score", "cost_usd", "latency_p50_s", "latency_p95_s")


@router.get("", response_class=HTMLResponse)
async def page(request: Request, api: ApiDep) -> Response:
    runs = await api.get_json("/api/evals/runs")
    reports = await api.get_json("/api/evals/reports")
    return render(request, "evals.html", section="evals", runs=runs, reports=reports)


@router.get("/reports/{report_id}", response_class=HTMLResponse)
async def report(request: Request, api: ApiDep, report_id: str) -> Response:
    response = await api.call("GET", f"/api/evals/reports/{path_segment(report_id)}")
    if response.status_code != 200:
        return render(request, "error.html", status_code=response.status_code, section="evals",
                      title="No such report", message=api_error(response)["message"])
    return render(request, "report.html", section="evals", report=response.json())


@router.get("/compare", response_class=HTMLResponse)
async def compare(request: Request, api: ApiDep, a: str, b: str) -> Response:
    runs = []
    for run_id in (a, b):
        response = await api.call("GET", f"/api/evals/runs/{path_segment(run_id)}")
        if response.status_code != 200:
            return render(request, "error.html", status_code=response.status_code, section="evals",
                          title="No such run", message=api_error(response)["message"])
        runs.append(response.json())
    targets = list(dict.fromkeys([*(runs[0]["totals"] or {}), *(runs[1]["totals"] or {})]))
    return render(request, "compare.html", section="evals", runs=runs, targets=targets, fields=COMPARED)
