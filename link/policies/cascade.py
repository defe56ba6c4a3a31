"""`cascade`: the cheapest model answers first; its answer is scored and escalated below a threshold.

    - name: cheap-then-strong
      type: cascade
      models: [smollm2-135m-instruct, gemma-3-270m]   # escalation order, cheapest first
      options:
        threshold: 0.5          # one number, or a list of one per step but the last; in [0, 1]; default: the one
                                # `link router calibrate --rule cascade` stored in the router file for
                                # these steps (scorer router) or `train-checker --target` in the checker
                                # file (scorer answer), else 0.5
        scorer: judge           # judge (a model's yes/no verdict on the answer) | router (predicted quality) |
                                # answer (a learned answer checker reading the step's answer)
        judge: gemma-3-270m     # scorer judge: the judge model (default: the last model)
        judge_logprobs: true    # scorer judge: read P(yes) from the judge's top logprobs when it returns them
        path: routers/trained/link-auto.safetensors   # scorer router: a router file trained on these models
        encoder: auto        # optional, scorer router or answer: the encoder, as a router policy's (link/policies/router.py)
        max_cost_usd: 0.01      # optional, scorer router: leave out the steps expected to cost more per request
                                # (every step in the router file then), in [0, 1e6]; none over: all steps
        checker: gsm8k-mixtral.checker.safetensors   # scorer answer: a file of `link router train-checker`, fitted
                                # on the first step's answers (used for every step but the last); its threshold,
                                # when calibrated there (--strong, --target) for these steps, is the default

Only the final answer reaches the client: intermediate steps run whole, and an accepted one is streamed as
chunks made from it (routers/cascade.py). Each step's score, acceptance or error goes into the request
log's decision ("cascade"); every call (steps and judge) is accounted: the answer's `usage` is the answering
step's call, `usage.link_billed` the sum over every call (link/executor.py). The threshold is calibrated like a
router's knob: `routers.cascade.replay_cascade` charges it on recorded outcomes.

The cost ceiling (`max_cost_usd`) is the routing objective's (`routers.decision.rank`, as for the router and hybrid
policies): the steps `rank` keeps under it, from the router file's expected costs, escalate in their configured
order, the last one kept answering when reached; when every step is over, the cheapest answers alone and the
decision says `over_max_cost`. The steps are never reordered by the objective: a cascade asks the cheap step
first so that its accepted answers cost little, where the objective would put the strongest model first
whenever its quality gain is worth its cost, and a judge's or a checker's score exists only once the step
has answered, after its cost is paid.
"""

from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator, Callable

from link.accounting import DEFAULT_MAX_COMPLETION_TOKENS, max_request_cost
from link.config import PolicyConfig
from link.policies.base import (MULTI_CALL_OPTIONS, CostBound, Plan, PlanExecutor, Policy, PolicyError, PolicyRequest,
                               without_stream_resume)
from link.policies.options import bool_option, check_options, number_option, number_value, str_option
from link.policies.router import (MAX_COST_USD, LazyRouter, encoder_option, gateway_embedder, require_text_prompt,
                                  router_path)
from routers.request import RoutingRequest   # stdlib only: importing it loads no model or numpy

OPTIONS = ("threshold", "scorer", "judge", "judge_logprobs", "path", "encoder", "checker", "max_cost_usd")
JUDGE_TOKENS = 256  # a bound on the judge's instruction and framing around the request and the answer
SCORERS = ("judge", "router", "answer")
# the options only one scorer reads: given with another scorer they would be ignored, so they are refused
SCORER_OPTIONS = {"judge": ("judge", "judge_logprobs"), "router": ("path", "max_cost_usd"), "answer": ("checker",)}
ENCODER_SCORERS = ("router", "answer")


