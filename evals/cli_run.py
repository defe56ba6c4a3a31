"""`link eval run` (see evals/cli.py): one suite against targets served by the gateway or closed models.

    link eval run --suite gsm8k --split test --limit 200 --target smollm2-135m-instruct --target gemma-3-270m
    link eval run --suite mt-bench --target fallback-small --judge smollm2-135m-instruct --max-cost 0.5
    link eval run --suite gsm8k --target my-model --base-url http://127.0.0.1:8000/v1 --api-key sk-...
    link eval run --suite gsm8k --target openai/gpt-4o          # needs OPENAI_API_KEY (checked before any call)

Without --base-url the gateway runs in this process (`link.app.create_app` over ASGI, no port) with --config
(else LINK_CONFIG, else the two local models), under a random master key of its own (keys in the database do
not matter). With --base-url the key is --api-key, else LINK_API_KEY. Responses are cached in the database
(LINK_DATABASE_URL), so a rerun of an interrupted run resumes. `execute` is the library function behind the
command; `RunSpec` checks the options (messages name the flags).
"""

from __future__ import annotations

import json
import os
import signal
from dataclasses import dataclass, field
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from evals.event_loop import run_sync

console = Console()
err_console = Console(stderr=True)
API_KEY_ENV = "LINK_API_KEY"  # the --base-url server's key when --api-key is not given


