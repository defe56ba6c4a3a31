"""`/api/evals`: the runs and reports of `link eval` (master key required; read-only, `link eval` writes them).

    GET /api/evals/runs                       every run, newest first: suite, split, targets, status, totals
    GET /api/evals/runs/{run_id}              one run (404 unknown)
    GET /api/evals/reports                    every stored report, newest first (no Markdown, no image)
    GET /api/evals/reports/{report_id}        one report: title, run_ids, markdown, data (the report's JSON), plot_url
    GET /api/evals/reports/{report_id}/plot.png    its quality-cost plot (404 when it has none)
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import Response
from sqlmodel import SQLModel, select

from link.db.evals import EvalReport, EvalRun
from link.db.models import UTCDateTime
from link.deps import AdminDep, SessionDep
from link.schemas import OpenAIError

router = APIRouter(prefix="/api/evals", tags=["evals"])


class EvalRunPublic(SQLModel):
    id: str
    suite: str
    split: str
    targets: list[str]
    params: dict[str, Any]
    status: str
    created_at: UTCDateTime
    finished_at: UTCDateTime | None = None
    totals: dict[str, Any] | None = None


class EvalReportSummary(SQLModel):
    id: str
    title: str
    run_ids: list[str]
    created_at: UTCDateTime
    has_plot: bool


class EvalReportPublic(EvalReportSummary):
    markdown: str
    data: dict[str, Any]
    plot_url: str | None


def _report(session, report_id: str) -> EvalReport:
    row = session.get(EvalReport, report_id)
    if row is None:
        raise OpenAIError(404, f"no eval report {report_id!r} (`link eval report` prints the id of each)",
                          param="report_id", code="report_not_found")
    return row


@router.get("/runs", response_model=list[EvalRunPublic])
def list_runs(session: SessionDep, _: AdminDep):
    return session.exec(select(EvalRun).order_by(EvalRun.created_at.desc(), EvalRun.id)).all()


@router.get("/runs/{run_id}", response_model=EvalRunPublic)
def one_run(run_id: str, session: SessionDep, _: AdminDep):
    row = session.get(EvalRun, run_id)
    if row is None:
        raise OpenAIError(404, f"no eval run {run_id!r}", param="run_id", code="run_not_found")
    return row


@router.get("/reports", response_model=list[EvalReportSummary])
def list_reports(session: SessionDep, _: AdminDep):
    columns = (EvalReport.id, EvalReport.title, EvalReport.run_ids, EvalReport.created_at, EvalReport.png.is_not(None))
    rows = session.exec(select(*columns).order_by(EvalReport.created_at.desc(), EvalReport.id)).all()
    return [EvalReportSummary(id=r[0], title=r[1], run_ids=r[2], created_at=r[3], has_plot=r[4]) for r in rows]


@router.get("/reports/{report_id}", response_model=EvalReportPublic)
def one_report(report_id: str, session: SessionDep, _: AdminDep):
    row = _report(session, report_id)
    return EvalReportPublic(id=row.id, title=row.title, run_ids=row.run_ids, created_at=row.created_at,
                            has_plot=row.png is not None, markdown=row.markdown, data=row.data,
                            plot_url=f"/api/evals/reports/{row.id}/plot.png" if row.png is not None else None)


@router.get("/reports/{report_id}/plot.png", response_class=Response)
def report_plot(report_id: str, session: SessionDep, _: AdminDep) -> Response:
    row = _report(session, report_id)
    if row.png is None:
        raise OpenAIError(404, f"eval report {report_id!r} has no plot", param="report_id", code="plot_not_found")
    return Response(row.png, media_type="image/png")
