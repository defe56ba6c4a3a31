"""Routing data: an outcome table pivoted into prompt x model matrices of quality and cost.

    data = RoutingData.from_outcomes(load_source("routerbench:train"))   # any rows shaped like evals.Outcome
    data.scores[i, j], data.costs[i, j]      # model j's score in [0, 1] and USD cost on prompt i (NaN: missing)
    data.complete_rows().select_models(["gpt-4-1106-preview", "mistral-7b-chat"])
    train, test = data.subset(train_idx), data.subset(test_idx)
    for train_idx, test_idx in kfold_indices(data.num_prompts, 5, seed=0, groups=data.groups("subject")): ...

Rows are duck-typed (attributes prompt_id, suite, prompt, model, score, cost_usd, completion_tokens), so
this module never imports `evals` (routers sit below evals and link, see ARCHITECTURE.md).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

GROUP_KEYS = ("suite", "subject")


@dataclass
class RoutingData:
    """Per-prompt, per-model outcomes.

    Attributes:
        prompt_ids, prompts, suites: [P] each; the prompt text is what a router reads.
        models: [M] candidate names, the column order of every matrix.
        scores: [P, M] float64 quality in [0, 1], NaN where the model was not run on the prompt.
        costs: [P, M] float64 USD per answer, NaN where missing.
        completion_tokens: [P, M] float64 or None, NaN where not recorded.
        has_tools: [P] bool, whether the prompt's request offered tools (None: none did).
        responses: [P, M] object array of each model's recorded answer text (None where not recorded), or None
            when no answer was recorded (an answer-reading cascade scorer trains on them, `routers.answer_check`).
        signals: [P, M] object array of each answer's signal summary (`routers.signals.answer_signals`: a dict,
            None where not recorded), or None when none was (`link eval run --signals`).
    Raises:
        ValueError: mismatched lengths or shapes, duplicated prompt ids or models, scores outside [0, 1],
            negative costs.
    """

    prompt_ids: list[str]
    prompts: list[str]
    suites: list[str]
    models: list[str]
    scores: np.ndarray
    costs: np.ndarray
    completion_tokens: np.ndarray | None = None
    has_tools: np.ndarray | None = None
    responses: np.ndarray | None = None
    signals: np.ndarray | None = None

    def __post_init__(self) -> None:
        self.prompt_ids, self.prompts, self.suites, self.models = (
            list(self.prompt_ids), list(self.prompts), list(self.suites), list(self.models))
        p, m = len(self.prompt_ids), len(self.models)
        if len(self.prompts) != p or len(self.suites) != p:
            raise ValueError(f"prompt_ids, prompts and suites differ in length: {p}, {len(self.prompts)}, {len(self.suites)}")
        if len(set(self.models)) != m:
            raise ValueError(f"duplicated model names in {self.models}")
        if len(set(self.prompt_ids)) != p:
            raise ValueError("duplicated prompt ids")
        self.scores = np.asarray(self.scores, dtype=np.float64).reshape(p, m)
        self.costs = np.asarray(self.costs, dtype=np.float64).reshape(p, m)
        if self.completion_tokens is not None:
            self.completion_tokens = np.asarray(self.completion_tokens, dtype=np.float64).reshape(p, m)
        self.has_tools = (np.zeros(p, dtype=bool) if self.has_tools is None
                          else np.asarray(self.has_tools, dtype=bool).reshape(p))
        if self.responses is not None:
            self.responses = np.asarray(self.responses, dtype=object).reshape(p, m)
        if self.signals is not None:
            grid = np.full((p, m), None, dtype=object)   # built cell by cell: numpy would unpack dicts' lists
            for (i, j), value in np.ndenumerate(np.asarray(self.signals, dtype=object).reshape(p, m)):
                grid[i, j] = value
            self.signals = grid
        finite = self.scores[~np.isnan(self.scores)]
        if finite.size and (finite.min() < 0 or finite.max() > 1):
            raise ValueError("scores must lie in [0, 1]")
        if np.nanmin(self.costs, initial=0.0) < 0:
            raise ValueError("costs must be >= 0")

    @property
    def num_prompts(self) -> int:
        return len(self.prompt_ids)

    @property
    def num_models(self) -> int:
        return len(self.models)

    @classmethod
    def from_outcomes(cls, rows: Iterable) -> RoutingData:
        """Pivot outcome rows (objects with prompt_id, suite, prompt, model, score, cost_usd and optionally
        completion_tokens, has_tools and response) into matrices; prompts and models keep their order of first
        appearance, a prompt offers tools when any of its rows says so.

        Raises:
            ValueError: a (prompt_id, model) pair given twice, or no rows.
        """
        rows = list(rows)
        if not rows:
            raise ValueError("no outcome rows")
        pi: dict[str, int] = {}
        mi: dict[str, int] = {}
        prompts: list[str] = []
        suites: list[str] = []
        tools: list[bool] = []
        for r in rows:
            if r.prompt_id not in pi:
                pi[r.prompt_id] = len(pi)
                prompts.append(r.prompt)
                suites.append(r.suite)
                tools.append(False)
            tools[pi[r.prompt_id]] |= bool(getattr(r, "has_tools", False))
            mi.setdefault(r.model, len(mi))
        scores = np.full((len(pi), len(mi)), np.nan)
        costs = np.full((len(pi), len(mi)), np.nan)
        tokens = np.full((len(pi), len(mi)), np.nan)
        responses = np.full((len(pi), len(mi)), None, dtype=object)
        signals = np.full((len(pi), len(mi)), None, dtype=object)
        for r in rows:
            i, j = pi[r.prompt_id], mi[r.model]
            if not np.isnan(scores[i, j]):
                raise ValueError(f"duplicate outcome for prompt {r.prompt_id!r} and model {r.model!r}")
            scores[i, j] = r.score
            costs[i, j] = r.cost_usd
            ct = getattr(r, "completion_tokens", None)
            if ct is not None:
                tokens[i, j] = ct
            responses[i, j] = getattr(r, "response", None)
            signals[i, j] = getattr(r, "signals", None)
        return cls(list(pi), prompts, suites, list(mi), scores, costs,
                   None if np.isnan(tokens).all() else tokens, np.array(tools, dtype=bool),
                   None if all(x is None for x in responses.flat) else responses,
                   None if all(x is None for x in signals.flat) else signals)

    # --- views ----------------------------------------------------------------------------------------

    def subset(self, idx) -> RoutingData:
        """The prompts at `idx` (an index array or a [P] bool mask), in that order."""
        idx = np.asarray(idx)
        idx = np.flatnonzero(idx) if idx.dtype == bool else idx.astype(np.int64)
        return RoutingData([self.prompt_ids[i] for i in idx], [self.prompts[i] for i in idx],
                           [self.suites[i] for i in idx], self.models, self.scores[idx], self.costs[idx],
                           None if self.completion_tokens is None else self.completion_tokens[idx],
                           self.has_tools[idx], None if self.responses is None else self.responses[idx],
                           None if self.signals is None else self.signals[idx])

    def select_models(self, names: Sequence[str]) -> RoutingData:
        """The columns of `names`, in that order. Raises KeyError naming an unknown model."""
        missing = [n for n in names if n not in self.models]
        if missing:
            raise KeyError(f"unknown models {missing}; models: {self.models}")
        cols = [self.models.index(n) for n in names]
        tokens = None if self.completion_tokens is None else self.completion_tokens[:, cols]
        return RoutingData(self.prompt_ids, self.prompts, self.suites, list(names), self.scores[:, cols],
                           self.costs[:, cols], tokens, self.has_tools,
                           None if self.responses is None else self.responses[:, cols],
                           None if self.signals is None else self.signals[:, cols])

    def complete_rows(self) -> RoutingData:
        """Only the prompts every model has a score for (RouterBench test: 945 prompts)."""
        return self.subset(~np.isnan(self.scores).any(axis=1))

    def num_scored(self) -> np.ndarray:
        """[M] int, the number of prompts each model has a score for."""
        return (~np.isnan(self.scores)).sum(axis=0)

    def incomplete_note(self) -> str | None:
        """Which prompts `complete_rows` leaves out and why, in words ("15 prompts left out: they lack a score of
        weak (45 of 60 prompts)", the models with fewest scores first); None when it keeps every prompt."""
        dropped = int(np.isnan(self.scores).any(axis=1).sum())
        if dropped == 0:
            return None
        counts = self.num_scored()
        short = [f"{self.models[j]} ({int(counts[j])} of {self.num_prompts} prompts)"
                 for j in np.argsort(counts, kind="stable") if counts[j] < self.num_prompts]
        return f"{dropped} prompt{'s' if dropped != 1 else ''} left out: they lack a score of {', '.join(short)}"

    def aligned_to(self, models: Sequence[str], *, names: tuple[str, str] = ("training", "test")) -> RoutingData:
        """The same data with its columns in the order of `models`, when both hold the same set of models (the
        order a file lists them in means nothing).

        Raises:
            ValueError: other models, naming those only on one side (`names`: what to call the side `models`
                come from and this data, in that order: "only in the test data: ...").
        """
        if list(models) == self.models:
            return self
        mine, theirs = set(self.models), set(models)
        if mine != theirs:
            only = [f"only in the {where} data: {', '.join(sorted(extra))}"
                    for where, extra in ((names[0], theirs - mine), (names[1], mine - theirs)) if extra]
            raise ValueError(f"the {names[0]} and {names[1]} data have different models ({'; '.join(only)}); "
                             "give both the same models' outcomes")
        return self.select_models(list(models))

    def with_suites(self, suites: Sequence[str]) -> RoutingData:
        """The same data with another task label per prompt (e.g. MMLU subjects as suites)."""
        return RoutingData(self.prompt_ids, self.prompts, list(suites), self.models, self.scores, self.costs,
                           self.completion_tokens, self.has_tools, self.responses, self.signals)

    def groups(self, by: str = "suite") -> list[str]:
        """[P] group label per prompt: "suite", or "subject" (the middle part of a RouteLLM MMLU prompt id,
        "routellm-mmlu/<subject>/<row>"; prompts without one fall back to their suite).

        Raises:
            ValueError: an unknown key.
        """
        if by == "suite":
            return list(self.suites)
        if by == "subject":
            return [pid.split("/")[1] if pid.count("/") >= 2 else suite
                    for pid, suite in zip(self.prompt_ids, self.suites)]
        raise ValueError(f"unknown group key {by!r}; keys: {', '.join(GROUP_KEYS)}")

    @property
    def prompt_chars(self) -> np.ndarray:
        """[P] float64 prompt length in characters."""
        return np.array([len(p) for p in self.prompts], dtype=np.float64)

    def mean_scores(self) -> np.ndarray:
        """[M] each model's mean score over the prompts it answered."""
        return np.nanmean(self.scores, axis=0)

    def mean_costs(self) -> np.ndarray:
        """[M] each model's mean USD cost over the prompts it answered."""
        return np.nanmean(self.costs, axis=0)

    @classmethod
    def concat(cls, parts: Sequence[RoutingData]) -> RoutingData:
        """The prompts of several sets over the union of their models (NaN where a set lacks a model).

        Raises:
            ValueError: a prompt id in two parts, or no parts.
        """
        if not parts:
            raise ValueError("nothing to concatenate")
        models = list(dict.fromkeys(m for part in parts for m in part.models))

        def widen(part: RoutingData, x: np.ndarray | None, fill=np.nan) -> np.ndarray:
            out = np.full((part.num_prompts, len(models)), fill, dtype=np.float64 if fill is not None else object)
            if x is not None:
                out[:, [models.index(m) for m in part.models]] = x
            return out

        has_tokens = any(part.completion_tokens is not None for part in parts)
        return cls([p for part in parts for p in part.prompt_ids], [p for part in parts for p in part.prompts],
                   [s for part in parts for s in part.suites], models,
                   np.vstack([widen(part, part.scores) for part in parts]),
                   np.vstack([widen(part, part.costs) for part in parts]),
                   np.vstack([widen(part, part.completion_tokens) for part in parts]) if has_tokens else None,
                   np.concatenate([part.has_tools for part in parts]),
                   np.vstack([widen(part, part.responses, None) for part in parts])
                   if any(part.responses is not None for part in parts) else None,
                   np.vstack([widen(part, part.signals, None) for part in parts])
                   if any(part.signals is not None for part in parts) else None)


# --- splits ---------------------------------------------------------------------------------------------

def train_test_split(num_prompts: int, test_size: int | float, *, seed: int = 0,
                     stratify: Sequence[str] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Random (train, test) index arrays, sorted.

    Args:
        test_size: a count, or a fraction in (0, 1).
        stratify: [P] labels; each label keeps its share of the test set (rounded, largest remainders).
    Raises:
        ValueError: a test size that leaves an empty train or test set.
    """
    n_test = int(round(test_size * num_prompts)) if isinstance(test_size, float) and test_size < 1 else int(test_size)
    if not 0 < n_test < num_prompts:
        raise ValueError(f"test size {test_size} leaves no train or test prompts out of {num_prompts}")
    rng = np.random.default_rng(seed)
    if stratify is None:
        test = rng.choice(num_prompts, size=n_test, replace=False)
    else:
        labels = np.asarray(stratify)
        names, counts = np.unique(labels, return_counts=True)
        quota = counts * n_test / num_prompts
        take = np.floor(quota).astype(int)
        for k in np.argsort(-(quota - take))[: n_test - take.sum()]:
            take[k] += 1
        test = np.concatenate([rng.choice(np.flatnonzero(labels == name), size=t, replace=False)
                               for name, t in zip(names, take)])
    mask = np.zeros(num_prompts, dtype=bool)
    mask[test] = True
    return np.flatnonzero(~mask), np.flatnonzero(mask)


def kfold_indices(num_prompts: int, k: int, *, seed: int = 0,
                  groups: Sequence[str] | None = None) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """k (train, test) index pairs that partition the prompts into k shuffled folds.

    With `groups` ([P] labels, e.g. MMLU subjects) whole groups are held out: the shuffled groups are dealt
    to the fold holding the fewest prompts so far (largest group first), so no group is on both sides.

    Raises:
        ValueError: k < 2, or more folds than prompts (or groups).
    """
    rng = np.random.default_rng(seed)
    fold = np.empty(num_prompts, dtype=np.int64)
    if groups is None:
        if not 2 <= k <= num_prompts:
            raise ValueError(f"k must be in [2, {num_prompts}], got {k}")
        fold[rng.permutation(num_prompts)] = np.arange(num_prompts) % k
    else:
        labels = np.asarray(groups)
        names, inverse, counts = np.unique(labels, return_inverse=True, return_counts=True)
        if not 2 <= k <= len(names):
            raise ValueError(f"k must be in [2, {len(names)}] (the number of groups), got {k}")
        order = rng.permutation(len(names))
        order = order[np.argsort(-counts[order], kind="stable")]
        sizes = np.zeros(k, dtype=np.int64)
        group_fold = np.empty(len(names), dtype=np.int64)
        for g in order:
            f = int(np.argmin(sizes))
            group_fold[g] = f
            sizes[f] += counts[g]
        fold = group_fold[inverse]
    for f in range(k):
        yield np.flatnonzero(fold != f), np.flatnonzero(fold == f)
