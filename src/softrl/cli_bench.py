"""`softrl bench learning`, `softrl bench anydata`, `softrl bench study` and `softrl bench systems`."""

from __future__ import annotations

import json
import time
from itertools import accumulate
from pathlib import Path

import typer

from softrl.bench.learning import METHODS
from softrl.cli_common import BASE_OPT, DEVICE_OPT, err, fail, one_line_errors, progress_bar

bench_app = typer.Typer(no_args_is_help=True, help="Benchmarks: learning (the papers' claims), anydata (stale, mixed and fixed data) and systems (speed, memory).")


# the options both learning benchmarks take
TASK_OPT = typer.Option("countdown", help="built-in task: countdown, tinycode or tinycode-loops")
SEEDS_OPT = typer.Option(3, min=1, help="seeds 0..N-1")
LR_OPT = typer.Option(1e-4, min=0.0, help="learning rate of every method")
PROMPTS_OPT = typer.Option(16, min=1, help="prompts per step (x samples per prompt = the batch)")
EVAL_SIZE_OPT = typer.Option(100, min=1, help="held-out prompts per evaluation")
EVAL_EVERY_OPT = typer.Option(25, min=1, help="learner steps between evaluations")


def _csv(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def _choices(option: str, noun: str, text: str, allowed, at_least_one: bool = False) -> list[str]:
    """`text`'s comma-separated names, each one of `allowed`; else one line naming the first bad one."""
    names = _csv(text)
    bad = sorted(set(names) - set(allowed)) or ([""] if at_least_one and not names else [])
    if bad:
        fail(f"{option}: unknown {noun} {bad[0]!r} (use {', '.join(allowed)})")
    return names


@bench_app.command("learning")
def learning(
    task: str = TASK_OPT,
    methods: str = typer.Option(",".join(METHODS), help="comma-separated methods"),
    seeds: int = SEEDS_OPT,
    steps: int = typer.Option(200, min=1, help="learner steps of every run"),
    lr: float = LR_OPT,
    prompts: int = PROMPTS_OPT,
    eval_size: int = EVAL_SIZE_OPT,
    eval_every: int = EVAL_EVERY_OPT,
    base: Path = BASE_OPT,
    runs: Path = typer.Option(Path("runs/bench"), help="where the runs (and their store) go; finished runs are reused"),
    report: Path = typer.Option(Path("runs/bench/report"), help="where the table, JSON and PNG go"),
    as_json: bool = typer.Option(False, "--json", help="print the claims as JSON"),
) -> None:
    """Every method from the same reference at equal batch and budget, N seeds: curves, table, claims."""
    from softrl.bench.learning import aggregate, check_claims, collect, method_config, run_all, slug
    from softrl.bench.report import markdown, plot_learning
    from softrl.config import ConfigError, read_settings

    chosen = _csv(methods)
    try:
        extra = read_settings(base) if base is not None else None
        configs = [method_config(m, task, s, steps, runs, lr, prompts, eval_size=eval_size, eval_every=eval_every,
                                 extra=extra) for s in range(seeds) for m in chosen]
    except (ValueError, ConfigError) as e:
        fail(str(e))
    with progress_bar("setup", total=len(configs) * steps) as update, one_line_errors():
        run_all(configs, lambda i, config, record: update(
            i * steps + record["step"], description=f"{config.name} ({i + 1}/{len(configs)})"))
    runs_by_method = collect(configs)
    agg, claims = aggregate(runs_by_method), check_claims(runs_by_method)
    report.mkdir(parents=True, exist_ok=True)
    table = markdown(agg, claims, seeds)
    name = f"learning-{slug(task)}"
    (report / f"{name}.md").write_text(table)
    (report / f"{name}.json").write_text(json.dumps({"curves": agg, "claims": claims, "runs": runs_by_method},
                                                    indent=1, default=str))
    png = plot_learning(agg, report / f"{name}.png",
                        f"{task}: {steps} steps x {prompts * configs[0].sampling.samples_per_prompt} rows, lr {lr}, "
                        + (f"{seeds} seeds (mean ± sd)" if seeds > 1 else "1 seed"))
    if as_json:
        typer.echo(json.dumps(claims, default=str))
        return
    typer.echo(table)
    typer.echo(f"plot: {png}")


@bench_app.command("anydata")
def anydata(
    task: str = TASK_OPT,
    settings: str = typer.Option("stale,half,offline", help="comma-separated: stale, half, offline"),
    methods: str = typer.Option(None, help="only these methods (comma-separated; default: every one a setting can use)"),
    seeds: int = SEEDS_OPT,
    steps: int = typer.Option(100, min=1, help="learner steps of every run"),
    earlier_steps: int = typer.Option(50, min=1, help="learner steps of the earlier run whose rollouts join the pool"),
    lr: float = LR_OPT,
    prompts: int = PROMPTS_OPT,
    eval_size: int = EVAL_SIZE_OPT,
    eval_every: int = EVAL_EVERY_OPT,
    base: Path = BASE_OPT,
    runs: Path = typer.Option(Path("runs/anydata"), help="where the runs and their stores go; finished runs are reused"),
    report: Path = typer.Option(Path("runs/anydata/report"), help="where the tables, JSON and PNGs go"),
) -> None:
    """Learning from stale, mixed and fixed data: SPO and AGRO against GRPO with and without TIS, CISPO,
    TOPR and KL-PG, N seeds, from the same reference at the same batch and steps."""
    from softrl.bench.anydata import SETTINGS, comparisons, plan, prepare_pool
    from softrl.bench.learning import aggregate, collect, run_all, slug
    from softrl.bench.report import markdown, plot_intervals, plot_learning
    from softrl.config import ConfigError, read_settings

    try:
        extra = read_settings(base) if base is not None else None
        chosen = _csv(settings)
        configs = plan(task, chosen, seeds, runs, steps, lr, prompts, 4, eval_size, eval_every, extra,
                       _csv(methods) if methods else None)
    except (ValueError, ConfigError) as e:
        fail(str(e))
    every = [c for setting in chosen for c in configs[setting]]
    done = earlier_steps if any(SETTINGS[s].pool for s in chosen) else 0  # the earlier run's steps come first
    with progress_bar("setup", total=len(every) * steps + done) as update, one_line_errors():
        if done:
            pool = prepare_pool(task, runs, earlier_steps, lr, prompts, 4, extra, on_step=lambda _, __, r: update(
                r["step"], description="earlier run (the pool's rollouts)"))
            err.print(f"pool: {', '.join(f'{n} {k}' for k, n in pool.items())} rows")
        run_all(every, lambda i, c, record: update(done + i * steps + record["step"],
                                                   description=f"{Path(c.out_dir).name}/{c.name} ({i + 1}/{len(every)})"))
    report.mkdir(parents=True, exist_ok=True)
    for name in chosen:
        setting, runs_by = SETTINGS[name], collect(configs[name])
        agg, claims = aggregate(runs_by), comparisons(SETTINGS[name], runs_by)
        stem = report / f"anydata-{slug(task)}-{name}"
        table = markdown(agg, claims, seeds)
        stem.with_suffix(".md").write_text(table)
        stem.with_suffix(".json").write_text(json.dumps({"curves": agg, "comparisons": claims, "runs": runs_by},
                                                        indent=1, default=str))
        title = f"{task}, {name}: {steps} steps x {prompts * 4} rows, lr {lr}, {seeds} seed(s)"
        if len(setting.intervals) > 1:  # the curves of one interval per plot, and the finals against the interval
            plot_intervals(agg, setting.intervals, stem.with_suffix(".png"), title)
            for k in setting.intervals:
                plot_learning({m: v for m, v in agg.items() if m.endswith(f"-i{k}")},
                              report / f"{stem.name}-i{k}.png", f"{title}, weights updated every {k} steps")
        else:
            plot_learning(agg, stem.with_suffix(".png"), title)
        typer.echo(f"## {name}\n\n{table}")
    typer.echo(f"reports: {report}/anydata-{slug(task)}-*")


def _write(report: Path, stem: str, table: str, data: dict) -> None:
    report.mkdir(parents=True, exist_ok=True)
    (report / f"{stem}.md").write_text(table)
    (report / f"{stem}.json").write_text(json.dumps(data, indent=1, default=str))


@bench_app.command("study")
def study(
    name: str = typer.Argument(..., help="loss, reverse, mc, code, agro or grow"),
    seeds: int = typer.Option(None, min=1, help="seeds 0..N-1 (lineages for grow); default: the study's (3, code 2)"),
    steps: int = typer.Option(None, min=1, help="learner steps of every run (grow: of run A); default: the study's"),
    later_steps: int = typer.Option(180, min=1, help="grow: learner steps of baseline, B and C"),
    lr: float = typer.Option(None, min=0.0, help="learning rate (agro's arms set their own); default: the study's"),
    rows: int = typer.Option(None, min=4, help="rows per learner step; default: the study's (32)"),
    eval_size: int = typer.Option(None, min=1, help="held-out prompts per evaluation; default: the study's"),
    eval_every: int = typer.Option(None, min=1, help="learner steps between evaluations; default: the study's"),
    toy: bool = typer.Option(True, "--toy/--no-toy", help="agro: the tabular sweep first"),
    quick: bool = typer.Option(False, "--quick", help="code: a few steps on a few problems (a smoke test, no result)"),
    jobs: int = typer.Option(1, min=1, help="code: runs at once, each with its share of the CPU threads"),
    kept: Path = typer.Option(None, help="code: the finished runs' outcomes, one JSON line each (default: "
                              "REPORT/study-code-runs.jsonl); a kept run is never retrained"),
    base: Path = BASE_OPT,
    runs: Path = typer.Option(Path("runs/studies"), help="where the runs and their stores go; finished runs are reused"),
    report: Path = typer.Option(Path("runs/studies/report"), help="where the tables, JSON and PNGs go"),
) -> None:
    """One of the papers' claims `bench learning` leaves out: SPO's loss, reverse-Q and MC-target ablations,
    code, on-policy AGRO's working region, experience that grows across runs."""
    from softrl.bench.learning import aggregate, collect, run_all
    from softrl.bench.report import markdown, plot_learning
    from softrl.bench.studies import STUDIES, check_claims, plan, prepare
    from softrl.config import ConfigError, read_settings

    if name == "grow":
        return _grow(seeds or 3, steps or 120, later_steps, lr or 2e-4, rows or 32, eval_size or 80, eval_every or 20,
                     base, runs, report)
    if name == "code":
        return _code(quick, seeds, steps, eval_size, eval_every, jobs, kept, base, runs, report)
    if name not in STUDIES:
        fail(f"unknown study {name!r} (use {', '.join(STUDIES)}, grow)")
    s = STUDIES[name]
    seeds, steps = seeds or s.seeds, steps or s.steps
    try:
        extra = read_settings(base) if base is not None else None
        configs = plan(s, seeds, runs, steps, lr or s.lr, rows or s.rows, eval_size or s.eval_size,
                       eval_every or s.eval_every, extra)
    except (ValueError, ConfigError) as e:
        fail(str(e))
    if name == "agro" and toy:
        _agro_toy(seeds, report)
    with progress_bar("setup", total=len(configs) * steps) as update, one_line_errors():
        prepared = prepare(s, configs[0], progress=lambda done, total: update(
            0, description=f"PTS over the reference's samples: {done}/{total}"))
        if prepared:
            err.print(f"prepared: {prepared}")
        try:
            run_all(configs, lambda i, config, record: update(
                i * steps + record["step"], description=f"{config.name} ({i + 1}/{len(configs)})"))
        except ValueError as e:  # a finished run with other settings
            fail(str(e))
    by_arm = collect(configs)
    agg, claims = aggregate(by_arm), check_claims(s, by_arm)
    table = markdown(agg, claims, seeds)
    _write(report, f"study-{name}", table, {"study": s.title, "prepared": prepared, "curves": agg, "claims": claims,
                                            "runs": by_arm})
    c = configs[0]
    png = plot_learning(agg, report / f"study-{name}.png",
                        f"{s.title}: {s.task}, {steps} steps x {rows or s.rows} rows, lr {c.optim.lr:g}, {seeds} seed(s)")
    typer.echo(f"{table}\nplot: {png}")


def run_stage(s, configs: list, jobs: int, update, what: str, prepare) -> None:
    """One stage's runs still to train under the progress bar (learner steps, or runs when several run at
    once), each on its own copy of the pool: `prepare(update)` makes the pool first, once, and returns
    its rows per source. `s`: the benchmark's settings (`bench.frontier.Settings` or the code study's)."""
    from softrl.bench import frontier as fr

    configs = fr.pending(s, configs)
    if not configs:
        return
    counts = prepare(update)
    err.print(f"pool: {', '.join(f'{n} {k}' for k, n in counts.items())} rows")
    if jobs <= 1:
        update(0, total=len(configs) * s.steps, description=what)
        fr.run(configs, s, on_step=lambda i, c, r: update(i * s.steps + r["step"],
                                                          description=f"{what}: {c.name} ({i + 1}/{len(configs)})"))
        return
    done = [0]
    update(0, total=len(configs), description=f"{what} ({jobs} at once)")

    def finished(config) -> None:
        done[0] += 1
        update(done[0], description=f"{what}: {config.name} done")

    fr.run(configs, s, jobs=jobs, on_done=finished)


def _code(quick: bool, seeds: int | None, steps: int | None, eval_size: int | None, eval_every: int | None,
          jobs: int, kept: Path | None, base: Path | None, runs: Path, report: Path) -> None:
    """SPO vs PPO vs GRPO on tinycode-loops: every arm's learning rate tuned, then the report seeds."""
    from softrl.bench import code_study as cs
    from softrl.bench.learning import aggregate
    from softrl.bench.report import code_markdown, plot_learning
    from softrl.config import ConfigError, read_settings

    try:
        extra = read_settings(base) if base is not None else None
        given = {k: v for k, v in (("seeds", seeds), ("steps", steps), ("eval_size", eval_size),
                                   ("eval_every", eval_every)) if v is not None}
        s = cs.Settings(runs, **{**(cs.QUICK if quick else {}), **given}, extra=extra,
                        kept=kept or report / "study-code-runs.jsonl")
        first = cs.run_config(s, "spo-online", s.lrs[0], cs.TUNE_SEED)
        if first.model.path == str(cs.reference_dir()):  # before any kept outcome is read: they name its weights
            cs.install_reference(s)
    except (ValueError, ConfigError) as e:
        fail(str(e))
    def pool(update) -> dict:
        return cs.prepare_pool(s, progress=lambda done, total: update(
            done, total=total, description="pool: Q0 of the training prompts from the reference's samples"))

    with progress_bar("setup") as update, one_line_errors():
        chosen = cs.tune(s, list(cs.ARMS), lambda plan: run_stage(s, plan, jobs, update, "tuning", pool))
        run_stage(s, cs.report_plan(s, chosen), jobs, update, "report seeds", pool)
        by_arm = cs.collect(s, chosen)
    agg, claims = aggregate(by_arm), cs.check_claims(by_arm)
    diversity = cs.diversity(by_arm)
    table = code_markdown(agg, claims, s.seeds, chosen, cs.reference_card(first), diversity)
    _write(report, "study-code", table, {"study": "code: tinycode-loops", "settings": {
        k: v for k, v in vars(s).items() if k != "root"}, "tuned": chosen, "curves": agg, "claims": claims,
        "diversity": diversity, "runs": by_arm})
    png = plot_learning(agg, report / "study-code.png",
                        f"code (tinycode-loops, held-out combinations): {s.steps} steps x "
                        f"{s.prompts * s.samples_per_prompt} generated, tuned lr, {s.seeds} seed(s)")
    typer.echo(f"{table}\nplot: {png}")


def _agro_toy(seeds: int, report: Path) -> None:
    """The tabular sweep of on-policy AGRO and RLOO over beta, group size and lr."""
    from softrl.bench import agro_sweep

    with progress_bar("toy sweep") as update:
        rows = agro_sweep.sweep(seeds, progress=lambda done, total: update(done, total))
        why = agro_sweep.mechanism(seeds)
    cells = agro_sweep.summarise(rows)
    table = (f"{agro_sweep.markdown(cells)}\nAt beta 1/ln(1e5), groups of 8, lr 0.1, from a reference that mostly "
             f"fails and one that mostly succeeds:\n\n{agro_sweep.mechanism_markdown(why)}")
    _write(report, "study-agro-toy", table, {"cells": cells, "runs": rows, "mechanism": why})
    agro_sweep.plot(cells, report / "study-agro-toy.png",
                    f"on-policy AGRO vs RLOO on the exact toy (V=2, L=5), {agro_sweep.SAMPLES} samples per step, "
                    f"600 steps, median of {seeds} seeds")
    typer.echo(f"## toy\n\n{table}")


def _grow(lineages: int, steps: int, later_steps: int, lr: float, rows: int, eval_size: int, eval_every: int,
          base: Path | None, runs: Path, report: Path) -> None:
    from softrl.bench import grow
    from softrl.bench.learning import aggregate
    from softrl.bench.report import grow_markdown, plot_learning
    from softrl.config import ConfigError, read_settings

    try:
        extra = read_settings(base) if base is not None else None
        configs = grow.plan(lineages, runs, steps, later_steps, lr, rows, eval_size, eval_every, extra)
    except (ValueError, ConfigError) as e:
        fail(str(e))
    starts = list(accumulate((c.optim.steps for c in configs), initial=0))  # steps done before each run
    with progress_bar("grow: Q0 of the base store", total=starts[-1]) as update, one_line_errors():
        try:
            grow.run_lineages(configs, runs, on_step=lambda i, c, r: update(
                starts[i] + r["step"], description=f"{Path(c.out_dir).name}: {c.name}"))
        except ValueError as e:
            fail(str(e))
    result = grow.report(configs, runs)
    table = grow_markdown(result)
    _write(report, "study-grow", table, result)
    png = plot_learning(aggregate(result["runs"]), report / "study-grow.png",
                        f"experience that grows: A {steps} steps, the others {later_steps}, {rows} rows, "
                        f"lr {lr:g}, {lineages} lineage(s)")
    typer.echo(f"{table}\nplot: {png}")


@bench_app.command("systems")
def systems(
    task: str = typer.Option("countdown", help="built-in task whose bootstrap model and prompts are used"),
    model: str = typer.Option("bootstrap", help="model directory, 'bootstrap' (the task's reference) or smollm2-135m"),
    parts: str = typer.Option("learner,e2e,ray,trl", help="comma-separated: learner, e2e, ray, trl, sync"),
    prompts: int = typer.Option(16, min=1, help="prompts per step"),
    samples_per_prompt: int = typer.Option(4, min=2, help="samples per prompt (the group size)"),
    max_new_tokens: int = typer.Option(24, min=1, help="generation length"),
    fixed_work: bool = typer.Option(True, "--fixed-work/--eos", help="every sample max_new_tokens long (EOS never "
                                    "drawn) on both sides, or samples end at EOS"),
    pairs: int = typer.Option(3, min=1, help="rounds of the learner steps (SPO, PPO, GRPO) and of softrl sync, "
                              "async, TRL, each run alternately"),
    lr: float = typer.Option(1e-4, min=0.0, help="learning rate of both sides"),
    device: str = DEVICE_OPT,
    checkpointing: bool = typer.Option(False, "--gradient-checkpointing", help="learner steps with activation "
                                       "checkpointing"),
    micro_batch_tokens: int = typer.Option(0, min=0, help="softrl's learner steps, timed and end to end, in "
                                           "micro-batches of at most this many tokens (optim.micro_batch_tokens; "
                                           "0: the whole batch at once)"),
    trl_generation: str = typer.Option("dynamic", help="TRL's generation settings, each a side of the rounds "
                                       "(softrl is compared with the fastest): dynamic, static, paged"),
    modes: str = typer.Option("sync,async", help="softrl's local runtime modes, each a side of the rounds"),
    timed_steps: int = typer.Option(10, min=1, help="timed learner steps per method (after one warm-up step)"),
    e2e_steps: int = typer.Option(40, min=2, help="learner steps of each end-to-end run (softrl's and TRL's)"),
    ray_steps: int = typer.Option(None, min=0, help="learner steps of each Ray run (default: --e2e-steps; "
                                  "0: --parts sync measures the updates only)"),
    runs: Path = typer.Option(Path("runs/bench/systems"), help="scratch directory of the runs"),
    report: Path = typer.Option(Path("runs/bench/report"), help="where systems.md and systems.json go"),
    as_json: bool = typer.Option(False, "--json", help="print the numbers as JSON"),
) -> None:
    """Learner step time, memory, split and FLOP/s of SPO vs PPO vs GRPO; samples/s of sync vs async vs
    TRL's GRPOTrainer on the same work, alternately; Ray interval 1 vs 10; weight sync, object store vs broadcast."""
    from softrl.bench.report import systems_markdown
    from softrl.bench.systems import run_systems
    from softrl.config import ConfigError
    from softrl.models.device import resolve_device
    from softrl.models.loading import ModelLoadError

    from softrl.bench.end_to_end import TRL_GENERATION

    settings = _choices("--trl-generation", "setting", trl_generation, TRL_GENERATION)
    chosen_modes = _choices("--modes", "mode", modes, ("sync", "async"), at_least_one=True)
    chosen = set(_choices("--parts", "part", parts, ("learner", "e2e", "ray", "trl", "sync")))
    from softrl.assemble import model_directory

    try:
        resolve_device(device)
        model = model_directory(model, task)
    except (ConfigError, ValueError) as e:
        fail(str(e))
    report.mkdir(parents=True, exist_ok=True)

    def write_json(result: dict) -> None:  # as it goes too: a benchmark cut off keeps what it finished
        (report / "systems.json").write_text(json.dumps(result, indent=1, default=str))

    with err.status("benchmarking") as status, one_line_errors():
        def phase(name: str) -> None:
            status.update(name)
            if not err.is_terminal:  # no status line is drawn into a log: a timed line says where the time went
                err.print(f"{time.strftime('%H:%M:%S')} {name}", highlight=False)

        try:
            result = run_systems(model, task, runs, chosen, prompts, samples_per_prompt, max_new_tokens,
                                 timed_steps=timed_steps, e2e_steps=e2e_steps,
                                 ray_steps=e2e_steps if ray_steps is None else ray_steps,
                                 trl_steps=e2e_steps, pairs=pairs, lr=lr, fixed=fixed_work,
                                 device=device, checkpointing=checkpointing, micro_batch_tokens=micro_batch_tokens,
                                 trl_generation=tuple(settings),
                                 modes=tuple(chosen_modes), phase=phase,
                                 on_progress=write_json)
        except (ConfigError, ModelLoadError, RuntimeError) as e:
            fail(str(e))
    table = systems_markdown(result)
    (report / "systems.md").write_text(table)
    write_json(result)
    typer.echo(json.dumps(result, default=str) if as_json else table)
