"""The replica benchmark's requests: MMLU 5-shot prompts (shared few-shot prefixes), prompts of the same shape
without a shared prefix, and Poisson arrival times.

    shared = shared_prefix_prompts(data_dir, 120, seed=0)    # 120 Prompts; .group: the subject (its prefix)
    distinct = no_prefix_prompts(data_dir, 120, seed=0)      # 120 Prompts, no two sharing their first characters
    offsets = poisson_arrivals(rate_per_s=1.6, num=120, seed=0)   # send times (s from the start), increasing

Shared prefix (`shared_prefix_prompts`): MMLU's test split, every prompt built by `evals/suites/mmlu.py` as the eval
builds it (the subject's header, its 5 dev shots, the question ending in "Answer:") plus the suite's chat instruction,
so every prompt of one subject shares the header and the shots (278 to 2,754 SmolLM2 tokens over the 57 subjects,
median 530) and differs from the question on. Each request's subject is drawn uniformly from all 57 subjects with
`random.Random(seed)`, then a question of that subject not drawn before (MMLU's repeated test rows counted once):
every prefix is equally popular, which is the hard case for a cache (no hot prefix to keep).

No shared prefix (`no_prefix_prompts`): the same shape and about the same length, with nothing in common: each
prompt is 6 MMLU test questions drawn without replacement from the whole test split (all subjects mixed): five with
their answers, the sixth open, blank-line separated like the 5-shot prompt, no subject header, plus the same chat
instruction. No question appears twice in a workload, and a prompt's first question is one whose first `LEAD_CHARS`
characters no other test question has (11,397 of the 13,950 distinct ones; not the 895 moral-scenarios questions,
which all open with the same sentence), so no two prompts share their leading text beyond the chat template's own
tokens, which every request of both workloads shares: not one KV block, and not one of the gateway's 64-character
prefix chunks.

Arrivals (`poisson_arrivals`): a Poisson process of `rate_per_s`, i.e. independent exponential gaps of mean
1 / rate (numpy's `default_rng(seed).exponential`); the first request is sent at 0.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

NUM_QUESTIONS_PER_PROMPT = 6  # the no-prefix prompt: as many questions as a 5-shot prompt holds
# A no-prefix prompt's first question differs from every other question within its first LEAD_CHARS characters: inside
# the gateway's first 64-character chunk even behind the 12-character JSON wrapper and a 10-character cell tag.
LEAD_CHARS = 40
WORKLOADS = ("shared_prefix", "no_prefix")


@dataclass(frozen=True)
class Prompt:
    """One request's user message. group: what it shares its prefix with ("anatomy" for a subject's 5-shot prompts;
    a unique "q<index>" where it shares nothing)."""

    text: str
    group: str


def _mmlu(data_dir: str | Path):
    """(the MMLU suite, its test items with every repeated row (question and options) after its first dropped)."""
    from evals.base import make_suite

    suite = make_suite("mmlu", Path(data_dir))
    items, seen = [], set()
    for item in suite.load("test"):
        key = tuple(item.metadata["row"])
        if key not in seen:
            seen.add(key)
            items.append(item)
    return suite, items


def shared_prefix_prompts(data_dir: str | Path, num: int, seed: int = 0) -> list[Prompt]:
    """`num` MMLU 5-shot chat prompts, subjects drawn uniformly (see the module docstring).

    Raises:
        FileNotFoundError: the MMLU data is missing under `data_dir` (see evals/suites/mmlu.py).
        ValueError: `num` below 1.
    """
    from evals.suites.mmlu import CHAT_INSTRUCTION

    if num < 1:
        raise ValueError(f"num must be at least 1, got {num}")
    suite, items = _mmlu(data_dir)
    by_subject: dict[str, list] = {}
    for item in items:
        by_subject.setdefault(item.metadata["subject"], []).append(item)
    rng = random.Random(seed)
    subjects = sorted(by_subject)
    for pool in by_subject.values():
        rng.shuffle(pool)
    prompts = []
    for _ in range(num):
        subject = rng.choice(subjects)
        pool = by_subject[subject]
        item = pool.pop() if len(pool) > 1 else pool[0]  # a subject's last question may repeat (never in short runs)
        prompts.append(Prompt(f"{suite.prompt_text(item)}\n\n{CHAT_INSTRUCTION}", subject))
    return prompts


def no_prefix_prompts(data_dir: str | Path, num: int, seed: int = 0) -> list[Prompt]:
    """`num` prompts of 6 MMLU test questions from all subjects, no header, none shared (see the module docstring).

    Raises:
        FileNotFoundError: the MMLU data is missing. ValueError: `num` below 1, or more prompts than the test split
            has questions for (6 each, the first with a distinct start).
    """
    from evals.suites.mmlu import CHAT_INSTRUCTION, format_question

    if num < 1:
        raise ValueError(f"num must be at least 1, got {num}")
    _, items = _mmlu(data_dir)
    starts = Counter(item.metadata["row"][0].strip()[:LEAD_CHARS] for item in items)
    leads = [i for i, item in enumerate(items) if starts[item.metadata["row"][0].strip()[:LEAD_CHARS]] == 1]
    if num > len(leads) or num * NUM_QUESTIONS_PER_PROMPT > len(items):
        raise ValueError(f"{num} prompts need {num} distinct first questions and {num * NUM_QUESTIONS_PER_PROMPT} questions; "
                         f"MMLU's test split has {len(leads)} and {len(items)}")
    rng = random.Random(seed)
    first = rng.sample(leads, num)
    taken = set(first)
    rest = rng.sample([i for i in range(len(items)) if i not in taken], num * (NUM_QUESTIONS_PER_PROMPT - 1))
    prompts = []
    for k, lead in enumerate(first):
        chosen = [items[lead], *(items[i] for i in rest[k * (NUM_QUESTIONS_PER_PROMPT - 1):(k + 1) * (NUM_QUESTIONS_PER_PROMPT - 1)])]
        blocks = [format_question(item.metadata["row"], item.reference) for item in chosen[:-1]]
        blocks.append(format_question(chosen[-1].metadata["row"]))
        prompts.append(Prompt("\n\n".join(blocks) + f"\n\n{CHAT_INSTRUCTION}", f"q{lead}"))
    return prompts


def workload_prompts(workload: str, data_dir: str | Path, num: int, seed: int = 0) -> list[Prompt]:
    """`shared_prefix_prompts` or `no_prefix_prompts` by name. Raises ValueError for another name (and as they do)."""
    if workload == "shared_prefix":
        return shared_prefix_prompts(data_dir, num, seed)
    if workload == "no_prefix":
        return no_prefix_prompts(data_dir, num, seed)
    raise ValueError(f"unknown workload {workload!r}; choose from {', '.join(WORKLOADS)}")


def poisson_arrivals(rate_per_s: float, num: int, seed: int = 0) -> list[float]:
    """Send offsets (s) of `num` requests of a Poisson process of `rate_per_s` requests/s: 0, then cumulative
    exponential gaps of mean 1 / rate.

    Raises:
        ValueError: a rate that is not positive and finite, or `num` below 1.
    """
    import numpy as np

    if not 0 < rate_per_s < float("inf") or num < 1:
        raise ValueError(f"rate_per_s must be positive and finite and num at least 1, got {rate_per_s}, {num}")
    gaps = np.random.default_rng(seed).exponential(1.0 / rate_per_s, num - 1)
    return [0.0, *np.cumsum(gaps).tolist()]
