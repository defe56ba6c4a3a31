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
from rich import box
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from cli.errors import fail

compile_app = typer.Typer(help="Tune kernels and engine configurations for the shapes a model runs.", no_args_is_help=True)
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
    status(model=model, as_json=False, configs=False, wide=False)


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
    from serving.tuning.config_search import default_space, describe, from_json
    from serving.tuning.traffic import load_mix

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
    wide: bool = typer.Option(False, "--wide", help="Every column: the times in ms and the calls of each bucket, "
                                                    "the default's throughput and TTFT of each mix."),
) -> None:
    """The winner tables: per op and bucket, the installed variant and its speedup over the default; per
    traffic mix, the tuned engine configuration against the default ($LINK_HOME/compile/winners.sqlite). One
    table per model, 80 columns wide without --wide."""
    from benchmarks.kernel_tuning import status_rows
    from benchmarks.config_tuning import config_rows

    if as_json:
        console.print_json(json.dumps(config_rows(model=model) if configs else status_rows(model=model)))
        return
    rows = [r for r in status_rows(model=model) if r["status"] != "passed"]
    for name in dict.fromkeys(r["model"] for r in rows):
        _print_kernels(name, [r for r in rows if r["model"] == name], wide)
    if not rows:
        console.print("no tuned buckets yet: run `link compile tune`")
    config_winners = config_rows(model=model)
    for name in dict.fromkeys(r["model"] for r in config_winners):
        _print_configs(name, [r for r in config_winners if r["model"] == name], wide)


# Without --wide the tables read whole at 80 columns: short headers; the long cells (a bucket's shapes, a variant's
# name) fold onto more lines rather than end in "…". With --wide every cell stays on one line, however wide.
_NUMERIC = {"ms", "default ms", "speedup", "calls", "requests", "tok/s", "default tok/s", "TTFT p99", "default TTFT"}
_FOLDED = {"bucket", "variant", "configuration"}


def _print_table(title: str, columns: tuple[str, ...], rows: list[tuple[list[str], str | None]], wide: bool) -> None:
    """One table: `rows` of (cells, style); `wide` prints it on one line per row, wider than the terminal if need be."""
    table = Table(title=title, box=box.SIMPLE_HEAD, title_justify="left")
    for column in columns:
        table.add_column(column, justify="right" if column in _NUMERIC else "left",
                         no_wrap=wide or column not in _FOLDED, overflow="fold")
    for cells, style in rows:
        table.add_row(*cells, style=style)
    if wide:
        natural = console.measure(table, options=console.options.update_width(10_000)).maximum
        Console(width=max(console.width, natural)).print(table)
    else:
        console.print(table)


def _print_kernels(model: str, rows: list[dict], wide: bool) -> None:
    """The kernel winners of one model: op, bucket, dtype, variant, status, speedup (and, with `wide`, the
    median times in ms of the variant and of the default, and the bucket's recorded calls)."""
    columns = ("op", "bucket", "dtype", "variant", "status", *(("ms", "default ms") if wide else ()), "speedup",
               *(("calls",) if wide else ()))
    fmt = lambda v, spec: "" if v is None else format(v, spec)  # noqa: E731
    lines = []
    for r in rows:
        style = "red" if r["status"] == "rejected" else ("green" if r["variant"] != "default" else None)
        times = [fmt(r["median_ms"], ".3f"), fmt(r["baseline_ms"], ".3f")] if wide else []
        lines.append(([r["op"], r["bucket"], r["dtype"], r["variant"], r["status"], *times,
                       fmt(r["speedup"], ".2f") + ("x" if r["speedup"] else ""), *([str(r["calls"])] if wide else [])],
                      style))
    _print_table(f"Kernel winners of {model}", columns, lines, wide)


def _print_configs(model: str, rows: list[dict], wide: bool) -> None:
    """The engine-configuration winners of one model, per traffic mix: the tuned configuration, its throughput
    and p99 TTFT (s), its speedup (and, with `wide`, the request count and the default's numbers)."""
    columns = ("mix", *(("requests",) if wide else ()), "configuration", *(("default tok/s",) if wide else ()),
               "tok/s", *(("default TTFT",) if wide else ()), "TTFT p99", "speedup")
    lines = [([r["mix"], *([str(r["num_requests"])] if wide else []), r["label"],
               *([f"{r['default_tokens_per_s']:.1f}"] if wide else []), f"{r['tokens_per_s']:.1f}",
               *([f"{r['default_ttft_p99_s']:.3f}"] if wide else []), f"{r['ttft_p99_s']:.3f}", f"{r['speedup']:.2f}x"],
              "green" if r["config"] else None) for r in rows]
    _print_table(f"Engine configuration winners of {model}, per traffic mix", columns, lines, wide)
