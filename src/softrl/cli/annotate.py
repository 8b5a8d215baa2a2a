"""`softrl q0` and `softrl pts`: SPO's annotations of prompts and trajectories from reference samples (Q0
from new samples or from samples already stored; `softrl data q0` is the older spelling of the latter)."""

from __future__ import annotations

import json
import math

import typer

from softrl.cli.common import (DEVICE_OPT, JSON_OPT, SEED_OPT, STORE_OPT, TASK_OPTION_OPT, err, fail, one_line_errors,
                               open_store, progress_bar, store_errors, task_options)
from softrl.limits import MAX_PROMPTS, MAX_SEED


def reference_model(task: str, model: str, size: int, seed: int, max_new_tokens: int, temperature: float,
                    source: str, dtype: str, device: str = "auto", options: list[str] | None = None):
    """`assemble.task_model` for the command line: 0 means the task's default; errors as one line."""
    from softrl.assemble import task_model
    from softrl.config import ConfigError
    from softrl.models.loading import ModelLoadError

    try:
        with err.status(f"loading {model} for {task}" + (" (built on first use: softrl bootstrap)"
                                                          if model == "bootstrap" else "")):
            return task_model(task, model, size=size or None, seed=seed or None, max_new_tokens=max_new_tokens,
                           temperature=temperature, source=source, dtype=dtype, device=device,
                           options=task_options(options))
    except (ConfigError, ModelLoadError, ValueError, OSError) as e:
        fail(str(e))


MODEL_OPT = typer.Option("bootstrap", "--model", help="reference model directory; 'bootstrap' = the task's built-in one")
SIZE_OPT = typer.Option(0, "--size", min=0, max=MAX_PROMPTS, help="number of prompts of the task; 0 = its default")
TASK_SEED_OPT = typer.Option(0, "--task-seed", min=0, max=MAX_SEED, help="seed of the task's problems; 0 = its default")
TOKENS_OPT = typer.Option(0, "--max-new-tokens", min=0, help="0 = the task's default")
DTYPE_OPT = typer.Option("float32", "--dtype", help="float32 or bfloat16")


SOURCE_OPT = typer.Option("reference", "--source", help="--from-store: the rows whose rewards make Q0 (every row "
                          "of it counts: give each model's samples their own source)")
MIN_K_OPT = typer.Option(1, "--min-k", min=1, help="--from-store: leave out prompts with fewer samples than this")
FORCE_OPT = typer.Option(False, "--force", help="--from-store: replace the Q0 that prompts have from another model")
RAY_OPT = typer.Option(False, "--ray", help="--from-store: read and group on Ray Data: the cluster of RAY_ADDRESS, "
                                            "else a local Ray (a store beyond one machine)")
STORED_MODEL_OPT = typer.Option(None, "--model", help="the model the samples came from, as runs name it (a directory "
                                "or hub id), so that its runs reuse this Q0; default store:SOURCE")
# the options of each way to make Q0, by parameter name: one given with the other way is refused
SAMPLING_ONLY = ("k", "size", "task_seed", "max_new_tokens", "temperature", "seed", "dtype", "device", "task_option")
STORED_ONLY = ("source", "min_k", "force", "on_ray")


def checked_beta(beta: float | None) -> float:
    """--beta as given (not given: the SPO paper's 1/ln(1e5)); 0 or less is refused, not read as the default."""
    from softrl.algorithms.common import SPO_BETA

    if beta is None:
        return SPO_BETA
    if not math.isfinite(beta) or beta <= 0:
        fail(f"--beta must be a positive number, got {beta:g}")
    return beta


def given(ctx: typer.Context, names: tuple[str, ...]) -> list[str]:
    """The options among `names` that the command line gave (not left at their defaults), as spelled there."""
    flags = {p.name: p.opts[0] for p in ctx.command.params}
    # by name: typer carries its own copy of click, whose ParameterSource is not click's
    return [flags[n] for n in names if getattr(ctx.get_parameter_source(n), "name", "DEFAULT") != "DEFAULT"]


