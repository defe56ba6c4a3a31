"""The serving benchmark's workloads besides the default one, and their request shapes as a replayable mix.

    workload_texts("repetitive", data_dir)     # prompts whose answers quote their input
    burst_plan(40, seed=0)                     # [7, 1, 16, ...]: burst sizes of the mixed workload
    records_to_mix([records_level_1, ...])     # -> [RequestShape] for `link compile tune-config --mix`

- default: AlpacaEval instructions and MT-Bench first turns (`benchmarks/link_bench/workload.py`), closed loops.
- repetitive: answers that repeat much of their prompt, where prompt-lookup (n-gram) speculative
  decoding pays: editing code that quotes its input (each HumanEval problem: "repeat this function,
  then complete it") and summarizing with quotations (MT-Bench writing and extraction first turns:
  "summarize, quoting ... word for word"). Closed loops at each concurrency, like the default.
- mixed: bursts of 1 to 16 concurrent requests (sizes drawn with the seed) of the default prompts; a
  burst starts when the previous one has finished, so the engine alternates between batch sizes.
"""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

from benchmarks.link_bench.timing import TimedRequest
from benchmarks.link_bench.workload import load_workload
from serving.tuning.traffic import RequestShape

WORKLOADS = ("default", "repetitive", "mixed")
MAX_BURST = 16

CODE_EDIT = ("Here is a Python function with its docstring. First repeat the code exactly as given, then write "
             "the completed function, keeping the signature and the docstring word for word.\n\n```python\n{code}```")
QUOTE_SUMMARY = ("Summarize the following task in three sentences. Quote its key phrases word for word in double "
                 "quotes, then restate the whole task exactly as written.\n\n{text}")


def load_repetitive(data_dir: str | Path, seed: int = 0) -> list[str]:
    """HumanEval code-editing prompts and MT-Bench (writing, extraction) quote-summary prompts, shuffled with `seed`.

    Raises:
        FileNotFoundError: human-eval/HumanEval.jsonl.gz or mt-bench/mt_bench/question.jsonl is missing.
    """
    data_dir = Path(data_dir)
    human_eval = data_dir / "human-eval" / "HumanEval.jsonl.gz"
    mt_bench = data_dir / "mt-bench" / "mt_bench" / "question.jsonl"
    for path in (human_eval, mt_bench):
        if not path.is_file():
            raise FileNotFoundError(f"{path} not found; point --data-dir or LINK_DATASETS_DIR at the shared data folder")
    with gzip.open(human_eval, "rt") as f:
        texts = [CODE_EDIT.format(code=json.loads(line)["prompt"]) for line in f if line.strip()]
    for line in mt_bench.read_text().splitlines():
        row = json.loads(line) if line.strip() else {}
        if row.get("category") in ("writing", "extraction"):
            texts.append(QUOTE_SUMMARY.format(text=row["turns"][0]))
    random.Random(seed).shuffle(texts)
    return texts


def workload_texts(workload: str, data_dir: str | Path, seed: int = 0) -> list[str]:
    """The prompt texts of a workload (the mixed one uses the default prompts).

    Raises:
        ValueError: an unknown workload. FileNotFoundError: its data is missing.
    """
    if workload not in WORKLOADS:
        raise ValueError(f"unknown workload {workload!r}; choose from {', '.join(WORKLOADS)}")
    return load_repetitive(data_dir, seed) if workload == "repetitive" else load_workload(data_dir, seed)


def burst_plan(num_requests: int, seed: int = 0, max_burst: int = MAX_BURST) -> list[int]:
    """Burst sizes drawn uniformly from 1..`max_burst` (seeded) until they add up to `num_requests`
    (the last one cut to fit)."""
    rng, sizes = random.Random(seed), []
    while sum(sizes) < num_requests:
        sizes.append(min(rng.randint(1, max_burst), num_requests - sum(sizes)))
    return sizes


def records_to_mix(levels: list[list[TimedRequest]], gap_s: float = 1.0) -> list[RequestShape]:
    """The request shapes of measured levels, one after another: within a level, arrivals are the
    recorded send times (`TimedRequest.start_s`) relative to its first; each level starts `gap_s`
    after the previous one's last request finished. Greedy, as the benchmark decodes.

    Raises:
        ValueError: a record without `start_s`.
    """
    shapes, offset = [], 0.0
    for records in levels:
        if not records:
            continue
        if any(r.start_s is None for r in records):
            raise ValueError("records without start times cannot become a mix")
        t0 = min(r.start_s for r in records)
        for r in sorted(records, key=lambda r: r.start_s):
            shapes.append(RequestShape(r.num_prompt_tokens, max(1, r.num_output_tokens), round(offset + r.start_s - t0, 6)))
        offset += max(r.start_s - t0 + r.latency_s for r in records) + gap_s
    return shapes