class CascadeExecutor(PlanExecutor):
    """Runs a `routers.cascade.Cascade` for one request (streams only once the final answer is known)."""

    keepalive = False

    def __init__(self, cascade):
        self.cascade = cascade

    async def complete(self, caller, body: dict[str, Any], decision: dict[str, Any]) -> dict:
        from routers.cascade import CascadeTrace

        trace = CascadeTrace()
        try:
            return await self.cascade.complete(caller, body, trace)
        finally:
            decision["cascade"] = trace.to_dict()

    async def stream(self, caller, body: dict[str, Any], decision: dict[str, Any]) -> AsyncIterator[dict]:
        from routers.cascade import CascadeTrace

        trace = CascadeTrace()
        try:
            async for chunk in self.cascade.stream(caller, body, trace):
                yield chunk
        finally:
            decision["cascade"] = trace.to_dict()

    def replay_model(self, body: dict[str, Any]) -> str | None:
        """With the router's predicted quality as scorer: the first step predicted at or above its threshold
        (else the last), whose recorded answer is the cascade's, paid alone (the steps before it are skipped
        without a call). A judge's verdicts are not recorded: None."""
        cascade = self.cascade
        predict = getattr(cascade.scorer, "predict", None)
        if cascade.scorer.needs_answer or predict is None:
            return None
        scores = predict(body)
        return next((m for m, t in zip(cascade.models, cascade.thresholds) if scores[m] >= t), cascade.models[-1])

    def max_cost_usd(self, endpoint: str, body: dict[str, Any], deployments: Callable[[str], list]) -> float:
        """Every step at its cap, plus (judge scorer) a verdict on every step but the last."""
        cascade = self.cascade
        total = sum(max_request_cost(endpoint, body, deployments(m)) for m in cascade.models)
        judge = getattr(cascade.scorer, "model", None)
        if judge is not None:
            answer = int(body.get("max_completion_tokens") or body.get("max_tokens") or DEFAULT_MAX_COMPLETION_TOKENS)
            verdict = cascade.scorer.judge_body(body, "")
            total += (len(cascade.models) - 1) * max_request_cost("chat", verdict, deployments(judge), extra_prompt_tokens=answer)
        return total


def default_threshold(config: PolicyConfig, router: LazyRouter | None, scorer=None) -> float:
    """The threshold when `options.threshold` is unset: the one `link router calibrate --rule cascade` stored in
    the router file, or `link router train-checker --target` in the checker file, for these same steps; else 0.5."""
    calibrated = ((router.header.get("decision") or {}).get("cascade") or {}) if router is not None else {}
    if router is None and scorer is not None:
        calibrated = getattr(getattr(scorer, "checker", None), "info", None) or {}
        calibrated = {"models": calibrated.get("steps"), "threshold": calibrated.get("threshold")}
    if calibrated.get("models") == list(config.models) and isinstance(calibrated.get("threshold"), (int, float)):
        return float(calibrated["threshold"])
    return 0.5


def answer_scorer(options: dict[str, Any], first_step: str | None = None):
    """A `routers.answer_check.AnswerScorer` of the `checker` file. Raises PolicyError when it is missing or
    not an answer-checker file."""
    from routers.answer_check import AnswerScorer, load_answer_checker

    path = options.get("checker")
    if path is None or path == "":
        raise PolicyError("a cascade with scorer 'answer' needs options.checker: a file written by "
                          "`link router train-checker`", param="options.checker")
    if not isinstance(path, str):
        raise PolicyError(f"options.checker must be a file path (a string), got {path!r}", param="options.checker")
    encoder = encoder_option(options)
    try:
        checker = load_answer_checker(path)
    except (FileNotFoundError, ValueError) as exc:
        raise PolicyError(f"options.checker: {exc}", param="options.checker") from None
    fitted_on = checker.info.get("model")
    if first_step is not None and fitted_on and fitted_on != first_step:
        raise PolicyError(f"options.checker was fitted on answers of {fitted_on!r}, but the cascade's first step is "
                          f"{first_step!r}; train one on that model's answers (`link router train-checker`)",
                          param="options.checker")
    if checker.num_components > 0:   # the prompt's and the answer's embeddings, from the encoder a router would use
        checker.encode = gateway_embedder(encoder).embed
    return AnswerScorer(checker)


