"""RunConfig -> the pieces of a run: models, tokenizer, tasks, rollout specs, store and learner.

Everything that loads a model, picks a task or builds a sampler does it here: the local and Ray
runtimes (`RunParts`, `rollout_worker`), `softrl eval`, `softrl q0` and `softrl pts` and the benchmarks
(`TaskModel`). Nothing here writes a file but the store's folder and, on first use, a built or
prepared model in the cache.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import softrl.objectives as registry
from softrl.config import ConfigError, RunConfig
from softrl.data import ExperienceStore
from softrl.data.batched import BatchedAppender
from softrl.models.device import Placement
from softrl.models.loading import encode_prompt, encode_response, load_causal_lm, model_positions
from softrl.models.wrappers import PolicyModel, ReferenceModel, ValueModel
from softrl.rollout import EpisodeLimits, RolloutSpec, RolloutWorker, check_prompt_lengths
from softrl.tasks.base import Task
from softrl.training.learner import Learner


def model_directory(path: str, task: str, on_phase=None) -> str:
    """The model directory: as given (or a hub id), the task's bootstrap reference ('bootstrap', or
    'bootstrap:TASK' for another task's; built once, then cached), or a pretrained model `softrl
    model prepare` knows. `on_phase(name, done, total)`, a runtime's progress: told of the bootstrap's
    build when it runs (minutes, on a first run: said, not silent)."""
    from softrl.bootstrap import TASKS, bootstrap
    from softrl.models.prepare import known_models, prepare_model

    if path in known_models():
        try:
            return str(prepare_model(path))
        except ValueError as e:
            raise ConfigError(f"model.path: {e}") from e
    named = bootstrap_task(path, task)
    if named is None:
        return path
    task = named
    if task not in TASKS:
        raise ConfigError(f"model.path: no bootstrap model for task {task!r} (there is one for "
                          f"{', '.join(TASKS)}: bootstrap:TASK); give a model directory or hub id")
    progress = None if on_phase is None else (
        lambda stage, done, total, loss: on_phase(f"building the {task} reference model: {stage}", done, total))
    return str(bootstrap(task, progress=progress))


def bootstrap_task(path: str, task: str) -> str | None:
    """The task whose bootstrap reference `model.path` names ('bootstrap': the run's `task`; 'bootstrap:TASK'),
    else None."""
    return path.removeprefix("bootstrap:") if path.startswith("bootstrap:") else task if path == "bootstrap" else None


def model_folder(path: str, task: str) -> str:
    """Where `model_directory` finds the model, without building, preparing or downloading anything: a
    bootstrap reference's or a prepared model's cache folder (built or not), else `path` as given."""
    from softrl.bootstrap import TASK_DEFAULTS, BootstrapConfig, bootstrap_dir
    from softrl.models.prepare import known_models, prepared_dir

    if path in known_models():
        return str(prepared_dir(path))
    named = bootstrap_task(path, task)
    if named is None:
        return path
    return str(bootstrap_dir(BootstrapConfig(task=named, **TASK_DEFAULTS.get(named, {}))))


def resolve_model(config: RunConfig, on_phase=None) -> str:
    return model_directory(config.model.path, config.task.name, on_phase)


def load_tasks(config: RunConfig) -> tuple[Task, Task]:
    """(training task, evaluation task): a generated task's held-out split comes from its own seed;
    a dataset task's prompts are both (docs/USAGE.md)."""
    from softrl.tasks.registry import generated

    t = config.task
    train = task_split(t.name, t.size, t.seed, t.options, t.reward_range)
    return train, task_split(t.name, t.eval_size, t.eval_seed, t.options, t.reward_range) if generated(t.name) \
        else train


def task_split(spec: str, size: int | None, seed: int | None, options: dict,
               reward_range: tuple[float, float] | None = None) -> Task:
    """`tasks.registry.load_split`, its errors as a ConfigError naming the task settings."""
    from softrl.tasks.registry import load_split

    twice = sorted({"size", "seed", "reward_range"} & set(options))
    if twice:
        raise ConfigError(f"task.options.{twice[0]}: give it as task.{twice[0]} (--{twice[0]} on the command line)")
    try:
        return load_split(spec, size, seed, reward_range, **options)
    except (ValueError, TypeError) as e:
        raise ConfigError(f"task: {e}") from e


def placement(config: RunConfig) -> Placement:
    """The run's device and precision (`model.device`, `model.dtype`, `model.autocast`)."""
    m = config.model
    try:
        return Placement.create(m.device, m.dtype, m.autocast)
    except ValueError as e:
        raise ConfigError(f"model.device: {e}") from e


def rollout_spec(config: RunConfig, task: Task, model, tokenizer, source: str, generator=None) -> RolloutSpec:
    """Sampling `model` (with `generator`, one made for it, if given) on `task` with the run's decoding
    settings and the task's generation length."""
    s = config.sampling
    return RolloutSpec.for_model(task, model, tokenizer, s.max_new_tokens or task.max_new_tokens, backend=s.backend,
                                 generator=generator, temperature=s.temperature, temperature_range=s.temperature_range,
                                 top_p=s.top_p, ignore_eos=s.ignore_eos and source == "online",
                                 source=source, run_id=config.name)


def rollout_worker(config: RunConfig, task: Task, model, tokenizer, store: ExperienceStore | None,
                   generator=None, env=None) -> RolloutWorker:
    """Online rollouts of `model` on `task` (episodes where `env`, `load_environment`'s, answers between
    turns), every trajectory written to `store`."""
    if env is not None:
        check_template(config, tokenizer)
    return RolloutWorker(rollout_spec(config, task, model, tokenizer, "online", generator),
                         lambda text: encode_prompt(tokenizer, text), store, env, episode_limits(config), tokenizer)


def episode_limits(config: RunConfig) -> EpisodeLimits:
    return EpisodeLimits(max_turns=config.task.max_turns, timeout_s=config.task.env_timeout_s)


# objectives that assume a trajectory is a function of the policy's tokens: exact with a deterministic
# environment, biased with a stochastic one (docs/ALGORITHMS.md, "Episodes: which objectives stay exact")
BIASED_WITH_STOCHASTIC_ENVIRONMENTS = ("spo", "agro-off", "oapl")


def load_environment(config: RunConfig, task: Task):
    """`task.environment` made for `task`: 'feedback' (`FeedbackEnvironment`) or module:Class (made with
    the task where its constructor takes an argument); unset, the task's own (`Task.make_environment`:
    tinycode-feedback's), None for single-turn tasks. A name that does not load, or a class that is no
    environment, is a ConfigError naming task.environment."""
    import importlib
    import inspect

    from softrl.tasks.environment import Environment, FeedbackEnvironment

    name = config.task.environment
    if name is None:
        return task.make_environment()
    if name == "feedback":
        return FeedbackEnvironment(task)
    module, _, attribute = name.partition(":")
    if not attribute:
        raise ConfigError(f"task.environment: {name!r}: use 'feedback' or module:Class")
    try:
        made = getattr(importlib.import_module(module), attribute)
        if inspect.isclass(made):  # given the task where its constructor asks for one by that name
            made = made(task=task) if "task" in inspect.signature(made).parameters else made()
    except Exception as e:  # noqa: BLE001 - a user's module: whatever it raises, one line naming the key
        raise ConfigError(f"task.environment: {name!r} does not load ({type(e).__name__}: "
                          f"{str(e).splitlines()[0][:200] if str(e) else ''})") from None
    if not isinstance(made, Environment):
        raise ConfigError(f"task.environment: {name!r} is no environment: it needs deterministic, is_completed(messages, "
                          "state) and env_response(messages, state)")
    return made


def check_template(config: RunConfig, tokenizer) -> None:
    """A ConfigError where the model's chat template cannot split an episode by turns (one that renders
    past turns differently once later ones follow, or insists on roles alternating otherwise)."""
    from softrl.models.loading import turn_pieces

    turns = [{"role": "assistant", "content": "a"}, {"role": "user", "content": "b"}]
    try:
        turn_pieces(tokenizer, "q", turns, policy_next=True)
    except Exception as e:  # noqa: BLE001 - a template's error, whatever its kind
        raise ConfigError(f"task.environment: the model's chat template cannot render an episode turn by turn "
                          f"({type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''})") from None


def environment_warnings(config: RunConfig, env) -> list[str]:
    """One line where the run's objectives are biased with its environment (a stochastic one)."""
    if env is None:
        return []
    algorithms = {config.data.objective_for(s).algorithm for s in config.data.mix}
    said = []
    biased = sorted(algorithms & set(BIASED_WITH_STOCHASTIC_ENVIRONMENTS))
    if biased and not env.deterministic:
        said.append(f"warning: {', '.join(biased)} with a stochastic environment ({type(env).__name__}) is "
                    "biased: it takes the environment's draws for the policy's doing (docs/ALGORITHMS.md, 'Episodes: "
                    "which objectives stay exact'); kl-pg, rloo or ppo on-policy are exact there")
    return said


@dataclass
class TaskModel:
    """A model loaded to sample one task (not a batch sampler: those are data/samplers.py): what
    `softrl eval`, `q0`, `pts` and the benchmarks need."""

    task: Task
    spec: RolloutSpec
    model: object  # the Hugging Face causal LM
    tokenizer: object
    model_id: str  # the resolved model directory: Q0 rows and annotations are kept per model

    def encode_prompt(self, text: str) -> list[int]:
        return encode_prompt(self.tokenizer, text)

    def encode_response(self, text: str) -> list[int]:
        return encode_response(self.tokenizer, text)


def task_model(task: str | Task, model: str = "bootstrap", *, size: int | None = None, seed: int | None = None,
               max_new_tokens: int = 0, temperature: float = 1.0, top_p: float = 1.0, source: str = "reference",
               dtype: str = "float32", options: dict | None = None, device: str = "auto",
               backend: str = "auto") -> TaskModel:
    """`model` (a directory, a hub id, 'bootstrap' or a prepared name) sampling `task` (a spec with
    `size` prompts from `seed` where it generates them, None: the task's defaults; or a Task), on
    `device` in `dtype`."""
    task_obj = task if isinstance(task, Task) else task_split(task, size, seed, options or {})
    directory = model_directory(model, task if isinstance(task, str) else task_obj.name)
    try:
        where = Placement.create(device, dtype, autocast="off")
    except ValueError as e:
        raise ConfigError(str(e)) from e
    check_prompt_lengths(task_obj.name, task_obj.prompts(), model_positions(directory))  # before the weights load
    lm, tokenizer = load_causal_lm(directory, dtype)
    lm = where.place(lm)
    spec = RolloutSpec.for_model(task_obj, lm, tokenizer, max_new_tokens or task_obj.max_new_tokens, backend=backend,
                                 temperature=temperature, top_p=top_p, source=source)
    return TaskModel(task_obj, spec, lm, tokenizer, model_id(directory))


def model_id(directory: str) -> str:
    """What Q0 rows and annotations are kept under: a local directory's full path, or the hub id."""
    return str(Path(directory).resolve()) if Path(directory).exists() else directory


class RunParts:
    """The pieces of one training run, built completely from its config: policy, frozen reference,
    the value model where an objective needs one, tokenizer, tasks, store and learner. `rank`: the
    learner's place in a group of `runtime.learners` (runtime/group.py); only rank 0 opens the store."""

    def __init__(self, config: RunConfig, rank: int = 0, tasks: tuple[Task, Task] | None = None):
        """`tasks`: (training, evaluation) Task objects made in Python (`softrl.train`) instead of
        `config.task`'s; a learner rank but 0 needs none."""
        self.config = config
        self.train_task, self.eval_task = (tasks or load_tasks(config)) if rank == 0 else (None, None)
        # the environments of multi-turn runs (None: one turn), made once, before any weights load
        self.env = load_environment(config, self.train_task) if rank == 0 else None
        self.eval_env = load_environment(config, self.eval_task) if rank == 0 else None
        self.placement = placement(config)
        self.placement.deterministic(config.runtime.deterministic)
        self.model_path = resolve_model(config)
        if rank == 0:  # before the weights load and any prompt is tokenized
            positions = model_positions(self.model_path)
            for task in {id(t): t for t in (self.train_task, self.eval_task)}.values():
                check_prompt_lengths(task.name, task.prompts(), positions)
        self.policy = PolicyModel.load(self.model_path, config.model.dtype, config.model.lora)
        self.placement.place(self.policy.model)
        self.reference = ReferenceModel.from_policy(self.policy)
        self.tokenizer = self.policy.tokenizer
        objectives = [registry.get(config.data.objective_for(s).algorithm) for s in config.data.mix]
        self.value = None
        if any(o.value_model for o in objectives):  # a trained copy of the reference, so in the trained dtype
            self.value = self.placement.place(ValueModel(self.reference.model))
        self.placement.place(self.reference.model, frozen=True)
        self.placement.host_allocator(lean=config.optim.gradient_checkpointing)
        if config.optim.gradient_checkpointing:
            self.policy.checkpoint_activations()
            if self.value is not None:
                self.value.checkpoint_activations()
        self.store = ExperienceStore(config.data.store) if rank == 0 else None
        if self.store is not None:
            self.store.check_intact()
        self.online_rows = BatchedAppender(self.store) if rank == 0 else None  # commits every few steps
        self.generators: dict[int, object] = {}  # id(model) -> its generator (`RunParts.generator`)
        self.learner = Learner(self.policy, self.reference, config, self.value, self.placement, rank,
                               config.runtime.learners)

    def encode_prompt(self, text: str) -> list[int]:
        return encode_prompt(self.tokenizer, text)

    def generator(self, model):
        """`model`'s one generator for the whole run (rollouts, every evaluation): the static backend's
        KV caches and compiled decode step are made once per model and shape, not once per evaluation
        (each new one would compile again, and torch.compile stops compiling after a few)."""
        from softrl.models.generation import make_generator

        if id(model) not in self.generators:  # a generator holds its model, so the id is not reused meanwhile
            self.generators[id(model)] = make_generator(model, self.tokenizer, self.config.sampling.backend)
        return self.generators[id(model)]

    def spec(self, model, source: str, task: Task | None = None) -> RolloutSpec:
        return rollout_spec(self.config, task or self.train_task, model, self.tokenizer, source, self.generator(model))

    def worker(self, model) -> RolloutWorker:
        return rollout_worker(self.config, self.train_task, model, self.tokenizer, self.online_rows,
                              self.generator(model), self.env)

    def q0(self, progress=None, log=None, snapshot=None) -> dict[str, float]:
        """Q0 of every training prompt at the run's beta (sampled from the reference now where the
        store has none for this model and K, at `snapshot` where the run reads a pinned or recorded one);
        `progress(done, prompts)` as it goes, `log` one line first (`annotate.q0.estimate_q0`)."""
        from softrl.annotate.q0 import estimate_q0, soft_values

        c = self.config
        # a generator of its own, dropped afterwards: the reference samples once, and its KV caches would
        # otherwise stay on the device for the whole run
        spec = rollout_spec(c, self.train_task, self.reference.model, self.tokenizer, "reference")
        with self.placement.autocast():
            rows = estimate_q0(spec, self.train_task.prompts(), self.encode_prompt,
                               self.store, c.q0.k, c.beta, model_id(self.model_path), seed=c.seed,
                               progress=progress, log=log, snapshot=snapshot, env=self.env,
                               limits=episode_limits(c))
        return soft_values(rows, c.beta)

    def evaluate(self, model) -> dict:
        """The evaluation protocol (config.eval) on the held-out prompts: pass@k and the rest."""
        from softrl.eval.protocol import evaluate

        e = self.config.eval
        model.eval()  # the learner leaves the policy in training mode (dropout, activation checkpointing)
        with self.placement.autocast():
            return evaluate(self.spec(model, "eval", self.eval_task), self.eval_task.prompts(), self.encode_prompt,
                            e.samples, e.temperature, e.top_p, seed=self.config.seed + 17, stats=e.stats,
                            reference=self.reference.model, env=self.eval_env, limits=episode_limits(self.config))
