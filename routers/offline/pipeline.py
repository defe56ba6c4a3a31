"""The library side of `link router train|calibrate|add-model|eval`: one function per subcommand.

    router, costs = train_router("knn", data)                       # fitted on the complete prompts of data
    path = train_and_save("knn", data, "auto.safetensors")
    result = calibrate_file("auto.safetensors", held_out, CalibrationTarget.parse("cost=0.001"))
    add_model_to_file("auto.safetensors", labelled, "acme-sft")     # a new model from its labelled prompts
    report = run_evaluation(train, test, EvalSettings(types=("knn",)), num_splits=5)

`data` is a `RoutingData` (the CLI builds it from outcome tables with `RoutingData.from_outcomes`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from routers.base import Router, load_router, make_router, save_router
from routers.decision import CostModel, choose, choose_threshold, estimate_prompt_tokens
from routers.features import Featurizer
from routers.offline.calibration import CalibrationTarget, calibrate
from routers.offline.cascade_eval import (calibrate_cascade, cascade_picks, cascade_sweep, check_step_order,
                                         efficient_steps)
from routers.offline.crossval import evaluate_add_model, evaluate_kfold, evaluate_resplits
from routers.offline.data import RoutingData
from routers.offline.evaluate import evaluate_split
from routers.offline.metrics import rank_auc
from routers.offline.progress import ProgressSteps
from routers.offline.settings import EvalSettings


# Fewer prompts with every model's score and a learned router predicts little beyond each model's mean (kNN's
# default k is 100); a model recorded on a handful of prompts would otherwise cut the training set to those.
MIN_TRAIN_PROMPTS = 10


def complete_prompts(data: RoutingData, needed: int, purpose: str) -> RoutingData:
    """`data.complete_rows()`, checked to hold at least `needed` prompts (`purpose` says for what, in the error).

    Raises:
        ValueError: fewer complete prompts, naming the models with fewest scores and their counts
            (`RoutingData.incomplete_note`).
    """
    complete = data.complete_rows()
    if complete.num_prompts < needed:
        why = data.incomplete_note() or f"the data holds {data.num_prompts}"
        raise ValueError(f"{purpose} needs at least {needed} prompts with a score of every model; {complete.num_prompts} "
                         f"of {data.num_prompts} have one ({why}): record those models on more prompts, or leave "
                         "their rows out")
    return complete


def train_router(type_: str, data: RoutingData, *, options: dict[str, Any] | None = None,
                 featurizer: Featurizer | None = None,
                 prices: dict[str, tuple[float, float]] | None = None) -> tuple[Router, CostModel]:
    """Fit a `type_` router on the prompts of `data` that every model answered, and its cost model.

    Args:
        prices: model -> (input, output) USD per million tokens, for the cost model (`CostModel.from_data`).
    Raises:
        ValueError: fewer than `MIN_TRAIN_PROMPTS` prompts have every model's score (the message names the
            models that lack scores, with their counts).
    """
    data = complete_prompts(data, MIN_TRAIN_PROMPTS, "training a router")
    featurizer = featurizer or Featurizer()
    router = make_router(type_, data.models, **(options or {}))
    router.fit(data, featurizer.transform(data.prompts, data.has_tools))
    router.featurizer = featurizer
    return router, CostModel.from_data(data, prices)


def train_and_save(type_: str, data: RoutingData, out: str | Path, *, options: dict[str, Any] | None = None,
                   featurizer: Featurizer | None = None, prices: dict[str, tuple[float, float]] | None = None,
                   info: dict[str, Any] | None = None) -> Path:
    """`train_router` then `save_router` with the lambda-0 decision (calibrate it afterwards). Returns the path."""
    router, costs = train_router(type_, data, options=options, featurizer=featurizer, prices=prices)
    complete = data.complete_rows()
    meta = {"num_prompts": complete.num_prompts, "suites": sorted(set(complete.suites)), "options": options or {},
            **(info or {})}
    return save_router(router, out, costs=costs, decision={"rule": "lambda", "cost_penalty": 0.0}, info=meta)


def add_model_to_file(path: str | Path, data: RoutingData, model: str, *, out: str | Path | None = None,
                      featurizer: Featurizer | None = None,
                      prices: dict[str, tuple[float, float]] | None = None) -> dict[str, Any]:
    """Add `model` to a saved router from its labelled prompts in `data`, without retraining the others.

    The router's `add_model` appends the model (kNN: a bank of its labelled prompts; the other models'
    predictions are unchanged); its cost model gains a column fitted on the same rows (`CostModel.from_data`);
    the calibrated decision is kept (recalibrate with `calibrate_file` on held-out data with every model).

    Args:
        data: outcomes with a column `model` (NaN where it has no label; other columns are ignored).
        out: write here instead of updating `path`.
        prices: model -> (input, output) USD per million tokens for its cost column.
    Returns:
        {"model", "num_prompts", "models", "path", "warnings": [text]}: a warning when the labelled prompts are
        fewer than the router needs for predictions that vary with the prompt (its `add_model_minimum`).
    Raises:
        ValueError: `model` is already the router's, has no labelled prompt, or the router type cannot add one.
        KeyError: `data` has no column `model`.
    """
    loaded = load_router(path)
    if model in loaded.models:
        raise ValueError(f"{model!r} is already one of the router's models {loaded.models}")
    if model not in data.models:
        raise KeyError(f"the data has no outcomes of {model!r}; models there: {list(data.models)}")
    column = data.select_models([model])
    labelled = column.subset(np.flatnonzero(np.isfinite(column.scores[:, 0])))
    if labelled.num_prompts == 0:
        raise ValueError(f"no prompt has a score of {model!r}")
    featurizer = featurizer or loaded.router.featurizer
    try:
        loaded.router.add_model(model, labelled, featurizer.transform(labelled.prompts, labelled.has_tools))
    except NotImplementedError:
        raise ValueError(f"a {loaded.router.type} router cannot add a model; retrain it on every model's outcomes "
                         "(`link router train`) or use --type knn") from None
    costs = loaded.costs.with_models(CostModel.from_data(labelled, prices)) if loaded.costs is not None else None
    added = [*loaded.info.get("added_models", []), {"model": model, "num_prompts": labelled.num_prompts}]
    target = save_router(loaded.router, out or path, costs=costs, decision=loaded.decision,
                         info={**loaded.info, "added_models": added})
    warnings = []
    minimum = getattr(loaded.router, "add_model_minimum", None)    # kNN: k + 1; LightGBM: a split's rows
    if minimum is not None and labelled.num_prompts < minimum():
        warnings.append(f"{model} has {labelled.num_prompts} labelled prompts; a {loaded.router.type} router needs at "
                        f"least {minimum()} for predictions that vary with the prompt: with fewer it predicts "
                        f"(nearly) one quality of {model} for every prompt of a task. Label more prompts")
    return {"model": model, "num_prompts": labelled.num_prompts, "models": list(loaded.models), "path": str(target),
            "warnings": warnings}


def calibrate_file(path: str | Path, data: RoutingData, target: CalibrationTarget, *, rule: str = "lambda",
                   strong: str | None = None, weak: str | None = None, cascade_models: Sequence[str] | None = None,
                   out: str | Path | None = None, featurizer: Featurizer | None = None) -> dict[str, Any]:
    """Set a saved router's knob so that `target` holds on held-out `data`, and write it back.

    The router predicts the held-out prompts; expected costs come from its cost model as the gateway would
    compute them (no suite known); each knob setting is charged the recorded scores and costs (complete
    prompts only). Rule "lambda" sets the cost penalty; "threshold" the strong/weak threshold; "cascade" the
    escalation threshold of a cascade scored by this router (`cascade_eval.calibrate_cascade`) over
    `cascade_models` (default: the data's cost-accuracy frontier), clipped to [0, 1] and stored in the file's
    decision as {"cascade": {"models", "threshold", "target"}} next to the router's own rule (the cascade
    policy's `options.threshold`).

    Returns:
        {"rule", "knob", "target", "num_prompts", "mean_cost_usd", "quality", "share": {model: fraction}, "path",
         "best_single_quality": the best single model's mean quality on the prompts}
        (+ "steps" for a cascade).
    Raises:
        ValueError: a threshold rule without strong and weak, a cascade of fewer than two models, an unknown
            rule, or no complete prompt (naming the models short of scores).
        KeyError: the data lacks one of the router's models, or a cascade model is not the router's.
    """
    loaded = load_router(path)
    models = loaded.models
    data = complete_prompts(data.select_models(models), 1, "calibrating the router")
    if rule not in ("lambda", "threshold", "cascade"):
        raise ValueError(f"unknown rule {rule!r}; rules: lambda, threshold, cascade")
    if rule == "threshold" and (strong not in models or weak not in models):
        raise ValueError(f"a threshold rule needs --strong and --weak among {models}")
    featurizer = featurizer or loaded.router.featurizer
    quality = loaded.router.predict(featurizer.transform(data.prompts, data.has_tools), None)
    if rule == "cascade":
        return _calibrate_cascade_file(loaded, path, data, quality, target, cascade_models, out)
    expected = (loaded.costs.select_models(models).expected_cost(estimate_prompt_tokens(data.prompts))
                if loaded.costs is not None else np.zeros_like(quality))
    s, w = (models.index(strong), models.index(weak)) if rule == "threshold" else (None, None)
    knob = calibrate(quality, expected, target, models=models, scores=data.scores, costs=data.costs, strong=s, weak=w)
    picks = choose_threshold(quality, s, w, knob) if rule == "threshold" else choose(quality, expected, knob)
    rows = np.arange(len(picks))
    decision: dict[str, Any] = ({"rule": "threshold", "strong": strong, "weak": weak, "threshold": knob}
                                if rule == "threshold" else {"rule": "lambda", "cost_penalty": knob})
    decision["target"] = {"kind": target.kind, "value": target.value, "model": target.model}
    if "cascade" in loaded.decision:   # a cascade threshold calibrated earlier stays
        decision["cascade"] = loaded.decision["cascade"]
    target_path = Path(out) if out is not None else Path(path)
    save_router(loaded.router, target_path, costs=loaded.costs, decision=decision,
                info={**loaded.info, "calibrated_on": data.num_prompts})
    return {"rule": rule, "knob": knob, "target": decision["target"], "num_prompts": data.num_prompts,
            "mean_cost_usd": float(data.costs[rows, picks].mean()), "quality": float(data.scores[rows, picks].mean()),
            "share": {m: float(np.mean(picks == j)) for j, m in enumerate(models)}, "path": str(target_path),
            "best_single_quality": float(np.max(data.scores.mean(axis=0)))}


def _calibrate_cascade_file(loaded, path, data: RoutingData, quality: np.ndarray, target: CalibrationTarget,
                            cascade_models: Sequence[str] | None, out) -> dict[str, Any]:
    """`calibrate_file` for rule "cascade" (see there)."""
    models = loaded.models
    steps = (check_step_order(cascade_models, models, data.costs) if cascade_models
             else efficient_steps(data.scores, data.costs))
    if len(steps) < 2:
        raise ValueError(f"a cascade needs at least two models, got {[models[j] for j in steps]}")
    step_quality = quality[:, steps]
    knob = min(1.0, max(0.0, calibrate_cascade(step_quality, steps, target, scores=data.scores, costs=data.costs,
                                                 models=models)))
    picks, paid = cascade_picks(step_quality, data.costs, steps, np.array([knob]))
    rows = np.arange(data.num_prompts)
    names = [models[j] for j in steps]
    target_info = {"kind": target.kind, "value": target.value, "model": target.model}
    decision = {**loaded.decision, "cascade": {"models": names, "threshold": knob, "target": target_info}}
    target_path = Path(out) if out is not None else Path(path)
    save_router(loaded.router, target_path, costs=loaded.costs, decision=decision,
                info={**loaded.info, "cascade_calibrated_on": data.num_prompts})
    return {"rule": "cascade", "knob": knob, "steps": names, "target": target_info, "num_prompts": data.num_prompts,
            "mean_cost_usd": float(paid[0].mean()), "quality": float(data.scores[rows, picks[0]].mean()),
            "share": {m: float(np.mean(picks[0] == j)) for j, m in enumerate(models)}, "path": str(target_path),
            "best_single_quality": float(np.max(data.scores.mean(axis=0)))}


def run_evaluation(train: RoutingData, test: RoutingData | None, settings: EvalSettings, *, num_splits: int = 0,
                   folds: int = 5, seeds: Sequence[int] = (0,), group_by: str | None = None,
                   add_model: str | None = None, add_prompts: int = 300,
                   featurizer: Featurizer | None = None,
                   progress: Callable[[int, int, str], None] | None = None) -> dict[str, Any]:
    """What `link router eval` reports.

    With `test`: the fixed split ("split"), plus `num_splits` re-drawn splits ("resplits") when > 0, plus
    per learned type the add-a-model check ("add_model": {type: result}) when `add_model` names a model.
    Without: k-fold cross-validation of `train` ("kfold") over `seeds`, holding out whole `group_by` groups.
    Every set is cut to its complete prompts first ("left_out": {"train"/"test": why, in words} when that
    drops any); the test columns are put in the training order when both hold the same models.

    Raises:
        ValueError: fewer than `MIN_TRAIN_PROMPTS` (or `folds`) complete training prompts or no complete test
            prompt (naming the models short of scores), or other models in test than in train.

    Args:
        progress: called with (steps done, total steps, label) as the evaluation goes: a step is one learned
            router fitted and measured on one fold or split (or one add-a-model check); 0 done while the
            prompts are encoded. The last call has done == total.
    """
    featurizer = featurizer or Featurizer()
    notes = {side: note for side, part in (("train", train), ("test", test))
             if part is not None and (note := part.incomplete_note()) is not None}
    train = complete_prompts(train, max(MIN_TRAIN_PROMPTS, folds if test is None else 0),
                             "training routers" if test is not None else f"{folds}-fold cross-validation")
    if test is not None:
        test = complete_prompts(test, 1, "testing routers").aligned_to(train.models)
    if settings.cascade and settings.cascade_models:       # once on all the training data, before any split
        check_step_order(settings.cascade_models, train.models, train.costs)
    out: dict[str, Any] = {"settings": {"types": list(settings.types), "baselines": list(settings.baselines),
                                        "options": settings.options, "num_lambdas": settings.num_lambdas,
                                        "cascade": settings.cascade, "cascade_models": settings.cascade_models,
                                        "ensembles": list(settings.ensembles)}}
    if notes:
        out["left_out"] = notes
    if test is None:
        out["kfold"] = evaluate_kfold(train, settings, k=folds, seeds=seeds, group_by=group_by, featurizer=featurizer,
                                      progress=progress)
        out["kfold"].update(k=folds, seeds=list(seeds), group_by=group_by)
        return out
    num_types = len(settings.types)
    steps = ProgressSteps(num_types * (1 + num_splits + (add_model is not None)), progress)
    steps.start(f"encoding {train.num_prompts + test.num_prompts} prompts")
    features = (featurizer.transform(train.prompts, train.has_tools),
                featurizer.transform(test.prompts, test.has_tools))
    out["split"] = evaluate_split(train, test, settings, features=features, featurizer=featurizer,
                                  on_router=lambda t: steps.step(f"test split, {t}"))
    if num_splits > 0:
        out["resplits"] = evaluate_resplits(train, test, settings, num_splits=num_splits, featurizer=featurizer,
                                            steps=steps)
    if add_model is not None:
        out["add_model"] = {}
        for t in settings.types:
            out["add_model"][t] = evaluate_add_model(train, test, t, add_model, num_labelled=add_prompts,
                                                     settings=settings, features=features)
            steps.step(f"adding {add_model}, {t}")
    return out


def _meets(point: dict[str, float], target: CalibrationTarget, strong: str, best_quality: float) -> bool:
    """Whether an operating point (cost_usd, quality, escalated) meets `target` (a share target: within 5
    points, since a threshold moves whole prompts)."""
    if target.kind == "cost":
        return point["cost_usd"] <= target.value * (1 + 1e-9)
    if target.kind == "quality":
        return point["quality"] >= target.value * best_quality - 1e-12
    share = point["escalated"] if target.model == strong else 1 - point["escalated"]
    return abs(share - target.value) <= 0.05


def train_checker_and_save(data: RoutingData, model: str, out: str | Path, *, num_components: int = 16,
                           strong: str | None = None, target: CalibrationTarget | None = None, folds: int = 5,
                           seed: int = 0, signal_families: Sequence[str] = ()) -> dict[str, Any]:
    """Fit an answer checker (`routers.answer_check`) on `model`'s recorded answers and save it; with `strong`
    and `target`, also calibrate the escalation threshold of the cascade [model, strong] scored by it.

    The checker is fitted on every recorded answer of `model`. The threshold is chosen on out-of-fold scores
    (`folds`-fold cross-fitting over the prompts both models answered, seeded), every prompt paying `model`
    and a quality target read against the better of the two (`calibrate_cascade(..., pays_rejected=True)`); it is stored
    in the file's info as "threshold" with "steps" (a cascade policy over those steps takes it by default).
    Returns {"path", "num_answers", "accuracy", "threshold", "steps", "auc", "operating_point"} (auc: the
    out-of-fold probability that a right answer outranks a wrong one; operating_point: the held-out folds'
    mean USD per request, quality and share escalated at the threshold, and whether the target is met (else
    the threshold is the closest setting, as `calibration.select_setting` picks it); None without calibration).

    Raises:
        KeyError: an unknown model. ValueError: no recorded answers of `model`, `target` without `strong`
            (or the reverse), `strong` equal to `model`, or too few right or wrong answers for the folds.
    """
    from routers.answer_check import AnswerChecker, save_answer_checker
    from routers.offline.data import kfold_indices

    for name in (model, strong):
        if name is not None and name not in data.models:
            raise KeyError(f"model {name!r} is not in the data; its models are {data.models}")
    if (strong is None) != (target is None):
        raise ValueError("calibrating a threshold needs both a strong model and a target")
    if strong == model:
        raise ValueError(f"--strong must be another model than --model {model!r}: the cascade escalates to it")
    j = data.models.index(model)
    answers = data.responses[:, j] if data.responses is not None else np.full(data.num_prompts, None, dtype=object)
    keep = np.array([a is not None and not np.isnan(s) for a, s in zip(answers, data.scores[:, j])], dtype=bool)
    if not keep.any():
        raise ValueError(f"the data records no answers of {model!r}; train on outcomes with a response column")
    data, answers = data.subset(keep), list(answers[keep])
    signals = list(data.signals[:, j]) if data.signals is not None else [None] * data.num_prompts
    if signal_families and all(x is None for x in signals):
        raise ValueError(f"the checker reads the signals {', '.join(signal_families)}, but the data records none for "
                         f"{model!r}; record them with `link eval run --signals`")
    labels = data.scores[:, j]
    info: dict[str, Any] = {"model": model, "num_answers": data.num_prompts, "accuracy": float(np.mean(labels >= 0.5)),
                            "threshold": None, "steps": None, "auc": None, "operating_point": None}
    if strong is not None:
        both = np.flatnonzero(~np.isnan(data.scores[:, data.models.index(strong)]))   # the pair's prompts
        pair = data.subset(both).select_models([model, strong])
        right = pair.scores[:, 0] >= 0.5
        if min(right.sum(), (~right).sum()) < folds:
            raise ValueError(f"calibrating over {folds} folds needs at least {folds} right and {folds} wrong answers on "
                             f"prompts both models answered; found {int(right.sum())} right and {int((~right).sum())} "
                             f"wrong of {pair.num_prompts}")
        oof = np.zeros(pair.num_prompts)
        for train_idx, test_idx in kfold_indices(pair.num_prompts, folds, seed=seed):
            if right[train_idx].all() or not right[train_idx].any():
                raise ValueError(f"a calibration fold has only right or only wrong training answers; label more "
                                 f"answers (found {int((~right).sum())} wrong of {pair.num_prompts})")
            fold = AnswerChecker(num_components=num_components, signal_families=signal_families).fit(
                [pair.prompts[i] for i in train_idx], [answers[both[i]] for i in train_idx], pair.scores[train_idx, 0],
                [signals[both[i]] for i in train_idx])
            oof[test_idx] = fold.predict([pair.prompts[i] for i in test_idx], [answers[both[i]] for i in test_idx],
                                         [signals[both[i]] for i in test_idx])
        step_scores = np.stack([oof, np.zeros_like(oof)], axis=1)
        threshold = calibrate_cascade(step_scores, [0, 1], target, scores=pair.scores, costs=pair.costs,
                                      models=pair.models, pays_rejected=True)
        at = cascade_sweep(step_scores, pair.scores, pair.costs, [0, 1], thresholds=np.array([threshold]),
                           pays_rejected=True)
        info["operating_point"] = point = {"cost_usd": float(at.mean_cost[0]), "quality": float(at.quality[0]),
                                           "escalated": float(at.share[0, 1])}
        point["target_met"] = _meets(point, target, strong, float(np.nanmax(np.nanmean(pair.scores, axis=0))))
        info.update(threshold=threshold, steps=[model, strong], auc=rank_auc(oof, right))
    checker = AnswerChecker(num_components=num_components, signal_families=signal_families).fit(
        data.prompts, answers, labels, signals)
    info["path"] = str(save_answer_checker(checker, out, info={k: v for k, v in info.items() if k != "path"}))
    return info
