"""A fine-tuning run folder end to end: traces -> checked dataset -> LoRA run (`run_sft`) -> export (`export_run`).

    job = SftJob(base="smollm2-135m-instruct", data=("bfcl",), out_dir=Path("runs/bfcl"),
                 train=LoraTrainConfig(max_seq_length=1024), val_fraction=0.3, seed=0)
    prepared = prepare_sft(job)     # every check on the data, format and base model; nothing loaded or trained
    summary = run_sft(job)          # prepare, then train; writes out_dir/split.json and out_dir/run.json
    folder, row = export_run(Path("runs/bfcl"), "acme-tools", register=True)

`prepare_sft` does every check that can fail on bad input before any model weights are read or any training
step runs: the base model is local (`posttrain.local_models`), the traces read and offer tools
(`posttrain.data_specs`), the personal-data filter leaves some, every tool schema is one the harness format can
carry (`ToolCallFormat.check_tools`), and the dataset is not empty after dropping examples over
max_seq_length. The split (by conversation, stratified by category, seeded: `posttrain.dataset.split_traces`)
is written to out_dir/split.json so that `link posttrain eval --split-file` scores exactly the held-out part.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from posttrain.errors import PosttrainDataError
from posttrain.train_config import LoraTrainConfig

SPLIT_FILE, RUN_FILE = "split.json", "run.json"


@dataclass(frozen=True)
class SftJob:
    """What to fine-tune on what.

    Attributes:
        base: a local model (registry name, .gguf file or Hugging Face folder).
        data: `--data` specs (posttrain.data_specs).
        out_dir: the run folder (split.json, run.json, train_log.jsonl, checkpoints/, adapter/, result.json).
        train: LoRA settings; its max_seq_length also limits the dataset and its seed the split.
        val_fraction: share of each category's conversations held out (0 = none).
        tool_format: the harness format (a registered name or a dict of fields; None = the default).
        pii: "drop", "redact" or "off": the personal-data filter on logged traces.
        resume: continue from out_dir's newest checkpoint.
    """

    base: str
    data: tuple[str, ...]
    out_dir: Path
    train: LoraTrainConfig = field(default_factory=LoraTrainConfig)
    val_fraction: float = 0.3
    tool_format: Any = None
    pii: str = "redact"
    resume: bool = True


@dataclass(frozen=True)
class PreparedSft:
    """A checked job: the base model's spec, the split traces and their tokenized datasets."""

    job: SftJob
    spec: Any  # serving.registry.ModelSpec
    train_traces: list
    val_traces: list
    train_set: Any  # posttrain.dataset.TraceDataset
    val_set: Any  # TraceDataset or None
    pii_summary: str | None

    def split_record(self) -> dict:
        """The content of split.json."""
        return {"seed": self.job.train.seed, "val_fraction": self.job.val_fraction, "data": list(self.job.data),
                "base": self.job.base, "tool_format": format_config(resolve_tool_format(self.job.tool_format)),
                "max_seq_length": self.job.train.max_seq_length,
                "train": [t.id for t in self.train_traces], "val": [t.id for t in self.val_traces],
                "dropped_too_long": list(self.train_set.dropped), "invalid": [list(x) for x in self.train_set.invalid]}


def format_config(fmt) -> str | dict:
    """A `ToolCallFormat` as link.yaml's `tool_format` value: its registered name when it is a registered format,
    else the dict of all its fields (so split.json, run.json and the registered model keep a custom format whole,
    not only its name)."""
    import dataclasses

    from serving.tools.formats import FORMATS

    if FORMATS.get(fmt.name) == fmt:
        return fmt.name
    return dataclasses.asdict(fmt)


def resolve_tool_format(tool_format: Any):
    """The harness format for None (the default JSON format), a registered name, a dict of fields, a
    `ToolCallFormat`, or a .json/.yaml file holding a dict of fields (`posttrain.dataset.resolve_tool_format`).

    Raises:
        PosttrainDataError: an unknown name, a bad field, a missing or unreadable file.
    """
    from posttrain.dataset import resolve_tool_format as from_config

    if isinstance(tool_format, str) and tool_format.endswith((".json", ".yaml", ".yml")):
        path = Path(tool_format)
        if not path.is_file():
            raise PosttrainDataError(f"tool format file {path} not found")
        import yaml

        try:
            tool_format = yaml.safe_load(path.read_text())  # JSON is YAML
        except yaml.YAMLError as exc:
            raise PosttrainDataError(f"tool format file {path} is not JSON or YAML: {exc}") from None
    return from_config(tool_format)


def check_format(traces, fmt) -> None:
    """Refuse, naming the trace, tools the harness format cannot carry (`ToolCallFormat.check_tools`)."""
    from serving.errors import ServingError

    for trace in traces:
        try:
            fmt.check_tools(trace.tools or None)
        except ServingError as exc:
            raise PosttrainDataError(f"trace {trace.id}: the {fmt.name!r} tool format cannot express its tools: {exc}") from None


