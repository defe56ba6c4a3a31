"""`run_eval`: one suite's items against several targets, concurrently, cached, under a cost cap.

    suite = make_suite("gsm8k", data_dir)
    items = suite.sample(suite.load("test"), 200)
    result = await run_eval(suite, items, targets, concurrency=4, retries=3, max_cost_usd=1.0, store=EvalStore())
    result.run_id, result.outcomes, result.totals["gemma-3-270m"]["score"], result.stopped_reason

Each (item, target) pair is one unit of work: `suite.answer` through the target, then `suite.grade` (with the
judge for judge-based suites). Calls go through `CachedTarget` (the store: a rerun of an interrupted run makes
no call for finished items and gives the same totals) around `GuardedTarget` (--max-cost and retries with
backoff). A pair whose target still fails after the retries is recorded with score 0 and its error; a pair
cut by the cost cap is not recorded. At most `concurrency` pairs (so at most `concurrency` model calls) are in
flight across all targets. Files: `<out_dir>/outcomes.jsonl` (OutcomeTable), `grades.jsonl` (one line per pair:
prompt_id, model, served_models (the model that answered each call: a policy target names its choice), score,
details, judge_cost_usd, error) and `run.json` (totals); the run is recorded in the store.
"""

from __future__ import annotations

import asyncio
import json
import random
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from evals.base import Answer, Grade, Item, Suite
from evals.cache import CachedTarget, EvalStore, utcnow
from evals.cost_guard import BudgetExhausted, CostGuard, GuardedTarget
from evals.outcomes import Outcome, OutcomeTable
from evals.progress import RunProgress
from evals.targets import ParamsTarget, Target


@dataclass
class PairResult:
    """One target's graded answer to one item."""

    item: Item
    target: str
    answer: Answer
    grade: Grade
    cache_hits: int = 0
    calls: int = 0
    signals: dict[str, Any] | None = None

    @property
    def error(self) -> str | None:
        return self.answer.error or self.grade.details.get("error")


@dataclass
class RunResult:
    """What `run_eval` returns.

    Attributes:
        run_id: hex id; files under `out_dir`, record in the store.
        outcomes: one row per recorded (item, target), in target then item order.
        grades: target name -> item id -> Grade.
        totals: target name -> {n, errors, score, cost_usd, judge_cost_usd, latency_p50_s, latency_p95_s,
            prompt_tokens, completion_tokens} (+ suite extras, e.g. AlpacaEval's lc_win_rate); a resumed run's
            totals equal an uninterrupted run's.
        calls: target name -> {"cache_hits", "calls"}: answer requests served from the store / made to the target.
        stopped_reason: "completed" or "max_cost".
        spent_usd: real USD spent by this run (cache hits excluded; judge calls included).
    """

    run_id: str
    outcomes: OutcomeTable
    grades: dict[str, dict[str, Grade]]
    totals: dict[str, dict[str, Any]]
    stopped_reason: str
    spent_usd: float
    calls: dict[str, dict[str, int]] = field(default_factory=dict)
    out_dir: Path | None = None
    pairs: list[PairResult] = field(default_factory=list, repr=False)


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    position = (len(ordered) - 1) * q
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def summarize(pairs: list[PairResult]) -> dict[str, Any]:
    """Totals of one target's pairs (see RunResult.totals); latency percentiles over answers without error."""
    latencies = [p.answer.latency_s for p in pairs if not p.error]
    n = len(pairs)
    return {"n": n, "errors": sum(1 for p in pairs if p.error),
            "score": sum(p.grade.score for p in pairs) / n if n else None,
            "cost_usd": sum(p.answer.cost_usd for p in pairs),
            "judge_cost_usd": sum(p.grade.judge_cost_usd for p in pairs),
            "latency_p50_s": _percentile(latencies, 0.5), "latency_p95_s": _percentile(latencies, 0.95),
            "prompt_tokens": sum(p.answer.prompt_tokens for p in pairs),
            "completion_tokens": sum(p.answer.completion_tokens for p in pairs)}


