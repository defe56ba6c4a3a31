"""`link posttrain sft|eval|export`: fine-tune a local model to a tool-call harness, score it, serve it.

    link posttrain sft --base smollm2-135m-instruct --data bfcl --out runs/bfcl          # posttrain.sft.run_sft
    link posttrain eval --model smollm2-135m-instruct --split-file runs/bfcl/split.json  # posttrain.scorer
    link posttrain eval --model ~/.link/models/acme-tools --data bfcl --val-fraction 0.3 --seed 0
    link posttrain export --run runs/bfcl --name acme-tools                              # posttrain.sft.export_run

Bad input (data without tools, tools the harness format cannot express, an empty dataset, a base model that is
not local) is one line on stderr and exit code 2, before any model is loaded or any training step runs.
Imports are inside the commands so that `link --help` stays fast.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import NoReturn

import typer
from rich.console import Console

from cli.errors import fail

posttrain_app = typer.Typer(help="Post-training: fine-tune a local model on tool-call traces, score it, export it.",
                            no_args_is_help=True)
console = Console()
err_console = Console(stderr=True)

DATA_HELP = ("Traces: bfcl[:DATA_DIR][:CATEGORIES] (e.g. bfcl::simple,irrelevance), an OpenAI fine-tuning JSONL "
             "file, or log[:DATABASE_URL][?policy=P&key=ID&since=ISO&until=ISO]. Repeat for several.")


def _fail(exc: BaseException) -> NoReturn:
    """One line on stderr (the message's first line), exit code 2."""
    raise fail(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)


def _errors() -> tuple[type, ...]:
    from link.model_registration import ModelNameTaken
    from posttrain.errors import PosttrainError
    from serving.errors import ServingError

    return PosttrainError, ServingError, ModelNameTaken, FileNotFoundError


@posttrain_app.command("sft")
def sft(
    base: str = typer.Option("smollm2-135m-instruct", "--base", help="Local base model: a name from `link models`, a .gguf file or a Hugging Face folder."),
    data: list[str] = typer.Option(..., "--data", help=DATA_HELP),
    out: Path = typer.Option(..., "--out", help="Run folder: split.json, run.json, train_log.jsonl, checkpoints/, adapter/."),
    val_fraction: float = typer.Option(0.3, help="Share of each category's conversations held out for evaluation."),
    seed: int = typer.Option(0, help="Seed of the split, the LoRA initialisation and the data order."),
    max_seq_length: int = typer.Option(1024, help="Longest example in tokens; longer ones are left out (counted)."),
    epochs: int = typer.Option(1, help="Passes over the training set."),
    max_steps: int = typer.Option(None, help="Stop after this many optimizer steps (default: all epochs)."),
    rank: int = typer.Option(16, help="LoRA rank r."),
    alpha: float = typer.Option(32, help="LoRA alpha (the update is scaled by alpha / r)."),
    lr: float = typer.Option(5e-4, "--lr", help="Peak learning rate (AdamW, warmup then cosine decay)."),
    batch_size: int = typer.Option(4, help="Sequences per optimizer step."),
    checkpoint_every: int = typer.Option(50, help="Optimizer steps between checkpoints (0: only at the end)."),
    dtype: str = typer.Option("auto", help="Base weights: auto (bfloat16 where the CPU has it), float32 or bfloat16."),
    tool_format: str = typer.Option(None, "--tool-format", help="Harness format: a registered name (json, xml, ...) or a .json/.yaml file of format fields."),
    pii: str = typer.Option("redact", "--pii", help="Personal data in logged traces: drop the trace, redact it, or off."),
    resume: bool = typer.Option(True, "--resume/--no-resume", help="Continue from the run folder's newest checkpoint."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Show the progress bar."),
) -> None:
    """Fine-tune a LoRA adapter on tool-call traces (posttrain.sft.run_sft)."""
    from posttrain.sft import SftJob, prepare_sft, run_sft
    from posttrain.train_config import LoraTrainConfig

    try:
        config = LoraTrainConfig(rank=rank, alpha=alpha, learning_rate=lr, epochs=epochs, max_steps=max_steps,
                                 batch_size=batch_size, max_seq_length=max_seq_length, seed=seed, dtype=dtype,
                                 checkpoint_every=checkpoint_every)
        job = SftJob(base=base, data=tuple(data), out_dir=out, train=config, val_fraction=val_fraction,
                     tool_format=tool_format, pii=pii, resume=resume)
        with err_console.status("reading and checking the traces ...", spinner="dots"):
            prepared = prepare_sft(job)
    except (*_errors(), ValueError) as exc:
        _fail(exc)
    stats = prepared.train_set.stats()
    err_console.print(f"{len(prepared.train_traces)} training and {len(prepared.val_traces)} held-out conversations; "
                      f"{stats['num_examples']} examples, {stats['num_tokens']:,} tokens "
                      f"({stats['num_label_tokens']:,} learned), {stats['num_dropped']} over {max_seq_length} tokens left out"
                      + (f", {stats['num_invalid']} invalid left out" if stats["num_invalid"] else "")
                      + (f"; personal data: {prepared.pii_summary}" if prepared.pii_summary else ""), highlight=False)
    try:
        summary = run_sft(job, progress=progress, prepared=prepared)
    except _errors() as exc:
        _fail(exc)
    _print_train_summary(summary)


def _print_train_summary(summary) -> None:
    from rich.table import Table

    r = summary.result
    table = Table(title=f"LoRA run {summary.out_dir}", show_header=False)
    table.add_column("", style="bold")
    table.add_column("")
    rows = [("steps", f"{r.steps} ({r.epochs:.2f} epochs)" + (f", resumed from step {r.resumed_from}" if r.resumed_from else "")),
            ("examples", f"{r.num_train} trained on, {summary.num_val_traces} conversations held out"),
            ("loss", "-" if r.final_loss is None else f"{r.final_loss:.4f} (smoothed, nats per target token)"),
            ("val loss", "-" if r.val_loss is None else f"{r.val_loss:.4f}"),
            ("tokens/s", f"{r.tokens_per_s:,.0f} ({r.tokens:,} tokens)"),
            ("wall time", f"{r.wall_s:.1f} s"), ("peak memory", f"{r.peak_rss_mb:,.0f} MiB (RSS)"), ("dtype", r.dtype),
            ("adapter", str(r.adapter_dir)), ("split", str(summary.out_dir / "split.json"))]
    for key, value in rows:
        table.add_row(key, value)
    console.print(table)


def _select(traces: list, split_file: Path | None, part: str, val_fraction: float | None, seed: int, limit: int | None) -> list:
    """The traces to score: a split file's part, or the part of a seeded split, then a seeded stratified subset."""
    from posttrain.dataset import split_traces
    from posttrain.errors import PosttrainDataError

    if part not in ("train", "val", "all"):
        raise PosttrainDataError(f"--part must be train, val or all, got {part!r}")
    if split_file is not None:
        record = json.loads(split_file.read_text())
        if part != "all":
            wanted = set(record[part])
            chosen = [t for t in traces if t.id in wanted]
            if len(chosen) != len(wanted):
                raise PosttrainDataError(f"{len(wanted) - len(chosen)} of the {len(wanted)} {part} ids of {split_file} are "
                                         "not in the data; pass the --data the run was trained on")
            traces = chosen
    elif val_fraction is not None and part != "all":
        train, val = split_traces(traces, val_fraction, seed)
        traces = val if part == "val" else train
    if limit is not None and limit < len(traces):
        if limit < 1:
            raise PosttrainDataError(f"--limit must be at least 1, got {limit}")
        traces = split_traces(traces, limit / len(traces), seed)[1]  # seeded and stratified by category
    if not traces:
        raise PosttrainDataError("no traces to score after the selection")
    return traces


@posttrain_app.command("eval")
def evaluate(
    model: str = typer.Option(..., "--model", "-m", help="Local model: a name from `link models`, an exported folder or a .gguf file."),
    data: list[str] = typer.Option(None, "--data", help=DATA_HELP + " Default: the split file's data."),
    split_file: Path = typer.Option(None, "--split-file", help="A run's split.json: score its --part exactly."),
    part: str = typer.Option("val", help="Which part of the split: val, train or all."),
    val_fraction: float = typer.Option(None, help="Without --split-file: split the data like `sft` (e.g. 0.3) and score --part."),
    seed: int = typer.Option(0, help="Seed of that split and of --limit."),
    limit: int = typer.Option(None, help="Score a seeded subset of this many items (stratified by category)."),
    max_tokens: int = typer.Option(256, help="Reply budget per item in tokens."),
    tool_format: str = typer.Option(None, "--tool-format", help="Harness format (default: the split file's, else json)."),
    dtype: str = typer.Option("float32", help="Engine dtype: float32 or bfloat16."),
    out: Path = typer.Option(None, "--out", help="Per-item JSONL (and FILE.metrics.json beside it)."),
) -> None:
    """Score a local model's tool calls against gold answers (posttrain.scorer.ToolCallScorer)."""
    from posttrain.data_specs import read_data
    from posttrain.local_models import local_model_spec
    from posttrain.scorer import ToolCallScorer, render_table, summary_line
    from posttrain.sft import check_format, resolve_tool_format

    try:
        if split_file is not None and not split_file.is_file():
            raise FileNotFoundError(f"split file {split_file} not found; `link posttrain sft --out DIR` writes DIR/split.json")
        record = json.loads(split_file.read_text()) if split_file is not None else {}
        local_model_spec(model)  # not local: fail before reading data
        specs = list(data or record.get("data") or [])
        fmt = resolve_tool_format(tool_format or record.get("tool_format"))
        traces, _ = read_data(specs, pii=None)
        check_format(traces, fmt)
        traces = _select(traces, split_file, part, val_fraction, seed, limit)
        with err_console.status(f"loading {model} ...", spinner="dots"):
            scorer = ToolCallScorer(model, tool_format=fmt, max_tokens=max_tokens, dtype=dtype)
        with err_console.status(f"scoring {len(traces)} items ...", spinner="dots"):
            result = scorer.score(traces)
    except (*_errors(), ValueError) as exc:
        _fail(exc)
    console.print(render_table(result))
    console.print(summary_line(result), highlight=False)
    if out is not None:
        result.write_jsonl(out)
        metrics_path = result.write_metrics(out.with_name(out.name.removesuffix(".jsonl") + ".metrics.json"))
        err_console.print(f"wrote {out} and {metrics_path}", highlight=False)


@posttrain_app.command("export")
def export(
    run: Path = typer.Option(..., "--run", help="The run folder of `link posttrain sft`."),
    name: str = typer.Option(..., "--name", help="The new model's name (what clients send as `model`)."),
    out: Path = typer.Option(None, "--out", help="Model folder (default: $LINK_HOME/models/NAME)."),
    register: bool = typer.Option(True, "--register/--no-register", help="Register it in the gateway database (LINK_DATABASE_URL)."),
    database_url: str = typer.Option(None, "--database-url", help="The gateway database (default: LINK_DATABASE_URL or $LINK_HOME/link.db)."),
    input_cost_per_million: float = typer.Option(None, "--input-cost-per-million", min=0,
                                                 help="USD per 1e6 prompt tokens (default: the base model's configured price)."),
    output_cost_per_million: float = typer.Option(None, "--output-cost-per-million", min=0,
                                                  help="USD per 1e6 completion tokens (default: the base model's configured price)."),
) -> None:
    """Merge the adapter into the base weights, write a safetensors model with provenance, register it.

    Provenance holds the run's metrics, with those of `link posttrain eval --out RUN/eval.jsonl` when present.
    """
    from posttrain.sft import export_run

    try:
        with err_console.status("merging and writing ...", spinner="dots"):
            prices = None
            if input_cost_per_million is not None or output_cost_per_million is not None:
                from posttrain.sft import base_prices

                default_in, default_out = base_prices(json.loads((run / "run.json").read_text())["base"]) \
                    if (run / "run.json").is_file() else (0.0, 0.0)
                prices = (default_in if input_cost_per_million is None else input_cost_per_million,
                          default_out if output_cost_per_million is None else output_cost_per_million)
            folder, row = export_run(run, name, out, register=register, database_url=database_url, prices=prices)
    except (*_errors(), ValueError) as exc:
        _fail(exc)
    trained_format = json.loads((folder / "provenance.json").read_text()).get("tool_format")
    custom = trained_format not in (None, "json", "default")
    label = trained_format if isinstance(trained_format, str) else (trained_format or {}).get("name", "custom")
    console.print(f"exported [bold]{name}[/bold] to {folder}" + (" and registered it: `link serve` serves it" if row else "")
                  + (f" with the {label!r} tool format it was trained on" if row and custom else ""), highlight=False)
    if custom and not row:
        err_console.print(f"[yellow]note:[/yellow] it was trained on the {label!r} tool format; serve it with that "
                          f"`tool_format` (provenance.json has it) on its link.yaml model entry (local: {folder})",
                          highlight=False)
