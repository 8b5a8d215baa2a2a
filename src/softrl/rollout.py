"""Sampling graded trajectories: K continuations of each context (a prompt, optionally followed by a
response prefix), as store rows. Q0 estimation samples prompts, Pivotal Token Search continues
prefixes of a stored response, and a `RolloutWorker` samples the current policy for training."""

from __future__ import annotations

import json

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any
from dataclasses import dataclass, replace

from softrl.data.schema import Trajectory, new_turn
from softrl.limits import MAX_CHARS_PER_TOKEN, MAX_RECORD_CHARS
from softrl.models.generation import Generator, SamplingParams, prefix_session
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


def refuse_unfit(spec: RolloutSpec, contexts: list[Context]) -> None:
    """A ValueError naming the first context that cannot fit the model's positions with `max_new_tokens`
    after it (rather than run out of memory on it, or sample nothing)."""
    for c in contexts:
        length = len(c.prompt_tokens) + len(c.prefix)
        if spec.max_length and length + spec.max_new_tokens > spec.max_length:
            raise ValueError(f"prompt {c.prompt.id!r} of task {spec.task.name!r}: {length} tokens and "
                             f"max_new_tokens {spec.max_new_tokens} exceed the model's {spec.max_length} positions: "
                             "shorten the prompt or lower sampling.max_new_tokens")


def rollouts(spec: RolloutSpec, contexts: list[Context], k: int, seed: int) -> list[Trajectory]:
    """k graded continuations of every context, grouped by context in order; each row's response is
    the prefix followed by the continuation. A context that cannot fit the model's positions with
    `max_new_tokens` after it is refused, naming its prompt (rather than run out of memory on it)."""
    refuse_unfit(spec, contexts)
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
    """Samples the policy its generator holds, on a task's prompts (multi-turn episodes where an
    environment `env` answers between turns, within `limits`); every trajectory goes to `store`."""

    def __init__(self, spec: RolloutSpec, encode_prompt: Callable[[str], list[int]], store=None, env=None,
                 limits: EpisodeLimits | None = None, tokenizer=None):
        if env is not None and tokenizer is None:
            raise ValueError("a rollout worker with an environment needs the tokenizer (its turns are tokenised)")
        self.spec, self.encode_prompt, self.store = spec, encode_prompt, store
        self.env, self.limits, self.tokenizer = env, limits or EpisodeLimits(), tokenizer
        self._tokens: dict[str, list[int]] = {}

    def collect(self, prompts: list[Prompt], n: int, version: int, seed: int) -> list[Trajectory]:
        contexts = contexts_of(self.spec, prompts, self.encode_prompt, self._tokens)
        spec = replace(self.spec, policy_version=version)
        rows = graded_samples(spec, contexts, n, seed, self.env, self.limits, self.tokenizer)
        if self.store is not None:
            self.store.append(rows)
        return rows


@dataclass(frozen=True)
class EpisodeLimits:
    """When an episode ends short of its environment saying so: after `max_turns` policy turns, past
    `token_budget` tokens after the prompt (0: the model's positions), when an environment call takes
    longer than `timeout_s`, or answers with more than `max_env_chars` characters."""

    max_turns: int = 3
    token_budget: int = 0
    timeout_s: float = 30.0
    max_env_chars: int = 20_000

    def __post_init__(self):
        # an episode of no policy turn has nothing to train on or grade
        if self.max_turns < 1:
            raise ValueError(f"max_turns must be at least 1, got max_turns={self.max_turns}")


@dataclass
class Episode:
    """One episode in progress: its conversation, its tokens after the prompt (the policy's sampled, the
    environment's tokenised) with the mask of the policy's and their log-probs (0 at the environment's)."""

    context: Context
    messages: list[dict]
    state: dict
    turns: list[dict]
    tokens: list[int]
    mask: list[bool]
    logprobs: list[float]
    temperature: float = 1.0
    finish: str | None = None
    why: str = ""
    failed_start: tuple[str, str] | None = None  # (finish, why) of an initial_state that failed

    def end(self, finish: str, why: str = "") -> None:
        self.finish, self.why = finish, why

    @property
    def finish_text(self) -> str:
        return f"{self.finish}: {self.why}" if self.why else self.finish


