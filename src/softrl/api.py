"""softrl from Python: `train` and `evaluate`, thin over what the `softrl` command uses (the config,
`assemble`, the runtimes, the evaluation protocol). Errors are raised as softrl's one-line
exceptions (ConfigError, RecordError, RewardError, ModelLoadError: all ValueErrors), before any
model is loaded where they can be. Faults while training are one-line exceptions too: Ctrl-C or
SIGTERM `RunStopped` (a KeyboardInterrupt), a full disk `DiskFullError` (an OSError), a run
directory another process trains in `RunInUseError` (a ConfigError); see `train`.

    import softrl

    def accuracy(prompts, completions, answer, **kwargs):      # TRL's batched form
        return [float(c.strip() == a) for c, a in zip(completions, answer)]

    run = softrl.train({"model": {"path": "HuggingFaceTB/SmolLM2-135M-Instruct"}, "optim": {"steps": 100}},
                       dataset=[{"prompt": "2 + 2 =", "answer": "4"}, ...], reward=accuracy)
    run.final_model, run.metrics[-1], run.summary["pass@1_after"]
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from softrl.config import ConfigError, RunConfig, config_from, load_config
from softrl.tasks.base import Task


@dataclass(frozen=True)
class Run:
    """A finished run: its directory, the final model folder (loads with
    `AutoModelForCausalLM.from_pretrained`), the summary (pass@k before and after, steps, samples,
    seconds) and the metrics history (every step's and evaluation's record, as in metrics.jsonl)."""

    run_dir: Path
    final_model: Path
    summary: dict
    config: RunConfig

    @property
    def metrics(self) -> list[dict]:
        from softrl.plots import read_metrics

        return read_metrics(self.run_dir)


class Callback:
    """Subclass and override what you need; `softrl.train(callbacks=[...])` calls every one's
    `on_step` with each learner step's metrics and `on_eval` with each evaluation (before training,
    every `eval.every` steps, after) as `{"step", "eval/pass@1", "eval/pass@10", ...}`."""

    def on_step(self, metrics: dict) -> None:
        pass

    def on_eval(self, result: dict) -> None:
        pass


def run_config(config: RunConfig | dict | str | Path | None) -> RunConfig:
    """A RunConfig from itself, a dict shaped like the YAML (sections, or dotted keys), a YAML path,
    or None (the defaults)."""
    if config is None or isinstance(config, RunConfig):
        return config or RunConfig()
    if isinstance(config, (str, Path)):
        return load_config(config)
    if isinstance(config, dict):
        return config_from(config)
    raise ConfigError(f"config must be a RunConfig, a dict or a YAML path, got {type(config).__name__}")


def reward_task(dataset: Any, reward: Any, what: str = "dataset", name: str | None = None,
                reward_range: tuple[float, float] | None = None) -> Task:
    """The task of `dataset` records graded by `reward` (tasks/reward_functions.py), whose values (their
    sum) lie in `reward_range` if declared."""
    from softrl.tasks.records import records_of
    from softrl.tasks.reward_functions import RewardFunctionTask, reward_functions

    return RewardFunctionTask(reward_functions(reward, summed=reward_range is not None), records_of(dataset, what),
                              name, reward_range)


def _tasks(config: RunConfig, dataset, reward, eval_dataset) -> tuple[Task, Task] | None:
    if dataset is None and reward is None:
        if eval_dataset is not None:
            raise ConfigError("eval_dataset needs dataset= and reward= (or set task.name in the config)")
        return None
    if dataset is None or reward is None:
        raise ConfigError("give dataset= and reward= together (or neither, and set task.name in the config)")
    if config.model.path == "bootstrap":  # the default would be the countdown task's tiny model
        raise ConfigError("model.path: give the model to train (a directory, a hub id, or bootstrap:TASK for a "
                          "built-in task's tiny reference)")
    declared = config.task.reward_range
    train_task = reward_task(dataset, reward, reward_range=declared)
    return train_task, reward_task(eval_dataset, reward, "eval_dataset", train_task.name, declared) \
        if eval_dataset is not None else train_task


def _import_offline(config: RunConfig, offline: Any, task: Task | None, log: Callable[[str], None]) -> RunConfig:
    """`offline` as one more source of the run's offline pool: a store source name, or records
    `{prompt, completion, reward}` imported into the store as source `import:NAME` first (unless
    `task` is None: a resumed run, or a rank other than 0, finds them there)."""
    if isinstance(offline, str) and not offline.startswith("hf:") and "/" not in offline and \
            not offline.endswith((".jsonl", ".gz", ".json", ".parquet")) and not Path(offline).exists():
        source = offline  # a source name; a path that is not there is named by read_records
    else:
        from softrl.data import ExperienceStore
        from softrl.data.io import check_conflicts, offline_trajectories
        from softrl.tasks.records import records_of

        source = f"import:{config.name}"
        if task is None:
            return _with_source(config, source)
        rows, unknown = offline_trajectories(records_of(offline, "offline"), task, source)
        check_conflicts(rows, "offline")
        written = ExperienceStore(config.data.store).append(rows)
        log(f"offline: {written} trajectories into {config.data.store} as source {source}"
            + (f"; {unknown} have a prompt the dataset lacks (kept, not trained on)" if unknown else ""))
    return _with_source(config, source)


def _with_source(config: RunConfig, source: str) -> RunConfig:
    if source in config.data.offline_sources:
        return config
    return config.model_copy(update={"data": config.data.model_copy(
        update={"offline_sources": [*config.data.offline_sources, source]})})


class ProgressLines:
    """Where no bar can be drawn (a log file, CI, a pipe), a line about every `every` seconds and at
    each new phase: `HH:MM:SS phase done/total info`."""

    def __init__(self, console, enabled: bool, every: float = 10.0):
        self.console, self.enabled, self.every = console, enabled, every
        self.last_time, self.last_phase = float("-inf"), None

    def say(self, phase: str, done: int | None = None, total: int | None = None, info: str = "") -> None:
        now = time.monotonic()
        if not self.enabled or (phase == self.last_phase and now - self.last_time < self.every):
            return
        self.last_time, self.last_phase = now, phase
        count = "" if done is None else f" {done}" + ("" if total is None else f"/{total}")
        self.console.print(f"{time.strftime('%H:%M:%S')} {phase}{count} {info}".rstrip(), highlight=False,
                           markup=False, soft_wrap=True)  # one line, however narrow the log's console


def run_with_progress(config: RunConfig, resume: bool = False, tasks: tuple[Task, Task] | None = None,
                      callbacks: list | None = None, quiet: bool = False, console=None) -> dict:
    """Train with a progress bar (step, reward, KL, samples/s: rich, so also in a notebook), calling
    every callback's `on_step` and `on_eval`; returns the summary. `softrl train` and `softrl.train`."""
    from rich.console import Console
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                               TimeRemainingColumn)

    from softrl.runtime import runtime_for

    console = console or Console(stderr=True)
    callbacks = list(callbacks or [])
    columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
               TimeElapsedColumn(), TimeRemainingColumn()]
    lines = ProgressLines(console, enabled=not quiet and not console.is_terminal)
    # off a terminal the lines say the progress, and a bar would leave an empty line before an error's
    with Progress(*columns, console=console, transient=True, disable=quiet or not console.is_terminal) as bar:
        job = bar.add_task("setup", total=config.optim.steps, info="")

        def on_phase(name: str, done: int, total: int) -> None:
            bar.update(job, description=name, completed=done, total=total, info="")
            lines.say(name, done, total)

        def on_step(r: dict) -> None:
            info = (f"reward {r.get('online_pass_rate', float('nan')):.3f}  KL {r.get('kl_ref', float('nan')):.3f}  "
                    f"{r['samples_per_s']:.1f} samples/s")
            bar.update(job, description="train", completed=r["step"], total=config.optim.steps, info=info)
            lines.say("train", r["step"], config.optim.steps, info)
            for c in callbacks:
                getattr(c, "on_step", lambda m: None)(r)

        def on_eval(r: dict) -> None:
            for c in callbacks:
                getattr(c, "on_eval", lambda m: None)(r)

        log = (lambda m: None) if quiet else (lambda m: console.print(m, highlight=False, soft_wrap=True))
        return runtime_for(config).train(config, resume=resume, on_step=on_step, on_phase=on_phase, log=log,
                                         on_eval=on_eval, tasks=tasks)


