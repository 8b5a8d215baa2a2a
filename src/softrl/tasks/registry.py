"""`load_task(spec, **config)`: a task by name, dataset path or import path."""

from __future__ import annotations

import importlib
import inspect
from typing import Any

from softrl.tasks.base import Task
from softrl.tasks.records import records_of
from softrl.tasks.reward_functions import RewardFunctionTask, reward_functions

BUILTIN = ("countdown", "countdown-tools", "tinycode", "tinycode-loops", "tinycode-feedback")
DATASETS = ("codecontests", "taco", "humaneval", "mbpp", "math")


def load_task(spec: str, reward_range: tuple[float, float] | None = None, **config: Any) -> Task:
    """`countdown`, `tinycode`, `humaneval` (bundled), `KIND:PATH` for KIND in codecontests, taco,
    humaneval, mbpp, math; `gym:NAME` (reasoning-gym); `hf:DATASET[:CONFIG][:SPLIT]` graded by
    `reward=module:function`; or `package.module:Name`, a Task subclass or a reward function
    (tasks/reward_functions.py) over the records of `prompts=PATH` (or `prompts=hf:...`). `reward_range`
    declares a reward function's range; other tasks grade on [0, 1] themselves."""
    task = _load_task(spec, reward_range, config)
    if reward_range is not None and not isinstance(task, RewardFunctionTask):
        raise ValueError(f"reward_range: {spec} grades its own rewards on [0, 1]; a range is declared for reward "
                         "functions (module:function, hf:DATASET)")
    return task


def _load_task(spec: str, reward_range: tuple[float, float] | None, config: dict[str, Any]) -> Task:
    kind, _, rest = spec.partition(":")
    if kind == "countdown" and not rest:
        from softrl.tasks.countdown import CountdownTask

        return CountdownTask(**config)
    if kind == "countdown-tools" and not rest:
        from softrl.tasks.tools import CountdownToolsTask

        return CountdownToolsTask(**config)
    if kind == "tinycode" and not rest:
        from softrl.tasks.tinycode import TinyCodeTask

        return TinyCodeTask(**config)
    if kind == "tinycode-loops" and not rest:
        from softrl.tasks.loopcode import LoopCodeTask

        return LoopCodeTask(**config)
    if kind == "tinycode-feedback" and not rest:
        from softrl.tasks.feedback_code import FeedbackCodeTask

        return FeedbackCodeTask(**config)
    if kind == "gym":
        from softrl.tasks.gym import GymTask

        return GymTask(rest, **config)
    if kind == "hf":
        return _from_hub_dataset(spec, config, reward_range)
    if kind in ("math", "codecontests", "taco", "mbpp") and not rest:
        raise ValueError(f"task {spec!r} needs a dataset path: {kind}:PATH")
    if kind == "math":
        from softrl.tasks.math import MathTask

        return MathTask(rest, **config)
    if kind in DATASETS:
        from softrl.tasks.code import CodeTask

        return CodeTask.load(kind, rest or None, **config)
    if rest:
        return _from_import_path(kind, rest, config, reward_range)
    raise ValueError(f"unknown task {spec!r}: use {', '.join(BUILTIN)}, KIND:PATH ({', '.join(DATASETS)}), "
                     "gym:NAME, hf:DATASET or module:Name")


def generated(spec: str) -> bool:
    """Whether the task generates its prompts from a size and a seed (built-in and gym tasks) rather
    than reading them from a dataset."""
    return spec in BUILTIN or spec.startswith("gym:")


def load_split(spec: str, size: int | None = None, seed: int | None = None, reward_range=None, **options: Any) -> Task:
    """`size` prompts from `seed` where the task generates them; a dataset task takes neither (its
    prompts are the file's)."""
    sized = {k: v for k, v in (("size", size), ("seed", seed)) if v is not None} if generated(spec) else {}
    return load_task(spec, reward_range, **sized, **options)


def _import(module: str, name: str) -> Any:
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"cannot import task {module}:{name}: {e}") from e


def _from_import_path(module: str, name: str, config: dict[str, Any], reward_range) -> Task:
    target = _import(module, name)
    if inspect.isclass(target) and issubclass(target, Task):
        return target(**config)
    if callable(target):
        _only_options(f"reward function {module}:{name}", config, ("prompts",))
        if "prompts" not in config:
            raise ValueError(f"reward function {module}:{name} needs prompts=PATH (records with 'prompt', or "
                             "hf:DATASET): task.options.prompts in a config, --task-option prompts=PATH on the "
                             "command line")
        return RewardFunctionTask(reward_functions(target, summed=reward_range is not None),
                                  records_of(config["prompts"]), reward_range=reward_range)
    raise ValueError(f"{module}:{name} is neither a Task subclass nor a reward function")


def _only_options(what: str, config: dict[str, Any], known: tuple[str, ...]) -> None:
    """A task built from records and reward functions takes these options and no others: any other
    would be dropped without a word."""
    unknown = sorted(set(config) - set(known))
    if unknown:
        raise ValueError(f"option {unknown[0]!r} is not one {what} takes (its options: {', '.join(known)})")


def _from_hub_dataset(spec: str, config: dict[str, Any], reward_range) -> Task:
    """`hf:DATASET[:CONFIG][:SPLIT]` graded by `reward=module:function` (or a list of them)."""
    _only_options(spec, config, ("reward",))
    reward = config.get("reward")
    names = [reward] if isinstance(reward, str) else reward
    if not names or not all(isinstance(n, str) and n.count(":") == 1 for n in names):
        raise ValueError(f"{spec} needs reward=module:function (or a list of them): task.options.reward in a "
                         "config, --task-option reward=module:function on the command line")
    return RewardFunctionTask(reward_functions([_import(*n.split(":")) for n in names], summed=reward_range is not None),
                              records_of(spec), reward_range=reward_range)
