"""`link router train|calibrate|add-model|eval`: learned routers trained and measured on outcome tables.

    link router train --type knn --data runs/abc/outcomes.jsonl --out auto.safetensors
    link router calibrate auto.safetensors --data held_out.jsonl --target cost=0.001
    link router calibrate auto.safetensors --data held_out.jsonl --target share:gemma-3-270m=0.3
    link router add-model auto.safetensors --model acme-sft --data runs/sft/outcomes.jsonl   # kNN: no retraining
    link router train-checker --data routellm-gsm8k --model mistralai/Mixtral-8x7B-Instruct-v0.1 \
        --out gsm8k-mixtral.checker.safetensors      # a cascade's `scorer: answer` (routers.answer_check)
    link router calibrate auto.safetensors --data held_out.jsonl --rule cascade --target cost=0.0005 \
        --cascade-models smollm2-135m-instruct,gemma-3-270m      # a cascade policy's escalation threshold
    link router eval --type all --train routerbench:train --test routerbench:test --splits 5 \\
        --json routing.json --plot routing.png
    link router eval --type all --train routellm-gsm8k --folds 5 --seeds 3 --json gsm8k.json
    link router eval --type all --train routellm-mmlu --group-by subject --json mmlu_subjects.json
    link router eval --type knn --train runs/a/outcomes.jsonl --test runs/b/outcomes.jsonl --hybrid link/moa

Every eval also replays each learned router's cascade (--no-cascade: not); --hybrid names outcome columns
of a multi-call policy (a `link eval run` target such as link/moa) for the hybrid router (routers.offline.evaluate).

Data: recorded sets (routerbench[:train|test], routellm-mmlu, routellm-gsm8k, alpaca-eval[:baseline]) or
outcome files (.jsonl/.csv, or gzipped), several `--data` merged. Each subcommand is one function of
`routers.offline.pipeline`. Errors print one line `error: ...` and exit with code 2.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import typer
from rich.console import Console

from cli.errors import fail
from cli.progress import progress_bar
from cli.router_report import print_report, split_reports

router_app = typer.Typer(help="Learned routers: train on outcome tables, calibrate the cost knob, evaluate offline.",
                         no_args_is_help=True)
console = Console()
DATA_HELP = ("Recorded sets (routerbench[:train|test], routellm-mmlu, routellm-gsm8k, alpaca-eval[:baseline]) "
             "or outcome files (.jsonl/.csv, optionally gzipped); repeat to merge.")


def _fail(exc: BaseException) -> typer.Exit:
    # an OSError's args[0] is its errno: its str() names the error and the path
    text = str(exc) if isinstance(exc, OSError) or not exc.args else str(exc.args[0])
    return fail(' '.join(text.split()))


def load_data(specs: list[str], data_dir: Path | None = None, *, task_by: str = "suite", min_models: int = 2):
    """A `RoutingData` of the merged outcome tables of `specs`; `task_by` "subject" relabels each prompt's
    suite with its group (MMLU subjects), so per-task baselines and routers see subjects.

    Every router embeds the prompt, so an outcome file's rows must carry prompt text; what a file holds but a
    reader should hear (rows without cost_usd, read as 0 USD) is printed as a warning.

    Raises:
        ValueError: no spec, an empty source or a row without prompt text (naming the file and line), or fewer
            than `min_models` models in the tables (routing chooses between two or more; adding a model or
            fitting an answer checker reads one).
    """
    from evals.recorded import load_source
    from routers.offline.data import RoutingData

    if not specs:
        raise ValueError("give at least one --data/--train source")
    tables = []
    for spec in specs:
        table = load_source(spec, data_dir, require_prompt=True)
        if not len(table):
            raise ValueError(f"{spec}: no outcome rows (an empty file?)")
        for warning in table.warnings:
            _warn(warning)
        tables.append(table)
    data = RoutingData.from_outcomes(itertools.chain.from_iterable(tables))
    if data.num_models < min_models:
        raise ValueError(f"this needs outcomes of at least {min_models} model{'s' if min_models > 1 else ''}; {', '.join(specs)} "
                         f"{'has' if len(specs) == 1 else 'have'} only {', '.join(data.models) or 'none'}: "
                         "add another --data/--train source with the other models' outcomes on the same prompts")
    return data if task_by == "suite" else data.with_suites(data.groups(task_by))


def parse_options(items: list[str], types: list[str]) -> dict[str, dict[str, Any]]:
    """["k=40", "lgbm.num_leaves=15"] -> {type: {key: value}}; a key without "TYPE." applies to every type;
    values are JSON when they parse ("40" -> 40, "true" -> True), else strings."""
    out: dict[str, dict[str, Any]] = {t: {} for t in types}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--option takes KEY=VALUE or TYPE.KEY=VALUE, got {item!r}")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        type_, dot, name = key.rpartition(".")
        for t in ([type_] if dot else types):
            if t not in out:
                raise ValueError(f"--option {item!r} names type {t!r}, not one of {', '.join(types)}")
            out[t][name] = value
    return out


def _prices(models: list[str], data_dir: Path | None) -> dict[str, tuple[float, float]]:
    from evals.prices import model_price
    from evals.recorded import default_data_dir

    found = {m: model_price(m, data_dir or default_data_dir()) for m in models}
    return {m: p for m, p in found.items() if p is not None}


@router_app.command("train")
def train(
    type_: str = typer.Option(..., "--type", help="Router type: knn, lgbm, mf (or a registered baseline)."),
    data: list[str] = typer.Option(..., "--data", help=DATA_HELP),
    out: Path = typer.Option(..., "--out", help="The router file to write (safetensors)."),
    option: list[str] = typer.Option([], "--option", help="Router option KEY=VALUE (repeatable)."),
    prices: bool = typer.Option(False, "--prices/--no-prices", help="Expected costs from list prices (routerarena "
                                "cost.json) where known, instead of the recorded costs alone."),
    task_by: str = typer.Option("suite", "--task-by", help="Task label: suite or subject."),
    choice_embeddings: bool = typer.Option(False, "--choice-embeddings/--no-choice-embeddings",
                                           help="Also read how alike a multiple-choice prompt's choices are "
                                           "(LightGBM; one more encoder call per such prompt)."),
    data_dir: Path = typer.Option(None, "--data-dir", help="The shared data folder (default LINK_DATASETS_DIR)."),
) -> None:
    """Train a router on outcome tables and save it (router, cost model, lambda 0) in one file."""
    from routers.features import Featurizer
    from routers.offline.pipeline import train_and_save

    try:
        table = load_data(data, data_dir, task_by=task_by)
        path = train_and_save(type_, table, out, options=parse_options(option, [type_])[type_],
                              featurizer=Featurizer(choice_embeddings=choice_embeddings),
                              prices=_prices(table.models, data_dir) if prices else None,
                              info={"type": type_, "data": data, "task_by": task_by})
    except (ValueError, KeyError, OSError) as exc:
        raise _fail(exc) from None
    console.print(f"trained {type_} on {table.complete_rows().num_prompts} of {table.num_prompts} prompts x "
                  f"{table.num_models} models -> {path}", highlight=False)
    _warn(table.incomplete_note())


FEW_ANSWERS = 200


@router_app.command("train-checker")
def train_checker(
    data: list[str] = typer.Option(..., "--data", help="Outcomes with recorded answers (e.g. routellm-gsm8k). " + DATA_HELP),
    model: str = typer.Option(..., "--model", help="The model whose answers are checked: a cascade's cheap step."),
    out: Path = typer.Option(..., "--out", help="The checker file to write (safetensors)."),
    components: int = typer.Option(16, "--components", help="Principal components of the prompt's and the answer's "
                                   "embeddings (0: no embeddings)."),
    strong: str = typer.Option(None, "--strong", help="The cascade's next step, to calibrate its threshold with --target."),
    target: str = typer.Option(None, "--target", help="cost=USD | share:MODEL=FRACTION | quality=FRACTION, met by the "
                               "cascade [--model, --strong] on out-of-fold scores."),
    data_dir: Path = typer.Option(None, "--data-dir", help="The shared data folder (default LINK_DATASETS_DIR)."),
    signals: str = typer.Option("", "--signals", help="Signal families read besides the answer, comma-separated: "
                                "confidence (token log-probabilities; the cascade asks the step for them), checks "
                                "(needs outcomes recorded with `link eval run --signals`)."),
) -> None:
    """Train an answer checker on a model's recorded answers and save it (a cascade's `scorer: answer`)."""
    from routers.offline.calibration import CalibrationTarget
    from routers.offline.pipeline import train_checker_and_save

    try:
        if components < 0:
            raise ValueError(f"--components must be >= 0, got {components}")
        result = train_checker_and_save(load_data(data, data_dir, min_models=1), model, out, num_components=components, strong=strong,
                                        target=CalibrationTarget.parse(target) if target else None,
                                        signal_families=[f.strip() for f in signals.split(",") if f.strip()])
    except (ValueError, KeyError, OSError) as exc:
        raise _fail(exc) from None
    console.print(f"trained an answer checker on {result['num_answers']} answers of {model} "
                  f"({result['accuracy']:.1%} correct) -> {result['path']}", highlight=False)
    if result["num_answers"] < FEW_ANSWERS:
        console.print(f"warning: {result['num_answers']} answers are few for a checker (its trees need 20 per leaf); "
                      f"its scores may barely vary. Label a few hundred.", highlight=False)
    if result["threshold"] is not None:
        at = result["operating_point"]
        console.print(f"cascade {' -> '.join(result['steps'])}: escalation threshold {result['threshold']:.4f} "
                      f"(out-of-fold AUC {result['auc']:.3f}): on the held-out folds ${at['cost_usd']:.6g} per request, "
                      f"quality {at['quality']:.3f}, {at['escalated']:.1%} escalated", highlight=False)
        if not at["target_met"]:
            console.print(f"warning: no threshold meets --target {target}; this is the closest setting", highlight=False)


@router_app.command("add-model")
def add_model(
    file: Path = typer.Argument(..., help="A router file from `link router train`."),
    model: str = typer.Option(..., "--model", help="The new candidate: a model column of the --data outcomes."),
    data: list[str] = typer.Option(..., "--data", help="Its labelled prompts (a few hundred suffice). " + DATA_HELP),
    out: Path = typer.Option(None, "--out", help="Write here instead of updating FILE."),
    prices: bool = typer.Option(False, "--prices/--no-prices", help="Its expected cost from list prices (routerarena "
                                "cost.json) where known, instead of the recorded costs alone."),
    data_dir: Path = typer.Option(None, "--data-dir", help="The shared data folder (default LINK_DATASETS_DIR)."),
) -> None:
    """Add a model to a trained router from its labelled prompts, without retraining the others (kNN)."""
    from routers.offline.pipeline import add_model_to_file

    try:
        table = load_data(data, data_dir, min_models=1)
        result = add_model_to_file(file, table, model, out=out,
                                   prices=_prices([model], data_dir) if prices else None)
    except (ValueError, KeyError, OSError) as exc:
        raise _fail(exc) from None
    console.print(f"added {result['model']} from {result['num_prompts']} labelled prompts: the router now chooses "
                  f"among {', '.join(result['models'])} -> {result['path']}", highlight=False)
    for warning in result["warnings"]:
        _warn(warning)


def _warn(text: str | None) -> None:
    """Print `text` (when there is one) as a warning line."""
    if text:
        console.print(f"warning: {text}", style="yellow", markup=False, highlight=False)


@router_app.command("calibrate")
def calibrate(
    file: Path = typer.Argument(..., help="A router file from `link router train`."),
    data: list[str] = typer.Option(..., "--data", help="Held-out outcomes. " + DATA_HELP),
    target: str = typer.Option(..., "--target", help="cost=USD | share:MODEL=FRACTION | quality=FRACTION."),
    rule: str = typer.Option("lambda", "--rule", help="lambda (cost penalty), threshold (strong/weak pair) or "
                             "cascade (the escalation threshold of a cascade scored by this router)."),
    strong: str = typer.Option(None, "--strong", help="The strong model of a threshold rule."),
    weak: str = typer.Option(None, "--weak", help="The weak model of a threshold rule."),
    cascade_models: str = typer.Option(None, "--cascade-models", help="Rule cascade: its models, cheapest first, "
                                       "comma-separated (default: the held-out cost-accuracy frontier)."),
    out: Path = typer.Option(None, "--out", help="Write here instead of updating FILE."),
    task_by: str = typer.Option("suite", "--task-by", help="Task label: suite or subject."),
    data_dir: Path = typer.Option(None, "--data-dir", help="The shared data folder (default LINK_DATASETS_DIR)."),
) -> None:
    """Set the router's knob so that the target holds on held-out outcomes, and save it in the file."""
    from routers.offline.calibration import CalibrationTarget
    from routers.offline.pipeline import calibrate_file

    try:
        goal = CalibrationTarget.parse(target)
        result = calibrate_file(file, load_data(data, data_dir, task_by=task_by), goal, rule=rule,
                                strong=strong, weak=weak, cascade_models=_names(cascade_models), out=out)
    except (ValueError, KeyError, OSError) as exc:
        raise _fail(exc) from None
    missed = _missed_target(goal, result)
    if missed:
        console.print(f"warning: {missed}", style="yellow", markup=False)
    knob = {"threshold": "threshold", "cascade": f"cascade {' -> '.join(result.get('steps', []))}: escalation threshold"
            }.get(rule, "cost penalty (lambda)")
    console.print(f"{knob} = {result['knob']:.6g} on {result['num_prompts']} prompts: mean cost "
                  f"{result['mean_cost_usd']:.6g} USD, quality {result['quality']:.4f} -> {result['path']}")
    shares = ", ".join(f"{m} {s:.1%}" for m, s in sorted(result["share"].items(), key=lambda kv: -kv[1]) if s > 0)
    console.print(f"share of calls: {shares}")
    if rule == "cascade":
        console.print(f"cascade policy: models {result['steps']}, options {{scorer: router, path: {result['path']}, "
                      f"threshold: {result['knob']:.6g}}}")