def train(config: RunConfig | dict | str | Path | None = None, *, dataset: Any = None, reward: Any = None,
          eval_dataset: Any = None, offline: Any = None, callbacks: list | None = None, resume: bool = False,
          progress: bool = True) -> Run:
    """Train a policy and return the finished `Run`.

    `config`: a RunConfig, a dict with the YAML's keys, or a YAML path. `dataset`: records with
    `prompt` (a string or chat messages) or `messages`, and any other fields: a list of dicts, a
    `datasets.Dataset`, a path `read_records` takes, or `hf:DATASET[:CONFIG][:SPLIT]`; with `reward`,
    one function or a list (`f` or `(f, weight)`; unweighted ones share what the given weights leave
    of 1), each per-sample `f(prompt, completion, **fields)` or batched, TRL's form, when a parameter
    is named `completions` (called by keyword: `f(completions=..., prompts=..., **fields) -> list`).
    Without them, `config.task` says the task; `model.path` must then name the model to train.
    `eval_dataset`: held-out records (else the dataset's own prompts are evaluated). `offline`:
    trajectories to learn from besides the online samples, records `{prompt, completion, reward}` in
    any form `dataset` takes, or the name of a source already in the store; they join
    `data.offline_sources`, drawn by `data.mix`'s offline share. `callbacks`: objects with
    `on_step(metrics)` and/or `on_eval(result)` (see `Callback`).

    Ctrl-C (SIGINT) or SIGTERM while it trains stops the run after the step in progress and writes
    a checkpoint of that step (a second Ctrl-C, or one during loading, Q0 or an evaluation, stops at
    once: the newest complete checkpoint stays); then `softrl.runtime.stop.RunStopped` is raised, a
    KeyboardInterrupt whose one line names the step and its checkpoint (`.step`, `.run_dir`,
    `.exit_status`), and the same call with `resume=True` continues. A full disk raises
    `softrl.runtime.faults.DiskFullError` (an OSError, errno ENOSPC) naming what was being written;
    earlier checkpoints and store rows are intact, and `resume=True` continues once there is space. A
    run directory that another process is training in (its `.lock`) is refused with
    `softrl.runtime.faults.RunInUseError` (a ConfigError) naming that process's PID."""
    from rich.console import Console

    from softrl.runtime.group import torchrun_rank
    from softrl.runtime.runlog import check_run_dir

    console = Console(stderr=True)
    cfg = run_config(config)
    tasks = _tasks(cfg, dataset, reward, eval_dataset)
    if tasks is not None and cfg.runtime.kind == "ray":  # refused before the store is written
        from softrl.runtime.ray_runtime import PYTHON_TASKS_REFUSED

        raise ConfigError(PYTHON_TASKS_REFUSED)
    check_run_dir(cfg, resume)  # before the store is written: a run that cannot start imports nothing
    if offline is not None:
        from softrl.assemble import load_tasks

        log = (lambda m: None) if not progress else (lambda m: console.print(m, highlight=False))
        importing = not resume and torchrun_rank() in (None, 0)  # once, by rank 0 of a new run
        cfg = _import_offline(cfg, offline, (tasks[0] if tasks else load_tasks(cfg)[0]) if importing else None, log)
    from softrl.runtime.stop import RunStopped

    try:
        summary = run_with_progress(cfg, resume, tasks, callbacks, quiet=not progress, console=console)
    except RunStopped as e:  # raised from here: a traceback of one frame under the caller's, not the runtime's
        raise e.with_traceback(None) from None
    return Run(Path(summary["run_dir"]), Path(summary["run_dir"]) / "final", summary, cfg)


