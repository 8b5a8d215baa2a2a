"""`softrl train`, `softrl demo`, `softrl plot` and `softrl eval`."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.table import Table

from softrl.cli.common import (DEVICE_OPT, JSON_OPT, SEED_OPT, TASK_OPTION_OPT, err, fail, one_line_errors,
                               out as stdout, task_options)
from softrl.limits import MAX_PROMPTS, MAX_SEED

# the demo's embedded defaults: SPO with the terminal Q-loss (the paper's main variant), half online
# and half offline (passed reference samples from Q0 estimation), on the countdown bootstrap model
DEMO = {
    "name": "demo", "out_dir": "runs",
    "task": {"name": "countdown", "size": 1000, "eval_size": 100},
    "q0": {"k": 32},
    "sampling": {"prompts_per_step": 16, "samples_per_prompt": 4},
    "data": {"mix": {"online": 0.5, "offline": 0.5}, "store": "runs/store",
             "objective": {"algorithm": "spo", "terminal": 1.0, "loss": "bce"}},
    "optim": {"steps": 300, "lr": 1e-4, "warmup_steps": 10},
    "eval": {"samples": 20, "temperature": 0.4, "top_p": 0.95, "every": 100},
    "log": {"checkpoint_every": 50},
}


def run_training(config, resume: bool, quiet: bool = False, again: list[str] | None = None) -> dict:
    """Train with a progress bar (step, reward, KL, samples/s); errors as one line. SIGINT (Ctrl-C)
    or SIGTERM stop the run after the step in progress (a second one at once) with one line saying
    the step and how to continue (`again`: the `softrl train` arguments that resume it; by default
    the run directory's config.yaml), exit status 130 or 143; a full disk is one line, status 1."""
    import os
    import shlex

    from softrl.api import run_with_progress
    from softrl.cli.common import DEBUG_ENV
    from softrl.runtime.faults import DiskFullError
    from softrl.runtime.stop import RunStopped

    try:
        with one_line_errors():
            return run_with_progress(config, resume, quiet=quiet, console=err)
    except RunStopped as e:
        import signal

        for sig in (signal.SIGINT, signal.SIGTERM):  # a further Ctrl-C while exiting would end it in a traceback
            signal.signal(sig, signal.SIG_IGN)
        args = again if again is not None else [str(config.run_dir / "config.yaml")]
        typer.echo(e.line(shlex.join(["softrl", "train", *args, "--resume"])), err=True)
        raise typer.Exit(e.exit_status) from None
    except DiskFullError as e:
        if os.environ.get(DEBUG_ENV, "") not in ("", "0"):
            raise
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from None


def train_command(
    args: list[str] = typer.Argument(None, help="[CONFIG.yaml] [key=value ...], e.g. run.yaml optim.lr=3e-4"),
    resume: bool = typer.Option(False, "--resume", help="continue the run from its newest checkpoint"),
    as_json: bool = JSON_OPT,
) -> None:
    """Train a policy from a YAML config (and key=value overrides)."""
    from softrl.config import ConfigError, load_config

    args = list(args or [])
    given = list(args)
    path = args.pop(0) if args and "=" not in args[0] else None
    try:
        config = load_config(path, args)
    except ConfigError as e:
        fail(str(e))
    summary = run_training(config, resume, again=given)
    typer.echo(json.dumps(summary) if as_json else f"run directory: {summary['run_dir']}")


def demo(
    steps: int = typer.Option(DEMO["optim"]["steps"], min=1, help="learner steps"),
    seed: int = typer.Option(0, min=0, max=MAX_SEED, help="seed of sampling and batches"),
    mode: str = typer.Option("sync", help="local runtime mode: sync or async"),
    out: Path = typer.Option(Path("runs"), help="parent of the run directory"),
    device: str = DEVICE_OPT,
    as_json: bool = typer.Option(False, "--json", help="print pass@1/pass@10 before and after as JSON"),
) -> None:
    """The main job on embedded defaults: countdown reference, Q0, SPO half online / half offline, pass@k before and after."""
    from softrl.config import ConfigError, load_config

    name = f"demo-s{seed}-{mode}"
    overrides = [f"optim.steps={steps}", f"seed={seed}", f"runtime.mode={mode}", f"out_dir={out}", f"name={name}",
                 f"data.store={out / 'store'}", f"model.device={device}"]
    try:
        config = load_config(None, overrides, base=DEMO)
    except ConfigError as e:
        fail(str(e))
    run_dir = config.run_dir
    if run_dir.exists():  # a demo starts over; the store (and its Q0 samples) is kept
        import shutil

        from softrl.runtime.faults import check_not_in_use

        try:
            check_not_in_use(run_dir)  # not under a demo of the same name still training
        except ConfigError as e:
            fail(str(e))
        shutil.rmtree(run_dir)
    summary = run_training(config, resume=False, quiet=as_json)
    if as_json:
        typer.echo(json.dumps({k: summary[k] for k in ("pass@1_before", "pass@10_before", "pass@1_after",
                                                       "pass@10_after", "run_dir", "steps", "samples", "seconds")}))
        return
    table = Table(title=f"SPO on countdown ({summary['steps']} steps, {summary['samples']} online samples, "
                        f"{summary['seconds']:.0f} s)")
    for col in ("", "pass@1", "pass@10"):
        table.add_column(col, justify="right" if col else "left")
    table.add_row("reference (before)", f"{summary['pass@1_before']:.3f}", f"{summary['pass@10_before']:.3f}")
    table.add_row("SPO (after)", f"{summary['pass@1_after']:.3f}", f"{summary['pass@10_after']:.3f}")
    stdout.print(table)
    typer.echo(f"run directory: {summary['run_dir']}\nplot: {summary['plots'][0]}")


def plot(run_dir: Path = typer.Argument(..., help="a run directory (holds metrics.jsonl)")) -> None:
    """Draw reward, pass@k, KL and loss against steps to RUN_DIR/training.png."""
    from softrl.plots import plot_run

    try:
        paths = plot_run(run_dir)
    except FileNotFoundError as e:
        fail(str(e))
    for p in paths:
        typer.echo(str(p))


def eval_command(
    model: str = typer.Option(..., "--model", help="model directory (or 'bootstrap' for the task's reference)"),
    task: str = typer.Option("countdown", "--task", help="task spec"),
    size: int = typer.Option(100, "--size", min=0, max=MAX_PROMPTS, help="prompts (built-in tasks; 0 = the task's default)"),
    task_seed: int = typer.Option(1, "--task-seed", min=0, max=MAX_SEED,
                                  help="seed of the prompts (1: the held-out split softrl train evaluates on)"),
    samples: int = typer.Option(20, "--samples", min=1, help="samples per prompt (SPO's protocol: 20)"),
    temperature: float = typer.Option(0.4, "--temperature", min=0.0, help="SPO's protocol: 0.4"),
    top_p: float = typer.Option(0.95, "--top-p", help="SPO's protocol: 0.95"),
    reference: str = typer.Option(None, "--reference", help="reference model directory, for KL(pi || pi0)"),
    max_new_tokens: int = typer.Option(0, "--max-new-tokens", min=0, help="0 = the task's default"),
    seed: int = SEED_OPT,
    dtype: str = typer.Option("float32", "--dtype"),
    device: str = DEVICE_OPT,
    as_json: bool = JSON_OPT,
    task_option: list[str] = TASK_OPTION_OPT,
) -> None:
    """pass@1 and pass@10 (unbiased), per-sample success, distinct correct answers, token entropy, KL to a reference."""
    from softrl.api import evaluate

    if temperature <= 0 or not 0 < top_p <= 1:
        fail(f"--temperature must be > 0 and --top-p in (0, 1], got {temperature} and {top_p}")
    options = task_options(task_option)
    with err.status(f"evaluating {model} on {task}: {samples} samples per prompt"), one_line_errors():
        result = {**evaluate(model, task=task, size=size, task_seed=task_seed, options=options, samples=samples,
                             temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens, reference=reference,
                             seed=seed, device=device, dtype=dtype), "task": task, "model": model}
    if as_json:
        typer.echo(json.dumps(result))
        return
    table = Table(title=f"{model} on {task}: {result['problems']} prompts x {samples} samples, T={temperature}, top-p={top_p}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, value in result.items():
        if isinstance(value, float):
            table.add_row(key, f"{value:.4f}")
    stdout.print(table)


COMMANDS = {"train": train_command, "demo": demo, "plot": plot, "eval": eval_command}
GROUPS: dict[str, typer.Typer] = {}
