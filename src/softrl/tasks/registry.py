"""`load_task(spec, **config)`: a task by name, dataset path or import path."""

from __future__ import annotations

import importlib
import inspect
from typing import Any

from softrl.tasks.base import Grade, Prompt, Task
from softrl.tasks.records import field, read_records

BUILTIN = ("countdown", "tinycode")
DATASETS = ("codecontests", "taco", "humaneval", "mbpp", "math")


def load_task(spec: str, **config: Any) -> Task:
    """`countdown`, `tinycode`, `humaneval` (bundled), `KIND:PATH` for KIND in codecontests, taco,
    humaneval, mbpp, math; `gym:NAME` (reasoning-gym); or `package.module:Name`, a Task subclass
    or a reward function `f(prompt_text, response) -> float | bool` (prompts from `prompts=PATH`)."""
    kind, _, rest = spec.partition(":")
    if kind == "countdown" and not rest:
        from softrl.tasks.countdown import CountdownTask

        return CountdownTask(**config)
    if kind == "tinycode" and not rest:
        from softrl.tasks.tinycode import TinyCodeTask

        return TinyCodeTask(**config)
    if kind == "gym":
        from softrl.tasks.gym import GymTask

        return GymTask(rest, **config)
    if kind == "math":
        from softrl.tasks.math import MathTask

        return MathTask(rest, **config)
    if kind in DATASETS:
        from softrl.tasks.code import CodeTask

        return CodeTask.load(kind, rest or None, **config)
    if rest:
        return _from_import_path(kind, rest, config)
    raise ValueError(f"unknown task {spec!r}: use {', '.join(BUILTIN)}, KIND:PATH ({', '.join(DATASETS)}), "
                     "gym:NAME or module:Name")


def generated(spec: str) -> bool:
    """Whether the task generates its prompts from a size and a seed (built-in and gym tasks) rather
    than reading them from a dataset."""
    return spec in BUILTIN or spec.startswith("gym:")


def load_split(spec: str, size: int | None = None, seed: int | None = None, **options: Any) -> Task:
    """`size` prompts from `seed` where the task generates them; a dataset task takes neither (its
    prompts are the file's)."""
    sized = {k: v for k, v in (("size", size), ("seed", seed)) if v is not None} if generated(spec) else {}
    return load_task(spec, **sized, **options)


def _from_import_path(module: str, name: str, config: dict[str, Any]) -> Task:
    try:
        target = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"cannot import task {module}:{name}: {e}") from e
    if inspect.isclass(target) and issubclass(target, Task):
        return target(**config)
    if callable(target):
        if "prompts" not in config:
            raise ValueError(f"reward function {module}:{name} needs prompts=PATH (JSONL of {{'id', 'prompt'}}): "
                             "task.options.prompts in a config, --task-option prompts=PATH on the command line")
        return RewardFunctionTask(target, config["prompts"])
    raise ValueError(f"{module}:{name} is neither a Task subclass nor a reward function")


class RewardFunctionTask(Task):
    """A user's reward function over prompts read from a file (fields `prompt`, optional `id`)."""

    def __init__(self, reward_fn, prompts_path: str):
        self.reward_fn, self.name = reward_fn, getattr(reward_fn, "__name__", "reward")
        self._prompts = [Prompt(str(r.get("id", where)), field(r, "prompt", where), r)
                         for where, r in read_records(prompts_path)]

    def prompts(self) -> list[Prompt]:
        return list(self._prompts)

    def grade(self, prompt: Prompt, response: str) -> Grade:
        # checked here as well as in grade_many, so a direct grade() call cannot pass a bad reward on
        value = self.reward_fn(prompt.text, response)
        if isinstance(value, Grade):
            return self.checked(prompt, value)
        reward = self.checked(prompt, Grade(value, False)).reward
        return Grade(reward, reward >= 1.0 if not isinstance(value, bool) else value)
