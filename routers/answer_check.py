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
- its arithmetic (`check_arithmetic`): every chain "a op b = c (= d ...)" in the working and every GSM8K
  calculator note "<<a op b=c>>" re-evaluated; a wrong step is strong evidence of a wrong answer
  (RouteLLM's GSM8K Mixtral answers: 8.9% have one, and 89% of those are wrong against 31% of the rest);
- the prompt's cheap text features (`routers.features.text_features`), and optionally the principal
  components of the prompt's and the answer's all-MiniLM-L6-v2 embeddings.

A step's answer must be generated before it is scored, so a cascade with this scorer pays every step up to
the one that answers (`measure_cascade(..., pays_rejected=True)`). Nothing here calls a model.
"""

from __future__ import annotations

import ast
import functools
import json
import math
import operator
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

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

_NUM = r"\$?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?%?"
_OPERAND = rf"(?:\(\s*)*{_NUM}(?:\s*\))*"    # whitespace in one place only: no exponential backtracking
_EXPR = rf"{_OPERAND}(?:\s*[-+*/x×÷]\s*{_OPERAND})*"
_CHAIN = re.compile(rf"(?<![\w.]){_EXPR}(?:\s*=\s*{_EXPR})+")
_OPERATOR_CHARS = set("+-*/×÷")
_HAS_OPERATOR = re.compile(r"\d\s*\)*\s*[-+*/x×÷]\s*\(*\s*\$?\d")
_CALCULATOR = re.compile(r"<<([^<>=]+)=([^<>]+)>>")
_FINAL_MARKER = re.compile(r"####|answer is|\\boxed|Answer:", re.I)
_FINAL_AFTER_MARKER = re.compile(r"(?:####|answer is|\\boxed\{|Answer:)\s*[:$]*\s*(-?[\d,]*\.?\d+)", re.I)
_NUMBER = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")
_HEDGE = re.compile(r"\b(?:approximately|about|round(?:ed|ing)?|assum(?:e|ing)|estimate|can't have|cannot have|"
                    r"not possible|however)\b", re.I)
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def evaluate_expression(text: str) -> float | None:
    """The value of an arithmetic expression as written in a worked answer ("9 * $2", "2 + 1/2", "20% * 50",
    "(3 + 4) x 2"): + - * / and parentheses; "x", "×" and "÷" as operators; "$" and thousands commas dropped;
    "n%" read as n / 100. None when it is not such an expression or divides by zero (never `eval`)."""
    cleaned = (text.replace("$", "").replace("×", "*").replace("÷", "/")
               .replace(",", ""))
    cleaned = re.sub(r"(?<=[\d)\s])x(?=[\s\d(])", "*", cleaned)
    cleaned = re.sub(r"(\d+(?:\.\d+)?)%", r"(\1/100)", cleaned)
    try:
        tree = ast.parse(cleaned.strip(), mode="eval")
    except SyntaxError:
        return None

    def value(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return float(node.value)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -value(node.operand)
        raise ValueError("not arithmetic")

    try:
        result = value(tree.body)
    except (ValueError, ZeroDivisionError, OverflowError):
        return None
    return result if math.isfinite(result) else None


def _agrees(a: float, b: float, stated: str | None = None) -> bool:
    """Equal up to the rounding of the `stated` side as written ("3.33" allows 0.005, "3" allows 0.5); a stated
    "n%" may stand for n / 100 or for n itself ("x 100 = 60%"); with no plain stated side, 1e-6 relative."""
    floor = 1e-6 * max(1.0, abs(a), abs(b))
    if stated is None:
        return abs(a - b) <= floor
    digits = stated.split(".", 1)[1] if "." in stated else ""
    tolerance = max(0.5 * 10.0 ** -len(re.sub(r"\D.*", "", digits)), floor)
    if stated.rstrip().endswith("%"):
        return abs(a - b) <= tolerance / 100 or abs(a - 100 * b) <= tolerance
    return abs(a - b) <= tolerance


def _plain(side: str) -> str | None:
    """The side itself when it is a plain number (no operator), else None."""
    return None if _HAS_OPERATOR.search(side) else side.strip().strip("()$ ")


def _truncated(text: str, start: int, end: int) -> tuple[bool, bool]:
    """Whether the chain text[start:end] continues an expression before it ("lilies / 5 = ...") or after it
    ("... = 1 * x"): its first or last side is then only part of one ("x" counts as an operator only as a
    token of its own, not as the end of "Alex")."""
    head, tail = text[:start].rstrip(), text[end:].lstrip()
    before = head[-1:] in _OPERATOR_CHARS or bool(re.search(r"(?:^|[\s\d)])x$", head))
    after = tail[:1] in _OPERATOR_CHARS or bool(re.match(r"x(?:$|[\s\d(])", tail))
    return before, after


def _step(left: str, right: str) -> bool | None:
    """Whether one "left = right" holds (None: not a checkable claim)."""
    if not (_HAS_OPERATOR.search(left) or _HAS_OPERATOR.search(right)):
        return None
    a, b = evaluate_expression(left), evaluate_expression(right)
    if a is None or b is None:
        return None
    return _agrees(a, b, _plain(right) or _plain(left))


def check_arithmetic(text: str) -> tuple[int, int]:
    """(steps checked, steps wrong) of the arithmetic in a worked answer.

    A step is one "=" of a chain "e1 = e2 (= e3 ...)" whose sides are numbers joined by + - * / x (with
    parentheses, "$", "%"), checked when at least one side has an operator ("3 * 4 = 12"; "of 50 = 10" is not
    a claim about arithmetic) and is not cut off by a variable or an operator outside the chain ("x / 5 = 40",
    "3 * 45 = 1 * x"); and each calculator note "<<e=v>>" of GSM8K's format. Notes are checked first and then
    removed, so "= $<<9*2=18>>18" counts once. A Markdown-escaped "\\*" is a "*".

    Example: "16 - 3 = 13 eggs, then 13 - 4 = 8" -> (2, 1).
    """
    text = text.replace("\\*", "*")
    steps = [_step(expr, result) for expr, result in _CALCULATOR.findall(text)]
    plain = _CALCULATOR.sub("", text)
    for match in _CHAIN.finditer(plain):
        sides = [side.strip() for side in match.group(0).split("=")]
        cut_first, cut_last = _truncated(plain, match.start(), match.end())
        pairs = list(zip(sides, sides[1:]))
        keep = range(1 if cut_first else 0, len(pairs) - 1 if cut_last else len(pairs))
        steps.extend(_step(*pairs[i]) for i in keep)
    checked = [ok for ok in steps if ok is not None]
    return len(checked), sum(not ok for ok in checked)


def final_number(text: str) -> float | None:
    """The answer's final number: the one after its last final-answer marker ("#### 18", "the answer is 18"),
    else its last numeral; None when it has none."""
    marked = _FINAL_AFTER_MARKER.findall(text)
    found = marked[-1] if marked else (_NUMBER.findall(text) or [None])[-1]
    if found is None:
        return None
    try:
        value = float(found.replace(",", ""))
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _numbers(text: str) -> set[float]:
    out = set()
    for n in _NUMBER.findall(text):
        try:
            out.add(abs(float(n.replace(",", ""))))
        except ValueError:
            pass
    return out


@functools.lru_cache(maxsize=1)
def _default_embedder():
    """One all-MiniLM-L6-v2 embedder shared by every checker without its own (loaded on first use)."""
    from routers.embedding import Embedder

    return Embedder()


def answer_row(prompt: str, answer: str) -> list[float]:
    """One answer's `ANSWER_FEATURE_NAMES` (see the module docstring)."""
    checked, wrong = check_arithmetic(answer)
    final = final_number(answer)
    markers = list(_FINAL_MARKER.finditer(answer))
    marker = markers[-1] if markers else None
    numerals = list(_NUMBER.finditer(answer))
    working = answer[: marker.start()] if marker else answer[: numerals[-1].start()] if numerals else answer
    f = abs(final) if final is not None else 0.0
    return [math.log1p(len(answer)), math.log1p(answer.count("\n")), math.log1p(len(_NUMBER.findall(answer))),
            float(checked), float(wrong), float(wrong > 0), float(marker is not None), float(final is not None),
            math.log10(1 + f), float(final is not None and f == int(f)),
            float(final is not None and f in _numbers(prompt)), float(final is not None and f in _numbers(working)),
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
    """

    def __init__(self, num_components: int = 16, num_rounds: int = DEFAULT_ROUNDS, params: dict[str, Any] | None = None,
                 embed=None):
        self.num_components, self.num_rounds = int(num_components), int(num_rounds)
        if self.num_components < 0 or self.num_rounds < 1:
            raise ValueError(f"need num_components >= 0 and num_rounds >= 1, got {num_components} and {num_rounds}")
        self.params = {**DEFAULT_PARAMS, **(params or {})}
        self.encode = embed          # texts -> [N, D] embeddings; None: the shared default encoder
        self.booster = None
        self.pca: dict[str, np.ndarray] = {}   # "prompt_mean", "prompt_components", "answer_mean", ...
        self.info: dict[str, Any] = {}         # what its file says of it (model, calibrated threshold, steps)

    @property
    def feature_names(self) -> list[str]:
        pcs = [f"{side}_pc{i}" for side in ("prompt", "answer") for i in range(self.num_components)]
        return [*ANSWER_FEATURE_NAMES, *(f"prompt_{n}" for n in TEXT_FEATURE_NAMES), *pcs]

    def embed(self, texts: list[str]) -> np.ndarray:
        return np.asarray((self.encode or _default_embedder().embed)(texts), dtype=np.float32)

    def _inputs(self, prompts: Sequence[str], answers: Sequence[str], *, fit: bool = False) -> np.ndarray:
        x = answer_features(prompts, answers)
        if self.num_components <= 0:
            return x
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
        return np.concatenate(parts, axis=1).astype(np.float32)

    def fit(self, prompts: Sequence[str], answers: Sequence[str], correct: Sequence[float]) -> AnswerChecker:
        """Fit on [N] prompts, the model's [N] answers and whether each was correct ([N] 0/1, e.g. a
        `RoutingData` score column). Raises ValueError on mismatched lengths, missing labels, a single class
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
        x = self._inputs(prompts, answers, fit=True)
        data = lightgbm.Dataset(x, label=y, feature_name=self.feature_names, params={"verbose": -1})
        self.booster = lightgbm.train(self.params, data, num_boost_round=self.num_rounds)
        return self

    def predict(self, prompts: Sequence[str], answers: Sequence[str]) -> np.ndarray:
        """[N] float64 P(the answer is correct). Raises RuntimeError before `fit`."""
        if self.booster is None:
            raise RuntimeError("the answer checker is not fitted; call fit() or load_answer_checker()")
        return np.asarray(self.booster.predict(self._inputs(prompts, answers)), dtype=np.float64)


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

    async def score(self, caller: ModelCaller, body: dict[str, Any], model: str, response: dict[str, Any] | None) -> float:
        import asyncio

        answer = response_text(response or {})
        p = await asyncio.to_thread(self.checker.predict, [last_user_text(body)], [answer])
        return float(p[0])


def save_answer_checker(checker: AnswerChecker, path: str | Path, *, info: dict[str, Any] | None = None) -> Path:
    """Write a fitted checker to one safetensors file: the PCA arrays, and in the header's metadata entry
    "answer_checker" JSON {"format", "version", "num_components", "num_rounds", "params", "booster" (LightGBM's
    text model, no pickle), "info" (default: `checker.info`, so a loaded checker keeps its calibration)}.
    Raises RuntimeError before `fit`."""
    from safetensors.numpy import save_file

    if checker.booster is None:
        raise RuntimeError("the answer checker is not fitted")
    header = {"format": FORMAT, "version": FORMAT_VERSION, "num_components": checker.num_components,
              "num_rounds": checker.num_rounds, "params": checker.params, "booster": checker.booster.model_to_string(),
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
        checker = AnswerChecker(header["num_components"], header["num_rounds"], header["params"], embed=embed)
        checker.booster = lightgbm.Booster(model_str=header["booster"])
    except (KeyError, TypeError, ValueError, lightgbm.basic.LightGBMError) as exc:
        raise ValueError(f"{path} is a damaged answer-checker file: {type(exc).__name__}: {exc}") from None
    checker.pca, checker.info = arrays, dict(header.get("info") or {})
    return checker