def _missed_target(goal, result: dict[str, Any], share_tolerance: float = 0.01) -> str | None:
    """What a calibration could not reach, in words (None when it met `goal`, a `routers.offline.calibration.CalibrationTarget`): a
    cost ceiling under every operating point, a quality fraction over every one, or a share more than
    `share_tolerance` from every reachable one."""
    if goal.kind == "cost" and result["mean_cost_usd"] > goal.value * (1 + 1e-9):
        return (f"no setting keeps the mean cost at or under {goal.value:g} USD on these prompts; this is the "
                f"cheapest one ({result['mean_cost_usd']:.6g} USD)")
    if goal.kind == "quality":
        reach = result["quality"] / result["best_single_quality"] if result["best_single_quality"] > 0 else 1.0
        if reach < goal.value - 1e-9:
            return (f"no setting keeps {goal.value:.1%} of the best single model's quality on these prompts; the best "
                    f"keeps {reach:.1%}")
    if goal.kind == "share":
        share = result["share"].get(goal.model, 0.0)
        if abs(share - goal.value) > share_tolerance:
            return (f"no setting sends {goal.value:.1%} of these prompts to {goal.model}; the nearest sends {share:.1%}")
    return None


def _names(text: str | None) -> list[str] | None:
    """"a,b" -> ["a", "b"]; None or "" -> None."""
    names = [n.strip() for n in (text or "").split(",") if n.strip()]
    return names or None


