"""Loaders that bring the recorded routing sets of ../shared/data into outcome tables.

    table = load_recorded("routerbench:test", data_dir)      # 11 models on ARC-Challenge, MBPP, Winogrande
    table = load_recorded("routellm-mmlu", data_dir)         # gpt-4-1106-preview vs Mixtral-8x7B on MMLU
    table = load_recorded("alpaca-eval", data_dir)           # 58 models' preferences against gpt4_1106_preview
    table = load_recorded("local-pool:gsm8k", data_dir)      # our local models through the gateway, with signals

A spec is `name` or `name:argument` with a name from `RECORDED`; the argument is the split for
RouterBench ("train" or "test", default "test") and the baseline for AlpacaEval. The costs of
RouteLLM and AlpacaEval are estimates (see `evals/prices.py`); RouterBench's are recorded.
"""

from __future__ import annotations

import ast
import csv
import json
import os
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from evals.outcomes import Outcome, OutcomeTable
from evals.prices import estimate_cost_usd, model_price, tokens_for_chars

ROUTERBENCH_DIR = Path("routerdc") / "datasets" / "routerbench_zs"
ROUTELLM_DIR = Path("routellm") / "routellm" / "evals"
ALPACA_DIR = Path("alpaca_eval")
ALPACA_PREFERENCES = ALPACA_DIR / "derived" / "alpaca_eval_per_prompt_preferences.csv"
_NOT_MODELS = {"", "sample_id", "prompt", "eval_name", "oracle_model_to_route_to"}


def default_data_dir() -> Path:
    """`LINK_DATASETS_DIR` when set, else ../shared/data (the layout every loader expects)."""
    return Path(os.environ.get("LINK_DATASETS_DIR") or Path("..") / "shared" / "data")


def _read_csv(path: Path) -> list[dict[str, str]]:
    csv.field_size_limit(2**31 - 1)  # recorded responses exceed the csv module's default 128 KiB field limit
    with path.open(encoding="utf-8", newline="") as f:
        return list(csv.DictReader(f))


def _require(path: Path) -> Path:
    if not path.exists():
        raise FileNotFoundError(f"{path} not found; point --data-dir (or LINK_DATASETS_DIR) at a copy of ../shared/data")
    return path


def load_routerbench(data_dir: Path, split: str = "test") -> OutcomeTable:
    """RouterBench rows (ARC-Challenge, MBPP, Winogrande) of `split` as outcomes of 11 models.

    One outcome per (row, model) whose 0/1 correctness cell is filled: prompt_id = `sample_id`,
    suite = `eval_name`, prompt = the string inside the stringified Python list of `prompt` (parsed
    with `ast.literal_eval`), score = the model's column, cost_usd = `<model>|total_cost` (recorded),
    response = `<model>|model_response`; tokens and latency are not recorded (None).

    Empty cells are skipped: 6 ARC test rows (20 train) hold the prompt twice in their list and carry
    only gpt-3.5-turbo-1106's score, and the twin row of the same `sample_id`, where there is one, carries
    the other 10 models. No (sample_id, model) pair is filled twice, so the twins merge into one prompt.

    Args:
        data_dir: a folder laid out like ../shared/data.
        split: "train" or "test".
    Raises:
        FileNotFoundError: the RouterBench folder is missing. ValueError: an unknown split.
    """
    folder = _require(Path(data_dir) / ROUTERBENCH_DIR)
    files = sorted(folder.glob(f"*_{split}.csv"))
    if not files:
        raise ValueError(f"RouterBench has no split {split!r}; splits: train, test")
    rows: list[Outcome] = []
    for path in files:
        for record in _read_csv(path):
            turns = ast.literal_eval(record["prompt"])
            prompt = turns[0] if isinstance(turns, list) else str(turns)
            models = [k for k in record if k not in _NOT_MODELS and "|" not in k]
            for model in models:
                if record[model] == "":
                    continue
                rows.append(Outcome(prompt_id=record["sample_id"], suite=record["eval_name"], prompt=prompt, model=model,
                                    score=float(record[model]), cost_usd=float(record[f"{model}|total_cost"]),
                                    response=record.get(f"{model}|model_response") or None))
    return OutcomeTable(rows)


