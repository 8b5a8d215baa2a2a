"""What every task is: prompts with ids, and a grader that turns a response into a reward."""

from __future__ import annotations

import hashlib
import math
import os
import re
from concurrent.futures import ThreadPoolExecutor
from abc import ABC, abstractmethod
from dataclasses import dataclass, field, replace
from typing import Any


@dataclass(frozen=True)
class Prompt:
    id: str
    text: str
    meta: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)


def prompt_id_of(text: str) -> str:
    """A prompt's id from its content, for prompts without one: the same prompt keeps its Q0 and its
    stored rows across runs and imports."""
    return "prompt-" + hashlib.sha256(text.encode()).hexdigest()[:16]


class RewardError(ValueError):
    """A reward that is not a finite number in [0, 1]: one line naming where it came from and the value."""


def check_reward(value: Any, where: str, name: str = "reward") -> float:
    """`value` as a float in [0, 1] (a bool counts as 0 or 1); anything else (NaN, inf, out of range,
    not a number) is a RewardError `"{where}: {name} must be a finite number in [0, 1], got {value}"`.
    The one check every reward passes on its way in: `Task.grade_many` and the store's writes."""
    reward = finite_float(value)
    if reward is None or not 0.0 <= reward <= 1.0:
        raise RewardError(f"{where}: {name} must be a finite number in [0, 1], got {shown(value)}")
    return reward


def finite_float(value: Any) -> float | None:
    """`value` as a finite float (a bool as 0 or 1), or None when it is not a finite number."""
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (str, bytes)) or not hasattr(type(value), "__float__"):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return number if math.isfinite(number) else None


def shown(value: Any) -> str:
    """A value as an error message quotes it: on one line, at most 80 characters."""
    text = " ".join(repr(value).split())
    return text if len(text) <= 80 else text[:77] + "..."


@dataclass(frozen=True)
class Grade:
    """`reward` a finite number in [0, 1] (1 = solved; a bool counts as 0 or 1, and anything else is a
    RewardError from `Task.grade_many`); `passed` the binary verdict; `details` for people and logs."""

    reward: float
    passed: bool
    details: dict[str, Any] = field(default_factory=dict)


class Task(ABC):
    name: str = "task"
    max_new_tokens: int = 256  # the default generation length of a response

    @abstractmethod
    def prompts(self) -> list[Prompt]:
        """Every prompt of the task, in a fixed order."""

    @abstractmethod
    def grade(self, prompt: Prompt, response: str) -> Grade:
        """Judge one response to one prompt."""

    def reference_solutions(self, prompt: Prompt) -> list[str]:
        """Known-correct responses (a solver's or humans'), for tests and offline data."""
        return []

    def make_environment(self):
        """The environment of a task that is multi-turn by nature (tinycode-feedback's shown tests), made
        for this task; None for a task of one turn. A run's `task.environment` overrides it."""
        return None

    # graders that wait on a sandbox process run in threads; graders that use signals must not
    parallel_grading: bool = False

    def grade_many(self, pairs: list[tuple[Prompt, str]], workers: int | None = None) -> list[Grade]:
        """Grades in order; a repeated (prompt, response) pair is graded once."""
        prompts = {p.id: p for p, _ in pairs}
        unique = list(dict.fromkeys((p.id, r) for p, r in pairs))
        grade = lambda key: self.checked(prompts[key[0]], self.grade(prompts[key[0]], key[1]))  # noqa: E731
        if self.parallel_grading and len(unique) > 1:
            with ThreadPoolExecutor(workers or os.cpu_count() or 1) as pool:
                grades = dict(zip(unique, pool.map(grade, unique)))
        else:
            grades = {key: grade(key) for key in unique}
        return [grades[(p.id, r)] for p, r in pairs]

    def checked(self, prompt: Prompt, grade: Any) -> Grade:
        """`grade` of `prompt`, its reward checked by `check_reward` (a RewardError naming the task, the
        prompt and the value otherwise); `grade_many` passes every grade through here."""
        where = f"task {self.name}, prompt {prompt.id}"
        if not isinstance(grade, Grade):
            raise RewardError(f"{where}: grade() must return a Grade, got {type(grade).__name__}")
        reward = check_reward(grade.reward, where)
        return grade if type(grade.reward) is float else replace(grade, reward=reward)


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