def evaluate(model: str | Path, *, dataset: Any = None, reward: Any = None, task: str | None = None,
             size: int = 100, task_seed: int = 1, options: dict | None = None, samples: int = 20,
             temperature: float = 0.4, top_p: float = 0.95, max_new_tokens: int = 0,
             reference: str | Path | None = None, seed: int = 0, device: str = "auto",
             dtype: str = "float32", reward_range: tuple[float, float] | None = None, max_turns: int = 3) -> dict:
    """The evaluation protocol of `softrl eval` (pass@1 and pass@10, unbiased; per-sample success;
    distinct correct answers; token entropy; KL to `reference` when given) of `model` (a directory,
    a hub id, or 'bootstrap:TASK') on `dataset` graded by `reward`, or on a task spec `task` (`size`
    prompts from `task_seed` where it generates them: by default the held-out split `softrl train`
    evaluates on; `options` its keyword options). `reward_range` as the config's task.reward_range. A
    multi-turn task (tinycode-feedback) is evaluated in episodes of up to `max_turns` policy turns."""
    from softrl.assemble import model_directory, task_model
    from softrl.rollout import EpisodeLimits
    from softrl.eval.protocol import evaluate as protocol
    from softrl.models.loading import load_causal_lm

    if (dataset is None) == (task is None) or (dataset is None) != (reward is None):
        raise ConfigError("give dataset= and reward=, or task= (a task spec such as countdown)")
    if not (temperature > 0 and 0 < top_p <= 1 and samples >= 1):
        raise ConfigError(f"temperature must be > 0, top_p in (0, 1] and samples >= 1, got {temperature}, "
                          f"{top_p}, {samples}")
    if reward_range is not None:
        reward_range = run_config({"task": {"reward_range": reward_range}}).task.reward_range  # checked as in a config
    graded = reward_task(dataset, reward, reward_range=reward_range) if dataset is not None else task
    s = task_model(graded, str(model), size=size or None,
                   seed=task_seed, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, source="eval",
                   dtype=dtype, options=options, device=device)
    ref = None
    if reference is not None:
        ref = load_causal_lm(model_directory(str(reference), s.task.name), dtype)[0].to(s.model.device)
    result = protocol(s.spec, s.task.prompts(), s.encode_prompt, samples, temperature, top_p, seed, stats=True,
                      reference=ref, env=s.task.make_environment(), limits=EpisodeLimits(max_turns=max_turns))
    return {**result, "task": s.task.name, "model": s.model_id}
