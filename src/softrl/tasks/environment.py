"""Environments: what answers the policy between its turns (docs/USAGE.md, "Multi-turn episodes").

The protocol is the turn-taking shape verifiers' classic `MultiTurnEnv` and gym-style text environments
share: after each policy turn, `is_completed(messages, state)` says whether the episode is over, and if
not, `env_response(messages, state)` returns the environment's messages (`tool` or `user`) and the new
state. `messages` is the whole conversation so far in OpenAI chat form (the prompt's messages, then the
turns); `state` is a dict the environment keeps per episode, made by `initial_state(prompt)`. Either
method may be a coroutine function (verifiers' are): softrl awaits it. The episode's reward is the
environment's `reward(messages, state)` where it has one, else the task's grade of the last policy turn.

`deterministic`: whether the environment's answer is a function of the history (a tool, a test run)
or a draw (a game, a user simulator); SPO and AGRO learn exactly from the first kind only
(docs/ALGORITHMS.md, "Episodes: which objectives stay exact").
"""

from __future__ import annotations

import asyncio
import inspect
from typing import Any, Protocol, runtime_checkable

from softrl.tasks.base import Prompt, Task

Messages = list[dict[str, Any]]


@runtime_checkable
class Environment(Protocol):
    deterministic: bool

    def is_completed(self, messages: Messages, state: dict) -> bool: ...

    def env_response(self, messages: Messages, state: dict) -> tuple[Messages, dict]: ...


def call(method, *args):
    """A protocol method's answer, awaited when it is a coroutine (verifiers' methods are async)."""
    result = method(*args)
    return asyncio.run(result) if inspect.isawaitable(result) else result


def initial_state(env: Environment, prompt: Prompt) -> dict:
    make = getattr(env, "initial_state", None)
    return dict(call(make, prompt)) if make is not None else {"prompt_id": prompt.id}


class FeedbackEnvironment:
    """The task grades each policy turn; a passing one ends the episode, any other gets the grade back as
    a user message (`Task.feedback`, else "That is not right. Try again.") and another try: the shape of
    execution feedback (RLEF) for any task. Deterministic: the feedback is a function of the history."""

    deterministic = True

    def __init__(self, task: Task):
        self.task = task

    def initial_state(self, prompt: Prompt) -> dict:
        return {"prompt": prompt}

    def is_completed(self, messages: Messages, state: dict) -> bool:
        grade = self.task.grade(state["prompt"], messages[-1]["content"])
        state["grade"] = grade
        return grade.passed

    def env_response(self, messages: Messages, state: dict) -> tuple[Messages, dict]:
        grade = state["grade"]
        text = grade.details.get("feedback") or "That is not right. Try again."
        return [{"role": "user", "content": str(text)}], state
