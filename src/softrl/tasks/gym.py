"""Any `reasoning-gym` dataset as a task (optional extra: `pip install softrl[gym]`)."""

from __future__ import annotations

import re
from typing import Any

from softrl.tasks.base import Grade, Prompt, Task, extract_answer


class GymTask(Task):
    """`gym:NAME` with the dataset's own config keys; graded by the dataset's own scorer. `prompt_suffix`
    is appended to every question. The scorer reads the text in the last `<answer>` tags, else the last
    match of `answer_regex` when given (e.g. `-?\\d+` for the final integer of "5 - 3 = 2"), else the
    last line."""

    def __init__(self, dataset: str, size: int = 500, seed: int = 0, prompt_suffix: str = "",
                 answer_regex: str | None = None, **config: Any):
        try:
            import reasoning_gym
        except ImportError as e:
            raise ValueError("gym tasks need reasoning-gym: pip install 'softrl[gym]'") from e
        try:
            self.data = reasoning_gym.create_dataset(dataset, size=size, seed=seed, **config)
        except (KeyError, ValueError, TypeError) as e:
            raise ValueError(f"reasoning-gym dataset {dataset!r} with config {config}: {e}") from e
        try:
            self.answer_regex = re.compile(answer_regex) if answer_regex else None
        except re.error as e:
            raise ValueError(f"answer_regex {answer_regex!r}: {e}") from e
        self.name = f"gym:{dataset}"
        self._prompts = [Prompt(f"gym-{dataset}-{seed}-{i}", entry["question"] + prompt_suffix, {"index": i})
                         for i, entry in enumerate(self.data)]

    def prompts(self) -> list[Prompt]:
        return list(self._prompts)

    def grade(self, prompt: Prompt, response: str) -> Grade:
        entry = self.data[prompt.meta["index"]]
        score = float(self.data.score_answer(answer=self.answer(response), entry=entry) or 0.0)
        return Grade(score, score >= 1.0, {"answer": entry.get("answer")})

    def answer(self, response: str) -> str:
        if self.answer_regex is not None and "<answer>" not in response:
            found = self.answer_regex.findall(response)
            return found[-1] if found else ""
        return extract_answer(response)

    def reference_solutions(self, prompt: Prompt) -> list[str]:
        return [str(self.data[prompt.meta["index"]]["answer"])]
