"""Math grading of answers written with a dollar sign: `\\$18.90` (MATH's gold answers) is the number
18.90, on the gold side and on the response side, while `$...$` math delimiters keep working."""

import json

import pytest

from softrl.tasks import load_task
from softrl.tasks.math import answers_match

pytest.importorskip("math_verify")

RIGHT = [
    ("\\$18.90", "\\boxed{\\$18.90}"),
    ("\\$5.00", "\\boxed{5}"),
    ("\\$18.90", "\\boxed{18.90}"),
    ("\\$18.90", "\\boxed{18.9}"),
    ("\\$18.90", "$\\$18.90$"),
    ("\\$18.90", "The total is \\$18.90."),
    ("\\$5.00", "So it costs $5."),
    ("$18.90", "\\boxed{\\$18.90}"),
    ("\\text{\\$}5", "\\boxed{5}"),
    ("\\$1,000", "\\boxed{1000}"),
    ("18.90", "\\boxed{\\$18.90}"),
]
WRONG = [
    ("\\$18.90", "\\boxed{\\$18.91}"),
    ("\\$5.00", "\\boxed{6}"),
    ("\\$5.00", "\\boxed{\\$50}"),
    ("\\$18.90", "no answer here"),
]


@pytest.mark.parametrize("gold,response", RIGHT)
def test_dollar_answers_graded_correct(gold, response):
    assert answers_match(gold, response)


@pytest.mark.parametrize("gold,response", WRONG)
def test_wrong_dollar_answers_graded_wrong(gold, response):
    assert not answers_match(gold, response)


def test_math_delimiters_still_work():
    assert answers_match("\\frac{1}{2}", "$\\frac{1}{2}$")
    assert answers_match("5", "so $x = 5$")
    assert answers_match("x^2 + 2x + 1", "$x^2+2x+1$")
    assert not answers_match("5", "$5 + 1 = 6$")


def test_math_task_with_dollar_gold(tmp_path):
    path = tmp_path / "money.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in [
        {"id": "a", "problem": "A book costs $\\$12.60$ and a pen $\\$6.30$. Total?", "answer": "\\$18.90"},
        {"id": "b", "problem": "Five coins of $\\$1$?", "solution": "Five dollars: $\\boxed{\\$5.00}$."},
    ]) + "\n")
    task = load_task(f"math:{path}")
    a, b = task.prompts()
    assert task.grade(a, "The total is \\boxed{\\$18.90}.").passed
    assert task.grade(a, task.reference_solutions(a)[0]).passed
    assert task.grade(b, "\\boxed{5}").passed and task.grade(b, task.reference_solutions(b)[0]).passed
    assert not task.grade(a, "\\boxed{\\$18.00}").passed and not task.grade(b, "\\boxed{4}").passed
    assert task.grade_many([(a, "\\boxed{\\$18.90}"), (b, "\\boxed{5}")])[1].reward == 1.0


def test_strip_currency_keeps_math_delimiters():
    from softrl.tasks.math import strip_currency

    assert strip_currency("\\$18.90") == "18.90"
    assert strip_currency("\\boxed{\\$ 5}") == "\\boxed{ 5}"
    assert strip_currency("$18.90") == "18.90"  # one `$` cannot be a delimiter pair
    assert strip_currency("$5$") == "$5$"
    assert strip_currency("$x + 1 = 6$") == "$x + 1 = 6$"
    assert strip_currency("$5 + x = 7$ costs $3") == "$5 + x = 7$ costs 3"
    assert strip_currency("$$5$$") == "$$5$$"
    assert strip_currency("a \\\\$x$") == "a \\\\$x$"  # a line break `\\` before a delimiter, not an escaped `$`
