"""A user's reward functions over a user's records: the task behind `softrl.train(dataset=...,
reward=...)`, `task.name=module:function` and `task.name=hf:DATASET`.

A record holds `prompt` (a string, or a list of chat messages) or `messages` (a conversation; a last
assistant turn is its known solution), and any other fields. A reward function sees the record:
- per-sample: `f(prompt, completion, **fields) -> float | bool | Grade`;
- batched, TRL's form: `f(prompts, completions, **fields) -> list[float]`, every field a list with one
  entry per completion.
The form is read from the signature: a parameter named `completions` (or an attribute
`f.batched = True`) makes it batched, called by keyword as TRL calls it (`prompts=` only where the
signature takes it); a per-sample function gets the prompt and the completion as its first two
arguments. A completion is a string, or, where the prompt is chat messages, as in TRL, the list of the
one assistant message `[{"role": "assistant", "content": text}]`. A function gets the fields its signature names, or all of
them when it takes `**kwargs`. Several functions are summed with weights: unweighted ones share what
the given weights leave of 1 (1/n each when none is given), so rewards in [0, 1] stay in [0, 1],
softrl's range: 1 = solved.
"""

from __future__ import annotations

import hashlib
import inspect
import math
from collections.abc import Callable, Iterable
from typing import Any

from softrl.tasks.base import Grade, Prompt, RewardError, Task, finite_float, prompt_id_of, shown
from softrl.tasks.records import RecordError, prompt_of



class RewardFunction:
    """One user function, its form read from its signature, and its weight in the sum."""

    def __init__(self, fn: Callable, weight: float = 1.0):
        if not callable(fn):
            raise RewardError(f"a reward must be a function, got {type(fn).__name__}")
        number = finite_float(weight)
        if number is None or number < 0:
            raise RewardError(f"the weight of reward function {getattr(fn, '__name__', fn)!r} must be a finite "
                              f"number >= 0, got {shown(weight)}")
        self.fn, self.weight = fn, number
        self.name = getattr(fn, "__name__", type(fn).__name__)
        try:
            parameters = list(inspect.signature(fn).parameters.values())
        except (TypeError, ValueError):  # a builtin without a signature: the plain per-sample form
            parameters = []
        names = [p.name for p in parameters if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        self.batched = bool(getattr(fn, "batched", False)) or "completions" in names
        self.all_fields = any(p.kind == p.VAR_KEYWORD for p in parameters)
        self.takes_prompts = "prompts" in names or self.all_fields
        # what is passed as the prompt and completion is never also passed as a field of that name
        passed = {"prompts", "completions", "prompt"} if self.batched else set(names[:2])
        self.fields = set(names) - passed
        self.excluded = passed

    def _wanted(self, record: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in record.items() if k not in self.excluded and (self.all_fields or k in self.fields)}

    def __call__(self, prompts: list[Any], completions: list[str], records: list[dict[str, Any]],
                 where: Callable[[int], str]) -> list[float | Grade]:
        """One value per completion (a number, or a Grade from the per-sample form), shape checked."""
        if not self.batched:
            return [self.fn(p, c, **self._wanted(r)) for p, c, r in zip(prompts, completions, records)]
        keys = dict.fromkeys(k for r in records for k in self._wanted(r))
        fields = {k: [r.get(k) for r in records] for k in keys}
        values = self.fn(completions=completions, **({"prompts": prompts} if self.takes_prompts else {}), **fields)
        if isinstance(values, (str, bytes, dict)) or not isinstance(values, Iterable):
            raise RewardError(f"{where(0)}: batched reward function {self.name} must return a list of "
                              f"{len(completions)} numbers, got {type(values).__name__}")
        values = list(values)
        if len(values) != len(completions):
            raise RewardError(f"{where(0)}: batched reward function {self.name} returned {len(values)} values "
                              f"for {len(completions)} completions")
        return values


def _number(value: Any, where: str, name: str) -> float:
    """A function's value as a finite float (True/False as 1/0); a RewardError naming it otherwise."""
    value = value.reward if isinstance(value, Grade) else value
    number = finite_float(value)
    if number is None:
        raise RewardError(f"{where}: reward function {name} must return a finite number, got {shown(value)}")
    return number


def reward_functions(reward: Any, summed: bool = False) -> list[RewardFunction]:
    """`f`, `[f, g, ...]` or `[(f, weight), ...]` as RewardFunctions. Unweighted ones share what the
    given weights leave of 1 (the weights sum to 1: rewards in [0, 1] stay there); `summed` (a declared
    reward range) makes them weigh 1 each, a plain sum as TRL's and verl's."""
    items = list(reward) if isinstance(reward, (list, tuple)) and not _is_pair(reward) else [reward]
    if not items:
        raise RewardError("reward: give at least one reward function")
    if summed:
        return [RewardFunction(*item) if _is_pair(item) else RewardFunction(item) for item in items]
    given = [item[1] for item in items if _is_pair(item)]
    rest = len(items) - len(given)
    left = 1.0 - sum(w for w in given if isinstance(w, (int, float)))
    if rest and left < -WEIGHT_TOLERANCE:
        raise RewardError(f"reward: the given weights sum to {1 - left:g}, leaving nothing for the unweighted functions")
    if not rest and abs(left) > WEIGHT_TOLERANCE:  # below 1 nothing can be solved; above, rewards leave [0, 1]
        raise RewardError(f"reward: the weights sum to {1 - left:.6g}, not 1: a completion that every function "
                          "rates 1 must score 1 (solved); scale the weights so that they sum to 1, or declare "
                          "the sum's range (task.reward_range)")
    left = max(left, 0.0)
    return [RewardFunction(*item) if _is_pair(item) else RewardFunction(item, left / rest) for item in items]


WEIGHT_TOLERANCE = 1e-9  # weights 1/3 + 1/3 + 1/3 sum to 0.9999999999999999 in floating point


def _is_pair(item: Any) -> bool:
    return isinstance(item, tuple) and len(item) == 2 and callable(item[0]) and not callable(item[1])


def grading_digest(rewards: list[RewardFunction], reward_range: tuple[float, float]) -> str:
    """8 hex digits of what decides a reward: each function's module, name, code and weight, and the range."""
    parts = [repr(reward_range)]
    for r in rewards:
        fn = r.fn if hasattr(r.fn, "__code__") else type(r.fn)
        code = getattr(fn, "__code__", None) or getattr(getattr(fn, "__call__", None), "__code__", None)
        parts += [getattr(fn, "__module__", ""), getattr(fn, "__qualname__", r.name), repr(r.weight),
                  _code_text(code) if code is not None else ""]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:8]


