"""K continuations of a prompt (and optionally a response prefix), graded, as store trajectories.
Q0 estimation is the empty prefix; Pivotal Token Search continues prefixes of a stored response."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from softrl.data.schema import Trajectory
from softrl.models.generation import Generator, SamplingParams
from softrl.tasks.base import Prompt, Task


@dataclass(frozen=True)
class RolloutSpec:
    """Everything but the prompt and prefix: who samples, how, who grades, how rows are labelled."""

    task: Task
    generator: Generator
    decode: Callable[[list[int]], str]
    tokenizer: str  # fingerprint written with the rows
    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    max_per_call: int = 256  # samples of one prompt per generate call
    source: str = "reference"
    run_id: str = ""
    policy_version: int = 0


def rollouts(spec: RolloutSpec, prompt: Prompt, prompt_tokens: list[int], prefix: list[int], k: int,
             seed: int) -> list[Trajectory]:
    """k graded continuations of `prompt_tokens + prefix`; each row's response is prefix + continuation."""
    samples = []
    for call, start in enumerate(range(0, k, spec.max_per_call)):
        n = min(spec.max_per_call, k - start)
        params = SamplingParams(n=n, max_new_tokens=max(1, spec.max_new_tokens - len(prefix)),
                                temperature=spec.temperature, top_p=spec.top_p, seed=seed + 7919 * call)
        samples += spec.generator.generate([prompt_tokens + prefix], params)
    texts = [spec.decode(prefix + s.tokens) for s in samples]
    grades = spec.task.grade_many([(prompt, t) for t in texts])
    decoding = {"temperature": spec.temperature, "top_p": spec.top_p}
    return [Trajectory(prompt.id, text, grade.reward, grade.passed, task=spec.task.name, prompt_text=prompt.text,
                       prompt_tokens=list(prompt_tokens), response_tokens=prefix + s.tokens, tokenizer=spec.tokenizer,
                       source=spec.source, run_id=spec.run_id, policy_version=spec.policy_version,
                       behavior_logprobs=None if prefix else s.logprobs, decoding=decoding)
            for s, text, grade in zip(samples, texts, grades)]
