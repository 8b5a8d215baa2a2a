"""tinycode-feedback: tinycode-loops problems as episodes with execution feedback (the shape of RLEF,
Gehring et al. 2024, the setting of the SPO paper's PPO baseline).

The policy writes a program; the sandbox runs it on the statement's two examples (the shown tests). If
one fails, the environment answers with the first failure (its input, the expected output, and what the
program printed or the error it raised) and the policy may revise, up to `task.max_turns`. The episode
ends when the shown tests pass. The reward is the task's grade of the last program on every test, the
hidden ones too, so a program fitted to the examples alone earns nothing.

The bootstrap reference (bootstrap.py) learns the format from synthetic episodes of the `seen`
combinations (`synthetic_episode`): a first program, right or a plausible wrong one, the feedback a
wrong one really gets, and a revision. The task's prompts are the held-out combinations, as in
tinycode-loops.
"""

from __future__ import annotations

import random

from softrl.rewards.sandbox import ExecResult
from softrl.tasks.base import Prompt
from softrl.tasks.code import extract_code
from softrl.tasks.environment import Messages
from softrl.tasks.loopcode import LoopCodeTask
from softrl.tasks.tinycode import run_reference

SHOWN = 2  # the statement's examples: its first two tests
MAX_SHOWN_CHARS = 60  # of an output or an error in the feedback: a tiny model's context is short


def feedback_text(stdin: str, expected: str, printed: str | None, error: str | None) -> str:
    """The environment's message for a failed shown test: what the program printed (`printed`), or the
    error it stopped with (`error`, the last line of a traceback or a limit's name)."""
    got = f"Error: {error.strip()[:MAX_SHOWN_CHARS]}" if error is not None else \
        f"Got: {' '.join(printed.split())[:MAX_SHOWN_CHARS] or '(nothing)'}"
    return f"Failed on input: {stdin}\nExpected: {expected.strip()}\n{got}"


def _error_of(result: ExecResult) -> str | None:
    """A failed run's error as the feedback shows it (None: it ran and printed the wrong thing)."""
    if result.status == "wrong_answer":
        return None
    if result.status == "runtime_error":
        lines = result.stderr.strip().splitlines()
        return lines[-1] if lines else "runtime error"
    return result.status.replace("_", " ")  # time limit, memory limit, output limit


class ShownTestsEnvironment:
    """Runs each policy turn's program on the shown tests in the task's sandbox: done when they pass,
    else the first failure as a user message. Deterministic: the feedback is a function of the program."""

    deterministic = True

    def __init__(self, task: LoopCodeTask):
        self.task = task

    def initial_state(self, prompt: Prompt) -> dict:
        return {"prompt": prompt}

    def is_completed(self, messages: Messages, state: dict) -> bool:
        tests = state["prompt"].meta["tests"][:SHOWN]
        results = self.task.sandbox.run_tests(extract_code(messages[-1]["content"]), tests, stop_at_first_error=True)
        state["failure"] = None
        for (stdin, expected), result in zip(tests, results):
            if result.status == "sandbox_error":
                raise RuntimeError(f"sandbox failed: {result.stderr[-200:]}")
            if not result.passed:
                state["failure"] = feedback_text(stdin, expected, result.stdout, _error_of(result))
                break
        return state["failure"] is None

    def env_response(self, messages: Messages, state: dict) -> tuple[Messages, dict]:
        return [{"role": "user", "content": state["failure"]}], state


class FeedbackCodeTask(LoopCodeTask):
    """tinycode-loops' problems, answered over up to `task.max_turns` turns with the shown tests' feedback."""

    name = "tinycode-feedback"
    max_new_tokens = 160  # a turn's: three turns and two feedbacks fit the bootstrap's 1024 positions

    def make_environment(self) -> ShownTestsEnvironment:
        return ShownTestsEnvironment(self)


def trusted_feedback(program: str, tests: list[tuple[str, str]]) -> str | None:
    """`ShownTestsEnvironment`'s answer to one of the bootstrap's own programs (trusted: run in-process),
    None where it passes the shown tests. The same text the sandbox's run gives."""
    for stdin, expected in tests[:SHOWN]:
        try:
            printed, error = run_reference(program, stdin), None
        except Exception as e:  # noqa: BLE001 - a wrong program's crash is its feedback
            printed, error = None, f"{type(e).__name__}: {e}"
        if error is not None or printed.split() != expected.split():
            return feedback_text(stdin, expected, printed, error)
    return None


def synthetic_episode(prompt: Prompt, right: list[str], wrong: list[str], rng: random.Random, max_turns: int,
                      p_correct: float) -> list[dict]:
    """An episode of the bootstrap's supervised data as chat messages (role and content): each program right
    with probability `p_correct`, else a plausible wrong one not written yet, with the feedback the environment gives it,
    until one passes the shown tests or `max_turns` programs are written. A wrong program that passes
    the shown tests (it fails only hidden ones) ends the episode as it would in a rollout. Once every wrong
    program has been written, the next is right. A change here changes the bootstrap's data: bump the
    "format" of its fingerprint (bootstrap.task_fingerprint)."""
    turns: list[dict] = []
    for written in range(1, max_turns + 1):
        tried = {t["content"] for t in turns}
        untried = [w for w in wrong if w not in tried]  # a revision changes the program
        program = rng.choice(right if not untried or rng.random() < p_correct else untried)
        turns.append({"role": "assistant", "content": program})
        failure = trusted_feedback(program, prompt.meta["tests"])
        if failure is None or written == max_turns:
            break
        turns.append({"role": "user", "content": failure})
    return turns