def prepare_sft(job: SftJob) -> PreparedSft:
    """Every check of `job` that bad input can fail, in a few seconds and without loading model weights.

    Raises:
        ModelNotLocalError: the base is not a local model.
        PosttrainDataError: bad data specs or traces, no traces with tools, nothing left after the PII filter, tools
            the harness format cannot express, val_fraction out of range, or an empty training set (e.g. every
            example over max_seq_length).
    """
    from posttrain.data_specs import read_data
    from posttrain.dataset import TraceDataset, load_chat_tokenizer, split_traces
    from posttrain.local_models import local_model_spec
    from posttrain.pii import PiiConfig

    spec = local_model_spec(job.base)
    fmt = resolve_tool_format(job.tool_format)
    if job.pii not in ("drop", "redact", "off"):
        raise PosttrainDataError(f"--pii must be drop, redact or off, got {job.pii!r}")
    traces, report = read_data(job.data, pii=None if job.pii == "off" else PiiConfig(action=job.pii))
    check_format(traces, fmt)
    train, val = split_traces(traces, job.val_fraction, job.train.seed)
    if not train:
        raise PosttrainDataError(f"the training split is empty ({len(traces)} traces, val_fraction {job.val_fraction}); "
                                 "add data or lower --val-fraction")
    tokenizer, chat_format = load_chat_tokenizer(spec)
    skip = any(t.meta.get("source") == "log" for t in traces)  # a logged reply may call a tool it was not offered
    train_set = TraceDataset(train, tokenizer, chat_format, max_seq_length=job.train.max_seq_length, tool_format=fmt,
                             skip_invalid=skip)
    val_set = None
    if val:
        try:
            val_set = TraceDataset(val, tokenizer, chat_format, max_seq_length=job.train.max_seq_length, tool_format=fmt,
                                   skip_invalid=skip)
        except PosttrainDataError:  # every held-out example too long: no validation loss, the split stands
            val_set = None
    return PreparedSft(job, spec, train, val, train_set, val_set, report.summary() if report is not None else None)


@dataclass(frozen=True)
class SftSummary:
    """What `run_sft` did: the dataset's stats and the training result (posttrain.train.TrainResult)."""

    out_dir: Path
    num_train_traces: int
    num_val_traces: int
    dataset: dict
    result: Any
    pii_summary: str | None

    def to_json(self) -> dict:
        return {"out_dir": str(self.out_dir), "num_train_traces": self.num_train_traces,
                "num_val_traces": self.num_val_traces, "dataset": self.dataset, "train": self.result.to_json(),
                "pii": self.pii_summary}


