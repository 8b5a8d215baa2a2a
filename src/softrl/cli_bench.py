"""`softrl bench learning` and `softrl bench systems`."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from softrl.bench.learning import METHODS
from softrl.cli_common import err, fail

bench_app = typer.Typer(no_args_is_help=True, help="Benchmarks: learning (the papers' claims) and systems (speed, memory).")


def _csv(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


@bench_app.command("learning")
def learning(
    task: str = typer.Option("countdown", help="built-in task: countdown or tinycode"),
    methods: str = typer.Option(",".join(METHODS), help="comma-separated methods"),
    seeds: int = typer.Option(3, min=1, help="seeds 0..N-1"),
    steps: int = typer.Option(200, min=1, help="learner steps of every run"),
    lr: float = typer.Option(1e-4, min=0.0, help="learning rate of every method"),
    prompts: int = typer.Option(16, min=1, help="prompts per step (x samples per prompt = the batch)"),
    eval_size: int = typer.Option(100, min=1, help="held-out prompts per evaluation"),
    eval_every: int = typer.Option(25, min=1, help="learner steps between evaluations"),
    runs: Path = typer.Option(Path("runs/bench"), help="where the runs (and their store) go; finished runs are reused"),
    report: Path = typer.Option(Path("runs/bench/report"), help="where the table, JSON and PNG go"),
    as_json: bool = typer.Option(False, "--json", help="print the claims as JSON"),
) -> None:
    """Every method from the same reference at equal batch and budget, N seeds: curves, table, claims."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from softrl.bench.learning import aggregate, check_claims, collect, method_config, run_all
    from softrl.bench.report import markdown, plot_learning
    from softrl.config import ConfigError

    chosen = _csv(methods)
    try:
        configs = [method_config(m, task, s, steps, runs, lr, prompts, eval_size=eval_size, eval_every=eval_every)
                   for s in range(seeds) for m in chosen]
    except (ValueError, ConfigError) as e:
        fail(str(e))
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err, transient=True) as bar:
        job = bar.add_task("setup", total=len(configs) * steps)

        def on_step(i: int, config, record: dict) -> None:
            bar.update(job, completed=i * steps + record["step"],
                       description=f"{config.name} ({i + 1}/{len(configs)})")

        run_all(configs, on_step)
    runs_by_method = collect(configs)
    agg, claims = aggregate(runs_by_method), check_claims(runs_by_method)
    report.mkdir(parents=True, exist_ok=True)
    table = markdown(agg, claims, seeds)
    (report / f"learning-{task}.md").write_text(table)
    (report / f"learning-{task}.json").write_text(json.dumps({"curves": agg, "claims": claims, "runs": runs_by_method},
                                                             indent=1, default=str))
    png = plot_learning(agg, report / f"learning-{task}.png",
                        f"{task}: {steps} steps x {prompts * 4} rows, lr {lr}, {seeds} seeds")
    if as_json:
        typer.echo(json.dumps(claims, default=str))
        return
    typer.echo(table)
    typer.echo(f"plot: {png}")
