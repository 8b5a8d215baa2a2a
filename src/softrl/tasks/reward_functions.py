"""A user's reward functions over a user's records: the task behind `softrl.train(dataset=...,
reward=...)`, `task.name=module:function` and `task.name=hf:DATASET`.

A record holds `prompt` (a string, or a list of chat messages) or `messages` (a conversation; a last
assistant turn is its known solution), and any other fields. A reward function sees the record:
- per-sample: `f(prompt, completion, **fields) -> float | bool | Grade`;
- batched, TRL's form: `f(prompts, completions, **fields) -> list[float]`, every field a list with one
  entry per completion.
The form is read from the signature: first two parameters named `prompts` and `completions` (or an
attribute `f.batched = True`) make it batched. A function gets the fields its signature names, or all
of them when it takes `**kwargs`. Several functions are summed with weights (default 1/n each, so
that rewards in [0, 1] stay in [0, 1], softrl's range: 1 = solved).
"""

from __future__ import annotations

import inspect
import json
import math
from collections.abc import Callable, Iterable
from typing import Any

from softrl.tasks.base import Grade, Prompt, RewardError, Task, prompt_id_of
from softrl.tasks.records import RecordError

BATCHED = ("prompts", "completions")
RESERVED = ("prompt", "completion", "prompts", "completions")  # passed positionally, never as fields


def conversation_text(messages: list[dict[str, str]]) -> str:
    """A conversation as one prompt text: what the store keeps and `apply_chat_template` renders."""
    return json.dumps({"messages": messages}, ensure_ascii=False)


def conversation_of(text: str) -> list[dict[str, str]] | None:
    """The messages of a text `conversation_text` made, else None (a plain prompt)."""
    if not text.startswith('{"messages": ['):
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return None
    return value["messages"] if isinstance(value, dict) and list(value) == ["messages"] else None


def _messages(value: Any, where: str, name: str) -> list[dict[str, str]]:
    if not isinstance(value, list) or not value or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in value):
        raise RecordError(f"{where}: field {name!r} must be a string or a non-empty list of "
                          "{'role': ..., 'content': ...} messages")
    return [{"role": m["role"], "content": m["content"]} for m in value]


def prompt_of(record: dict[str, Any], where: str) -> tuple[str, Any, list[str]]:
    """(prompt text, the prompt as the reward function sees it, known solutions) of a record."""
    if "prompt" in record and record["prompt"] is not None:
        value = record["prompt"]
        if isinstance(value, str):
            return value, value, []
        messages = _messages(value, where, "prompt")
        return conversation_text(messages), messages, []
    if "messages" in record and record["messages"] is not None:
        messages = _messages(record["messages"], where, "messages")
        solutions = []
        if messages[-1]["role"] == "assistant" and len(messages) > 1:
            solutions, messages = [messages[-1]["content"]], messages[:-1]
        return conversation_text(messages), messages, solutions
    raise RecordError(f"{where}: record has no field 'prompt' (a string or chat messages) or 'messages'")


