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
        rows = (rollouts(spec, contexts, n, seed) if self.env is None
                else episodes(spec, self.env, contexts, n, seed, self.limits, self.tokenizer))
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

    def end(self, finish: str, why: str = "") -> None:
        self.finish, self.why = finish, why


def _turn(role: str, content: str, **extra) -> dict:
    return {"role": role, "content": content, "tool_calls": None, "tool_call_id": None, "name": None,
            "reward": None} | extra


def _environment_turns(env, episode: Episode, limits: EpisodeLimits, pool) -> list[dict] | None:
    """The environment's answer to the episode's last policy turn as turns (None: it ended the episode,
    which then says why: done, timeout, env_error)."""
    from concurrent.futures import TimeoutError as Late

    from softrl.tasks.environment import call

    def ask(method, *args):
        return pool.submit(call, method, *args).result(timeout=limits.timeout_s)

    try:
        if ask(env.is_completed, episode.messages, episode.state):
            episode.end("done")
            return None
        answer, episode.state = ask(env.env_response, episode.messages, episode.state)
    except Late:
        episode.end("timeout", f"the environment took longer than {limits.timeout_s:g} s")
        return None
    except Exception as e:  # noqa: BLE001 - whatever an environment raises ends its episode, not the run
        episode.end("env_error", f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}")
        return None
    turns = []
    for message in answer if isinstance(answer, list) else [answer]:
        role, content = (message or {}).get("role"), (message or {}).get("content")
        if role not in ("tool", "user") or not isinstance(content, str):
            episode.end("env_error", f"the environment answered with {str(message)[:120]!r}: a tool or user message "
                        "with a 'content' text is needed")
            return None
        if len(content) > limits.max_env_chars:
            episode.end("env_error", f"the environment answered with {len(content):,} characters, more than "
                        f"{limits.max_env_chars:,}")
            return None
        turns.append(_turn(role, content, tool_call_id=message.get("tool_call_id"), name=message.get("name")))
    if not turns:
        episode.end("done")
    return turns or None


def episodes(spec: RolloutSpec, env, contexts: list[Context], k: int, seed: int, limits: EpisodeLimits,
             tokenizer) -> list[Trajectory]:
    """k multi-turn episodes of every context, grouped by context in order: the policy samples a turn for
    every live episode in one batched generate call, the environment answers each (`tasks.environment`),
    until it says done or a limit ends the episode; the row says which (`finish`). Environment tokens are
    tokenised as training tokenises them (`models.loading.turn_pieces`) and masked; the policy's keep
    their behaviour log-probs. An environment that raises, hangs or floods ends its episode, never the run."""
    from concurrent.futures import ThreadPoolExecutor

    from softrl.data.chat import prompt_messages, transcript
    from softrl.models.loading import turn_pieces
    from softrl.tasks.environment import initial_state

    budget = limits.token_budget or (spec.max_length - max(len(c.prompt_tokens) for c in contexts)
                                     if spec.max_length else 10**9)
    live = [Episode(c, prompt_messages(c.prompt.text), initial_state(env, c.prompt), [], [], [], [])
            for c in contexts for _ in range(k)]
    pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="softrl-env")
    try:
        for turn in range(limits.max_turns):
            active = [e for e in live if e.finish is None]
            if not active:
                break
            room = min(spec.max_new_tokens, budget - max(len(e.tokens) for e in active))
            if room < 1:
                for e in active:
                    e.end("token_budget")
                break
            params = SamplingParams(n=1, max_new_tokens=room, temperature=spec.temperature, top_p=spec.top_p,
                                    temperature_range=spec.temperature_range, seed=seed + 7919 * turn)
            got = spec.generator.generate([e.context.prompt_tokens + e.tokens for e in active], params)
            for e, s in zip(active, sorted(got, key=lambda s: s.prompt_index)):
                text = spec.decode(s.tokens)
                e.turns.append(_turn("assistant", text))
                e.messages.append({"role": "assistant", "content": text})
                e.tokens += s.tokens
                e.mask += [True] * len(s.tokens)
                e.logprobs += s.logprobs
                e.temperature = s.temperature
                if turn + 1 == limits.max_turns:
                    e.end("max_turns")
                    continue
                answer = _environment_turns(env, e, limits, pool)
                if answer is None:
                    continue
                start = len(e.turns)
                e.turns += answer
                e.messages += [{k_: v for k_, v in t.items() if v is not None and k_ != "reward"} for t in answer]
                for piece in turn_pieces(tokenizer, e.context.prompt.text, e.turns, start, policy_next=True):
                    e.tokens += piece
                    e.mask += [False] * len(piece)
                    e.logprobs += [0.0] * len(piece)
                if len(e.tokens) >= budget:
                    e.end("token_budget")
    finally:
        pool.shutdown(wait=False, cancel_futures=True)  # a hung environment call is left behind, not waited on
    rewards = _episode_rewards(spec, env, live)
    rows = []
    for e, (reward, passed) in zip(live, rewards):
        rows.append(Trajectory(e.context.prompt.id, transcript(e.turns), reward, passed, task=spec.task.name,
                               prompt_text=e.context.prompt.text, prompt_tokens=list(e.context.prompt_tokens),
                               response_tokens=e.tokens, tokenizer=spec.fingerprint, source=spec.source,
                               run_id=spec.run_id, policy_version=spec.policy_version, behavior_logprobs=e.logprobs,
                               decoding={"temperature": e.temperature, "top_p": spec.top_p}, turns=e.turns,
                               action_mask=e.mask, finish=f"{e.finish}: {e.why}" if e.why else e.finish))
    return rows


def _episode_rewards(spec: RolloutSpec, env, episodes_: list[Episode]) -> list[tuple[float, bool]]:
    """Each episode's (reward, passed): the environment's `reward(messages, state)` where it has one
    (passed: a reward of 1), else the task's grade of the last policy turn."""
    from softrl.tasks.base import check_reward
    from softrl.tasks.environment import call

    if hasattr(env, "reward"):
        out = []
        for e in episodes_:
            reward = check_reward(call(env.reward, e.messages, e.state),
                                  f"environment reward, prompt {e.context.prompt.id}")
            out.append((reward, reward >= 1))
        return out
    last = [next(t["content"] for t in reversed(e.turns) if t["role"] == "assistant") for e in episodes_]
    grades = spec.task.grade_many([(e.context.prompt, text) for e, text in zip(episodes_, last)])
    return [(g.reward, g.passed) for g in grades]