def q0(
    ctx: typer.Context,
    task: str = typer.Argument(None, help="task spec to sample, e.g. countdown (none with --from-store)"),
    from_store: bool = typer.Option(False, "--from-store", help="no sampling: Q0 from the samples of --source "
                                    "already in the store (e.g. imported from another sampler)"),
    k: int = typer.Option(800, "--k", min=1, help="reference samples per prompt (the SPO paper: 800)"),
    beta: float = typer.Option(None, "--beta", help="beta of the stored q0_hat (default 1/ln(1e5); runs at any beta use the stored rewards)"),
    model: str = typer.Option(None, "--model", help="sampling: the reference model directory, 'bootstrap' (the default) "
                              "= the task's built-in one; --from-store: the model the samples came from, as runs name "
                              "it, so its runs reuse this Q0 (default store:SOURCE)"),
    size: int = SIZE_OPT, task_seed: int = TASK_SEED_OPT, max_new_tokens: int = TOKENS_OPT,
    temperature: float = typer.Option(1.0, help="sampling temperature of the reference"),
    seed: int = SEED_OPT, dtype: str = DTYPE_OPT, device: str = DEVICE_OPT,
    source: str = SOURCE_OPT, min_k: int = MIN_K_OPT, force: bool = FORCE_OPT, on_ray: bool = RAY_OPT,
    store: str = STORE_OPT, as_json: bool = JSON_OPT, task_option: list[str] = TASK_OPTION_OPT,
) -> None:
    """Q0_hat of every prompt: from K new reference samples of TASK, kept in the store (source=reference;
    resumable), or, with --from-store, from samples the store holds already."""
    if from_store:
        if task is not None:
            fail(f"give TASK (to sample it) or --from-store (to use stored samples), not both (TASK: {task!r})")
        if given(ctx, SAMPLING_ONLY):
            fail(f"{', '.join(given(ctx, SAMPLING_ONLY))}: only when sampling a TASK, not with --from-store")
        stored_q0(model, source, force, beta, min_k, store, as_json, on_ray)
        return
    if task is None:
        fail("give TASK to sample (e.g. softrl q0 countdown), or --from-store to use samples already stored")
    if given(ctx, STORED_ONLY):
        fail(f"{', '.join(given(ctx, STORED_ONLY))}: only with --from-store")
    from softrl.annotate.q0 import binomial_stderr, estimate_q0

    beta, model = checked_beta(beta), model or "bootstrap"
    s = reference_model(task, model, size, task_seed, max_new_tokens, temperature, "reference", dtype, device,
                        task_option)
    target = open_store(store, writes=True)  # after every option is checked: a refused command leaves no store behind
    with progress_bar(f"q0 {task} (K={k})") as update, one_line_errors():
        rows = estimate_q0(s.spec, s.task.prompts(), s.encode_prompt, target, k, beta, s.model_id, seed=seed,
                           env=s.task.make_environment(),  # episodes, for a task that brings its environment
                           progress=lambda done, total: update(done, total),
                           log=lambda line: err.print(line, highlight=False, soft_wrap=True))
    success = [r["q0_success"] for r in rows.values()]
    summary = {"prompts": len(rows), "k": k, "beta": beta, "mean_success": sum(success) / max(len(success), 1),
               "solved_prompts": sum(s > 0 for s in success), "store": str(target.root),
               "mean_stderr": sum(binomial_stderr(s, k) for s in success) / max(len(success), 1)}
    typer.echo(json.dumps(summary) if as_json else
               f"Q0 of {summary['prompts']} prompts (K={k}): mean success {summary['mean_success']:.3f} "
               f"(+-{summary['mean_stderr']:.3f} per prompt), {summary['solved_prompts']} with a success; "
               f"samples in {target.root}")


