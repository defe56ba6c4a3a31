"""`link eval run` (see evals/cli.py): one suite against targets served by the gateway or closed models.

    link eval run --suite gsm8k --split test --limit 200 --target smollm2-135m-instruct --target gemma-3-270m
    link eval run --suite mt-bench --target fallback-small --judge smollm2-135m-instruct --max-cost 0.5
    link eval run --suite gsm8k --target my-model --base-url http://127.0.0.1:8000/v1 --api-key sk-...
    link eval run --suite gsm8k --target openai/gpt-4o          # needs OPENAI_API_KEY (checked before any call)

Without --base-url the gateway runs in this process (`link.app.create_app` over ASGI, no port) with --config
(else LINK_CONFIG, else the two local models). Responses are cached in the database (LINK_DATABASE_URL), so a rerun
of an interrupted run resumes. `execute` is the library function behind the command.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from evals.cli import eval_app

console = Console()
err_console = Console(stderr=True)


@dataclass
class RunSpec:
    """The options of `link eval run` (see the command's help for each)."""

    suite: str
    targets: list[str]
    split: str = "test"
    limit: int | None = None
    seed: int = 0
    base_url: str | None = None
    api_key: str | None = None
    config: Path | None = None
    data_dir: Path | None = None
    shots: int | None = None
    style: str = "auto"
    concurrency: int = 16
    order: str = "interleave"
    retries: int = 3
    max_cost_usd: float | None = None
    judge: str | None = None
    out_dir: Path | None = None
    progress: bool = True
    options: dict = field(default_factory=dict)


def default_data_dir(settings) -> Path:
    """LINK_DATASETS_DIR when set and present, else ../shared/data when present, else $LINK_HOME/datasets."""
    if settings.datasets_dir and Path(settings.datasets_dir).is_dir():
        return Path(settings.datasets_dir)
    shared = Path("..") / "shared" / "data"
    return shared if shared.is_dir() else Path(settings.datasets_dir)


def _precheck_closed_models(names: list[str], config) -> None:
    """Fail before the gateway starts when a provider/model target (not served by the config) lacks its key."""
    from evals.target_litellm import LiteLLMTarget

    served = set(config.model_names) | {p.name for p in config.policies}
    for name in names:
        if name and "/" in name and name not in served:
            LiteLLMTarget(name)  # raises MissingCredentialsError naming the variable


async def execute(spec: RunSpec):
    """Run `spec` end to end and return the `evals.runner.RunResult`.

    Raises:
        ValueError: unknown suite, split or target; a judge-based suite without --judge; MissingCredentialsError.
        FileNotFoundError: the suite's data is missing. link.config.ConfigError: an invalid --config.
        evals.targets.TargetError: a --base-url server that cannot be reached.
    """
    from link.config import load_config
    from link.settings import get_settings

    from evals.base import make_suite
    from evals.cache import EvalStore
    from evals.runner import run_eval
    from evals.target_gateway import in_process_gateway, remote_gateway
    from evals.targets import resolve_targets

    if spec.style not in ("auto", "chat", "completion"):
        raise ValueError(f"--style must be auto, chat or completion, not {spec.style!r}")
    overrides = {"config": spec.config} if spec.config else {}
    settings = get_settings(**overrides)
    data_dir = spec.data_dir or default_data_dir(settings)

    def build(style: str):
        return make_suite(spec.suite, data_dir, shots=spec.shots, style=style, seed=spec.seed, **spec.options)

    suite = build("chat" if spec.style == "auto" else spec.style)
    if suite.needs_judge and not spec.judge:
        raise ValueError(f"suite {spec.suite!r} is graded by a judge model: pass --judge MODEL")
    items = suite.sample(suite.load(spec.split), spec.limit)
    if spec.base_url is None:
        config = load_config(settings.config)
        _precheck_closed_models([*spec.targets, spec.judge or ""], config)
        gateway = in_process_gateway(settings, config, api_key=spec.api_key)
    else:
        gateway = remote_gateway(spec.base_url, spec.api_key)
    async with gateway as connection:
        targets = resolve_targets(spec.targets, connection.cards, connection.client, prices=connection.prices)
        judge = resolve_targets([spec.judge], connection.cards, connection.client, prices=connection.prices)[0] \
            if spec.judge else None
        suite_for = {}
        if spec.style == "auto":
            styles = {t.name: connection.style_for(t.name) if t.name in connection.cards else "chat" for t in targets}
            suite_for = {name: build(style) for name, style in styles.items() if style != suite.style}
        store = EvalStore(settings.database_url)
        try:
            params = {"seed": spec.seed, "limit": spec.limit, "shots": suite.shots, "style": spec.style,
                      "data_dir": str(data_dir), "base_url": spec.base_url,
                      "styles": {t.name: (suite_for.get(t.name) or suite).style for t in targets}}
            return await run_eval(suite, items, targets, judge=judge, concurrency=spec.concurrency, retries=spec.retries,
                                  max_cost_usd=spec.max_cost_usd, store=store, progress=spec.progress, split=spec.split,
                                  params=params, out_dir=spec.out_dir, seed=spec.seed, suite_for=suite_for,
                                  order=spec.order)
        finally:
            store.close()


def summary_table(result) -> Table:
    """The end-of-run table: per target n, score, errors, cost, judge cost, latency p50 (+ suite extras)."""
    extras = [k for k in ("win_rate", "lc_win_rate") if any(k in t for t in result.totals.values())]
    table = Table(title=f"run {result.run_id} ({result.stopped_reason})")
    for column in ("target", "n", "score", "errors", "cost USD", "judge USD", "latency p50 s", *extras):
        table.add_column(column, justify="left" if column == "target" else "right")

    def fmt(value, digits=3):
        return "-" if value is None else f"{value:.{digits}f}"

    for name, t in result.totals.items():
        table.add_row(name, str(t["n"]), fmt(t["score"]), str(t["errors"]), fmt(t["cost_usd"], 6),
                      fmt(t["judge_cost_usd"], 6), fmt(t["latency_p50_s"], 2), *(fmt(t.get(k)) for k in extras))
    return table


@eval_app.command("run")
def run(
    suite: str = typer.Option(..., "--suite", "-s", help="gsm8k, mmlu, humaneval, mt-bench, alpaca-eval, bfcl or jsonl."),
    target: list[str] = typer.Option(..., "--target", "-t", help="A model or policy the gateway serves, or provider/model "
                                     "(LiteLLM, e.g. openai/gpt-4o). Repeat for several."),
    split: str = typer.Option("test", help="The suite's split."),
    limit: int = typer.Option(None, help="Run a seeded sample of this many items."),
    seed: int = typer.Option(0, help="Seeds the sample, few-shot picks and retry jitter."),
    base_url: str = typer.Option(None, "--base-url", help="A running gateway or OpenAI-compatible server (.../v1); "
                                 "default: the gateway in this process."),
    api_key: str = typer.Option(None, "--api-key", help="Gateway key (default: LINK_MASTER_KEY, else open mode)."),
    config: Path = typer.Option(None, "--config", "-c", help="link.yaml of the in-process gateway."),
    data_dir: Path = typer.Option(None, "--data-dir", help="Data folder laid out like ../shared/data."),
    shots: int = typer.Option(None, help="Few-shot examples (default: the suite's)."),
    style: str = typer.Option("auto", help="chat, completion, or auto (completion for base models)."),
    concurrency: int = typer.Option(16, help="(item, target) pairs in flight at most, over all targets; local engines batch them."),
    order: str = typer.Option("interleave", help="interleave (every target item by item) or by-target (one target "
                                                 "after another: best for local models sharing one machine)."),
    retries: int = typer.Option(3, help="Retries of timeouts, connection errors, 429 and 5xx."),
    max_cost: float = typer.Option(None, "--max-cost", help="Stop before spending more than this many USD."),
    judge: str = typer.Option(None, help="Judge model for mt-bench and alpaca-eval."),
    out: Path = typer.Option(None, "--out", help="Folder for outcomes.jsonl (default $LINK_HOME/evals/<run id>)."),
    path: Path = typer.Option(None, "--path", help="The JSONL file of a `jsonl` suite."),
    baseline: str = typer.Option(None, "--baseline", help="alpaca-eval: the baseline whose outputs are compared."),
    category: list[str] = typer.Option(None, "--category", help="bfcl: a category to run (repeat; default all five)."),
    progress: bool = typer.Option(True, help="Show progress bars."),
) -> None:
    """Run a benchmark suite against targets; print scores, cost and latency; write the outcome table."""
    from pydantic import ValidationError

    from link.config import ConfigError

    from evals.targets import TargetError

    options = {k: v for k, v in {"path": path, "baseline": baseline, "categories": category or None}.items() if v is not None}
    spec = RunSpec(suite=suite, targets=target, split=split, limit=limit, seed=seed, base_url=base_url, api_key=api_key,
                   config=config, data_dir=data_dir, shots=shots, style=style, concurrency=concurrency, order=order, retries=retries,
                   max_cost_usd=max_cost, judge=judge, out_dir=out, progress=progress, options=options)
    try:
        result = asyncio.run(execute(spec))
    except (ValueError, FileNotFoundError, ConfigError, ValidationError, TargetError) as exc:
        message = " ".join(line.strip() for line in str(exc).splitlines() if line.strip()) or type(exc).__name__
        err_console.print(f"[red]error:[/red] {escape(message)}", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None
    except KeyboardInterrupt:
        err_console.print("interrupted: run the same command again to resume (finished answers are cached)")
        raise typer.Exit(130) from None
    console.print(summary_table(result))
    console.print(f"run id: {result.run_id}   outcomes: {result.out_dir / 'outcomes.jsonl'}", highlight=False)
    if result.stopped_reason == "max_cost":
        console.print(f"stopped: the next call could exceed --max-cost (spent ${result.spent_usd:.6f})", highlight=False)