def load_routellm(data_dir: Path, benchmark: str) -> OutcomeTable:
    """RouteLLM's recorded pair, gpt-4-1106-preview vs Mixtral-8x7B-Instruct, on "mmlu" or "gsm8k".

    Score: the model's True/False column (1.0/0.0). prompt_id: "routellm-mmlu/<subject>/<row>" (57 subject
    files, 14,042 rows) or "routellm-gsm8k/<row>" (1,319 rows); suite: "mmlu" or "gsm8k".

    Cost is an estimate, since the CSVs record no tokens: prompt tokens = ceil(prompt characters / 4);
    completion tokens = ceil(response characters / 4) for GSM8K (responses recorded) and 1 for MMLU (no
    response recorded; the answer is one letter); times the model's price from cost.json or
    `evals.prices.FALLBACK_PRICES`. Tokens are left None (they were not measured).

    Raises:
        FileNotFoundError: the RouteLLM files are missing. ValueError: another benchmark.
    """
    base = Path(data_dir) / ROUTELLM_DIR
    if benchmark == "mmlu":
        files = sorted(_require(base / "mmlu" / "responses").glob("mmlu_*.csv"))
    elif benchmark == "gsm8k":
        files = [_require(base / "gsm8k" / "gsm8k_responses.csv")]
    else:
        raise ValueError(f"RouteLLM records 'mmlu' and 'gsm8k', not {benchmark!r}")
    rows: list[Outcome] = []
    for path in files:
        records = _read_csv(path)
        models = [k for k in records[0] if k != "prompt" and not k.endswith("_response")] if records else []
        prefix = f"routellm-mmlu/{path.stem.removeprefix('mmlu_')}" if benchmark == "mmlu" else "routellm-gsm8k"
        for i, record in enumerate(records):
            for model in models:
                response = record.get(f"{model}_response") or None
                cost = estimate_cost_usd(record["prompt"], response, model_price(model, data_dir),
                                         completion_tokens=1 if benchmark == "mmlu" else None)
                rows.append(Outcome(prompt_id=f"{prefix}/{i}", suite=benchmark, prompt=record["prompt"], model=model,
                                    score=1.0 if record[model] == "True" else 0.0, cost_usd=cost, response=response))
    return OutcomeTable(rows)


def alpaca_eval_instructions(data_dir: Path) -> list[str]:
    """The 805 AlpacaEval instructions in order, from the first `alpaca_eval/results/*/model_outputs.json`
    (every model's file lists the same instructions in the same order)."""
    files = sorted(_require(Path(data_dir) / ALPACA_DIR / "results").glob("*/model_outputs.json"))
    if not files:
        raise FileNotFoundError(f"no model_outputs.json under {Path(data_dir) / ALPACA_DIR / 'results'}")
    return [entry["instruction"] for entry in json.loads(files[0].read_text(encoding="utf-8"))]


def _alpaca_rows(data_dir: Path, baseline: str) -> list[dict[str, str]]:
    rows = [r for r in _read_csv(_require(Path(data_dir) / ALPACA_PREFERENCES))
            if r["generator_1_baseline"] == baseline and r["preference"] != ""]
    if not rows:
        raise ValueError(f"no AlpacaEval preferences against baseline {baseline!r}; "
                         "baselines: gpt4_1106_preview, text_davinci_003")
    return rows


def alpaca_score(preference: float) -> float:
    """AlpacaEval preference -> score in [0, 1]: preference - 1 (1 = baseline wins, 2 = model wins), and
    0.5 for a preference of 0, which AlpacaEval's discrete annotators write for a draw."""
    return 0.5 if preference == 0 else preference - 1.0


def load_alpaca_eval_preferences(data_dir: Path, baseline: str = "gpt4_1106_preview") -> OutcomeTable:
    """AlpacaEval per-prompt judge preferences against `baseline` as outcomes; the mean score per model
    is its leaderboard win rate (/ 100).

    prompt_id: "alpaca-eval/<instruction_index>"; suite: "alpaca-eval"; prompt: the instruction
    (`alpaca_eval_instructions`); score: `alpaca_score(preference)`; rows without a preference are
    skipped; response: None (`load_alpaca_eval_lengths` gives the output lengths).
    Cost: estimated as in `load_routellm` (prompt characters / 4 and the recorded output length / 4
    tokens) for a model with a known price (`evals.prices.model_price`), else 0 (most models here).

    Args:
        baseline: "gpt4_1106_preview" (annotator weighted_alpaca_eval_gpt4_turbo, AlpacaEval 2) or
            "text_davinci_003" (annotator alpaca_eval_gpt4, AlpacaEval 1).
    Raises:
        FileNotFoundError: the AlpacaEval files are missing. ValueError: an unknown baseline.
    """
    instructions = alpaca_eval_instructions(data_dir)
    out: list[Outcome] = []
    for r in _alpaca_rows(data_dir, baseline):
        index, model = int(r["instruction_index"]), r["model"]
        price = model_price(model, data_dir)
        cost = 0.0 if price is None else estimate_cost_usd(instructions[index], None, price,
                                                           completion_tokens=tokens_for_chars(int(r["output_2_chars"])))
        out.append(Outcome(prompt_id=f"alpaca-eval/{index}", suite="alpaca-eval", prompt=instructions[index], model=model,
                           score=alpaca_score(float(r["preference"])), cost_usd=cost))
    return OutcomeTable(out)


def load_alpaca_eval_lengths(data_dir: Path, baseline: str = "gpt4_1106_preview") -> dict[tuple[str, str], tuple[int, int]]:
    """(prompt_id, model) -> (model output characters, baseline output characters), for the rows of
    `load_alpaca_eval_preferences` (the inputs of `evals.stats.length_controlled_win_rate`)."""
    return {(f"alpaca-eval/{int(r['instruction_index'])}", r["model"]): (int(r["output_2_chars"]), int(r["output_1_chars"]))
            for r in _alpaca_rows(data_dir, baseline)}


