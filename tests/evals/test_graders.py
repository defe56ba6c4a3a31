"""evals.graders: number and letter extraction on hand-written replies, and the named graders."""

from __future__ import annotations

import pytest

from evals.graders import (GRADERS, extract_choice, extract_number, get_grader, grade_choice, grade_contains,
                           grade_exact, grade_json, grade_numeric, grade_regex, numbers_equal, parse_number)


@pytest.mark.parametrize("text, expected", [
    # the "####" marker wins over everything else
    ("She has 3 apples, then 5 more.\n#### 8", 8),
    ("#### 8\nThe answer is 9", 8),
    ("step #### 4 then more text #### 72", 72),
    ("#### 1,250", 1250),
    ("#### $1,250.00", 1250),
    ("#### -3", -3),
    ("#### 18.00", 18),
    ("#### 0.5", 0.5),
    ("#### 3/4", 0.75),
    ("#### 45%", 45),
    ("#### \u22127", -7),  # U+2212 minus
    # "answer is" / "answer:" when there is no "####"
    ("Each costs 4 dollars, so 3 cost 12. The answer is 12.", 12),
    ("The final answer is $1,000,000.", 1_000_000),
    ("Answer: 42 because 6 * 7 = 42 and 5 more is 47", 42),
    ("answer = -15 (a loss)", -15),
    ("\\boxed{27} and then 3", 27),
    # else the last number
    ("48 / 2 = 24 in May, 48 + 24 = 72 in total.", 72),
    ("He ran 5 miles a day for 7 days: 35 miles.", 35),
    ("It costs $7.50.", 7.5),
    ("between 3-5 hours, so 5", 5),
    ("she lost 10 - 4 = 6 marbles", 6),
    ("numbers 1, 2, 3", 3),
    ("total: 2,000 sheep.", 2000),
    ("x = -2", -2),
    ("#### no number here, but 9 before? no: 9", 9),
])
def test_extract_number(text, expected):
    assert extract_number(text) == pytest.approx(expected)


@pytest.mark.parametrize("text", ["", "I don't know.", "####", "The answer is unclear."])
def test_extract_number_none(text):
    assert extract_number(text) is None


def test_parse_number_and_equality():
    assert parse_number("1,000") == 1000
    assert parse_number("$-") is None
    assert parse_number("1/0") is None
    assert numbers_equal(18.0, 18)
    assert numbers_equal(0.1 + 0.2, 0.3)
    assert not numbers_equal(18.001, 18)
    assert not numbers_equal(None, 18)
    assert not numbers_equal(18, None)


@pytest.mark.parametrize("text, expected", [
    (" C", "C"),
    ("C\n\nQuestion:", "C"),
    ("B", "B"),
    ("d", "D"),
    ("Answer: C", "C"),
    ("The answer is (B).", "B"),
    ("the correct answer is **D**", "D"),
    ("I believe the answer is option A", "A"),
    ("answer: c.", "C"),
    ("(C) The mitochondria", "C"),
    ("c) 42", "C"),
    ("B. 42", "B"),
    ("A is correct because ...", "A"),
    ("A prime number has two divisors, so B", "B"),
    ("Looking at the options, (D) fits best.", "D"),
    ("I'd go with C since it is larger.", "C"),
    ("**A**", "A"),
])
def test_extract_choice(text, expected):
    assert extract_choice(text) == expected


@pytest.mark.parametrize("text", ["", "None of them.", "I am not sure.", "The answer is a prime number.",
                                  "E", "Answer: E"])
def test_extract_choice_none(text):
    assert extract_choice(text) is None


def test_extract_choice_more_letters():
    assert extract_choice("Answer: E", "ABCDE") == "E"


def test_named_graders():
    assert grade_exact("  Paris \n", "paris") == 1.0
    assert grade_exact("Paris, France", "Paris") == 0.0
    assert grade_contains("The capital is  Paris.", "paris") == 1.0
    assert grade_contains("The capital is Rome.", "Paris") == 0.0
    assert grade_numeric("so #### 1,200", "1200") == 1.0
    assert grade_numeric("so #### 1,200", 1200) == 1.0
    assert grade_numeric("so 1199", "1200") == 0.0
    assert grade_choice("The answer is (b)", "B") == 1.0
    assert grade_choice("The answer is (b)", "C") == 0.0
    assert grade_choice("Answer: F", "F") == 1.0  # letters reach the reference's
    assert grade_regex("order #A-1234 shipped", r"#A-\d{4}") == 1.0
    assert grade_regex("no order", r"#A-\d{4}") == 0.0
    assert grade_json('{"a": 1, "b": [1, 2]}', {"b": [1, 2], "a": 1}) == 1.0
    assert grade_json('Here:\n```json\n{"a": 1}\n```', '{"a": 1}') == 1.0
    assert grade_json('The result is {"a": 1} as asked.', {"a": 1}) == 1.0
    assert grade_json('{"a": 2}', {"a": 1}) == 0.0
    assert grade_json("not json", {"a": 1}) == 0.0


def test_grader_reference_errors():
    with pytest.raises(ValueError, match="holds no number"):
        grade_numeric("#### 3", "three")
    with pytest.raises(ValueError, match="one letter"):
        grade_choice("A", "AB")


def test_registry():
    assert set(GRADERS) == {"exact", "contains", "numeric", "choice", "regex", "json"}
    assert get_grader("numeric") is grade_numeric
    with pytest.raises(ValueError, match="available: choice, contains, exact, json, numeric, regex"):
        get_grader("fuzzy")
