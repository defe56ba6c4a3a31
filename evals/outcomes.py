"""The outcome table: one row per (prompt, model), the common format of evals and routers.

Every source of routing evidence ends up here: `link eval run` (our own measurements) and the recorded
sets in ../shared/data (RouterBench rows, RouteLLM pairs, AlpacaEval preferences, see `recorded.py`).
The routers (`routers/`) train on it and `link eval replay` charges a policy's picks from it.

    table = OutcomeTable.read("runs/abc/outcomes.jsonl")
    table.models                         # ("gemma-3-270m", "smollm2-135m-instruct")
    ids, models, scores, costs = table.pivot()   # [P], [M], float arrays [P, M] (NaN where missing)
    table.write("out.jsonl")             # or .csv

Columns (`OUTCOME_COLUMNS`):

    prompt_id          str    stable id of the prompt within its suite ("gsm8k/test/17")
    suite              str    the task or benchmark the prompt belongs to ("gsm8k", "arc-challenge")
    prompt             str    the prompt text a router sees (for multi-turn: the first user turn)
    model              str    the model or policy that answered
    score              float  quality in [0, 1] (correctness, pass@1, judge score / 10, preference)
    cost_usd           float  USD spent on the answer (0 for free local models), judge cost excluded
    prompt_tokens      int | None
    completion_tokens  int | None
    latency_s          float | None   seconds from request to complete answer
    response           str | None     the answer text, where recorded
    has_tools          bool           the request offered tools (a tool-calling prompt); rows written before
                                      this column existed read as True for the tool suites (`TOOL_SUITES`)
    signals            dict | None    what the answer itself says of its quality, recorded by
                                      `link eval run --signals` (`routers.signals.answer_signals`: token
                                      confidence, checks, the answer's key, and with --samples the extra samples'
                                      keys, scores, agreement and cost); None where not recorded
"""

from __future__ import annotations

import csv
import gzip
import json
import math
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import IO

import numpy as np

OUTCOME_COLUMNS = ("prompt_id", "suite", "prompt", "model", "score", "cost_usd", "prompt_tokens",
                   "completion_tokens", "latency_s", "response", "has_tools", "signals")
# Suites whose every request offers tools: what a row without a has_tools value means for them.
TOOL_SUITES = frozenset({"bfcl", "nestful"})


@dataclass(frozen=True)
class Outcome:
    """One model's recorded result on one prompt (see the module docstring for the columns).

    Raises:
        ValueError: score outside [0, 1], negative cost, or an empty prompt_id/model.
    """

    prompt_id: str
    suite: str
    prompt: str
    model: str
    score: float
    cost_usd: float = 0.0
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    latency_s: float | None = None
    response: str | None = None
    has_tools: bool = False
    signals: dict | None = None

    def __post_init__(self) -> None:
        if not self.prompt_id or not self.model:
            raise ValueError("an outcome needs a prompt_id and a model")
        if not (0.0 <= self.score <= 1.0) or math.isnan(self.score):
            raise ValueError(f"score must be in [0, 1], got {self.score} ({self.model}, {self.prompt_id})")
        if self.cost_usd < 0 or math.isnan(self.cost_usd):
            raise ValueError(f"cost_usd must be >= 0, got {self.cost_usd} ({self.model}, {self.prompt_id})")

    @classmethod
    def from_dict(cls, row: dict, *, from_csv: bool = False) -> Outcome:
        """Build from a JSON/CSV row; empty strings become None for the optional columns; a missing
        has_tools is True for the suites in `TOOL_SUITES`; a missing cost_usd is 0 USD (`OutcomeTable.read`
        counts such rows). A JSON row's empty response ("") is a recorded empty answer, its null one an
        unrecorded answer; a CSV cell cannot tell the two apart (`from_csv`: both read as None).

        Raises:
            KeyError: no prompt_id, model or score. ValueError: a null or non-numeric value (the message names
                the field), or a value `Outcome` refuses.
        """
        def opt(name, cast):
            value = row.get(name)
            return None if value in (None, "") else _cast(name, value, cast)
        suite = str(row.get("suite") or "")
        tools = row.get("has_tools")
        has_tools = (suite in TOOL_SUITES if tools in (None, "")
                     else tools is True or str(tools).strip().lower() in ("true", "1"))
        response = row.get("response")
        response = None if response is None or (from_csv and response == "") else str(response)
        score = row["score"]
        if score in (None, ""):
            raise ValueError("field 'score' is empty (null); every outcome row needs a score in [0, 1]")
        return cls(prompt_id=str(row["prompt_id"]), suite=suite, prompt=str(row.get("prompt") or ""),
                   model=str(row["model"]), score=_cast("score", score, float), cost_usd=opt("cost_usd", float) or 0.0,
                   prompt_tokens=opt("prompt_tokens", int), completion_tokens=opt("completion_tokens", int),
                   latency_s=opt("latency_s", float), response=response, has_tools=has_tools,
                   signals=opt("signals", _signals_of))