@dataclass
class RunSpec:
    """The options of `link eval run` (see the command's help for each)."""

    suite: str
    targets: list[str]
    split: str = "test"
    limit: int | None = None
    seed: int = 0
    shard: str | None = None
    items_file: str | None = None
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
    signals: bool = False
    samples: int = 0
    sample_temperature: float = 0.7
    top_logprobs: int = 5

    def signal_options(self, cls):
        """`cls(...)` (an `evals.runner.SignalOptions`) when --signals or --samples asks for signals, else None."""
        if not (self.signals or self.samples):
            return None
        return cls(top_logprobs=self.top_logprobs, samples=self.samples, temperature=self.sample_temperature)

    def __post_init__(self) -> None:
        """Raises ValueError naming the flag of an out-of-range option."""
        checks = [
            (self.limit is None or self.limit >= 1, f"--limit must be >= 1, got {self.limit}"),
            (self.concurrency >= 1, f"--concurrency must be >= 1, got {self.concurrency}"),
            (self.retries >= 0, f"--retries must be >= 0, got {self.retries}"),
            (self.max_cost_usd is None or self.max_cost_usd >= 0, f"--max-cost must be >= 0, got {self.max_cost_usd}"),
            (self.shard is None or parse_shard(self.shard) is not None,
             f"--shard must be K/N with 0 <= K < N (e.g. 0/4), got {self.shard!r}"),
            (self.shots is None or self.shots >= 0, f"--shots must be >= 0, got {self.shots}"),
            (self.samples >= 0, f"--samples must be >= 0, got {self.samples}"),
            (self.sample_temperature > 0, f"--sample-temperature must be > 0, got {self.sample_temperature}"),
            (1 <= self.top_logprobs <= 20, f"--top-logprobs must be in 1..20, got {self.top_logprobs}"),
            (self.order in ("interleave", "by-target"), f"--order must be interleave or by-target, not {self.order!r}"),
            (self.style in ("auto", "chat", "completion"), f"--style must be auto, chat or completion, not {self.style!r}"),
            (self.options.get("scoring") in (None, "logprob", "generate"),
             f"--scoring must be logprob or generate, not {self.options.get('scoring')!r}"),
        ]
        owners = {"scoring": ("--scoring", "mmlu"), "categories": ("--category", "bfcl"),
                  "baseline": ("--baseline", "alpaca-eval"), "path": ("--path", "jsonl")}
        for key, (flag, suite) in owners.items():
            checks.append((key not in self.options or self.suite == suite, f"{flag} applies to --suite {suite} only"))
        for ok, message in checks:
            if not ok:
                raise ValueError(message)


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
        ValueError: unknown suite, split or target; no items; a judge-based suite without --judge;
            MissingCredentialsError.
        FileNotFoundError: the suite's data is missing. link.config.ConfigError: an invalid --config.
        evals.targets.TargetError: a --base-url server that cannot be reached, or refuses the key (status 401).
    """
    from link.config import load_config
    from link.settings import get_settings

    from evals.base import make_suite
    from evals.cache import EvalStore
    from evals.runner import SignalOptions, run_eval
    from evals.target_gateway import in_process_gateway, remote_gateway
    from evals.target_factory import resolve_targets

    overrides = {"config": spec.config} if spec.config else {}
    settings = get_settings(**overrides)
    data_dir = spec.data_dir or default_data_dir(settings)

    def build(style: str):
        return make_suite(spec.suite, data_dir, shots=spec.shots, style=style, seed=spec.seed, **spec.options)

    suite = build("chat" if spec.style == "auto" else spec.style)
    if suite.needs_judge and not spec.judge:
        raise ValueError(f"suite {spec.suite!r} is graded by a judge model: pass --judge MODEL")
    loaded = suite.load(spec.split)
    if spec.items_file is not None:
        loaded = select_items(loaded, spec.items_file)
    items = shard_items(suite.sample(loaded, spec.limit), spec.shard)
    if not items:
        raise ValueError(f"suite {spec.suite!r} has no items in split {spec.split!r}")
    if spec.base_url is None:
        config = load_config(settings.config)
        _precheck_closed_models([*spec.targets, spec.judge or ""], config)
        gateway = in_process_gateway(settings, config, api_key=spec.api_key)
    else:
        gateway = remote_gateway(spec.base_url, spec.api_key or os.environ.get(API_KEY_ENV) or None)
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
            params = {"seed": spec.seed, "limit": spec.limit, "shard": spec.shard, "items": spec.items_file, "shots": suite.shots, "style": spec.style,
                      "data_dir": str(data_dir), "base_url": spec.base_url,
                      "styles": {t.name: (suite_for.get(t.name) or suite).style for t in targets}}
            return await run_eval(suite, items, targets, judge=judge, concurrency=spec.concurrency, retries=spec.retries,
                                  max_cost_usd=spec.max_cost_usd, store=store, progress=spec.progress, split=spec.split,
                                  params=params, out_dir=spec.out_dir, seed=spec.seed, suite_for=suite_for,
                                  order=spec.order, signals=spec.signal_options(SignalOptions))
        finally:
            store.close()


def read_item_ids(spec: str) -> list[str]:
    """Item ids from `FILE` or `FILE:PART`.

    FILE is a JSON list of ids, a JSON object whose key PART holds the list (a `link posttrain sft` run's
    split.json with PART train or val), or text with one id per line.
    Raises:
        FileNotFoundError: FILE does not exist.
        ValueError: PART is missing from the object, or the file holds no list of ids.
    """
    path_text, _, part = spec.rpartition(":") if ":" in spec and not Path(spec).exists() else (spec, "", "")
    path = Path(path_text)
    if not path.is_file():
        raise FileNotFoundError(f"--items file not found: {path}")
    text = path.read_text(encoding="utf-8")
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        data = [line.strip() for line in text.splitlines() if line.strip()]
    if isinstance(data, dict):
        if not part or part not in data or not isinstance(data[part], list):
            keys = [k for k, v in data.items() if isinstance(v, list)]
            raise ValueError(f"--items {spec}: name the list to use as FILE:PART, one of {', '.join(keys) or '(none)'}")
        data = data[part]
    if not isinstance(data, list) or not all(isinstance(i, str) for i in data):
        raise ValueError(f"--items {spec}: expected a list of item ids (strings)")
    return data


def select_items(items: list, spec: str) -> list:
    """The items whose ids `read_item_ids(spec)` lists, in the suite's order.

    Raises:
        ValueError: an id is not an item of the suite (the message names up to three).
    """
    wanted = read_item_ids(spec)
    known = {item.id for item in items}
    missing = [i for i in wanted if i not in known]
    if missing:
        raise ValueError(f"--items {spec}: {len(missing)} ids are not items of this suite and split "
                         f"(e.g. {', '.join(missing[:3])}); check --suite, --split and --category")
    chosen = set(wanted)
    return [item for item in items if item.id in chosen]


def parse_shard(text: str) -> tuple[int, int] | None:
    """"K/N" -> (K, N) when 0 <= K < N, else None."""
    k, sep, n = text.partition("/")
    if not (sep and k.strip().isdigit() and n.strip().isdigit()):
        return None
    k_i, n_i = int(k), int(n)
    return (k_i, n_i) if 0 <= k_i < n_i else None


def shard_items(items: list, shard: str | None) -> list:
    """The K-th of N interleaved parts of `items` (items[K::N]); all items when `shard` is None.

    Raises:
        ValueError: `shard` is not "K/N" with 0 <= K < N.
    """
    if shard is None:
        return list(items)
    parsed = parse_shard(shard)
    if parsed is None:
        raise ValueError(f"--shard must be K/N with 0 <= K < N (e.g. 0/4), got {shard!r}")
    k, n = parsed
    return list(items[k::n])


def summary_table(result) -> Table:
    """The end-of-run table: per target n, score, errors, cost, judge cost (when any), latency p50 (+ suite extras).
    Target names are never cut: a name wider than its column folds onto a second line."""
    totals = result.totals.values()
    extras = [k for k in ("win_rate", "lc_win_rate") if any(k in t for t in totals)]
    has_judge_cost = any(t["judge_cost_usd"] for t in totals)
    table = Table(title=f"run {result.run_id} ({result.stopped_reason})")
    longest = max((len(name) for name in result.totals), default=6)
    table.add_column("target", min_width=min(longest, 16), overflow="fold")
    for column in ("n", "score", "errors", "cost USD", *(["judge USD"] if has_judge_cost else []), "latency p50 s", *extras):
        table.add_column(column, justify="right")

    def fmt(value, digits=3):
        return "-" if value is None else f"{value:.{digits}f}"

    for name, t in result.totals.items():
        judge = [fmt(t["judge_cost_usd"], 6)] if has_judge_cost else []
        table.add_row(name, str(t["n"]), fmt(t["score"]), str(t["errors"]), fmt(t["cost_usd"], 6), *judge,
                      fmt(t["latency_p50_s"], 2), *(fmt(t.get(k)) for k in extras))
    return table


def run(
    suite: str = typer.Option(..., "--suite", "-s", help="gsm8k, mmlu, humaneval, mt-bench, alpaca-eval, bfcl or jsonl."),
    target: list[str] = typer.Option(..., "--target", "-t", help="A model or policy the gateway serves, or provider/model "
                                     "(LiteLLM, e.g. openai/gpt-4o). Repeat for several."),
    split: str = typer.Option("test", help="The suite's split."),
    limit: int = typer.Option(None, help="Run a seeded sample of this many items."),
    seed: int = typer.Option(0, help="Seeds the sample, few-shot picks and retry jitter."),
    shard: str = typer.Option(None, help="K/N: run every N-th item of the (sampled) items starting at the K-th "
                              "(0-based), so N runs of K = 0..N-1 split one sample into disjoint parts."),
    items: str = typer.Option(None, "--items", help="Run only these item ids: FILE (a JSON list or one id per line) or "
                              "FILE:PART (a key of a JSON object, e.g. a `link posttrain sft` split.json:val)."),
    base_url: str = typer.Option(None, "--base-url", help="A running gateway or OpenAI-compatible server (.../v1); "
                                 "default: the gateway in this process."),
    api_key: str = typer.Option(None, "--api-key", help="Key of the --base-url server (default: LINK_API_KEY). "
                                "The in-process gateway needs none: it makes its own master key."),
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
    scoring: str = typer.Option(None, "--scoring", help="mmlu: logprob (the likeliest letter as the next token; "
                                "default) or generate (the letter read from a short reply)."),
    signals: bool = typer.Option(False, "--signals", help="Record each answer's signals for routers: token "
                                 "log-probabilities (mean, min, entropy), answer checks and its final-answer key "
                                 "(the outcome rows' signals column)."),
    samples: int = typer.Option(0, "--samples", help="With signals: this many extra sampled answers per item and "
                                "target, graded, for the self-agreement signal (implies --signals)."),
    sample_temperature: float = typer.Option(0.7, "--sample-temperature", help="Temperature of the --samples answers."),
    top_logprobs: int = typer.Option(5, "--top-logprobs", help="With signals: alternatives per token (1-20) for "
                                     "the entropy."),
    progress: bool = typer.Option(True, help="Show progress bars."),
) -> None:
    """Run a benchmark suite against targets; print scores, cost and latency; write the outcome table."""
    from pydantic import ValidationError

    from link.config import ConfigError

    from evals.targets import TargetError

    options = {k: v for k, v in {"path": path, "baseline": baseline, "categories": category or None,
                                     "scoring": scoring}.items() if v is not None}
    try:
        spec = RunSpec(suite=suite, targets=target, split=split, limit=limit, seed=seed, shard=shard, items_file=items, base_url=base_url,
                       api_key=api_key, config=config, data_dir=data_dir, shots=shots, style=style, concurrency=concurrency,
                       order=order, retries=retries, max_cost_usd=max_cost, judge=judge, out_dir=out, progress=progress,
                       options=options, signals=signals, samples=samples, sample_temperature=sample_temperature,
                       top_logprobs=top_logprobs)
        # SIGTERM (a scheduler or `kill`) stops the run like Ctrl-C: in-flight calls are cancelled, the
        # run is recorded as interrupted, and a rerun resumes from the cache.
        previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
        try:
            result = run_sync(execute(spec))  # asyncio.run, in a worker thread inside a running loop
        finally:
            signal.signal(signal.SIGTERM, previous)
    except (ValueError, FileNotFoundError, ConfigError, ValidationError, TargetError) as exc:
        message = " ".join(line.strip() for line in str(exc).splitlines() if line.strip()) or type(exc).__name__
        if isinstance(exc, TargetError) and exc.status == 401:
            message = message.rstrip(".") + (f"; pass --api-key KEY (or set {API_KEY_ENV})" if base_url else
                                             "; drop --api-key: the in-process gateway makes its own master key")
        err_console.print(f"[red]error:[/red] {escape(message)}", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None
    except KeyboardInterrupt:
        err_console.print("interrupted: run the same command again to resume (finished answers are cached)")
        raise typer.Exit(130) from None
    console.print(summary_table(result))
    hits = sum(c["cache_hits"] for c in result.calls.values())
    if hits:
        total = hits + sum(c["calls"] for c in result.calls.values())
        console.print(f"{hits} of {total} answers from the cache", highlight=False)
    console.print(f"run id: {result.run_id}   outcomes: {result.out_dir / 'outcomes.jsonl'}", highlight=False)
    if result.stopped_reason == "max_cost":
        console.print(f"stopped: the next call could exceed --max-cost (spent ${result.spent_usd:.6f})", highlight=False)
