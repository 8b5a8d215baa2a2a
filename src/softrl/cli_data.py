"""`softrl data ...`, `softrl q0` and `softrl pts`: the experience store and SPO's annotations."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.table import Table

from softrl.cli_common import JSON_OPT, STORE_OPT, default_store, err, fail, progress_bar

data_app = typer.Typer(no_args_is_help=True, help="The experience store: import, export, stats, dedupe.")


def open_store(path: Path | None, create: bool = True):
    from softrl.data.store import ExperienceStore, StoreError

    try:
        return ExperienceStore(path or default_store(), create=create)
    except StoreError as e:
        fail(str(e))


def report_problems(store) -> None:
    for problem in store.problems:
        err.print(f"[yellow]skipped[/yellow] {problem}", markup=True, highlight=False, soft_wrap=True)


@data_app.command("import")
def data_import(
    file: Path = typer.Argument(None, help="JSONL / JSON / Parquet of {prompt, response, reward} records, or an export"),
    source: str = typer.Option(None, "--source", help="source name for the rows, e.g. human or import:mydata"),
    solutions: str = typer.Option(None, "--solutions", help="instead of FILE: the known solutions of this task"),
    task: str = typer.Option("", "--task", help="task name recorded for records that name none"),
    store: Path = STORE_OPT,
) -> None:
    """Add trajectories to the store (all or nothing: a bad record writes nothing)."""
    from softrl.data.io import read_trajectories, task_solutions
    from softrl.tasks.records import RecordError
    from softrl.tasks.registry import load_task

    if (file is None) == (solutions is None):
        fail("give either FILE or --solutions TASK")
    try:
        if solutions is not None:
            rows = task_solutions(load_task(solutions), source or "human")
        else:
            rows = read_trajectories(file, source, task)
    except (RecordError, ValueError, OSError) as e:
        fail(str(e))
    target = open_store(store)
    written = target.append(rows)
    err.print(f"imported {written} trajectories ({len(rows) - written} repeated within the input) into {target.root}")


@data_app.command("export")
def data_export(
    out: Path = typer.Argument(..., help="output file: .parquet, .jsonl or .jsonl.gz"),
    source: list[str] = typer.Option(None, "--source", help="only these sources (repeatable)"),
    task: list[str] = typer.Option(None, "--task", help="only these tasks (repeatable)"),
    passed: bool = typer.Option(None, "--passed/--failed", help="only passed (or only failed) trajectories"),
    store: Path = STORE_OPT,
) -> None:
    """Write the store's trajectories (deduplicated, MC targets joined) to a file."""
    from softrl.data.io import export

    target = open_store(store, create=False)
    table = target.trajectories(source=source or None, task=task or None, passed=passed)
    report_problems(target)
    try:
        n = export(table, out)
    except (ValueError, OSError) as e:
        fail(str(e))
    err.print(f"exported {n} trajectories to {out}")


@data_app.command("stats")
def data_stats(store: Path = STORE_OPT, as_json: bool = JSON_OPT) -> None:
    """Trajectories, prompts and pass rate per source."""
    target = open_store(store, create=False)
    stats = target.stats()
    if as_json:
        typer.echo(json.dumps(stats))
        return
    report_problems(target)
    table = Table(title=f"{target.root}: {stats['trajectories']} trajectories, {stats['prompts']} prompts "
                        f"({stats['prompts_with_q0']} with Q0), {stats['duplicates']} duplicate rows")
    for column in ("source", "trajectories", "prompts", "pass rate", "mean reward", "with MC targets"):
        table.add_column(column, justify="left" if column == "source" else "right")
    for source, s in stats["sources"].items():
        table.add_row(source, str(s["trajectories"]), str(s["prompts"]), f"{s['pass_rate']:.3f}",
                      f"{s['mean_reward']:.3f}", str(s["with_mc_targets"]))
    err.print(table)


@data_app.command("dedupe")
def data_dedupe(store: Path = STORE_OPT) -> None:
    """Rewrite the store's trajectories without duplicate rows (annotations folded in)."""
    target = open_store(store, create=False)
    before, after = target.dedupe()
    report_problems(target)
    err.print(f"{before} rows -> {after} trajectories ({before - after} duplicates removed)")


def reference_spec(task_spec: str, model: str, size: int, seed: int, max_new_tokens: int, temperature: float,
                   source: str, dtype: str):
    """(task, RolloutSpec, encode_prompt, encode_response, model id) for sampling the reference policy."""
    from softrl.models.bootstrap import MAX_NEW_TOKENS, TASKS, bootstrap
    from softrl.models.loading import ModelLoadError, encode_prompt, encode_response, load_causal_lm
    from softrl.rollout import RolloutSpec
    from softrl.tasks.registry import load_task

    try:
        task = load_task(task_spec, **({"size": size} if size else {}), **({"seed": seed} if seed else {}))
        if model == "bootstrap":
            if task_spec not in TASKS:
                fail(f"no bootstrap model for task {task_spec!r}: pass --model DIR")
            with err.status(f"finding or building the {task_spec} reference model (softrl bootstrap {task_spec})"):
                model = str(bootstrap(task_spec))
        lm, tokenizer = load_causal_lm(model, dtype)
    except (ModelLoadError, ValueError, OSError) as e:
        fail(str(e))
    spec = RolloutSpec.for_model(task, lm, tokenizer, max_new_tokens or MAX_NEW_TOKENS.get(task_spec, 256),
                                 temperature=temperature, source=source)
    return (task, spec, (lambda text: encode_prompt(tokenizer, text)), (lambda text: encode_response(tokenizer, text)),
            str(Path(model).resolve()))


