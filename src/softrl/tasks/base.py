"""What every task is: prompts with ids, and a grader that turns a response into a reward."""

from __future__ import annotations

import os
import re
from concurrent.futures import ThreadPoolExecutor
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Prompt:
    id: str
    text: str
    meta: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)


@dataclass(frozen=True)
class Grade:
    """`reward` in [0, 1] (1 = solved); `passed` the binary verdict; `details` for people and logs."""

    reward: float
    passed: bool
    details: dict[str, Any] = field(default_factory=dict)


class Task(ABC):
    name: str = "task"

    @abstractmethod
    def prompts(self) -> list[Prompt]:
        """Every prompt of the task, in a fixed order."""

    @abstractmethod
    def grade(self, prompt: Prompt, response: str) -> Grade:
        """Judge one response to one prompt."""

    def reference_solutions(self, prompt: Prompt) -> list[str]:
        """Known-correct responses (a solver's or humans'), for tests and offline data."""
        return []

    # graders that wait on a sandbox process run in threads; graders that use signals must not
    parallel_grading: bool = False

    def grade_many(self, pairs: list[tuple[Prompt, str]], workers: int | None = None) -> list[Grade]:
        """Grades in order; a repeated (prompt, response) pair is graded once."""
        prompts = {p.id: p for p, _ in pairs}
        unique = list(dict.fromkeys((p.id, r) for p, r in pairs))
        grade = lambda key: self.grade(prompts[key[0]], key[1])  # noqa: E731
        if self.parallel_grading and len(unique) > 1:
            with ThreadPoolExecutor(workers or os.cpu_count() or 1) as pool:
                grades = dict(zip(unique, pool.map(grade, unique)))
        else:
            grades = {key: grade(key) for key in unique}
        return [grades[(p.id, r)] for p, r in pairs]


_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.S)
_FENCE = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.S)


def extract_answer(response: str) -> str:
    """The text inside the last `<answer>...</answer>`, else the last non-empty line."""
    tagged = _ANSWER.findall(response)
    if tagged:
        return tagged[-1].strip()
    lines = [line.strip() for line in response.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


def extract_code(response: str) -> str:
    """The last fenced code block (```python ... ```), else the whole response."""
    blocks = _FENCE.findall(response)
    return blocks[-1] if blocks else response