class OutcomeTable:
    """An ordered collection of outcomes with the views routers and reports need.

    Args:
        rows: outcomes; a (prompt_id, model) pair may appear once only.
    Raises:
        ValueError: a duplicated (prompt_id, model) pair.
    """

    def __init__(self, rows: Iterable[Outcome] = ()):
        self.rows: list[Outcome] = list(rows)
        self.warnings: list[str] = []   # what `read` accepted but a reader should hear (rows without cost_usd)
        seen: set[tuple[str, str]] = set()
        for row in self.rows:
            key = (row.prompt_id, row.model)
            if key in seen:
                raise ValueError(f"duplicate outcome for prompt {row.prompt_id!r} and model {row.model!r}")
            seen.add(key)

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self) -> Iterator[Outcome]:
        return iter(self.rows)

    @property
    def models(self) -> tuple[str, ...]:
        """Model names in order of first appearance."""
        return tuple(dict.fromkeys(r.model for r in self.rows))

    @property
    def prompt_ids(self) -> tuple[str, ...]:
        """Prompt ids in order of first appearance."""
        return tuple(dict.fromkeys(r.prompt_id for r in self.rows))

    def prompts(self) -> dict[str, tuple[str, str]]:
        """prompt_id -> (suite, prompt text), from the first row of each prompt."""
        out: dict[str, tuple[str, str]] = {}
        for r in self.rows:
            out.setdefault(r.prompt_id, (r.suite, r.prompt))
        return out

    def select(self, *, models: Iterable[str] | None = None, prompt_ids: Iterable[str] | None = None) -> OutcomeTable:
        """The rows of the given models and/or prompts (order kept)."""
        keep_m = None if models is None else set(models)
        keep_p = None if prompt_ids is None else set(prompt_ids)
        return OutcomeTable(r for r in self.rows
                            if (keep_m is None or r.model in keep_m) and (keep_p is None or r.prompt_id in keep_p))

    def pivot(self) -> tuple[list[str], list[str], np.ndarray, np.ndarray]:
        """(prompt_ids [P], models [M], scores [P, M], costs [P, M] in USD); NaN where a pair is missing."""
        ids, models = list(self.prompt_ids), list(self.models)
        pi = {p: i for i, p in enumerate(ids)}
        mi = {m: j for j, m in enumerate(models)}
        scores = np.full((len(ids), len(models)), np.nan)
        costs = np.full((len(ids), len(models)), np.nan)
        for r in self.rows:
            scores[pi[r.prompt_id], mi[r.model]] = r.score
            costs[pi[r.prompt_id], mi[r.model]] = r.cost_usd
        return ids, models, scores, costs

    def extend(self, other: Iterable[Outcome]) -> OutcomeTable:
        """A new table with the rows of both (duplicates raise)."""
        return OutcomeTable([*self.rows, *other])

    # --- files ------------------------------------------------------------------------------------

    def write(self, path: str | Path, *, text: bool = True) -> Path:
        """Write as JSON lines (`.jsonl`) or CSV (`.csv`), chosen by the suffix, gzip-compressed when the name
        ends in `.gz` (`outcomes.jsonl.gz`). `text=False` leaves out the prompt and response texts (ids, scores,
        costs and signals only: what may be shipped of a benchmark whose texts are not ours). Returns the path."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        records = [asdict(r) if text else {**asdict(r), "prompt": "", "response": None} for r in self.rows]
        if _is_csv(path):
            with _open_text(path, "w") as f:
                writer = csv.DictWriter(f, fieldnames=OUTCOME_COLUMNS)
                writer.writeheader()
                for record in records:
                    writer.writerow({k: ("" if v is None else json.dumps(v) if isinstance(v, dict) else v)
                                     for k, v in record.items()})
        else:
            with _open_text(path, "w") as f:
                for record in records:
                    f.write(json.dumps(record, ensure_ascii=False) + "\n")
        return path

    @classmethod
    def read(cls, path: str | Path, *, require_prompt: bool = False) -> OutcomeTable:
        """Read a `.jsonl` or `.csv` outcome file, or either gzip-compressed (`.jsonl.gz`, `.csv.gz`).

        Rows without cost_usd read as 0 USD and are counted in the table's `warnings`. A text-free file (every
        prompt empty, as `write(text=False)` ships it) reads as it is: replay by prompt id needs no text.

        Args:
            require_prompt: refuse rows without prompt text (what a router reads: it embeds the prompt).
        Raises:
            ValueError: a bad row (the message names its line and field), or with `require_prompt` a row
                without prompt text (its line; a file without any prompt text says so).
            OSError: the file is missing, or a `.gz` name holds no gzip data (gzip.BadGzipFile).
        """
        path = Path(path)
        rows: list[Outcome] = []
        no_cost, no_prompt = 0, []          # rows without cost_usd; line numbers of rows without prompt text
        is_csv = _is_csv(path)
        with _open_text(path, "r") as f:
            # (line number, raw record): blank JSON lines are skipped but still counted
            numbered = (enumerate(csv.DictReader(f), start=2) if is_csv
                        else ((n, line) for n, line in enumerate(f, start=1) if line.strip()))
            for number, record in numbered:
                try:
                    record = record if isinstance(record, dict) else json.loads(record)
                    rows.append(Outcome.from_dict(record, from_csv=is_csv))
                except KeyError as exc:   # a required column is missing
                    raise ValueError(f"{path}:{number}: bad outcome row: missing field {exc}; an outcome row needs "
                                     "prompt_id, model and score") from exc
                except (ValueError, TypeError, AttributeError) as exc:   # AttributeError: a row that is not an object
                    raise ValueError(f"{path}:{number}: bad outcome row: {exc}") from exc
                no_cost += record.get("cost_usd") in (None, "")
                if not rows[-1].prompt:
                    no_prompt.append(number)
        if require_prompt and no_prompt:
            if len(no_prompt) == len(rows):
                raise ValueError(f"{path}: no prompt text on any row (field 'prompt'; a text-free file, as shipped "
                                 "with ids and scores only): a router embeds the prompt; join the prompts back in, "
                                 "or replay it by prompt id (`link eval replay`)")
            raise ValueError(f"{path}:{no_prompt[0]}: bad outcome row: no prompt text (field 'prompt'), nor on "
                             f"{len(no_prompt) - 1} other rows; a router embeds the prompt")
        table = cls(rows)
        if no_cost:
            table.warnings.append(f"{no_cost} rows of {path} have no cost_usd; read as 0 USD (a free model)")
        return table


def _cast(name: str, value, cast):
    """`cast(value)`, its error naming the field `name`."""
    try:
        return cast(value)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"field {name!r}: {exc}") from exc


def _signals_of(value) -> dict:
    """A `signals` cell: a dict (JSON lines) or its JSON text (CSV). Raises ValueError for anything else."""
    value = json.loads(value) if isinstance(value, str) else value
    if not isinstance(value, dict):
        raise ValueError(f"signals must be an object, got {type(value).__name__}")
    return value


def _is_csv(path: Path) -> bool:
    return path.suffixes[-2:] == [".csv", ".gz"] if path.suffix == ".gz" else path.suffix == ".csv"


def _open_text(path: Path, mode: str) -> IO[str]:
    """`path` opened for text in `mode` ("r" or "w"), through gzip when its name ends in `.gz`."""
    if path.suffix == ".gz":
        return gzip.open(path, mode + "t", encoding="utf-8", newline="")
    return path.open(mode, encoding="utf-8", newline="")


assert tuple(f.name for f in fields(Outcome)) == OUTCOME_COLUMNS