MODEL_OPT = typer.Option("bootstrap", "--model", help="reference model directory; 'bootstrap' = the task's built-in one")
SIZE_OPT = typer.Option(0, "--size", min=0, help="number of prompts of the task; 0 = its default")
TASK_SEED_OPT = typer.Option(0, "--task-seed", help="seed of the task's problems; 0 = its default")
TOKENS_OPT = typer.Option(0, "--max-new-tokens", min=0, help="0 = the task's default")
DTYPE_OPT = typer.Option("float32", "--dtype", help="float32 or bfloat16")


def q0(
    task: str = typer.Argument(..., help="task spec, e.g. countdown"),
    k: int = typer.Option(800, "--k", min=1, help="reference samples per prompt (the SPO paper: 800)"),
    beta: float = typer.Option(0.0, "--beta", help="SPO beta for q0_hat; 0 = 1/ln(1e5) (q0_success allows any later)"),
    model: str = MODEL_OPT, size: int = SIZE_OPT, task_seed: int = TASK_SEED_OPT, max_new_tokens: int = TOKENS_OPT,
    temperature: float = typer.Option(1.0, help="sampling temperature of the reference"),
    seed: int = typer.Option(0, help="sampling seed"), dtype: str = DTYPE_OPT,
    store: Path = STORE_OPT, as_json: bool = JSON_OPT,
) -> None:
    """Estimate Q0_hat of every prompt from K reference samples; keep the samples (source=reference). Resumable."""
    import math

    from softrl.annotate.q0 import binomial_stderr, estimate_q0
    from softrl.algorithms.common import SPO_BETA

    beta = beta or SPO_BETA
    if not math.isfinite(beta) or beta <= 0:
        fail(f"--beta must be a positive number, got {beta}")
    target = open_store(store)
    task_obj, spec, encode, _, model_id = reference_spec(task, model, size, task_seed, max_new_tokens, temperature,
                                                         "reference", dtype)
    with progress_bar(f"q0 {task} (K={k})") as update:
        rows = estimate_q0(spec, task_obj.prompts(), encode, target, k, beta, model_id, seed=seed,
                           progress=lambda done, total: update(done, total))
    success = [r["q0_success"] for r in rows.values()]
    summary = {"prompts": len(rows), "k": k, "beta": beta, "mean_success": sum(success) / max(len(success), 1),
               "solved_prompts": sum(s > 0 for s in success), "store": str(target.root),
               "mean_stderr": sum(binomial_stderr(s, k) for s in success) / max(len(success), 1)}
    typer.echo(json.dumps(summary) if as_json else
               f"Q0 of {summary['prompts']} prompts (K={k}): mean success {summary['mean_success']:.3f} "
               f"(+-{summary['mean_stderr']:.3f} per prompt), {summary['solved_prompts']} with a success; "
               f"samples in {target.root}")


def pts(
    task: str = typer.Argument(..., help="task spec, e.g. countdown"),
    k: int = typer.Option(10, "--k", min=1, help="rollouts per visited prefix (the SPO paper: 10)"),
    threshold: float = typer.Option(0.2, "--threshold", help="split an interval when S jumps by at least this"),
    limit: int = typer.Option(None, "--limit", min=1, help="annotate at most this many trajectories"),
    show: int = typer.Option(5, "--show", min=0, help="print this many annotated responses with pivots marked"),
    force: bool = typer.Option(False, "--force", help="annotate again trajectories that have MC targets"),
    source: list[str] = typer.Option(None, "--source", help="only trajectories of these sources (repeatable)"),
    model: str = MODEL_OPT, size: int = SIZE_OPT, task_seed: int = TASK_SEED_OPT, max_new_tokens: int = TOKENS_OPT,
    seed: int = typer.Option(0, help="sampling seed"), dtype: str = DTYPE_OPT,
    store: Path = STORE_OPT, as_json: bool = JSON_OPT,
) -> None:
    """Pivotal Token Search over the store's passed trajectories: MC targets, rollouts, pivotal tokens."""
    from softrl.annotate.pts import annotate_store, render

    if not 0 < threshold <= 1:
        fail(f"--threshold must be in (0, 1], got {threshold}")
    target = open_store(store, create=False)
    _, spec, encode_prompt, encode_response, model_id = reference_spec(task, model, size, task_seed, max_new_tokens,
                                                                       1.0, "pts", dtype)
    with progress_bar(f"pts {task} (K={k})") as update:
        results = annotate_store(spec, target, encode_prompt, encode_response, model_id, k, threshold, seed=seed,
                                 limit=limit, force=force, sources=source or None,
                                 progress=lambda done, total: update(done, total))
    report_problems(target)
    summary = {"annotated": len(results), "pivotal_tokens": sum(len(r.pivots) for r in results),
               "rollouts": sum(len(r.rollouts) for r in results),
               "mean_prefixes_evaluated": sum(r.evaluated for r in results) / max(len(results), 1)}
    if as_json:
        typer.echo(json.dumps({**summary, "results": [
            {"trajectory_id": r.trajectory_id, "prompt_id": r.prompt_id, "mc_targets": r.mc_targets,
             "pivots": [vars(p) for p in r.pivots]} for r in results]}))
        return
    for result in results[:show]:
        typer.echo(render(result) + "\n")
    typer.echo(f"annotated {summary['annotated']} trajectories: {summary['pivotal_tokens']} pivotal tokens, "
               f"{summary['rollouts']} rollouts stored, {summary['mean_prefixes_evaluated']:.1f} prefixes evaluated each")
