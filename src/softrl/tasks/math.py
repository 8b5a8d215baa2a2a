"""Math problems with a final answer, graded by `math-verify` (boxed answers, fractions, equivalent forms)."""

from __future__ import annotations

import re
import threading
from pathlib import Path

from softrl.tasks.base import Grade, Prompt, Task
from softrl.tasks.records import RecordError, field, read_records

_BOXED = re.compile(r"\\boxed\{")


def last_boxed(text: str) -> str | None:
    """The content of the last `\\boxed{...}` (braces balanced), or None."""
    starts = [m.end() for m in _BOXED.finditer(text)]
    if not starts:
        return None
    depth, start = 1, starts[-1]
    for i in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[start:i]
    return None


# an escaped dollar (odd number of backslashes before it), `\text{\$}` or `\textdollar`: never a math delimiter
_ESCAPED_DOLLAR = re.compile(r"(?<!\\)((?:\\\\)*)(?:\\(?:text|textrm|textnormal|mbox|mathrm)\{\s*\\\$\s*\}"
                             r"|\\textdollar(?![A-Za-z])|\\\$)")
_BARE_DOLLAR = re.compile(r"(?<!\$)\$(?=\.?\d)")  # `$` right before a number, not part of `$$`


def strip_currency(text: str) -> str:
    """`text` without dollar signs used as currency, so that `\\$18.90` reads as 18.90: every escaped
    dollar (`\\$`, `\\text{\\$}`, `\\textdollar`), and, when the unescaped `$` cannot all pair up as math
    delimiters (an odd count), the last `$` written right before a number (`$5`). `$...$` math is kept."""
    text = _ESCAPED_DOLLAR.sub(r"\1", text)
    if text.count("$") % 2:
        candidates = [m.start() for m in _BARE_DOLLAR.finditer(text)]
        if candidates:
            text = text[: candidates[-1]] + text[candidates[-1] + 1 :]
    return text


def answers_match(gold: str, response: str) -> bool:
    """Does the response's final answer equal `gold` mathematically (math-verify)? Dollar signs used
    as currency are dropped on both sides first (`strip_currency`)."""
    from math_verify import parse, verify

    # math-verify's timeouts use SIGALRM, which only the main thread may set
    timeout = 5 if threading.current_thread() is threading.main_thread() else None
    gold, response = strip_currency(gold), strip_currency(response)
    gold_parsed = parse(gold if "$" in gold or "\\boxed" in gold else f"${gold}$", parsing_timeout=timeout)
    answer = parse(response, parsing_timeout=timeout)
    return bool(gold_parsed) and bool(answer) and verify(gold_parsed, answer, timeout_seconds=timeout)


class MathTask(Task):
    """Records with `problem` (or `question`) and `answer` (or a `solution` with a final \\boxed{})."""

    name = "math"

    def __init__(self, path: str | Path, limit: int | None = None):
        self.items: dict[str, tuple[str, str, str]] = {}
        for where, record in read_records(path):
            question = record.get("problem", record.get("question"))
            if not isinstance(question, str):
                got = "is missing" if question is None else f"must be a string, got {type(question).__name__}"
                raise RecordError(f"{where}: record {record.get('id', '?')!r}: field 'problem' (or 'question') {got}")
            answer = record.get("answer")
            solution = record.get("solution") or ""
            if answer is None:
                answer = last_boxed(field(record, "solution", where))
                if answer is None:
                    raise RecordError(f"{where}: record {record.get('id', '?')!r}: field 'answer' is missing "
                                      "and 'solution' has no \\boxed{} answer")
            key = str(record.get("id", record.get("unique_id", where)))
            self.items[key] = (question, str(answer), solution)
            if limit and len(self.items) >= limit:
                break
        if not self.items:
            raise ValueError(f"{path}: no math problems")

    def prompts(self) -> list[Prompt]:
        return [Prompt(k, q) for k, (q, _, _) in self.items.items()]

    def grade(self, prompt: Prompt, response: str) -> Grade:
        gold = self.items[prompt.id][1]
        ok = answers_match(gold, response)
        return Grade(float(ok), ok, {"gold": gold})

    def reference_solutions(self, prompt: Prompt) -> list[str]:
        _, answer, solution = self.items[prompt.id]
        return [solution or f"\\boxed{{{answer}}}"]
