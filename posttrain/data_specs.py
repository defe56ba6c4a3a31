"""Where traces come from, written as one string per source (the `--data` option of `link posttrain`).

    bfcl                                   BFCL's five categories in the shared data folder (LINK_DATASETS_DIR)
    bfcl:../shared/data                    ... in that folder (or its bfcl/ subfolder)
    bfcl:../shared/data:simple,parallel    ... only these categories (bfcl::simple for the default folder)
    calls.jsonl  (or jsonl:calls.jsonl)    OpenAI fine-tuning JSONL (posttrain.traces.read_openai_jsonl)
    log                                    the gateway's recorded traces (its LINK_DATABASE_URL)
    log:sqlite:////home/me/.link/link.db?policy=harness&key=3&since=2026-12-01&until=2027-01-01
                                           ... of that database, filtered (policy and key take comma lists)

    traces, report = read_data(["bfcl::simple", "log?policy=harness"], pii=PiiConfig(action="drop"))

The personal-data filter (posttrain.pii) applies to logged traces: they are users' conversations; BFCL and
JSONL files are data the harness author prepared.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Sequence
from urllib.parse import parse_qs

from posttrain.errors import PosttrainDataError
from posttrain.pii import PiiConfig, PiiReport, filter_traces
from posttrain.traces import Trace, check_traces

SPEC_HELP = ("bfcl[:DATA_DIR][:CATEGORIES], a JSONL file (OpenAI fine-tuning format), or "
             "log[:DATABASE_URL][?policy=P&key=ID&since=ISO&until=ISO]")
_LOG_FILTERS = ("policy", "key", "since", "until")


@dataclass(frozen=True)
class DataSpec:
    """One parsed source: kind "bfcl" (path, categories), "jsonl" (path) or "log" (path = database URL, filters)."""

    text: str
    kind: str
    path: str | None = None
    categories: tuple[str, ...] | None = None
    filters: tuple[tuple[str, str], ...] = ()


def default_data_dir() -> Path:
    """The shared data folder, as `link eval` finds it (LINK_DATASETS_DIR, else ../shared/data, else $LINK_HOME/datasets)."""
    from evals.cli_run import default_data_dir as eval_default
    from link.settings import get_settings

    return eval_default(get_settings())


def parse_data_spec(spec: str) -> DataSpec:
    """Parse one `--data` string (see the module docstring).

    Raises:
        PosttrainDataError: an unknown BFCL category or log filter, or a string that is none of the forms.
    """
    from posttrain.traces_bfcl import BFCL_CATEGORIES

    text = spec.strip()
    if text == "bfcl" or text.startswith("bfcl:"):
        path, sep, tail = text[5:].rpartition(":")
        if not sep:
            path, tail = tail, ""
        categories = tuple(c.strip() for c in tail.split(",") if c.strip())
        unknown = [c for c in categories if c not in BFCL_CATEGORIES]
        if unknown:
            raise PosttrainDataError(f"--data {spec!r}: unknown BFCL categories {unknown}; known: {', '.join(BFCL_CATEGORIES)}")
        return DataSpec(spec, "bfcl", path or None, categories or None)
    if text == "log" or text.startswith("log:") or text.startswith("log?"):
        rest = text[4:] if text.startswith("log:") else text[3:]
        url, _, query = rest.rpartition("?") if "?" in rest else (rest, "", "")
        params = parse_qs(query, keep_blank_values=True, strict_parsing=False) if query else {}
        filters = [(k, v) for k, values in params.items() for v in values if k in _LOG_FILTERS]
        passthrough = {k: v for k, v in params.items() if k not in _LOG_FILTERS}
        if passthrough:  # the database URL's own query (e.g. PostgreSQL sslmode) stays on the URL
            url += "?" + "&".join(f"{k}={v}" for k, values in passthrough.items() for v in values)
        return DataSpec(spec, "log", url or None, None, tuple(filters))
    path = text.removeprefix("jsonl:")
    if text.startswith("jsonl:") or path.endswith(".jsonl") or Path(path).is_file():
        return DataSpec(spec, "jsonl", path)
    raise PosttrainDataError(f"--data {spec!r} is not a data source; give {SPEC_HELP}")


def _log_filters(spec: DataSpec) -> dict:
    """read_request_log's keyword arguments from a log spec's filters."""
    kwargs: dict = {}
    for key, value in spec.filters:
        if key == "policy":
            kwargs.setdefault("policies", []).extend(p for p in value.split(",") if p)
        elif key == "key":
            try:
                kwargs.setdefault("api_key_ids", []).extend(int(k) for k in value.split(",") if k)
            except ValueError:
                raise PosttrainDataError(f"--data {spec.text!r}: key must be API key ids (integers), got {value!r}") from None
        else:
            try:
                kwargs["since" if key == "since" else "until"] = datetime.fromisoformat(value)
            except ValueError:
                raise PosttrainDataError(f"--data {spec.text!r}: {key} must be an ISO 8601 date or time, got {value!r}") from None
    return kwargs


def read_spec(spec: DataSpec) -> list[Trace]:
    """The traces of one source (each reader checks them).

    Raises:
        PosttrainDataError: the reader's errors (a missing file, a malformed line, no traces, ...); for a log, an
            unreachable database too.
    """
    if spec.kind == "bfcl":
        from posttrain.traces_bfcl import BFCL_CATEGORIES, read_bfcl

        return read_bfcl(spec.path or default_data_dir(), spec.categories or BFCL_CATEGORIES)
    if spec.kind == "jsonl":
        from posttrain.traces import read_openai_jsonl

        return read_openai_jsonl(spec.path)
    from sqlalchemy.exc import SQLAlchemyError

    from posttrain.traces_log import read_request_log

    url = spec.path
    if url is None:
        from link.settings import get_settings

        url = get_settings().database_url
    try:
        return read_request_log(url, **_log_filters(spec))
    except (SQLAlchemyError, ValueError) as exc:
        if isinstance(exc, PosttrainDataError):
            raise
        raise PosttrainDataError(f"--data {spec.text!r}: cannot read the request log: {str(exc).splitlines()[0]}") from None


def read_data(specs: Sequence[str], *, pii: PiiConfig | None = PiiConfig()) -> tuple[list[Trace], PiiReport | None]:
    """Read every source, filter logged traces for personal data, and check the whole set.

    Args:
        specs: `--data` strings (at least one).
        pii: the filter for logged traces (None: off).
    Returns:
        (the traces in source order, the PII report of the logged traces or None when there were none / pii off).
    Raises:
        PosttrainDataError: no spec, a bad spec or source, the same trace id in two sources, or nothing left
            after the PII filter (the message gives the filter's report).
    """
    if not specs:
        raise PosttrainDataError(f"no --data given; give one or more of: {SPEC_HELP}")
    traces: list[Trace] = []
    report = None
    for text in specs:
        spec = parse_data_spec(text)
        part = read_spec(spec)
        if spec.kind == "log" and pii is not None:
            part, part_report = filter_traces(part, pii)
            if report is None:
                report = part_report
            else:
                report.num_traces += part_report.num_traces
                report.num_dropped += part_report.num_dropped
                report.num_redacted += part_report.num_redacted
                report.counts += part_report.counts
        traces.extend(part)
    if not traces:
        raise PosttrainDataError("no traces are left to train on" + (f" after the personal-data filter ({report.summary()}); "
                                 "use --pii redact to keep redacted traces" if report is not None else ""))
    check_traces(traces, " + ".join(specs))
    return traces, report