def stored_q0(model: str = STORED_MODEL_OPT, source: str = SOURCE_OPT, force: bool = FORCE_OPT,
              beta: float = typer.Option(None, "--beta", help="beta of the stored q0_hat (default 1/ln(1e5))"),
              min_k: int = MIN_K_OPT, store: str = STORE_OPT, as_json: bool = JSON_OPT, on_ray: bool = RAY_OPT) -> None:
    """Q0 of every prompt from the samples of SOURCE already in the store (no sampling): the prompts table
    gets each prompt's Q0 and its rewards, as sampling leaves them. The same as `softrl q0 --from-store`,
    whose older spelling this is."""
    from softrl.annotate.q0 import Q0Conflict, store_q0_from_samples
    from softrl.assemble import model_folder, model_id

    beta = checked_beta(beta)
    target = open_store(store, create=False, writes=True)
    with store_errors():
        if on_ray:
            from softrl.data.distributed import rewards_on_ray

            rewards = rewards_on_ray(target, source)
        else:
            rewards = target.rewards_by_prompt(source)
        if not rewards.num_rows:
            fail(f"{target.root}: no trajectories of source {source!r}")
        tasks = set(rewards["task"].to_pylist())
        if model == "bootstrap" and len(tasks) != 1:
            fail(f"--model bootstrap: the rows are of {len(tasks)} tasks; name one: --model bootstrap:TASK")
        # the name runs keep Q0 under: a bootstrap alias's or prepared model's folder, in full
        label = model_id(model_folder(model, next(iter(tasks)) or "")) if model else f"store:{source}"
        try:
            rows = store_q0_from_samples(target, rewards, beta, label, min_k, force)
        except Q0Conflict as e:
            fail(str(e))
    samples = [r["q0_k"] for r in rows]
    summary = {"prompts": len(rows), "left_out": rewards.num_rows - len(rows), "samples": sum(samples),
               "min_k": min(samples, default=0), "max_k": max(samples, default=0), "beta": beta,
               "mean_success": sum(r["q0_success"] for r in rows) / max(len(rows), 1), "store": str(target.root)}
    if as_json:
        typer.echo(json.dumps(summary))
        return
    err.print(f"Q0 of {summary['prompts']} prompts from {summary['samples']} {source} samples "
              f"({summary['min_k']}-{summary['max_k']} a prompt), mean success {summary['mean_success']:.3f}"
              + (f"; {summary['left_out']} prompts with fewer than {min_k} left out" if summary["left_out"] else ""))


def pts(
    task: str = typer.Argument(..., help="task spec, e.g. countdown"),
    k: int = typer.Option(10, "--k", min=1, help="rollouts per visited prefix (the SPO paper: 10)"),
    threshold: float = typer.Option(0.2, "--threshold", help="split an interval when S jumps by at least this"),
    limit: int = typer.Option(None, "--limit", min=1, help="annotate at most this many trajectories"),
    show: int = typer.Option(5, "--show", min=0, help="print this many annotated responses with pivots marked"),
    force: bool = typer.Option(False, "--force", help="annotate again trajectories that have MC targets"),
    source: list[str] = typer.Option(None, "--source", help="only trajectories of these sources (repeatable)"),
    model: str = MODEL_OPT, size: int = SIZE_OPT, task_seed: int = TASK_SEED_OPT, max_new_tokens: int = TOKENS_OPT,
    seed: int = SEED_OPT, dtype: str = DTYPE_OPT, device: str = DEVICE_OPT,
    store: str = STORE_OPT, as_json: bool = JSON_OPT, task_option: list[str] = TASK_OPTION_OPT,
) -> None:
    """Pivotal Token Search over the store's passed trajectories: MC targets, rollouts, pivotal tokens."""
    from softrl.annotate.pts import annotate_store, render

    if not 0 < threshold <= 1:
        fail(f"--threshold must be in (0, 1], got {threshold}")
    target = open_store(store, create=False, writes=True)
    with store_errors():
        present = set(target.stats()["sources"])
    for missing in sorted(set(source or []) - present):
        err.print(f"warning: the store {target.root} has no trajectories of source {missing!r} "
                  f"(it has: {', '.join(sorted(present)) or 'none'})", highlight=False, soft_wrap=True)
    s = reference_model(task, model, size, task_seed, max_new_tokens, 1.0, "pts", dtype, device, task_option)
    with progress_bar(f"pts {task} (K={k})") as update, one_line_errors():
        results = annotate_store(s.spec, target, s.encode_prompt, s.encode_response, s.model_id, k, threshold, seed=seed,
                                 limit=limit, force=force, sources=source or None,
                                 progress=lambda done, total: update(done, total))
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


COMMANDS = {"q0": q0, "pts": pts}
GROUPS: dict[str, typer.Typer] = {}
ALIASES = {("data", "q0"): stored_q0}  # (group, name) -> command: an older spelling kept (cli/root.py)
