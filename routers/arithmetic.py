"""Arithmetic in a worked answer: expressions evaluated without `eval`, "a op b = c" steps re-checked, the final number.

    check_arithmetic("16 - 3 = 13 eggs, then 13 - 4 = 8")     # (2, 1): two steps checked, one wrong
    final_number("... so she has 18 dollars. #### 18")        # 18.0
    evaluate_expression("(3 + 4) x 2")                        # 14.0

Shared by the answer checker (`routers.answer_check`, a learned P(correct)) and the answer signals
(`routers.signals`, the checks family). Pure Python: no model, no numpy.
"""

from __future__ import annotations

import ast
import math
import operator
import re

_NUM = r"\$?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?%?"
_OPERAND = rf"(?:\(\s*)*{_NUM}(?:\s*\))*"    # whitespace in one place only: no exponential backtracking
_EXPR = rf"{_OPERAND}(?:\s*[-+*/x×÷]\s*{_OPERAND})*"
_CHAIN = re.compile(rf"(?<![\w.]){_EXPR}(?:\s*=\s*{_EXPR})+")
_OPERATOR_CHARS = set("+-*/×÷")
_HAS_OPERATOR = re.compile(r"\d\s*\)*\s*[-+*/x×÷]\s*\(*\s*\$?\d")
_CALCULATOR = re.compile(r"<<([^<>=]+)=([^<>]+)>>")
FINAL_MARKER = re.compile(r"####|answer is|\\boxed|Answer:", re.I)
_FINAL_AFTER_MARKER = re.compile(r"(?:####|answer is|\\boxed\{|Answer:)\s*[:$]*\s*(-?[\d,]*\.?\d+)", re.I)
NUMBER = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")
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
    found = marked[-1] if marked else (NUMBER.findall(text) or [None])[-1]
    if found is None:
        return None
    try:
        value = float(found.replace(",", ""))
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def numbers_in(text: str) -> set[float]:
    """The absolute values of the numerals in `text` ("1,200" -> 1200.0)."""
    out = set()
    for n in NUMBER.findall(text):
        try:
            out.add(abs(float(n.replace(",", ""))))
        except ValueError:
            pass
    return out