@router_app.command("eval")
def eval_(
    type_: str = typer.Option("all", "--type", help="knn, lgbm, mf, a comma list, or all."),
    train: list[str] = typer.Option(..., "--train", help="Training outcomes. " + DATA_HELP),
    test: list[str] = typer.Option([], "--test", help="Test outcomes; without, k-fold cross-validation of --train."),
    splits: int = typer.Option(0, "--splits", help="Also re-draw this many train/test splits of the same test size."),
    folds: int = typer.Option(5, "--folds", help="Cross-validation folds (no --test)."),
    seeds: int = typer.Option(1, "--seeds", help="Cross-validation repeats with different shuffles (no --test)."),
    group_by: str = typer.Option(None, "--group-by", help="Hold whole groups out of training: suite or subject."),
    task_by: str = typer.Option("suite", "--task-by", help="Task label for per-task baselines: suite or subject."),
    baselines: str = typer.Option("random,best-per-task,length,oracle", "--baselines", help="Comma list."),
    option: list[str] = typer.Option([], "--option", help="Router option [TYPE.]KEY=VALUE (repeatable)."),
    lambdas: int = typer.Option(256, "--lambdas", help="Cost penalties swept per router."),
    add_model: str = typer.Option(None, "--add-model", help="Also train without this model and add it afterwards."),
    add_prompts: int = typer.Option(300, "--add-prompts", help="Labelled prompts for --add-model."),
    cascade: bool = typer.Option(True, "--cascade/--no-cascade", help="Also replay each learned router's cascade "
                                 "and a perfect-judge cascade."),
    cascade_models: str = typer.Option(None, "--cascade-models", help="The cascade's models, cheapest first, "
                                       "comma-separated (default: the training cost-accuracy frontier)."),
    hybrid: list[str] = typer.Option([], "--hybrid", help="An outcome column of a multi-call policy (e.g. link/moa): "
                                     "routers choose among the other columns, hybrid:<type> among all (repeatable)."),
    seed: int = typer.Option(0, "--seed", help="Seed of splits and the random baseline."),
    choice_embeddings: bool = typer.Option(False, "--choice-embeddings/--no-choice-embeddings",
                                           help="Also read how alike a multiple-choice prompt's choices are "
                                           "(LightGBM; one more encoder call per such prompt)."),
    answer_check: bool = typer.Option(False, "--answer-check/--no-answer-check", help="Also replay the cascade "
                                      "scored by answer checkers fitted on the steps' recorded answers (cascade:answer)."),
    answer_signals: str = typer.Option("", "--answer-signals", help="With --answer-check: signal families its "
                                       "checkers also read (confidence, checks, agreement; comma-separated), from "
                                       "outcomes recorded with `link eval run --signals`; agreement also charges "
                                       "the cheap steps' extra samples."),
    json_out: Path = typer.Option(None, "--json", help="Write the full report (curves included) here."),
    plot: Path = typer.Option(None, "--plot", help="Write the cost-quality plot (PNG) here."),
    data_dir: Path = typer.Option(None, "--data-dir", help="The shared data folder (default LINK_DATASETS_DIR)."),
) -> None:
    """Evaluate routers offline next to single models, random, best model per task, prompt length and the oracle."""
    from routers.features import Featurizer
    from routers.offline.pipeline import run_evaluation
    from routers.offline.plot import plot_report
    from routers.offline.settings import LEARNED_TYPES, EvalSettings

    try:
        if answer_check and not cascade:
            raise ValueError("--answer-check replays a cascade: drop --no-cascade")
        families = [f.strip() for f in answer_signals.split(",") if f.strip()]
        if families and not answer_check:
            raise ValueError("--answer-signals are read by the answer checkers: add --answer-check")
        types = list(LEARNED_TYPES) if type_ == "all" else [t.strip() for t in type_.split(",") if t.strip()]
        steps = _names(cascade_models)
        settings = EvalSettings(types=tuple(types), baselines=tuple(b.strip() for b in baselines.split(",") if b.strip()),
                                options={**parse_options(option, types),
                                         **({"answer": {"signal_families": families}} if families else {})},
                                num_lambdas=lambdas, seed=seed, cascade=cascade,
                                cascade_models=tuple(steps) if steps else None, ensembles=tuple(hybrid),
                                answer_check=answer_check)
        train_data = load_data(train, data_dir, task_by=task_by)
        test_data = load_data(test, data_dir, task_by=task_by) if test else None
        with progress_bar("evaluating routers") as update:  # on stderr: folds (or splits) x learned routers
            report = run_evaluation(train_data, test_data, settings, num_splits=splits, folds=folds,
                                    seeds=tuple(range(seed, seed + seeds)), group_by=group_by, add_model=add_model,
                                    add_prompts=add_prompts, featurizer=Featurizer(choice_embeddings=choice_embeddings),
                                    progress=update)
        report["data"] = {"train": train, "test": test, "task_by": task_by}
        if json_out is not None:
            json_out.parent.mkdir(parents=True, exist_ok=True)
            json_out.write_text(json.dumps(report, indent=1))
        if plot is not None:
            cv = f"{folds}-fold CV, mean of {folds * seeds} folds"
            plot_report(report, plot, title=f"{', '.join(train)} -> {', '.join(test) or cv}")
    except (ValueError, KeyError, OSError) as exc:
        raise _fail(exc) from None
    for side, note in report.get("left_out", {}).items():
        _warn(f"{side} data: {note}")
    print_report(report)
    parts = split_reports(report)
    gaps = [part["not_measured"]["cascade:answer"] for part in parts if "cascade:answer" in part.get("not_measured", {})]
    if gaps:
        where = "" if len(parts) == 1 else f" in {len(gaps)} of {len(parts)} splits"
        _warn(f"cascade:answer not measured{where}: {'; '.join(dict.fromkeys(gaps))}")
    elif answer_check and not any("cascade:answer" in (part.get("routers") or {}) for part in parts):
        _warn("cascade:answer not measured: no cascade of two or more models on the training cost-accuracy "
              "frontier (name its steps with --cascade-models)")
    for path in (json_out, plot):
        if path is not None:
            console.print(f"wrote {path}")