def _code_text(code) -> str:
    """A code object as stable text: its bytecode, names and constants (nested functions' code in turn;
    their repr would hold a memory address)."""
    consts = [_code_text(c) if hasattr(c, "co_code") else repr(sorted(map(repr, c))) if isinstance(c, frozenset)
              else repr(c) for c in code.co_consts]  # a frozenset's order follows the string hash's seed
    return "|".join([code.co_code.hex(), repr(code.co_names), *consts])


class RewardFunctionTask(Task):
    """Prompts from records, graded by the sum of the reward functions over each record's fields."""

    def __init__(self, rewards: list[RewardFunction], records: Iterable[tuple[str, dict[str, Any]]],
                 name: str | None = None, reward_range: tuple[float, float] | None = None):
        self.rewards = rewards
        self.declared = reward_range is not None
        self.reward_range = tuple(reward_range or (0.0, 1.0))  # the weighted sum's [lo, hi]; hi = solved
        self.name = name or "+".join(r.name for r in rewards)
        # ids carry the grading, not only its name: Q0 and the stored reference rows are values under
        # this reward, and another function of the same name (or this one edited) must not reuse them
        grading = f"{self.name}.{grading_digest(rewards, self.reward_range)}"
        self._prompts, self._solutions, seen = [], {}, {}
        for where, record in records:
            text, as_given, solutions = prompt_of(record, where)
            # ids carry the task's name: Q0 is the soft value under this reward, not another's
            key = record.get("id")
            key = f"{grading}:{key}" if isinstance(key, (str, int)) and not isinstance(key, bool) \
                else prompt_id_of(f"{grading}\0{text}")
            if key in seen:  # the same prompt twice (or a repeated id): each stays its own prompt
                seen[key] += 1
                key = f"{key}#{seen[key]}"
            else:
                seen[key] = 0
            self._prompts.append(Prompt(key, text, {"record": record, "prompt": as_given}))
            self._solutions[key] = solutions
        if not self._prompts:
            raise RecordError(f"task {self.name}: the dataset has no records")

    def prompts(self) -> list[Prompt]:
        return list(self._prompts)

    def reference_solutions(self, prompt: Prompt) -> list[str]:
        return list(self._solutions.get(prompt.id, []))

    def grade(self, prompt: Prompt, response: str) -> Grade:
        return self.grade_many([(prompt, response)])[0]

    def grade_many(self, pairs: list[tuple[Prompt, str]], workers: int | None = None) -> list[Grade]:
        """Every function once over all pairs (a batched one in one call), then the weighted sum, each
        checked to be a finite number in the reward range, and mapped onto [0, 1] (hi = solved)."""
        if not pairs:
            return []
        as_given = [p.meta.get("prompt", p.text) for p, _ in pairs]
        # TRL's convention: a conversation's completion is the assistant's message, a list of one
        completions = [[{"role": "assistant", "content": r}] if isinstance(given, list) else r
                       for given, (_, r) in zip(as_given, pairs)]
        records = [p.meta.get("record", {}) for p, _ in pairs]
        where = lambda i: f"task {self.name}, prompt {pairs[i][0].id}"  # noqa: E731
        total = [0.0] * len(pairs)
        values: list[list[float]] = [[] for _ in pairs]  # each function's value, to name them in an error
        own: list[Grade | bool | None] = [None] * len(pairs)  # a lone function's own verdict, if it gave one
        for fn in self.rewards:
            for i, value in enumerate(fn(as_given, completions, records, where)):
                values[i].append(_number(value, where(i), fn.name))
                total[i] += fn.weight * values[i][-1]
                if len(self.rewards) == 1 and isinstance(value, (bool, Grade)):
                    own[i] = value
        low, high = self.reward_range
        tolerance = WEIGHT_TOLERANCE * (high - low)
        grades = []
        for i, reward in enumerate(total):
            for bound in (low, high):  # a weighted sum's rounding is not a miss
                reward = bound if abs(reward - bound) <= tolerance else reward
            if not math.isfinite(reward) or not low <= reward <= high:
                terms = " + ".join(f"{fn.weight:g} x {fn.name} {v:g}" for fn, v in zip(self.rewards, values[i]))
                raise RewardError(f"{where(i)}: reward must be a finite number in [{low:g}, {high:g}], got {reward:g}"
                                  + (f" ({terms})" if len(self.rewards) > 1 else "")
                                  + (" (task.reward_range)" if self.declared else
                                     " (declare another range with task.reward_range)"))
            verdict = own[i]
            unit = (reward - low) / (high - low)  # what the store, Q0 and SPO keep: 1 = solved
            grade = (Grade(unit, verdict.passed, verdict.details) if isinstance(verdict, Grade)
                     else Grade(unit, reward >= high if verdict is None else verdict))
            grades.append(self.checked(pairs[i][0], grade))
        return grades