def _ask(method, args: tuple, timeout_s: float) -> tuple[Any, tuple[str, str] | None]:
    """`method(*args)` (awaited where it is a coroutine) on a daemon thread, waited for `timeout_s`:
    (answer, None), or (None, (finish, why)) with finish timeout or env_error. A call that hangs is left
    behind on its daemon thread, which never holds the process at exit."""
    import threading

    from softrl.tasks.environment import call

    box: dict = {}

    def run() -> None:
        try:
            box["answer"] = call(method, *args)
        except BaseException as e:  # noqa: BLE001 - whatever an environment raises ends its episode, not the run
            box["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"

    thread = threading.Thread(target=run, daemon=True, name="softrl-env")
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        return None, ("timeout", f"the environment took longer than {timeout_s:g} s")
    if "error" in box:
        return None, ("env_error", box["error"])
    return box.get("answer"), None


def _environment_turns(env, episode: Episode, limits: EpisodeLimits) -> list[dict] | None:
    """The environment's answer to the episode's last policy turn as turns (None: it ended the episode,
    which then says why: done, timeout, env_error). Runs on a thread of its own (`_answer_all`)."""
    completed, failure = _ask(env.is_completed, (episode.messages, episode.state), limits.timeout_s)
    if failure is None and completed:
        episode.end("done")
        return None
    if failure is None:
        answer, failure = _ask(env.env_response, (episode.messages, episode.state), limits.timeout_s)
    if failure is not None:
        episode.end(*failure)
        return None
    if not (isinstance(answer, (tuple, list)) and len(answer) == 2):
        episode.end("env_error", f"env_response returned {str(answer)[:120]!r}, not (messages, state)")
        return None
    messages, episode.state = answer
    turns = []
    for message in messages if isinstance(messages, list) else [messages]:
        role = message.get("role") if isinstance(message, dict) else None
        content = message.get("content") if isinstance(message, dict) else None
        if role not in ("tool", "user") or not isinstance(content, str):
            episode.end("env_error", f"the environment answered with {str(message)[:120]!r}: a tool or user message "
                        "with a 'content' text is needed")
            return None
        if len(content) > limits.max_env_chars:
            episode.end("env_error", f"the environment answered with {len(content):,} characters, more than "
                        f"{limits.max_env_chars:,}")
            return None
        extra = {key: message[key] if isinstance(message.get(key), str) else None for key in ("tool_call_id", "name")}
        turns.append(new_turn(role, content, **extra))
    if not turns:
        episode.end("done")
    return turns or None


def _answer_all(env, waiting: list[Episode], limits: EpisodeLimits) -> dict[int, list[dict] | None]:
    """Every waiting episode's environment answer, asked at once (one thread each): a slow environment
    costs a turn its slowest call, not the sum of them."""
    if not waiting:
        return {}
    # each worker waits on its own daemon call thread (`_ask`), so none of these threads ever hangs
    with ThreadPoolExecutor(max_workers=min(32, len(waiting)), thread_name_prefix="softrl-env-turn") as pool:
        answers = list(pool.map(lambda e: _environment_turns(env, e, limits), waiting))
    return {id(e): a for e, a in zip(waiting, answers)}


def episodes(spec: RolloutSpec, env, contexts: list[Context], k: int, seed: int, limits: EpisodeLimits,
             tokenizer) -> list[Trajectory]:
    """k multi-turn episodes of every context, grouped by context in order: the policy samples a turn for
    every live episode in one batched generate call, the environment answers each (`tasks.environment`,
    all at once), until it says done or a limit ends the episode; the row says which (`finish`).
    Environment tokens are tokenised as training tokenises them (`models.loading.turn_pieces`) and
    masked; the policy's keep their behaviour log-probs. An environment that raises, hangs or floods
    ends its episode, never the run. Each episode has its own token budget: `token_budget`, or the
    model's positions after its prompt. An episode's reward is asked for as soon as it ends, on a thread
    of its own, while the others' next turn is generated (not while the environment answers them); the
    task grades the episodes that ended in a turn together, one `grade_many` call a turn."""
    from softrl.data.chat import transcript

    refuse_unfit(spec, contexts)
    live = _started(env, contexts, k, limits)
    asked: list[tuple[list[Episode], Future]] = []  # episodes whose rewards were asked for, together
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="softrl-episode-reward") as rewards, \
            prefix_session(spec.generator):  # a turn prefills what the last one added, not the conversation
        try:
            for turn in range(limits.max_turns):
                active = [e for e in live if e.finish is None]
                for e in active:
                    if _room(spec, limits, e) < 1:
                        e.end("token_budget")
                active = [e for e in active if e.finish is None]
                if not active:
                    break
                waiting = _policy_turn(spec, env, active, turn, k, seed, limits)
                # rewards overlap generation, never the environment's calls (for its sandbox and its threads)
                wait([future for _, future in asked])
                _environment_turn(env, waiting, limits, tokenizer, lambda e: _room(spec, limits, e))
                if ended := [e for e in active if e.finish is not None]:
                    asked.append((ended, rewards.submit(_episode_rewards, spec, env, ended, limits)))
            done = {id(e) for batch, _ in asked for e in batch}
            if rest := [e for e in live if id(e) not in done]:  # out of room before a turn
                asked.append((rest, rewards.submit(_episode_rewards, spec, env, rest, limits)))
            outcome = {id(e): result for batch, future in asked for e, result in zip(batch, future.result())}
        except BaseException:  # a failed turn (or an interrupt) does not wait for the rewards still queued
            rewards.shutdown(wait=False, cancel_futures=True)
            raise
    rows = []
    for e in live:
        reward, passed, failure = outcome[id(e)]
        finish = f"{failure[0]}: reward: {failure[1]}" if failure else e.finish_text
        rows.append(Trajectory(e.context.prompt.id, transcript(e.turns), reward, passed, task=spec.task.name,
                               prompt_text=e.context.prompt.text, prompt_tokens=list(e.context.prompt_tokens),
                               response_tokens=e.tokens, tokenizer=spec.fingerprint, source=spec.source,
                               run_id=spec.run_id, policy_version=spec.policy_version, behavior_logprobs=e.logprobs,
                               decoding={"temperature": e.temperature, "top_p": spec.top_p}, turns=e.turns,
                               action_mask=e.mask, finish=finish))
    return rows