def _check_scorer_options(options: dict[str, Any], scorer_name: str) -> None:
    """Refuse an option that only another scorer reads (e.g. `checker` with scorer judge). Raises PolicyError."""
    for key in (*(k for other, keys in SCORER_OPTIONS.items() if other != scorer_name for k in keys),
                *(("encoder",) if scorer_name not in ENCODER_SCORERS else ())):
        if options.get(key) is not None:          # null: unset
            readers = [n for n, keys in SCORER_OPTIONS.items() if key in keys] or list(ENCODER_SCORERS)
            raise PolicyError(f"options.{key} is read only by scorer {' or '.join(map(repr, readers))}, but this "
                              f"cascade's scorer is {scorer_name!r}: drop options.{key} or set options.scorer",
                              param=f"options.{key}")


def build_cascade(config: PolicyConfig, model_names: tuple[str, ...] | None = None):
    """(a `routers.cascade.Cascade`, the LazyRouter of a router scorer or None) from a policy definition.
    Raises PolicyError."""
    from routers.cascade import Cascade, JudgeScorer, PredictedQuality

    options = config.options
    check_options("cascade", without_stream_resume("cascade", options), (*OPTIONS, *MULTI_CALL_OPTIONS))
    scorer_name = options.get("scorer", "judge")
    if scorer_name not in SCORERS:
        raise PolicyError(f"options.scorer must be one of {SCORERS}, got {scorer_name!r}", param="options.scorer")
    _check_scorer_options(options, scorer_name)
    if scorer_name == "judge":
        judge = str_option(options, "judge", config.models[-1])
        if model_names is not None and judge not in model_names:
            raise PolicyError(f"judge model {judge!r} is not served; the gateway serves {sorted(model_names)}",
                              param="options.judge")
        scorer, router = JudgeScorer(judge, use_logprobs=bool_option(options, "judge_logprobs", True)), None
    elif scorer_name == "answer":
        scorer, router = answer_scorer(options, config.models[0] if config.models else None), None
    else:
        router = LazyRouter(router_path(config), encoder_option(options))
        outside = [m for m in config.models[:-1] if m not in router.models]
        if outside:
            raise PolicyError(f"step model(s) {outside} are not among the router's models {router.models}", param="models")
        if max_cost_option(options) is not None and config.models[-1] not in router.models:
            raise PolicyError(f"options.max_cost_usd prices every step from the router file, but the last step "
                              f"{config.models[-1]!r} is not among its models {router.models}", param="options.max_cost_usd")
        scorer = PredictedQuality(lambda body: router.get().router.score(body))
    threshold = options.get("threshold")
    if threshold is None:
        threshold = default_threshold(config, router, scorer)
    elif isinstance(threshold, list):
        threshold = [number_value(t, f"options.threshold[{i}]", 0.0, 1.0) for i, t in enumerate(threshold)]
    else:
        threshold = number_value(threshold, "options.threshold", 0.0, 1.0)
    try:
        return Cascade(config.models, scorer, threshold), router
    except (TypeError, ValueError) as exc:
        raise PolicyError(f"cascade: {exc}", param="options.threshold" if "threshold" in str(exc) else "models") from None


def max_cost_option(options: dict[str, Any]) -> float | None:
    """`options.max_cost_usd` (USD per request, in [0, MAX_COST_USD]), None when unset (or null). Raises PolicyError."""
    return None if options.get("max_cost_usd") is None else number_option(options, "max_cost_usd", None, 0.0, MAX_COST_USD)


def steps_within(cascade, ranking) -> Any:
    """The cascade of the steps `ranking` (`routers.decision.rank` under a ceiling) keeps, in escalation order,
    each with its own threshold and the last one kept answering; a single step's name when only one is kept."""
    from routers.cascade import Cascade

    kept = [m for m in cascade.models if m in ranking.order]
    if len(kept) == len(cascade.models):
        return cascade
    if len(kept) == 1:
        return kept[0]
    threshold = dict(zip(cascade.models, cascade.thresholds))
    return Cascade(kept, cascade.scorer, [threshold[m] for m in kept[:-1]])


