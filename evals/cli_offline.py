"""`link eval replay`, `link eval report` and `link eval export` (see evals/cli.py): offline, no model is called.

    link eval replay routerbench:test --policy fallback:claude-instant-v1,gpt-4-1106-preview --out replay/
    link eval replay routellm-gsm8k --policy cheap --policy-type fallback --models a,b
    link eval replay runs/abc/outcomes.jsonl --policy mypkg.routing:TaskRouter --options '{"path": "r.json"}'
    link eval report RUN_ID runs/b/outcomes.jsonl --out report/ --title "GSM8K"
    link eval export RUN_A RUN_B --out outcomes.jsonl.gz     # merged, without prompt or answer text

Errors (a bad spec, a missing file, an unknown run) print one line `error: ...` and exit with code 2.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

import typer
from rich.console import Console
from rich.table import Table

from link.money import format_usd

T = TypeVar("T")
SOURCE_HELP = ("Recorded sets (routerbench[:train|test], routellm-mmlu, routellm-gsm8k, alpaca-eval[:baseline]) "
               "or outcome files (.jsonl/.csv).")


def _fail(exc: BaseException) -> typer.Exit:
    message = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
    if isinstance(exc, KeyError) and " " not in str(message):  # a bare lookup, e.g. a policy's missing option
        message = f"missing {message!r} (a required policy option or data field?)"
    typer.echo(f"error: {' '.join(str(message).split())}", err=True)
    return typer.Exit(2)


def _clean_errors(body: Callable[[], T]) -> T:
    """Run a command body; expected errors become one line on stderr and exit code 2."""
    from sqlalchemy.exc import SQLAlchemyError  # an unreachable database (EvalStore)

    try:
        return body()
    except (ValueError, KeyError, OSError, SQLAlchemyError) as exc:  # PolicyError, ValidationError: ValueErrors
        raise _fail(exc) from None


def _options(text: str | None) -> dict[str, Any]:
    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"--options is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ValueError(f"--options must be a JSON object, got {text!r}")
    return value


def _print_table(title: str, built: Any, kinds: dict[str, str], console: Console) -> None:
    table = Table(title=title)
    table.add_column("name", overflow="fold")
    for column in ("kind", "n", "score", "95% CI", "cost", "cost / 1k"):
        table.add_column(column, justify="left" if column == "kind" else "right", no_wrap=True)
    for s in built.summaries:
        table.add_row(built.label(s), kinds.get(s.name, "model"), str(s.n), f"{s.score:.3f}",
                      f"{s.ci_low:.3f}-{s.ci_high:.3f}", format_usd(s.cost_usd), format_usd(s.cost_per_1k_usd))
    console.print(table)


def replay(
    sources: list[str] = typer.Argument(..., help=SOURCE_HELP),
    policy: str = typer.Option(..., "--policy", "-p", help="A model of the table, '<type>:<m1>,<m2>' (fallback:a,b), "
                               "'module:Class' (a Policy subclass), or the name of a --policy-type policy."),
    policy_type: str = typer.Option(None, "--policy-type", help="A registered policy type (fixed, fallback, ...)."),
    models: str = typer.Option(None, "--models", help="Comma-separated models of the policy (default: all)."),
    options: str = typer.Option(None, "--options", help="The policy's options as a JSON object."),
    split: str = typer.Option(None, "--split", help="RouterBench split when the spec names none (default: test)."),
    data_dir: Path = typer.Option(None, "--data-dir", help="Data folder (default: LINK_DATASETS_DIR, else ../shared/data)."),
    out: Path = typer.Option(None, "--out", help="Write report.md/json/png and the routed outcomes.jsonl here."),
    json_output: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
    concurrency: int = typer.Option(16, min=1, help="Policy plan() calls in flight."),
) -> None:
    """Evaluate a routing policy on recorded outcomes: the policy picks, the recorded score and cost are charged.
    Prints the policy next to every single model and the oracle."""
    from evals.recorded import load_source
    from evals.replay import build_policy, oracle, replay as run_replay
    from evals.report import Report
    from evals.outcomes import OutcomeTable

    def body() -> None:
        if os.getcwd() not in sys.path:  # "module:Class" policies import from the working directory, as in uvicorn
            sys.path.insert(0, os.getcwd())
        table = OutcomeTable([row for source in sources for row in load_source(source, data_dir, split=split)])
        listed = [m.strip() for m in models.split(",") if m.strip()] if models else None
        chosen = build_policy(policy, table.models, policy_type=policy_type, models=listed, options=_options(options))
        result = run_replay(chosen, table, concurrency=concurrency)
        label = chosen.name if chosen.name not in table.models and chosen.name != "oracle" else f"{chosen.name} (policy)"
        routed = [replace(row, model=label) for row in result.outcomes]
        if not routed:
            raise ValueError(f"policy {chosen.name!r} covered none of the {len(table.prompt_ids)} prompts")
        built = Report.from_tables([OutcomeTable(routed), oracle(table).outcomes, table], title=f"Replay of {label}")
        summary = {"policy": label, "num_prompts": result.num_prompts, "num_skipped": len(result.skipped),
                   "mean_score": result.mean_score, "total_cost_usd": result.total_cost_usd,
                   "pick_share": result.pick_share, "report": built.to_dict()}
        if out is not None:
            summary["files"] = {k: str(v) for k, v in built.write(out).items()}
            summary["files"]["outcomes"] = str(OutcomeTable(routed).write(Path(out) / "outcomes.jsonl"))
        if json_output:
            typer.echo(json.dumps(summary, indent=2))
            return
        console = Console()
        _print_table(built.title, built, {label: "policy", "oracle": "oracle"}, console)
        shares = ", ".join(f"{m} {share:.1%}" for m, share in result.pick_share.items())
        console.print(f"picks: {shares}", soft_wrap=True)
        if result.skipped:
            console.print(f"skipped {len(result.skipped)} prompts that no planned model has a recorded outcome for")
        for kind, path in summary.get("files", {}).items():
            console.print(f"{kind}: {path}", soft_wrap=True)

    _clean_errors(body)


def _resolve(arg: str, data_dir: Path | None) -> tuple[Any, bool]:
    """(OutcomeTable, is_run_id) for a report argument: a file, a run folder, a recorded set, or a run id
    (its folder `$LINK_HOME/evals/<id>/`, else `EvalStore.load_run_outcomes`)."""
    from evals.recorded import is_recorded_spec, load_source
    from link.settings import get_settings

    path = Path(arg)
    if path.exists() or is_recorded_spec(arg) or path.suffix in (".jsonl", ".csv"):
        return load_source(arg, data_dir), False
    run_dir = get_settings().home / "evals" / arg
    if (run_dir / "outcomes.jsonl").is_file():
        return load_source(str(run_dir), data_dir), True
    try:
        from evals.cache import EvalStore
    except ImportError as exc:
        raise ValueError(f"{arg!r} is neither an outcome file nor a run folder, and run ids need evals.cache ({exc})") from None
    return EvalStore().load_run_outcomes(arg), True


def report(
    runs: list[str] = typer.Argument(..., help="Run ids, run folders, outcome files (.jsonl/.csv) or recorded sets."),
    out: Path = typer.Option(Path("report"), "--out", help="Folder for report.md, report.json and report.png."),
    title: str = typer.Option("", "--title", help="Shown above the table and on the plot (default: the suites and runs)."),
    data_dir: Path = typer.Option(None, "--data-dir", help="Data folder for recorded sets."),
    json_output: bool = typer.Option(False, "--json", help="Print the report's JSON instead of the Markdown."),
    save: bool = typer.Option(True, "--save/--no-save", help="Store the report in the database (for the console)."),
) -> None:
    """Score with a 95% CI, cost, cost per 1,000 queries and latency per model (per suite and model when the
    runs are of different suites); Markdown, JSON and a quality-cost PNG with the Pareto frontier."""
    from evals.report import Report

    def body() -> None:
        resolved = [_resolve(arg, data_dir) for arg in runs]
        built = Report.from_tables([table for table, _ in resolved], title=title)
        if not title:  # e.g. "gsm8k, mmlu: 3f2a9c1b0d4e, 8e1f0a2b3c4d"
            sources = [arg if is_run else Path(arg).name for arg, (_, is_run) in zip(runs, resolved)]
            built.title = f"{', '.join(built.suites)}: {', '.join(sources)}"
        paths = built.write(out)
        report_id = None
        if save:
            try:
                from evals.cache import EvalStore
            except ImportError:
                typer.echo("note: not stored in the database (evals.cache is unavailable)", err=True)
            else:
                run_ids = [arg for arg, (_, is_run) in zip(runs, resolved) if is_run]
                report_id = EvalStore().save_report(title=built.title, run_ids=run_ids, markdown=built.to_markdown(),
                                                    data=built.to_dict(), png=paths["png"].read_bytes())
        if json_output:
            typer.echo(json.dumps({**built.to_dict(), "report_id": report_id,
                                   "files": {k: str(v) for k, v in paths.items()}}, indent=2))
            return
        typer.echo(built.to_markdown())
        typer.echo("written: " + ", ".join(str(p) for p in paths.values()))
        if report_id:
            typer.echo(f"stored as report {report_id}")

    _clean_errors(body)


def export(
    runs: list[str] = typer.Argument(..., help="Run ids, run folders or outcome files (.jsonl/.csv) to merge."),
    out: Path = typer.Option(..., "--out", help="The file to write: .jsonl or .csv, gzip-compressed when it ends in .gz."),
    text: bool = typer.Option(False, "--text/--no-text", help="Keep the prompt and answer texts (default: ids, "
                              "scores, costs, tokens, latency and signals only)."),
) -> None:
    """Merge outcome tables into one file to ship or share: by default without prompt or answer text, so that
    what leaves the machine is item ids, scores, costs and signal summaries (a benchmark's texts stay with it)."""
    from evals.outcomes import OutcomeTable

    def body() -> None:
        tables = [_resolve(arg, None)[0] for arg in runs]
        merged = OutcomeTable([row for table in tables for row in table])
        path = merged.write(out, text=text)
        models = ", ".join(merged.models)
        typer.echo(f"wrote {len(merged)} outcomes ({len(merged.prompt_ids)} prompts; {models}) to {path}")

    _clean_errors(body)