@dataclass(frozen=True)
class SignalOptions:
    """What `run_eval(signals=...)` records of each answer besides its score (`routers.signals`).

    Attributes:
        top_logprobs: alternatives asked for per generated token (chat `logprobs` + `top_logprobs`, completions
            `logprobs`), 1-20 (the OpenAI APIs' range); a suite that asks for its own keeps them.
        samples: extra answers per (item, target) for the agreement signal, k >= 0, each sampled at
            `temperature` with its own seed (seed + j + 1) and graded like the main one.
        temperature: the extra samples' temperature (> 0).
    Raises:
        ValueError: a value out of range (the message names it).
    """

    top_logprobs: int = 5
    samples: int = 0
    temperature: float = 0.7

    def __post_init__(self) -> None:
        if not 1 <= self.top_logprobs <= 20:
            raise ValueError(f"top_logprobs must be in 1..20, got {self.top_logprobs}")
        if self.samples < 0:
            raise ValueError(f"samples must be >= 0, got {self.samples}")
        if not self.temperature > 0:
            raise ValueError(f"the samples' temperature must be > 0, got {self.temperature}")


async def _answer_and_grade(suite: Suite, item: Item, answering: Target, judge: Target | None, wrap
                            ) -> tuple[Answer, Grade] | None:
    """One answer and its grade; None when the cost cap cut it. Errors are recorded, never raised."""
    try:
        answer = await suite.answer(item, answering)
    except BudgetExhausted:
        return None
    except Exception as exc:  # noqa: BLE001  (an item never crashes the run)
        answer = Answer([], error=f"{type(exc).__name__}: {exc}")
    if answer.error:
        return answer, Grade(0.0, {"error": answer.error})
    try:
        grade = await suite.grade(item, answer, wrap(judge, item) if judge is not None else None)
    except BudgetExhausted:
        return None
    except Exception as exc:  # noqa: BLE001
        grade = Grade(0.0, {"error": f"grading: {type(exc).__name__}: {exc}"})
    return answer, grade


async def _evaluate(suite: Suite, item: Item, target: Target, judge: Target | None, wrap,
                    signals: SignalOptions | None = None, seed: int = 0) -> PairResult | None:
    """Answer and grade one pair (with `signals`, also its signal summary and extra samples); None when the cost
    cap cut it. Errors (TargetError after the retries, or a suite's own exception) are recorded in the pair,
    never raised."""
    cached = wrap(target, item)
    logprobs = ({"chat_defaults": {"logprobs": True, "top_logprobs": signals.top_logprobs},
                 "completion_defaults": {"logprobs": signals.top_logprobs}} if signals is not None else {})
    done = await _answer_and_grade(suite, item, ParamsTarget(cached, **logprobs), judge, wrap)
    if done is None:
        return None
    answer, grade = done
    pair = PairResult(item, target.name, answer, grade, cached.hits, cached.misses)
    if signals is not None and not pair.error:
        pair.signals = await _signals(suite, item, target, answer, grade, judge, wrap, signals, seed, logprobs)
    return pair


async def _signals(suite, item, target, answer, grade, judge, wrap, options: SignalOptions, seed: int,
                   logprobs: dict) -> dict[str, Any]:
    """The signal summary of a graded answer (`routers.signals.answer_signals`), with `options.samples` extra
    sampled answers graded for the agreement signal (a sample that fails or is cut by the cost cap is left out)."""
    from routers.signals import answer_signals

    async def sample(j: int):
        overrides = {"temperature": options.temperature, "seed": seed + j + 1}
        return await _answer_and_grade(suite, item, ParamsTarget(wrap(target, item), **logprobs, overrides=overrides),
                                       judge, wrap)

    sampled = [s for s in await asyncio.gather(*(sample(j) for j in range(options.samples)))
               if s is not None and not s[0].error]
    last = answer.completions[-1] if answer.completions else None
    return answer_signals(answer.text, last.token_logprobs if last else None, last.top_logprobs if last else None,
                          key=suite.answer_key(item, answer, grade),
                          sample_keys=[suite.answer_key(item, a, g) for a, g in sampled] if options.samples else None,
                          sample_scores=[g.score for _, g in sampled] if options.samples else None,
                          samples_cost_usd=sum(a.cost_usd for a, _ in sampled) if options.samples else None)


