"""Answer checking: a learned P(correct) of one model's answer, read from the answer itself (a cascade scorer).

    checker = AnswerChecker().fit(prompts, answers, correct)     # [N] texts and [N] 0/1 labels of one model
    p = checker.predict(prompts, answers)                        # [N] P(the answer is correct)
    save_answer_checker(checker, "gsm8k-mixtral.safetensors"); load_answer_checker(path)
    Cascade([weak, strong], AnswerScorer(checker), threshold=0.5)   # the gateway's `scorer: answer`

FrugalGPT's scorer (Chen, Zaharia and Zou 2023, arXiv:2305.05176, section 3) is a small model trained on
(query, answer, correct) triples of the cheap model; here it is a LightGBM classifier (Ke et al. 2017) on:

- the answer's structure (`ANSWER_FEATURE_NAMES`): its length, numerals and lines; a final-answer marker
  ("####", "answer is", \\boxed); the final number (size, integer or not, whether the prompt or the earlier
  working already has it); hedges ("approximately", "round", "assume");
- its arithmetic (`routers.arithmetic.check_arithmetic`): every chain "a op b = c (= d ...)" in the working and every GSM8K
  calculator note "<<a op b=c>>" re-evaluated; a wrong step is strong evidence of a wrong answer
  (RouteLLM's GSM8K Mixtral answers: 8.9% have one, and 89% of those are wrong against 31% of the rest);
- the prompt's cheap text features (`routers.features.text_features`), and optionally the principal
  components of the prompt's and the answer's all-MiniLM-L6-v2 embeddings.

A step's answer must be generated before it is scored, so a cascade with this scorer pays every step up to
the one that answers (`measure_cascade(..., pays_rejected=True)`). Nothing here calls a model.
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from routers.arithmetic import FINAL_MARKER, NUMBER, check_arithmetic, final_number, numbers_in
from routers.calls import ModelCaller, last_user_text, response_text
from routers.features import TEXT_FEATURE_NAMES, text_features

FORMAT = "togetherlink-answer-checker"
FORMAT_VERSION = 1
ANSWER_FEATURE_NAMES = ("log_chars", "log_lines", "log_numbers", "num_checked_steps", "num_wrong_steps",
                        "any_wrong_step", "has_final_marker", "has_final_number", "log10_final", "final_is_integer",
                        "final_in_prompt", "final_in_working", "has_hedge", "final_is_negative")
# LightGBM binary classifier; chosen by 5-fold CV on RouteLLM's GSM8K Mixtral answers (seeds 0-2)
DEFAULT_PARAMS: dict[str, Any] = {"objective": "binary", "learning_rate": 0.03, "num_leaves": 15,
                                  "min_data_in_leaf": 20, "bagging_fraction": 0.8, "bagging_freq": 1,
                                  "feature_fraction": 0.5, "verbose": -1, "num_threads": 1, "seed": 0}
DEFAULT_ROUNDS = 200

_HEDGE = re.compile(r"\b(?:approximately|about|round(?:ed|ing)?|assum(?:e|ing)|estimate|can't have|cannot have|"
                    r"not possible|however)\b", re.I)


@functools.lru_cache(maxsize=1)
def _default_embedder():
    """One all-MiniLM-L6-v2 embedder shared by every checker without its own (loaded on first use)."""
    from routers.embedding import Embedder

    return Embedder()


def answer_row(prompt: str, answer: str) -> list[float]:
    """One answer's `ANSWER_FEATURE_NAMES` (see the module docstring)."""
    checked, wrong = check_arithmetic(answer)
    final = final_number(answer)
    markers = list(FINAL_MARKER.finditer(answer))
    marker = markers[-1] if markers else None
    numerals = list(NUMBER.finditer(answer))
    working = answer[: marker.start()] if marker else answer[: numerals[-1].start()] if numerals else answer
    f = abs(final) if final is not None else 0.0
    return [math.log1p(len(answer)), math.log1p(answer.count("\n")), math.log1p(len(NUMBER.findall(answer))),
            float(checked), float(wrong), float(wrong > 0), float(marker is not None), float(final is not None),
            math.log10(1 + f), float(final is not None and f == int(f)),
            float(final is not None and f in numbers_in(prompt)), float(final is not None and f in numbers_in(working)),
            float(bool(_HEDGE.search(answer))), float(final is not None and final < 0)]


