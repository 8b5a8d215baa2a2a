"""Sampling graded trajectories: K continuations of each context (a prompt, optionally followed by a
response prefix), as store rows. Q0 estimation samples prompts, Pivotal Token Search continues
prefixes of a stored response, and a `RolloutWorker` samples the current policy for training."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from softrl.data.schema import Trajectory
from softrl.limits import MAX_CHARS_PER_TOKEN, MAX_RECORD_CHARS
from softrl.models.generation import Generator, SamplingParams
from softrl.tasks.base import Prompt, Task


@dataclass(frozen=True)
class RolloutSpec:
    """Everything but the contexts: who samples, how, who grades, how rows are labelled."""

    task: Task
    generator: Generator
    decode: Callable[[list[int]], str]
    fingerprint: str  # the tokenizer's, written with the rows (token ids are only valid under it)
    max_new_tokens: int
    temperature: float = 1.0
    temperature_range: tuple[float, float] | None = None  # per-sample temperature ~ U(lo, hi)
    top_p: float = 1.0
    max_per_call: int = 256  # samples per generate call
    ignore_eos: bool = False  # fixed work (benchmarks): every sample is max_new_tokens long
    source: str = "reference"
    run_id: str = ""
    policy_version: int = 0
    max_length: int = 0  # the model's positions (prompt + response); 0: not known

    @classmethod
    def for_model(cls, task: Task, model, tokenizer, max_new_tokens: int, backend: str = "hf",
                  generator: Generator | None = None, **options) -> RolloutSpec:
        """Sampling a Hugging Face model with a generation `backend` (`models.generation.make_generator`),
        or with `generator`, one already made for `model`; rows carry its tokenizer's fingerprint."""
        from softrl.models.generation import make_generator
        from softrl.models.loading import tokenizer_fingerprint

        if generator is None:
            generator = make_generator(model, tokenizer, backend, max_batch=options.get("max_per_call", 256))
        return cls(task, generator, lambda ids: tokenizer.decode(ids, skip_special_tokens=True),
                   tokenizer_fingerprint(tokenizer), max_new_tokens, max_length=positions_of(model), **options)


@dataclass(frozen=True)
class Context:
    prompt: Prompt
    prompt_tokens: list[int]
    prefix: tuple[int, ...] = ()  # a response prefix to continue


def positions_of(model) -> int:
    """The model's positions (prompt + response), 0 where its config does not say."""
    return int(getattr(getattr(model, "config", None), "max_position_embeddings", 0) or 0)


def max_prompt_chars(max_length: int) -> int:
    """The most characters a prompt may have to be tokenized at all: the model's positions x
    `limits.MAX_CHARS_PER_TOKEN` (no text packs more into a token), else `limits.MAX_RECORD_CHARS`."""
    return max_length * MAX_CHARS_PER_TOKEN if max_length else MAX_RECORD_CHARS


def check_prompt_lengths(task: str, prompts: list[Prompt], max_length: int) -> None:
    """A ValueError naming the first prompt too long for a model of `max_length` positions whatever
    its tokens: one that would take a minute and gigabytes to tokenize only to be refused then
    (`rollouts`). Costs a length per prompt: done before any work on them."""
    limit = max_prompt_chars(max_length)
    for p in prompts:
        if len(p.text) > limit:
            bound = (f"the model's {max_length} positions at {MAX_CHARS_PER_TOKEN} characters a token"
                     if max_length else "the record limit")
            raise ValueError(f"prompt {p.id!r} of task {task!r} has {len(p.text):,} characters, more than {bound} "
                             f"could hold: at most {limit:,} characters; shorten it or leave it out")


def refuse_long_prompts(spec: RolloutSpec, prompts: list[Prompt]) -> None:
    """`check_prompt_lengths` for the model `spec` samples."""
    check_prompt_lengths(spec.task.name, prompts, spec.max_length)


def contexts_of(spec: RolloutSpec, prompts: list[Prompt], encode: Callable[[str], list[int]],
                known: dict[str, list[int]] | None = None) -> list[Context]:
    """The prompts tokenized, none before every one is known to be short enough (`refuse_long_prompts`);
    `known`: token ids by prompt id, reused and added to."""
    refuse_long_prompts(spec, prompts)
    known = {} if known is None else known
    for p in prompts:
        if p.id not in known:
            known[p.id] = encode(p.text)
    return [Context(p, known[p.id]) for p in prompts]


def rollouts(spec: RolloutSpec, contexts: list[Context], k: int, seed: int) -> list[Trajectory]:
    """k graded continuations of every context, grouped by context in order; each row's response is
    the prefix followed by the continuation. A context that cannot fit the model's positions with
    `max_new_tokens` after it is refused, naming its prompt (rather than run out of memory on it)."""
    for c in contexts:
        length = len(c.prompt_tokens) + len(c.prefix)
        if spec.max_length and length + spec.max_new_tokens > spec.max_length:
            raise ValueError(f"prompt {c.prompt.id!r} of task {spec.task.name!r}: {length} tokens and "
                             f"max_new_tokens {spec.max_new_tokens} exceed the model's {spec.max_length} positions: "
                             "shorten the prompt or lower sampling.max_new_tokens")
    per_call = max(1, spec.max_per_call // k)
    samples = []
    for call, start in enumerate(range(0, len(contexts), per_call)):
        chunk = contexts[start : start + per_call]
        budget = max(1, spec.max_new_tokens - max(len(c.prefix) for c in chunk))
        for rep, first in enumerate(range(0, k, spec.max_per_call)):
            params = SamplingParams(n=min(spec.max_per_call, k - first), max_new_tokens=budget,
                                    temperature=spec.temperature, temperature_range=spec.temperature_range,
                                    top_p=spec.top_p, seed=seed + 7919 * call + 104729 * rep,
                                    ignore_eos=spec.ignore_eos)
            got = spec.generator.generate([c.prompt_tokens + list(c.prefix) for c in chunk], params)
            samples += [(start + s.prompt_index, s) for s in got]
    samples.sort(key=lambda pair: pair[0])  # stable: by context, then in sampling order
    samples = [(contexts[i], s) for i, s in samples]
    texts = [spec.decode(list(c.prefix) + s.tokens) for c, s in samples]
    grades = spec.task.grade_many([(c.prompt, t) for (c, _), t in zip(samples, texts)])
    return [Trajectory(c.prompt.id, text, grade.reward, grade.passed, task=spec.task.name, prompt_text=c.prompt.text,
                       prompt_tokens=list(c.prompt_tokens), response_tokens=list(c.prefix) + s.tokens,
                       tokenizer=spec.fingerprint, source=spec.source, run_id=spec.run_id,
                       policy_version=spec.policy_version, behavior_logprobs=None if c.prefix else s.logprobs,
                       decoding={"temperature": s.temperature, "top_p": spec.top_p})
            for (c, s), text, grade in zip(samples, texts, grades)]


class RolloutWorker:
    """Samples the policy its generator holds, on a task's prompts; every trajectory goes to `store`."""

    def __init__(self, spec: RolloutSpec, encode_prompt: Callable[[str], list[int]], store=None):
        self.spec, self.encode_prompt, self.store = spec, encode_prompt, store
        self._tokens: dict[str, list[int]] = {}

    def collect(self, prompts: list[Prompt], n: int, version: int, seed: int) -> list[Trajectory]:
        contexts = contexts_of(self.spec, prompts, self.encode_prompt, self._tokens)
        rows = rollouts(replace(self.spec, policy_version=version), contexts, n, seed)
        if self.store is not None:
            self.store.append(rows)
        return rows