class RewardFunction:
    """One user function, its form read from its signature, and its weight in the sum."""

    def __init__(self, fn: Callable, weight: float = 1.0):
        if not callable(fn):
            raise RewardError(f"a reward must be a function, got {type(fn).__name__}")
        if not (isinstance(weight, (int, float)) and math.isfinite(weight) and weight >= 0):
            raise RewardError(f"the weight of reward function {getattr(fn, '__name__', fn)!r} must be a finite "
                              f"number >= 0, got {weight!r}")
        self.fn, self.weight = fn, float(weight)
        self.name = getattr(fn, "__name__", type(fn).__name__)
        try:
            parameters = list(inspect.signature(fn).parameters.values())
        except (TypeError, ValueError):  # a builtin without a signature: the plain per-sample form
            parameters = []
        positional = [p.name for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        self.batched = bool(getattr(fn, "batched", False)) or tuple(positional[:2]) == BATCHED
        self.all_fields = any(p.kind == p.VAR_KEYWORD for p in parameters)
        self.fields = {p.name for p in parameters[2:] if p.kind != p.VAR_POSITIONAL} - set(RESERVED)

    def _wanted(self, record: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in record.items() if k not in RESERVED and (self.all_fields or k in self.fields)}

    def __call__(self, prompts: list[Any], completions: list[str], records: list[dict[str, Any]],
                 where: Callable[[int], str]) -> list[float | Grade]:
        """One value per completion (a number, or a Grade from the per-sample form), shape checked."""
        if not self.batched:
            return [self.fn(p, c, **self._wanted(r)) for p, c, r in zip(prompts, completions, records)]
        keys = dict.fromkeys(k for r in records for k in self._wanted(r))
        values = self.fn(prompts, completions, **{k: [r.get(k) for r in records] for k in keys})
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
    if isinstance(value, Grade):
        value = value.reward
    if isinstance(value, bool):
        return float(value)
    if value is not None and not isinstance(value, (str, bytes)) and hasattr(type(value), "__float__"):
        number = float(value)
        if math.isfinite(number):
            return number
    shown = " ".join(repr(value).split())
    raise RewardError(f"{where}: reward function {name} must return a finite number, got "
                      f"{shown if len(shown) <= 80 else shown[:77] + '...'}")


def reward_functions(reward: Any) -> list[RewardFunction]:
    """`f`, `[f, g, ...]` or `[(f, weight), ...]` as RewardFunctions; unweighted ones share 1/n."""
    items = list(reward) if isinstance(reward, (list, tuple)) and not _is_pair(reward) else [reward]
    if not items:
        raise RewardError("reward: give at least one reward function")
    default = 1.0 / len(items)
    return [RewardFunction(*item) if _is_pair(item) else RewardFunction(item, default) for item in items]


def _is_pair(item: Any) -> bool:
    return isinstance(item, tuple) and len(item) == 2 and callable(item[0]) and not callable(item[1])


class RewardFunctionTask(Task):
    """Prompts from records, graded by the sum of the reward functions over each record's fields."""

    parallel_grading = False

    def __init__(self, rewards: list[RewardFunction], records: Iterable[tuple[str, dict[str, Any]]],
                 name: str | None = None):
        self.rewards = rewards
        self.name = name or "+".join(r.name for r in rewards)
        self._prompts, self._solutions, seen = [], {}, {}
        for where, record in records:
            text, shown, solutions = prompt_of(record, where)
            key = record.get("id")
            key = str(key) if isinstance(key, (str, int)) and not isinstance(key, bool) else prompt_id_of(text)
            if key in seen:  # the same prompt twice (or a repeated id): each stays its own prompt
                seen[key] += 1
                key = f"{key}#{seen[key]}"
            else:
                seen[key] = 0
            self._prompts.append(Prompt(key, text, {"record": record, "prompt": shown}))
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
        checked to be a finite number in [0, 1]."""
        if not pairs:
            return []
        shown = [p.meta.get("prompt", p.text) for p, _ in pairs]
        completions = [r for _, r in pairs]
        records = [p.meta.get("record", {}) for p, _ in pairs]
        where = lambda i: f"task {self.name}, prompt {pairs[i][0].id}"  # noqa: E731
        total = [0.0] * len(pairs)
        own: list[Grade | bool | None] = [None] * len(pairs)  # a lone function's own verdict, if it gave one
        for fn in self.rewards:
            for i, value in enumerate(fn(shown, completions, records, where)):
                total[i] += fn.weight * _number(value, where(i), fn.name)
                if len(self.rewards) == 1 and isinstance(value, (bool, Grade)):
                    own[i] = value
        grades = []
        for i, reward in enumerate(total):
            if not math.isfinite(reward) or not 0.0 <= reward <= 1.0:
                raise RewardError(f"{where(i)}: reward must be a finite number in [0, 1], got {reward:g} "
                                  "(softrl's rewards are in [0, 1], 1 = solved: scale the function or set weights)")
            verdict = own[i]
            grade = (Grade(reward, verdict.passed, verdict.details) if isinstance(verdict, Grade)
                     else Grade(reward, reward >= 1.0 if verdict is None else verdict))
            grades.append(self.checked(pairs[i][0], grade))
        return grades