def answer_features(prompts: Sequence[str], answers: Sequence[str]) -> np.ndarray:
    """[N, len(ANSWER_FEATURE_NAMES) + len(TEXT_FEATURE_NAMES)] float32: each answer's features, then its
    prompt's text features. Raises ValueError when the lengths differ."""
    if len(prompts) != len(answers):
        raise ValueError(f"{len(prompts)} prompts but {len(answers)} answers")
    rows = np.asarray([answer_row(p, a or "") for p, a in zip(prompts, answers)], dtype=np.float32)
    rows = rows.reshape(len(answers), len(ANSWER_FEATURE_NAMES))
    return np.concatenate([rows, text_features(list(prompts))], axis=1)


class AnswerChecker:
    """P(correct) of one model's answers (see the module docstring).

    Args:
        num_components: principal components kept of the prompt's and of the answer's embedding (0: no
            embeddings, and no encoder is ever loaded).
        num_rounds, params: LightGBM boosting rounds and parameters (default `DEFAULT_PARAMS`).
        embed: texts -> [N, D] embeddings (default `routers.embedding.Embedder().embed`, loaded on first use).
        signal_families: families of `routers.signals.SIGNAL_FAMILIES` read besides the answer's text (e.g.
            ("confidence", "checks"): the answer's token log-probabilities, which the cascade then asks the
            step for); fit and predict take each answer's signal summary. A signal an answer lacks is NaN.
    Raises:
        ValueError: num_components < 0, num_rounds < 1, or an unknown signal family.
    """

    def __init__(self, num_components: int = 16, num_rounds: int = DEFAULT_ROUNDS, params: dict[str, Any] | None = None,
                 embed=None, signal_families: Sequence[str] = ()):
        from routers.signals import SIGNAL_FAMILIES

        self.num_components, self.num_rounds = int(num_components), int(num_rounds)
        if self.num_components < 0 or self.num_rounds < 1:
            raise ValueError(f"need num_components >= 0 and num_rounds >= 1, got {num_components} and {num_rounds}")
        unknown = [f for f in signal_families if f not in SIGNAL_FAMILIES]
        if unknown:
            raise ValueError(f"unknown signal families {unknown}; families: {', '.join(SIGNAL_FAMILIES)}")
        self.signal_families = tuple(signal_families)
        self.params = {**DEFAULT_PARAMS, **(params or {})}
        self.encode = embed          # texts -> [N, D] embeddings; None: the shared default encoder
        self.booster = None
        self.pca: dict[str, np.ndarray] = {}   # "prompt_mean", "prompt_components", "answer_mean", ...
        self.info: dict[str, Any] = {}         # what its file says of it (model, calibrated threshold, steps)

    @property
    def feature_names(self) -> list[str]:
        pcs = [f"{side}_pc{i}" for side in ("prompt", "answer") for i in range(self.num_components)]
        return [*ANSWER_FEATURE_NAMES, *(f"prompt_{n}" for n in TEXT_FEATURE_NAMES), *pcs,
                *(f"signal_{n}" for n in self.signal_columns)]

    @property
    def signal_columns(self) -> list[str]:
        """The `routers.signals.SIGNAL_FEATURE_NAMES` this checker reads, in order."""
        from routers.signals import SIGNAL_FAMILIES

        return [c for family in self.signal_families for c in SIGNAL_FAMILIES[family][0]]

    def _signal_inputs(self, n: int, signals: Sequence[dict | None] | None) -> np.ndarray:
        """[n, len(signal_columns)] float32 (NaN where a summary lacks a signal)."""
        from routers.signals import SIGNAL_FEATURE_NAMES, signal_vector

        if signals is not None and len(signals) != n:
            raise ValueError(f"{n} answers but {len(signals)} signal summaries")
        cols = [SIGNAL_FEATURE_NAMES.index(c) for c in self.signal_columns]
        rows = [signal_vector(s)[cols] for s in (signals if signals is not None else [None] * n)]
        return np.asarray(rows, dtype=np.float32).reshape(n, len(cols))

    def embed(self, texts: list[str]) -> np.ndarray:
        return np.asarray((self.encode or _default_embedder().embed)(texts), dtype=np.float32)

    def _inputs(self, prompts: Sequence[str], answers: Sequence[str], signals: Sequence[dict | None] | None = None, *,
                fit: bool = False) -> np.ndarray:
        x = answer_features(prompts, answers)
        tail = [self._signal_inputs(len(answers), signals)] if self.signal_families else []
        if self.num_components <= 0:
            return np.concatenate([x, *tail], axis=1).astype(np.float32) if tail else x
        parts = [x]
        for side, texts in (("prompt", list(prompts)), ("answer", [a or "" for a in answers])):
            e = self.embed(texts)
            if fit:
                if self.num_components > e.shape[1]:
                    raise ValueError(f"num_components {self.num_components} exceeds the embedding's {e.shape[1]} "
                                     "dimensions")
                mean = e.mean(axis=0)
                _, _, vt = np.linalg.svd(e - mean, full_matrices=False)
                self.pca[f"{side}_mean"], self.pca[f"{side}_components"] = mean, vt[: self.num_components]
            parts.append((e - self.pca[f"{side}_mean"]) @ self.pca[f"{side}_components"].T)
        return np.concatenate([*parts, *tail], axis=1).astype(np.float32)

    def fit(self, prompts: Sequence[str], answers: Sequence[str], correct: Sequence[float],
            signals: Sequence[dict | None] | None = None) -> AnswerChecker:
        """Fit on [N] prompts, the model's [N] answers and whether each was correct ([N] 0/1, e.g. a
        `RoutingData` score column); `signals`: [N] signal summaries (`RoutingData.signals` column), read when the
        checker has signal families. Raises ValueError on mismatched lengths, missing labels, a single class
        of labels, or more components than answers (or than the embedding's dimensions)."""
        import lightgbm

        y = np.asarray(correct, dtype=np.float64)
        if y.shape != (len(prompts),):
            raise ValueError(f"{len(prompts)} prompts but labels of shape {y.shape}")
        if np.isnan(y).any():
            raise ValueError(f"{int(np.isnan(y).sum())} labels are missing (NaN); drop those answers first")
        if self.num_components > len(prompts):
            raise ValueError(f"num_components {self.num_components} exceeds the {len(prompts)} answers; "
                             "use fewer components (0: no embeddings) or more answers")
        y = (y >= 0.5).astype(np.float64)
        if y.min() == y.max():
            raise ValueError("the labels must hold both correct and wrong answers")
        x = self._inputs(prompts, answers, signals, fit=True)
        data = lightgbm.Dataset(x, label=y, feature_name=self.feature_names, params={"verbose": -1})
        self.booster = lightgbm.train(self.params, data, num_boost_round=self.num_rounds)
        return self

    def predict(self, prompts: Sequence[str], answers: Sequence[str],
                signals: Sequence[dict | None] | None = None) -> np.ndarray:
        """[N] float64 P(the answer is correct); `signals` as in `fit`. Raises RuntimeError before `fit`."""
        if self.booster is None:
            raise RuntimeError("the answer checker is not fitted; call fit() or load_answer_checker()")
        return np.asarray(self.booster.predict(self._inputs(prompts, answers, signals)), dtype=np.float64)