async def run_eval(suite: Suite, items: list[Item], targets: list[Target], *, judge: Target | None = None,
                   concurrency: int = 4, retries: int = 3, max_cost_usd: float | None = None,
                   store: EvalStore | None = None, progress: bool = True, run_id: str | None = None,
                   out_dir: Path | None = None, split: str = "", params: dict[str, Any] | None = None,
                   backoff_s: float = 0.5, seed: int = 0, suite_for: dict[str, Suite] | None = None,
                   order: str = "interleave", signals: SignalOptions | None = None) -> RunResult:
    """Run `suite` on `items` for every target (module docstring).

    Args:
        suite, items: the benchmark and the items to run (already sampled).
        targets: distinct names. judge: the judge target of a judge-based suite (`suite.needs_judge`).
        concurrency: pairs in flight at most (>= 1). retries: extra attempts for retryable errors.
        max_cost_usd: hard cap on the USD this run spends (None: no cap).
        store: response cache and run records (None: no cache, no record).
        progress: show a Rich progress bar per target (live accuracy and spend).
        run_id, out_dir: default a new hex id and `$LINK_HOME/evals/<run_id>`.
        split, params: recorded with the run. backoff_s: base retry delay (s). seed: seeds the backoff jitter.
        suite_for: target name -> the suite instance that asks it (the same benchmark in another prompt style,
            e.g. "completion" for a base model); default `suite` for every target.
        order: "interleave" (item by item, every target in turn: spreads load over remote providers) or
            "by-target" (all items of the first target, then the next: local engines that share one machine
            then run one at a time, each with a full batch).
        signals: record each answer's signal summary (`SignalOptions`; the outcome rows' `signals` column), or
            None (the default: no logprobs asked for, no extra samples).
    Raises:
        ValueError: no targets, duplicate target names, concurrency < 1, an unknown order, or a judge-based
            suite without a judge.
    """
    if order not in ("interleave", "by-target"):
        raise ValueError(f"order must be 'interleave' or 'by-target', got {order!r}")
    names = [t.name for t in targets]
    if not targets or len(set(names)) != len(names):
        raise ValueError(f"targets must be non-empty and distinct, got {names}")
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    if suite.needs_judge and judge is None:
        raise ValueError(f"suite {suite.name!r} is graded by a judge model: pass --judge")
    run_id = run_id or uuid.uuid4().hex[:12]
    if out_dir is None:
        from link.settings import get_settings

        out_dir = get_settings().home / "evals" / run_id
    guard, rng = CostGuard(max_cost_usd), random.Random(seed)

    def wrap(target: Target, item: Item) -> CachedTarget:
        guarded = GuardedTarget(target, guard, retries=retries, backoff_s=backoff_s, rng=rng)
        return CachedTarget(guarded, store, suite.name, item.id)

    record = {"id": run_id, "suite": suite.name, "split": split, "targets": names, "status": "running",
              "params": {"concurrency": concurrency, "retries": retries, "max_cost_usd": max_cost_usd, "n_items": len(items),
                         "judge": judge.name if judge else None,
                         "signals": None if signals is None else asdict(signals), **(params or {})}}
    if store is not None:
        await asyncio.to_thread(store.save_run, record)
    queue: asyncio.Queue = asyncio.Queue()
    pairs = ([(item, target) for item in items for target in targets] if order == "interleave"
             else [(item, target) for target in targets for item in items])
    for pair in pairs:
        queue.put_nowait(pair)
    results: list[PairResult] = []
    bars = RunProgress(names, len(items), enabled=progress)

    async def worker() -> None:
        while not guard.is_exhausted:
            try:
                item, target = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            pair = await _evaluate((suite_for or {}).get(target.name, suite), item, target, judge, wrap, signals, seed)
            if pair is not None:
                results.append(pair)
                bars.advance(pair.target, pair.grade.score, pair.answer.cost_usd + pair.grade.judge_cost_usd, pair.error)

    try:
        with bars:
            await asyncio.gather(*(worker() for _ in range(min(concurrency, queue.qsize()) or 1)))
    except BaseException as exc:
        if store is not None:
            status = "interrupted" if isinstance(exc, (asyncio.CancelledError, KeyboardInterrupt)) else "failed"
            store.save_run({"id": run_id, "status": status, "finished_at": utcnow()})
        raise
    return await _finish(suite, items, targets, results, guard, store, run_id, Path(out_dir))


