"""`link compile tune|tune-config|status`: continuous compilation of a local model's kernels on demand
(benchmarks/kernel_tuning.py) and tuning of its engine configuration for a traffic mix (benchmarks/config_tuning.py).

    link compile tune --model smollm2-135m-instruct --workload serving --budget-s 300
    link compile tune --workload recorded          # the shapes `link serve` recorded (engine option compile_tune)
    link compile tune-config --mix mix.jsonl --speedup 4 --budget 10   # default vs tuned EngineConfig
    link compile status                            # kernel and configuration winners; --json for scripts
"""

from __future__ import annotations

import json

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from cli.errors import fail

compile_app = typer.Typer(help="Tune kernels for the shapes a model runs (issue 9).", no_args_is_help=True)
console = Console()
err_console = Console(stderr=True)


@compile_app.command("tune")
def tune(
    model: str = typer.Option("smollm2-135m-instruct", "--model", "-m", help="A model name from `link models`."),
    workload: str = typer.Option("serving", help="serving (record the serving benchmark's prompts) or recorded (saved counts)."),
    budget_s: float = typer.Option(300.0, "--budget-s", help="Seconds of tuning at most (recording not included)."),
    dtype: str = typer.Option("float32", help="float32 or bfloat16."),
    num_prompts: int = typer.Option(None, help="Serving prompts recorded (default: enough for every level, 2 at concurrency 1, c at c > 1)."),
    concurrency: str = typer.Option("1,16", help="Closed-loop concurrency levels recorded, comma-separated (e.g. 1,2,4,8,16: "
                                                  "the decode batches and speculative verify steps between 1 and 16 rows)."),
    quantized: bool = typer.Option(False, "--quantized", help="Also try lossy weight-only int8/int4 matmuls."),
    data_dir: str = typer.Option(None, help="Shared data folder (default: $LINK_DATASETS_DIR or ../shared/data)."),
) -> None:
    """Record shapes, verify and time the candidate variants of the hot buckets, store and show the winners."""
    from serving import ServingError

    from benchmarks.kernel_tuning import tune_model

    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), console=err_console, transient=True) as bar:
        task = bar.add_task("starting", total=None)

        def progress(message: str, done: int, total: int) -> None:
            bar.update(task, description=message, completed=done, total=total or None)

        try:
            try:
                levels = tuple(sorted({int(c) for c in concurrency.split(",")}))
            except ValueError:
                levels = ()
            if not levels or min(levels) < 1:
                raise ValueError(f"--concurrency {concurrency!r}: give positive integers, comma-separated (e.g. 1,16)")
            outcome = tune_model(model, workload, budget_s, dtype=dtype, num_prompts=num_prompts, allow_lossy=quantized,
                                 concurrencies=levels, data_dir=data_dir, progress=progress)
        except (ServingError, ValueError, FileNotFoundError) as exc:
            raise fail(exc) from None
    rejected = [r for r in outcome.results if r.status == "rejected"]
    console.print(f"{model}: {len(outcome.counts)} buckets recorded in {outcome.record_s:.0f} s; "
                  f"{len({r.bucket for r in outcome.results})} tuned in {outcome.tune_s:.0f} s; "
                  f"{len(outcome.winners)} winners, {len(rejected)} rejected variants")
    status(model=model, as_json=False)


@compile_app.command("tune-config")
def tune_config(
    mix: str = typer.Option(..., "--mix", help="A traffic mix JSONL (`link serve` writes $LINK_HOME/compile/traffic/<model>.jsonl; "
                                                "`link bench serving --save-mix` a workload's)."),
    model: str = typer.Option("smollm2-135m-instruct", "--model", "-m", help="A model name from `link models`."),
    speedup: float = typer.Option(1.0, help="Replay the arrivals this many times faster than recorded."),
    budget: int = typer.Option(10, help="Replays during the search, the default's included."),
    confirm: int = typer.Option(1, help="Extra alternating replays of the default and the winner at the end."),
    ttft_slack: float = typer.Option(0.0, help="Allowed relative p99 TTFT excess over the default (0: equal or better)."),
    repeats: int = typer.Option(1, help="Replays per candidate, compared by their median (noisy machines); each counts in the budget."),
    no_speculation: bool = typer.Option(False, "--no-speculation", help="Leave speculative decoding out of the search."),
    dtype: str = typer.Option("float32", help="float32 or bfloat16."),
) -> None:
    """Replay a recorded traffic mix under candidate engine configurations; store and show the best one."""
    from serving import ServingError
    from serving.config_search import default_space, describe, from_json
    from serving.traffic import load_mix

    from benchmarks.config_tuning import tune_config as run_tuning

    try:
        shapes = load_mix(mix)
        outcome = run_tuning(model, shapes, dtype=dtype, speedup=speedup, budget=budget, confirm=confirm, ttft_slack=ttft_slack, repeats=repeats,
                             space=default_space(not no_speculation), progress=lambda m: err_console.log(m, markup=False))
    except (ServingError, ValueError, FileNotFoundError) as exc:
        raise fail(exc) from None
    row = outcome.stored
    table = Table(title=f"{model}: engine configuration for {len(shapes)} requests (mix {row.signature}), measured in one run")
    for column in ("configuration", "", "output tok/s", "p99 TTFT s"):
        table.add_column(column, justify="right" if "/" in column or "TTFT" in column else "left")
    table.add_row("default", "", f"{row.default_tokens_per_s:.1f}", f"{row.default_ttft_p99_s:.3f}")
    table.add_row("tuned", describe(from_json(row.config)), f"{row.tokens_per_s:.1f}", f"{row.ttft_p99_s:.3f}", style="green")
    console.print(table)
    console.print(f"{row.speedup:.2f}x throughput; {row.num_trials} replays in {outcome.tune_s:.0f} s; fingerprint {row.fingerprint}")


@compile_app.command("status")
def status(
    model: str = typer.Option(None, "--model", "-m", help="Only this model's rows."),
    as_json: bool = typer.Option(False, "--json", help="Print the rows as JSON."),
    configs: bool = typer.Option(False, "--configs", help="With --json: the configuration winners instead of the kernel rows."),
) -> None:
    """The winner tables: per op and bucket, the installed variant and its speedup over the default; per
    traffic mix, the tuned engine configuration against the default."""
    from benchmarks.kernel_tuning import status_rows
    from benchmarks.config_tuning import config_rows

    if as_json:
        console.print_json(json.dumps(config_rows(model=model) if configs else status_rows(model=model)))
        return
    rows = status_rows(model=model)
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
    _print_configs(config_rows(model=model))


def _print_configs(rows: list[dict]) -> None:
    if not rows:
        return
    table = Table(title="Engine configuration winners, per traffic mix")
    for column in ("model", "mix", "requests", "configuration", "default tok/s", "tok/s", "default p99 TTFT", "p99 TTFT", "speedup"):
        table.add_column(column, justify="left" if column in ("model", "mix", "configuration") else "right")
    for r in rows:
        table.add_row(r["model"], r["mix"], str(r["num_requests"]), r["label"], f"{r['default_tokens_per_s']:.1f}",
                      f"{r['tokens_per_s']:.1f}", f"{r['default_ttft_p99_s']:.3f}", f"{r['ttft_p99_s']:.3f}",
                      f"{r['speedup']:.2f}x", style="green" if r["config"] else None)
    console.print(table)