class AnswerScorer:
    """A cascade `Scorer` (routers.cascade) reading the step's answer with an `AnswerChecker`.

    Args:
        checker: a fitted AnswerChecker for the cascade's cheap model.
    """

    name = "answer"
    needs_answer = True

    def __init__(self, checker: AnswerChecker):
        self.checker = checker

    def preload(self) -> None:
        """Load the checker's encoder in a daemon thread (one warm-up prediction), so that the first request
        does not wait for it; a failure is logged (the request meets it again and reports it)."""
        import logging
        import threading

        def warm() -> None:
            try:
                self.checker.predict(["warm-up"], ["warm-up"])
            except Exception:  # noqa: BLE001 - logged here, raised again by the request that scores
                logging.getLogger(__name__).exception("answer checker: the warm-up prediction failed")

        if self.checker.num_components > 0:
            threading.Thread(target=warm, name="answer-checker-warm-up", daemon=True).start()

    @property
    def step_fields(self) -> dict[str, Any]:
        """Request fields the scored step is sent (a client's own values win): token log-probabilities with 5
        alternatives when the checker reads the confidence signals."""
        return {"logprobs": True, "top_logprobs": 5} if "confidence" in self.checker.signal_families else {}

    def read_signals(self, response: dict[str, Any] | None) -> dict[str, Any] | None:
        """The answer's signal summary (`routers.signals.answer_signals`), or None when the checker reads none."""
        if not self.checker.signal_families:
            return None
        from routers.signals import answer_signals, response_logprobs

        tokens, alternatives = response_logprobs(response or {})
        return answer_signals(response_text(response or {}), tokens, alternatives)

    async def score(self, caller: ModelCaller, body: dict[str, Any], model: str, response: dict[str, Any] | None) -> float:
        import asyncio

        answer = response_text(response or {})
        signals = self.read_signals(response)
        p = await asyncio.to_thread(self.checker.predict, [last_user_text(body)], [answer],
                                    None if signals is None else [signals])
        return float(p[0])