def _started(env, contexts: list[Context], k: int, limits: EpisodeLimits) -> list[Episode]:
    """k new episodes of every context, each with the environment's initial state (one whose start failed
    ends after its first policy turn, saying why)."""
    from softrl.data.chat import prompt_messages
    from softrl.tasks.environment import initial_state

    live = []
    for c in contexts:
        for _ in range(k):
            state, failure = _ask(initial_state, (env, c.prompt), limits.timeout_s)
            live.append(Episode(c, prompt_messages(c.prompt.text), state if isinstance(state, dict) else {},
                                [], [], [], [], failed_start=failure))
    return live


def _room(spec: RolloutSpec, limits: EpisodeLimits, e: Episode) -> int:
    """Tokens an episode may still take: its budget (`token_budget`, or the model's positions after its
    prompt) less what it holds."""
    budget = limits.token_budget or (spec.max_length - len(e.context.prompt_tokens) if spec.max_length else 10**9)
    return budget - len(e.tokens)


def _policy_turn(spec: RolloutSpec, env, active: list[Episode], turn: int, k: int, seed: int,
                 limits: EpisodeLimits) -> list[Episode]:
    """One policy turn for every active episode, in one generate call; returns those that wait for the
    environment's answer (the others ended: a failed start, or their last turn)."""
    from softrl.data.chat import turn_message
    from softrl.tasks.tools import parse_tool_calls

    # a context's k episodes start alike (each one's room is its context's): its prompt prefilled once
    n = k if turn == 0 else 1
    room = {id(e): _room(spec, limits, e) for e in active}
    params = SamplingParams(n=n, max_new_tokens=max(min(spec.max_new_tokens, r) for r in room.values()),
                            temperature=spec.temperature, top_p=spec.top_p, temperature_range=spec.temperature_range,
                            seed=seed + 7919 * turn, ignore_eos=spec.ignore_eos)
    got = spec.generator.generate([e.context.prompt_tokens + e.tokens for e in active[::n]], params)
    waiting = []
    for e, sample in zip(active, sorted(got, key=lambda s: s.prompt_index)):
        keep = min(spec.max_new_tokens, room[id(e)])  # one call for all: each episode cut to its own room
        tokens, logprobs = sample.tokens[:keep], sample.logprobs[:keep]
        text, calls = spec.decode(tokens), None
        if getattr(env, "tools", None):  # the calls its text carries, for an environment with tools
            text, calls = parse_tool_calls(text, turn)
        e.turns.append(new_turn("assistant", text, tool_calls=json.dumps(calls) if calls else None))
        e.messages.append(turn_message(e.turns[-1]))
        e.tokens += tokens
        e.mask += [True] * len(tokens)
        e.logprobs += logprobs
        e.temperature = sample.temperature
        if e.failed_start:
            e.end(*e.failed_start)
        elif turn + 1 == limits.max_turns:
            e.end("max_turns")
        else:
            waiting.append(e)
    return waiting


