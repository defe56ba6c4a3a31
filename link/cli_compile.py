"""`link compile tune|status`: continuous compilation of a local model's kernels on demand (link/compile.py).

    link compile tune --model smollm2-135m-instruct --workload serving --budget-s 300
    link compile tune --workload recorded          # the shapes `link serve` recorded (engine option compile_tune)
    link compile status                            # the winner table with speedups; --json for scripts
"""

from __future__ import annotations

import json

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

compile_app = typer.Typer(help="Tune kernels for the shapes a model runs (issue 9).", no_args_is_help=True)
console = Console()
err_console = Console(stderr=True)


@compile_app.command("tune")
def tune(
    model: str = typer.Option("smollm2-135m-instruct", "--model", "-m", help="A model name from `link models`."),
    workload: str = typer.Option("serving", help="serving (record the serving benchmark's prompts) or recorded (saved counts)."),
    budget_s: float = typer.Option(300.0, "--budget-s", help="Seconds of tuning at most (recording not included)."),
    dtype: str = typer.Option("float32", help="float32 or bfloat16."),
    num_prompts: int = typer.Option(18, help="Serving prompts recorded (2 at concurrency 1, the rest at 16)."),
    quantized: bool = typer.Option(False, "--quantized", help="Also try lossy weight-only int8/int4 matmuls."),
    data_dir: str = typer.Option(None, help="Shared data folder (default: $LINK_DATASETS_DIR or ../shared/data)."),
) -> None:
    """Record shapes, verify and time the candidate variants of the hot buckets, store and show the winners."""
    from serving import ServingError

    from link.compile import tune_model

    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), console=err_console, transient=True) as bar:
        task = bar.add_task("starting", total=None)

        def progress(message: str, done: int, total: int) -> None:
            bar.update(task, description=message, completed=done, total=total or None)

        try:
            outcome = tune_model(model, workload, budget_s, dtype=dtype, num_prompts=num_prompts, allow_lossy=quantized,
                                 data_dir=data_dir, progress=progress)
        except (ServingError, ValueError, FileNotFoundError) as exc:
            err_console.print(f"[red]error:[/red] {exc}")
            raise typer.Exit(2) from None
    rejected = [r for r in outcome.results if r.status == "rejected"]
    console.print(f"{model}: {len(outcome.counts)} buckets recorded in {outcome.record_s:.0f} s; "
                  f"{len({r.bucket for r in outcome.results})} tuned in {outcome.tune_s:.0f} s; "
                  f"{len(outcome.winners)} winners, {len(rejected)} rejected variants")
    status(model=model, as_json=False)


@compile_app.command("status")
def status(
    model: str = typer.Option(None, "--model", "-m", help="Only this model's rows."),
    as_json: bool = typer.Option(False, "--json", help="Print the rows as JSON."),
) -> None:
    """The winner table: per op and bucket, the installed variant and its speedup over the default."""
    from link.compile import status_rows

    rows = status_rows(model=model)
    if as_json:
        console.print_json(json.dumps(rows))
        return
    table = Table(title="Kernel winners ($LINK_HOME/compile/winners.sqlite)")
    for column in ("model", "op", "bucket", "dtype", "variant", "status", "ms", "default ms", "speedup", "calls"):
        table.add_column(column, justify="right" if column in ("ms", "default ms", "speedup", "calls") else "left")
    for r in rows:
        if r["status"] == "passed":
            continue
        fmt = lambda v, spec: "" if v is None else format(v, spec)  # noqa: E731
        style = "red" if r["status"] == "rejected" else ("green" if r["variant"] != "default" else None)
        table.add_row(r["model"], r["op"], r["bucket"], r["dtype"], r["variant"], r["status"], fmt(r["median_ms"], ".3f"),
                      fmt(r["baseline_ms"], ".3f"), fmt(r["speedup"], ".2f") + ("x" if r["speedup"] else ""), str(r["calls"]),
                      style=style)
    console.print(table)
    if not rows:
        console.print("no tuned buckets yet: run `link compile tune`")