def run_sft(job: SftJob, *, progress: bool = True, prepared: PreparedSft | None = None) -> SftSummary:
    """Check the job (`prepare_sft`), convert the base to a Hugging Face folder if needed, write split.json and
    train (`posttrain.train.train_lora`); run.json records job, dataset and result.

    Raises:
        the errors of `prepare_sft`; TrainingError (before any step) from `resolve_base` and `train_lora`.
    """
    from posttrain.base_model import resolve_base
    from posttrain.train import train_lora

    prepared = prepared or prepare_sft(job)
    base_dir = resolve_base(prepared.spec.resolve_path())
    out_dir = Path(job.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    split = prepared.split_record()
    previous = out_dir / SPLIT_FILE
    if job.resume and previous.is_file() and json.loads(previous.read_text()).get("val") != split["val"]:
        raise PosttrainDataError(f"{previous} holds another split (other data, seed or val_fraction); use a new --out "
                                 "or --no-resume")
    previous.write_text(json.dumps(split, indent=1) + "\n")
    val = list(prepared.val_set) if prepared.val_set is not None else None
    result = train_lora(base_dir, list(prepared.train_set), val, out_dir, job.train, resume=job.resume, progress=progress)
    summary = SftSummary(out_dir, len(prepared.train_traces), len(prepared.val_traces), prepared.train_set.stats(),
                         result, prepared.pii_summary)
    record = {"base": job.base, "base_dir": str(base_dir), "data": list(job.data), "tool_format": split["tool_format"],
              "val_fraction": job.val_fraction, "pii": job.pii, "config": dataclasses.asdict(job.train),
              "data_sha256": hashlib.sha256(json.dumps(split["train"]).encode()).hexdigest(), **summary.to_json()}
    (out_dir / RUN_FILE).write_text(json.dumps(record, indent=2, default=str) + "\n")
    return summary


def read_run(run_dir: str | Path) -> dict:
    """run.json of a finished `run_sft` folder.

    Raises:
        PosttrainDataError: no run.json or no adapter/ (the run did not finish).
    """
    run_dir = Path(run_dir)
    if not (run_dir / RUN_FILE).is_file() or not (run_dir / "adapter" / "adapter_config.json").is_file():
        raise PosttrainDataError(f"{run_dir} is not a finished fine-tuning run (run.json and adapter/ missing); run "
                                 "`link posttrain sft --out DIR` first, or finish it (it resumes)")
    return json.loads((run_dir / RUN_FILE).read_text())


def export_run(run_dir: str | Path, name: str, out_dir: str | Path | None = None, *, register: bool = True,
               database_url: str | None = None, prices: tuple[float, float] | None = None) -> tuple[Path, Any]:
    """Merge a run's adapter into its base (`posttrain.export.export_adapter`) and register the folder as local
    model `name` in the gateway database (`link.model_registration.register_local_model`).

    Provenance: base model, data specs and the training split's hash, tool format, steps, training config, and
    metrics (train and validation loss; run_dir/eval.metrics.json when `link posttrain eval` wrote one there).

    Args:
        out_dir: the model folder (default: $LINK_HOME/models/<name>, "/" in the name becoming "--").
        register: also register it; database_url: the gateway's (default: LINK_DATABASE_URL / settings).
        prices: (input, output) USD per 1e6 tokens for routing and accounting (default: the base model's prices in
            the gateway config, else 0): a fine-tuned model costs what its base costs to run, so a router weighs
            its quality at the base's price rather than as free.
    Returns:
        (the folder, the registered row (link.db.models.ModelPublic) or None).
    Raises:
        PosttrainDataError: not a finished run. ModelNameTaken: `name` is a local registry name (checked before
        merging) or already registered. ExportError: out_dir exists and is not empty.
    """
    from link.model_registration import ModelNameTaken, register_local_model
    from link.settings import get_settings
    from posttrain.export import export_adapter
    from serving.paths import link_home
    from serving.registry import default_registry

    run_dir = Path(run_dir)
    run = read_run(run_dir)
    if register:  # a bad or taken name fails before the merge, not after it
        from pydantic import ValidationError

        from link.config import ModelDeployment

        if name in default_registry().names():
            raise ModelNameTaken(f"model name {name!r} is already a local model; choose another name")
        try:
            ModelDeployment(name=name, kind="local", local=str(run_dir.resolve()), architecture="llama")
        except ValidationError as exc:
            raise ValueError(f"cannot register {name!r}: {exc.errors()[0]['msg'].removeprefix('Value error, ')}") from None
        database_url = database_url or get_settings().database_url
        if name in _registered_names(database_url):
            raise ModelNameTaken(f"model name {name!r} is already registered in the gateway database; choose another name")
    metrics = {"final_loss": run["train"]["final_loss"], "val_loss": run["train"]["val_loss"]}
    eval_file = run_dir / "eval.metrics.json"
    if eval_file.is_file():
        metrics["eval"] = json.loads(eval_file.read_text())
    provenance = {"base_model": run["base"], "tool_format": run["tool_format"],
                  "data": {"specs": run["data"], "train_sha256": run["data_sha256"], "num_train": run["num_train_traces"],
                           "num_val": run["num_val_traces"], "val_fraction": run["val_fraction"], "pii": run["pii"]},
                  "steps": run["train"]["steps"], "epochs": run["train"]["epochs"], "training": run["config"],
                  "metrics": metrics}
    folder = Path(out_dir) if out_dir is not None else link_home() / "models" / name.replace("/", "--")
    folder = export_adapter(run["base_dir"], run_dir / "adapter", folder, name=name, provenance=provenance)
    row = None
    if register:
        input_price, output_price = prices if prices is not None else base_prices(run["base"])
        row = register_local_model(database_url, name, folder, tool_format=_registered_format(run["tool_format"]),
                                   input_cost_per_million=input_price, output_cost_per_million=output_price)
    return folder, row


def base_prices(base: str) -> tuple[float, float]:
    """(input, output) USD per 1e6 tokens of the gateway-config model named `base` (LINK_CONFIG, else the embedded
    default), or (0, 0) when no configured model has that name (a .gguf path or a folder)."""
    from link.config import load_config
    from link.settings import get_settings

    for model in load_config(get_settings().config).models:
        if model.name == base:
            return model.input_cost_per_million, model.output_cost_per_million
    return 0.0, 0.0


def _registered_format(tool_format: Any) -> str | dict | None:
    """The model's `tool_format` registration value from run.json's: None for the default JSON format (the
    serving default), else the format as link.yaml writes it."""
    value = format_config(resolve_tool_format(tool_format))
    return None if value in ("json", "default") else value


def _registered_names(database_url: str) -> set[str]:
    """Names of the models registered in the database (none when it has no model table yet)."""
    from sqlalchemy import inspect

    from link.db import make_db_engine
    from link.db.models import ModelRow
    from link.model_registration import registered_deployments

    engine = make_db_engine(database_url, pool_size=1)
    try:
        if not inspect(engine).has_table(ModelRow.__tablename__):
            return set()
        return {d.name for d in registered_deployments(engine)}
    finally:
        engine.dispose()