def _environment_turn(env, waiting: list[Episode], limits: EpisodeLimits, tokenizer,
                      room: Callable[[Episode], int]) -> None:
    """The environment's answers to the waiting episodes, asked all at once, tokenised and appended
    (masked); an answer that cannot be tokenised, or leaves no room for a policy token, ends its episode."""
    from softrl.data.chat import turn_message
    from softrl.models.loading import turn_pieces

    answers = _answer_all(env, waiting, limits)
    for e in waiting:
        answer = answers[id(e)]
        if answer is None:
            continue
        try:
            pieces = turn_pieces(tokenizer, e.context.prompt.text, e.turns + answer, len(e.turns), policy_next=True)
        except Exception as error:  # noqa: BLE001 - a chat template's error is the episode's, not the run's
            e.end("env_error", f"the environment's turn could not be tokenised: {type(error).__name__}: "
                  f"{str(error).splitlines()[0][:200] if str(error) else ''}")
            continue
        tokens = [t for piece in pieces for t in piece]
        if len(tokens) + 1 > room(e):  # no room for its tokens and one of the policy's after them
            e.end("token_budget")
            continue
        e.turns += answer
        e.messages += [turn_message(t) for t in answer]
        e.tokens += tokens
        e.mask += [False] * len(tokens)
        e.logprobs += [0.0] * len(tokens)


def graded_samples(spec: RolloutSpec, contexts: list[Context], k: int, seed: int, env=None,
                   limits: EpisodeLimits | None = None, tokenizer=None) -> list[Trajectory]:
    """k graded samples of every context: single responses (`rollouts`), or, where an environment `env`
    answers between turns, episodes within `limits` (`episodes`; the environment's turns tokenised with
    `tokenizer`, by default the generator's)."""
    if env is None:
        return rollouts(spec, contexts, k, seed)
    return episodes(spec, env, contexts, k, seed, limits or EpisodeLimits(), tokenizer or spec.generator.tokenizer)


def _episode_rewards(spec: RolloutSpec, env, episodes_: list[Episode],
                     limits: EpisodeLimits) -> list[tuple[float, bool, tuple[str, str] | None]]:
    """Each episode's (reward, passed, (finish, why) where the reward failed, else None): the environment's
    `reward(messages, state)` where it has one (passed: a reward of 1; one that raises, hangs or is no
    number in [0, 1] gives 0, and the row's finish says why; an episode the environment already failed
    gets 0 without asking it again), else the task's grade of the last policy turn."""
    from softrl.tasks.base import RewardError, check_reward

    if hasattr(env, "reward"):
        def reward_of(e: Episode) -> tuple[float, bool, tuple[str, str] | None]:
            if e.finish in ("env_error", "timeout"):
                return 0.0, False, None
            value, failure = _ask(env.reward, (e.messages, e.state), limits.timeout_s)
            try:
                reward = check_reward(value, "the environment's reward") if failure is None else 0.0
            except RewardError as error:
                reward, failure = 0.0, ("env_error", str(error))
            return reward, reward >= 1, failure

        # asked at once, as `_answer_all` asks for turns
        with ThreadPoolExecutor(max_workers=min(32, len(episodes_) or 1), thread_name_prefix="softrl-reward") as pool:
            return list(pool.map(reward_of, episodes_))
    last = [next(t["content"] for t in reversed(e.turns) if t["role"] == "assistant") for e in episodes_]
    grades = spec.task.grade_many([(e.context.prompt, text) for e, text in zip(episodes_, last)])
    return [(g.reward, g.passed, None) for g in grades]