def predicted_steps(executor: Any, body: dict[str, Any]) -> list[dict[str, Any]] | None:
    """What a cascade scored by the router's predicted quality will do with `body`, decided before any call:
    [{"model", "predicted_quality", "threshold", "status"}] per step, status "skipped" (predicted under its
    threshold), "answers" (the first step at or over its threshold, else the last) or "not reached"; the last
    step's prediction and threshold are None. None for any other plan (a judge or an answer checker scores
    answers, known only once they exist). Blocking: the router embeds the prompt once.

    Raises:
        OSError, ValueError: the router file cannot be read (as `routers.base.load_router`).
    """
    cascade = getattr(executor, "cascade", None)
    predict = getattr(getattr(cascade, "scorer", None), "predict", None)
    if cascade is None or predict is None or cascade.scorer.needs_answer:
        return None
    scores = predict(body)
    steps, answered = [], False
    for model, threshold in zip(cascade.models, [*cascade.thresholds, None]):
        quality = None if threshold is None else float(scores[model])
        status = ("not reached" if answered else "answers" if threshold is None or quality >= threshold else "skipped")
        answered = answered or status == "answers"
        steps.append({"model": model, "predicted_quality": quality, "threshold": threshold, "status": status})
    return steps


class CascadePolicy(Policy):
    """A cascade over the policy's models (see the module docstring)."""

    type = "cascade"
    OPTIONS = OPTIONS
    CONTINUES_STREAMS = False  # the answer comes from several calls

    @classmethod
    def check(cls, config: PolicyConfig, model_names: tuple[str, ...]) -> None:
        super().check(config, model_names)
        build_cascade(config, model_names)

    def __init__(self, config: PolicyConfig, model_names: tuple[str, ...] | list[str]):
        super().__init__(config, model_names)
        self.cascade, self.router = build_cascade(config)
        self.max_cost_usd = max_cost_option(config.options)
        if self.router is not None:
            self.router.preload()
        preload = getattr(self.cascade.scorer, "preload", None)
        if preload is not None:
            preload()
        self.executor = CascadeExecutor(self.cascade)

    def cost_bound(self) -> CostBound:
        """Every step, plus (judge scorer) a verdict on each step but the last, reading the request and an answer."""
        cascade = self.cascade
        judge = getattr(cascade.scorer, "model", None)
        if judge is None:
            return CostBound(len(cascade.models), tuple(cascade.models))
        return CostBound(2 * len(cascade.models) - 1, tuple(dict.fromkeys([*cascade.models, judge])),
                         prompt_tokens_per_max_token=1, extra_prompt_tokens=JUDGE_TOKENS)

    def rank_steps(self, request: RoutingRequest):
        """`routers.decision.rank` of the steps by the router file's predicted quality and expected cost under
        `max_cost_usd` (lambda 0: only which steps it keeps is used). Blocking: the router embeds the prompt."""
        from routers.decision import rank

        loaded = self.router.get()
        quality = loaded.router.score(request)
        cost = dict(zip(loaded.models, (float(c) for c in loaded.expected_cost(request))))
        steps = self.cascade.models
        return rank({m: quality[m] for m in steps}, {m: cost[m] for m in steps}, 0.0, self.max_cost_usd)

    async def plan(self, request: PolicyRequest) -> Plan:
        require_text_prompt(request.body)   # its steps may read token ids differently, and its scorer reads text
        cascade, executor = self.cascade, self.executor
        decision = {"type": self.type, "scorer": cascade.scorer.name, "thresholds": cascade.thresholds}
        if self.max_cost_usd is not None:
            routing = RoutingRequest.from_body(request.body, endpoint=request.endpoint)
            ranking = await asyncio.to_thread(self.rank_steps, routing)
            decision.update(max_cost_usd=self.max_cost_usd, excluded=ranking.excluded,
                            over_max_cost=ranking.is_over_max_cost,
                            expected_cost_usd={r.name: r.cost for r in ranking.given})
            kept = steps_within(cascade, ranking)
            if isinstance(kept, str):    # one step left: it answers alone, no escalation
                return Plan(self.name, [kept], decision)
            if kept is not cascade:
                cascade, executor = kept, CascadeExecutor(kept)
                decision["thresholds"] = cascade.thresholds
        judge = getattr(cascade.scorer, "model", None)
        models = list(dict.fromkeys([*cascade.models, *([judge] if judge else [])]))
        return Plan(self.name, models, decision, executor=executor)
