"""What every `softrl` subcommand shares: one-line errors, the stdout and stderr consoles, progress bars,
and the options and store helpers several command groups use (the sampling seed, task options, the store).

A command's result (a table, a report, a path, with `--json` one JSON document) goes to stdout, through
`out` or `typer.echo`; messages, warnings and progress go to stderr, through `err`."""

from __future__ import annotations

import os
from contextlib import contextmanager

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from softrl.limits import MAX_SEED

out = Console()  # results: tables (plain text when stdout is not a terminal)
err = Console(stderr=True)  # messages and progress
JSON_OPT = typer.Option(False, "--json", help="print one JSON object")
DEVICE_OPT = typer.Option("auto", "--device", help="auto (CUDA when available), cpu, cuda or cuda:N")
BASE_OPT = typer.Option(None, "--base", help="YAML of settings over every run's (model, task options, ...); "
                                             "objective options merge into each method's objective")


def default_store() -> str:
    return os.environ.get("SOFTRL_STORE", "runs/store")


# a str, not a Path: a Path would fold s3://bucket into s3:/bucket
STORE_OPT = typer.Option(None, "--store", help="experience store: a directory or s3://bucket/prefix "
                                               "(default $SOFTRL_STORE or runs/store)")


DEBUG_ENV = "SOFTRL_DEBUG"


def one_line(error: BaseException) -> str:
    """An error that reached the command's boundary, as one line: a file-system error names its path
    and the OS's reason; anything else its type and message."""
    if isinstance(error, OSError) and error.strerror:
        where = f"{error.filename}" + (f" -> {error.filename2}" if error.filename2 else "")
        return f"{where}: {error.strerror}" if error.filename else error.strerror
    first = next((line.strip() for line in str(error).splitlines() if line.strip()), "")
    if isinstance(error, ValueError) and first:  # softrl's own ValueErrors are written for users
        return first
    return f"{type(error).__name__}: {first}" if first else type(error).__name__


def finite_floats(command) -> None:
    """Every option and argument of `command` and its subcommands refuses an inf or nan float (a
    range lets nan through: it compares false with either bound)."""
    import math

    def check(ctx, param, value):
        values = value if isinstance(value, (tuple, list)) else [value]
        if any(isinstance(v, float) and not math.isfinite(v) for v in values):
            raise typer.BadParameter(f"must be a finite number, got {value}")
        return value

    def chained(callback):
        if callback is None:
            return check
        return lambda ctx, param, value: callback(ctx, param, check(ctx, param, value))

    for param in command.params:
        param.callback = chained(param.callback)
    for sub in getattr(command, "commands", {}).values():
        finite_floats(sub)


def fail(message: str) -> None:
    """One unwrapped line on stderr, exit status 2 (with --debug, the error being handled, if any,
    with its traceback)."""
    import sys

    if os.environ.get(DEBUG_ENV, "") not in ("", "0") and sys.exc_info()[1] is not None:
        raise sys.exc_info()[1]
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


@contextmanager
def progress_bar(description: str, total: int | None = None):
    """A transient bar on stderr, or off a terminal (a log, a pipe) a timed line at each new description
    and about every 10 s within one; yields `update(done, total=None, description=None)`."""
    from softrl.api import ProgressLines

    lines = ProgressLines(err, enabled=not err.is_terminal)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TimeRemainingColumn(), console=err, transient=True, disable=not err.is_terminal) as bar:
        job = bar.add_task(description, total=total)

        def update(done: int, total: int | None = None, description: str | None = None) -> None:
            bar.update(job, completed=done, **({"total": total} if total is not None else {}),
                       **({"description": description} if description else {}))
            task = bar.tasks[0]
            lines.say(task.description, done, None if task.total is None else int(task.total))

        yield update


def run_errors() -> tuple[type[Exception], ...]:
    """What a run raises for bad input or data: reported as one line, not a traceback."""
    from softrl.config import ConfigError
    from softrl.data.store import StoreError
    from softrl.models.loading import ModelLoadError
    from softrl.network import NetworkError
    from softrl.runtime.group import LearnerGroupError
    from softrl.runtime.runlog import NonFiniteWeightsError
    from softrl.tasks.base import RewardError
    from softrl.training.learner import NonFiniteLossError

    return (ConfigError, ModelLoadError, StoreError, NonFiniteLossError, RewardError, LearnerGroupError,
            NonFiniteWeightsError, NetworkError)


@contextmanager
def one_line_errors():
    """Bad input or data met while working (a reward out of range, a store problem) ends the
    command with one line."""
    import torch

    from softrl.models.device import out_of_memory_advice

    try:
        yield
    except run_errors() as e:
        fail(str(e))
    except torch.OutOfMemoryError as e:
        fail(out_of_memory_advice(e))


# shared by the store's commands (data, annotate) and the task options of q0, pts and eval
SEED_OPT = typer.Option(0, "--seed", min=0, max=MAX_SEED, help="sampling seed")
TASK_OPTION_OPT = typer.Option(None, "--task-option", help="a task keyword option KEY=VALUE (repeatable), as "
                               "task.options in a config, e.g. prompts=prompts.jsonl for a module:function reward")


@contextmanager
def store_errors():
    """A store that cannot be opened, read or written (no server, credentials, format) as one line."""
    from softrl.data.store import StoreError

    try:
        yield
    except StoreError as e:
        fail(str(e))


def open_store(where: str | None, create: bool = True, writes: bool = False):
    """The store at `where` (the default store: None); one that the command `writes` to refused at once
    when a table is damaged (docs/DATA.md, "A damaged table"), before any work that would end in a write."""
    from softrl.data.store import ExperienceStore

    with store_errors():
        store = ExperienceStore(where or default_store(), create=create)
        if writes:
            store.check_intact()
        return store


def task_options(pairs: list[str] | None) -> dict:
    """`--task-option KEY=VALUE` pairs as the task's keyword options (each value read as YAML, as a
    config override's is)."""
    from softrl.config import ConfigError, parse_override

    options = {}
    for pair in pairs or []:
        try:
            _, options[pair.partition("=")[0].strip()] = parse_override(pair)
        except ConfigError as e:
            fail(f"--task-option {e}")
    return options