def save_answer_checker(checker: AnswerChecker, path: str | Path, *, info: dict[str, Any] | None = None) -> Path:
    """Write a fitted checker to one safetensors file: the PCA arrays, and in the header's metadata entry
    "answer_checker" JSON {"format", "version", "num_components", "num_rounds", "params", "signal_families", "booster" (LightGBM's
    text model, no pickle), "info" (default: `checker.info`, so a loaded checker keeps its calibration)}.
    Raises RuntimeError before `fit`."""
    from safetensors.numpy import save_file

    if checker.booster is None:
        raise RuntimeError("the answer checker is not fitted")
    header = {"format": FORMAT, "version": FORMAT_VERSION, "num_components": checker.num_components,
              "num_rounds": checker.num_rounds, "params": checker.params, "booster": checker.booster.model_to_string(),
              "signal_families": list(checker.signal_families),
              "info": checker.info if info is None else info}
    path = Path(path)
    if path.exists() and not path.is_file():
        raise ValueError(f"{path} exists and is not a regular file; give a file path ending in .safetensors")
    path.parent.mkdir(parents=True, exist_ok=True)
    arrays = {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in checker.pca.items()}
    try:
        save_file(arrays or {"empty": np.zeros(1, dtype=np.float32)}, str(path),
                  metadata={"answer_checker": json.dumps(header)})
    except Exception as exc:  # noqa: BLE001 - safetensors raises its own error type for an unwritable path
        raise OSError(f"cannot write {path}: {exc}") from None
    return path


def load_answer_checker(path: str | Path, *, embed=None) -> AnswerChecker:
    """Read a file written by `save_answer_checker`.

    Raises:
        FileNotFoundError: no such file. ValueError: not an answer-checker file, or a newer format version.
    """
    import lightgbm
    from safetensors import safe_open

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no answer-checker file at {path}")
    try:
        with safe_open(str(path), framework="np") as f:
            header = json.loads((f.metadata() or {}).get("answer_checker") or "{}")
            arrays = {k: f.get_tensor(k) for k in f.keys() if k != "empty"}
    except Exception as exc:  # noqa: BLE001 - safetensors raises its own error types for a malformed file
        raise ValueError(f"{path} is not an answer-checker file: {exc}") from exc
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise ValueError(f"{path} is not an answer-checker file (no '{FORMAT}' header)")
    if not isinstance(header.get("version", 0), int):
        raise ValueError(f"{path} is a damaged answer-checker file: version {header['version']!r}")
    if header.get("version", 0) > FORMAT_VERSION:
        raise ValueError(f"{path} has answer-checker format version {header['version']}; this build reads {FORMAT_VERSION}")
    try:
        checker = AnswerChecker(header["num_components"], header["num_rounds"], header["params"], embed=embed,
                                signal_families=header.get("signal_families") or ())
        checker.booster = lightgbm.Booster(model_str=header["booster"])
    except (KeyError, TypeError, ValueError, lightgbm.basic.LightGBMError) as exc:
        raise ValueError(f"{path} is a damaged answer-checker file: {type(exc).__name__}: {exc}") from None
    checker.pca, checker.info = arrays, dict(header.get("info") or {})
    return checker