def _offers_tools(suite, item) -> bool:
    """Whether the suite's request for `item` offers tools (an outcome row's has_tools: what the gateway's
    router reads of a request as `routers.features.request_text_features`); False for a suite that builds
    its requests in its own `answer` (MT-Bench's two turns)."""
    try:
        _, request = suite.request(item)
    except NotImplementedError:
        return False
    params = request.get("params") or {}
    return bool(params.get("tools") or params.get("functions"))


async def _finish(suite, items, targets, results, guard, store, run_id, out_dir) -> RunResult:
    order = {item.id: i for i, item in enumerate(items)}
    by_target: dict[str, list[PairResult]] = {t.name: [] for t in targets}
    for pair in sorted(results, key=lambda p: order[p.item.id]):
        by_target[pair.target].append(pair)
    totals = {name: summarize(pairs) for name, pairs in by_target.items()}
    extra = getattr(suite, "summarize", None)
    if callable(extra):
        for name, pairs in by_target.items():
            totals[name].update(extra([(p.item, p.answer, p.grade) for p in pairs]))
    pairs = [p for name in by_target for p in by_target[name]]
    has_tools = {item.id: _offers_tools(suite, item) for item in items}
    outcomes = OutcomeTable(Outcome(prompt_id=p.item.id, suite=suite.name, prompt=p.item.prompt, model=p.target,
                                    score=p.grade.score, cost_usd=p.answer.cost_usd, prompt_tokens=p.answer.prompt_tokens,
                                    completion_tokens=p.answer.completion_tokens,
                                    latency_s=p.answer.latency_s if not p.error else None, response=p.answer.text,
                                    has_tools=has_tools[p.item.id], signals=p.signals)
                            for p in pairs)
    stopped = "max_cost" if guard.is_exhausted else "completed"
    outcomes_path = outcomes.write(out_dir / "outcomes.jsonl")
    with (out_dir / "grades.jsonl").open("w", encoding="utf-8") as f:
        for p in pairs:
            served = [c.model for c in p.answer.completions if c.model]  # per call; a policy names the model that answered
            line = {"prompt_id": p.item.id, "model": p.target, "served_models": served, "score": p.grade.score,
                    "details": p.grade.details,
                    "judge_cost_usd": p.grade.judge_cost_usd, "error": p.error}
            f.write(json.dumps(line, ensure_ascii=False, default=str) + "\n")
    summary = {"run_id": run_id, "suite": suite.name, "stopped_reason": stopped, "spent_usd": guard.spent_usd, "totals": totals}
    (out_dir / "run.json").write_text(json.dumps(summary, indent=2, default=str))
    if store is not None:
        await asyncio.to_thread(store.save_run, {"id": run_id, "status": "stopped" if guard.is_exhausted else "finished",
                                                 "totals": totals, "outcomes_path": str(outcomes_path), "finished_at": utcnow()})
    grades = {name: {p.item.id: p.grade for p in ps} for name, ps in by_target.items()}
    calls = {name: {"cache_hits": sum(p.cache_hits for p in ps), "calls": sum(p.calls for p in ps)}
             for name, ps in by_target.items()}
    return RunResult(run_id, outcomes, grades, totals, stopped, guard.spent_usd, calls, out_dir, pairs)