# The local pool's outcomes, measured through the gateway and shipped without prompt or answer text
# (`link eval export`); README.md there gives the commands that remake them.
POOL_DIR = Path(__file__).parent / "pool"


def load_local_pool(data_dir: Path, suite: str | None = None) -> OutcomeTable:
    """The shipped outcomes of the local pool (`POOL_DIR/*.jsonl.gz`; `suite`: only that suite's files, named
    "<suite>-..."), each row's prompt text re-attached from the suite's own data by item id (the text is not
    shipped: it is the benchmark's). Rows whose item the data folder lacks keep an empty prompt.

    Raises:
        FileNotFoundError: no shipped file (for `suite`). ValueError: a bad row.
    """
    from evals.base import make_suite

    files = sorted(POOL_DIR.glob(f"{suite or ''}*.jsonl.gz"))
    if not files:
        raise FileNotFoundError(f"no shipped pool outcomes{f' of {suite!r}' if suite else ''} in {POOL_DIR}")
    rows = [row for f in files for row in OutcomeTable.read(f)]
    texts: dict[str, str] = {}
    for name, split in sorted({(r.suite, r.prompt_id.split("/")[1]) for r in rows}):
        try:
            texts.update((item.id, item.prompt) for item in make_suite(name, data_dir).load(split))
        except (FileNotFoundError, ValueError):
            continue   # that suite's data is not here: its rows keep no text
    return OutcomeTable(Outcome(**{**asdict(r), "prompt": texts.get(r.prompt_id, r.prompt)}) for r in rows)


# name -> loader(data_dir, argument or None)
RECORDED: dict[str, Callable[[Path, str | None], OutcomeTable]] = {
    "local-pool": load_local_pool,
    "routerbench": lambda d, arg: load_routerbench(d, arg or "test"),
    "routellm-mmlu": lambda d, arg: load_routellm(d, "mmlu"),
    "routellm-gsm8k": lambda d, arg: load_routellm(d, "gsm8k"),
    "alpaca-eval": lambda d, arg: load_alpaca_eval_preferences(d, arg or "gpt4_1106_preview"),
}
_TAKES_ARGUMENT = {"routerbench", "alpaca-eval", "local-pool"}


def is_recorded_spec(spec: str) -> bool:
    """True when `spec` names a recorded set ("routerbench", "routerbench:train", ...)."""
    return spec.partition(":")[0] in RECORDED


def load_recorded(spec: str, data_dir: Path | None = None, *, split: str | None = None) -> OutcomeTable:
    """The outcome table of a recorded-set spec ("routerbench:test", "routellm-mmlu", "alpaca-eval:text_davinci_003").

    Args:
        spec: `name[:argument]`, name from `RECORDED`.
        data_dir: the data folder (default `default_data_dir()`).
        split: RouterBench's split when the spec names none (the CLI's `--split`); ignored by the other sets.
    Raises:
        ValueError: an unknown name, or an argument for a set that takes none. FileNotFoundError: missing files.
    """
    name, has_arg, arg = spec.partition(":")
    if name not in RECORDED:
        raise ValueError(f"unknown recorded set {name!r}; available: {', '.join(sorted(RECORDED))}")
    if has_arg and name not in _TAKES_ARGUMENT:
        raise ValueError(f"recorded set {name!r} takes no ':argument' (got {spec!r})")
    if not has_arg and name == "routerbench":
        arg = split or ""
    return RECORDED[name](Path(data_dir) if data_dir is not None else default_data_dir(), arg or None)


def load_source(source: str, data_dir: Path | None = None, *, split: str | None = None,
                require_prompt: bool = False) -> OutcomeTable:
    """An outcome table from an outcome file (.jsonl/.csv, or either gzipped: .jsonl.gz/.csv.gz), a folder
    holding outcomes.jsonl (a run's folder), or a recorded-set spec (see `load_recorded`); `require_prompt`
    refuses a file's rows without prompt text (`OutcomeTable.read`).

    Raises:
        FileNotFoundError: a missing file. ValueError: neither a file nor a known spec, or a bad row.
    """
    path = Path(source)
    if path.is_file():
        return OutcomeTable.read(path, require_prompt=require_prompt)
    if path.is_dir() and (path / "outcomes.jsonl").is_file():
        return OutcomeTable.read(path / "outcomes.jsonl", require_prompt=require_prompt)
    if is_recorded_spec(source):
        return load_recorded(source, data_dir, split=split)
    if path.suffix in (".jsonl", ".csv", ".gz") or path.is_dir():
        raise FileNotFoundError(f"no outcome file at {path}")
    raise ValueError(f"{source!r} is neither an outcome file (.jsonl/.csv, optionally .gz) nor a recorded set "
                     f"({', '.join(sorted(RECORDED))}, optionally ':argument')")
