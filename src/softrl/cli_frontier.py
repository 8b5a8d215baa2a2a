"""`softrl bench frontier` and `softrl bench staleness`: learning from stale and foreign data, compared
fairly, and SPO on stale data where the truth is known."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from softrl.cli_bench import TASK_OPT, _choices, _csv, bench_app, run_stage
from softrl.cli_common import BASE_OPT, fail, one_line_errors, progress_bar

QUICK = {"regimes": "lag1,lag16,human", "methods": "spo,oapl,grpo-tis,topr", "seeds": 1, "tune_seeds": 1,
         "steps": 30, "lrs": "1e-4,1e-3", "extend": 0, "eval_size": 20, "eval_every": 30, "earlier_steps": 20}
QUICK_TASK = {"task.size": 200, "q0.k": 16}  # Q0 of 1,000 prompts x 32 samples alone would take minutes
FULL = {"regimes": "lag1,lag4,lag16,lag64,lag256,half,offline,human", "methods": None, "seeds": 4, "tune_seeds": 1,
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
    regimes: str = typer.Option(None, help="comma-separated: lag1, lag4, lag16, lag64, lag256, half, offline, human "
                                "(default: all; --quick: lag1,lag16,human)"),
    methods: str = typer.Option(None, help="only these methods (default: every one a regime can use)"),
    seeds: int = typer.Option(None, min=1, help="report seeds 0..N-1 (default 4; --quick 1)"),
    tune_seeds: int = typer.Option(None, min=1, help="tuning seeds 100..100+N-1 (default 1)"),
    steps: int = typer.Option(None, min=1, help="learner steps of every run (default 300; --quick 30)"),
    lrs: str = typer.Option(None, help="the learning-rate grid (default 3e-5,1e-4,3e-4; --quick 1e-4,1e-3)"),
    extend: int = typer.Option(None, min=0, help="learning rates a method's grid may grow past the edge its best "
                               "point lies on, each way, one step of the 1-3-10 ladder each (default 1; --quick 0)"),
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
    (policy lag 1..256, half online, offline from another policy, offline from known solutions)."""
    from softrl.bench import frontier as fr
    from softrl.bench.frontier_report import lag_results, lags_markdown, markdown, plot, plot_lags
    from softrl.bench.learning import slug
    from softrl.config import ConfigError, read_settings

    preset = QUICK if quick else FULL
    given = {"regimes": regimes, "methods": methods, "seeds": seeds, "tune_seeds": tune_seeds, "steps": steps,
             "lrs": lrs, "extend": extend, "eval_size": eval_size, "eval_every": eval_every, "earlier_steps": earlier_steps}
    o = {k: preset[k] if v is None else v for k, v in given.items()}
    chosen = _choices("--regimes", "regime", o["regimes"], fr.REGIMES, at_least_one=True)
    only = _choices("--methods", "method", o["methods"], fr.METHODS, at_least_one=True) if o["methods"] else None
    try:
        extra = {**(QUICK_TASK if quick else {}), **(read_settings(base) if base is not None else {})}
        stem = f"frontier-{slug(task)}" if task != "countdown" else "frontier"
        s = fr.Settings(runs, task, o["steps"], prompts, 4, o["eval_size"], o["eval_every"], o["earlier_steps"],
                        _floats("--lrs", o["lrs"]), o["extend"], extra, kept or report / f"{stem}-runs.jsonl")
        fr.check_names(chosen, only)
        fr.install_reference(s)  # before any kept outcome is read: they name its weights
    except (ValueError, ConfigError) as e:
        fail(str(e))
    if not report_only:
        def pool(update) -> dict:  # the earlier run first (the other policy's data), then the pool, once
            return fr.prepare(s, on_step=lambda _, __, r: update(r["step"], total=s.earlier_steps,
                                                                 description="earlier run (the other policy's data)"))

        with progress_bar("setup", total=None) as update, one_line_errors():
            for _ in range(fr.tuning_rounds(s)):  # a grid whose best lies on an edge grows there, round by round
                run_stage(s, fr.tuning_plan(s, chosen, only, o["tune_seeds"]), jobs, update, "tuning", pool)
            for name in chosen:
                lrs = fr.regime_lrs(s, fr.REGIMES[name], only, o["tune_seeds"])
                picks = fr.choose(fr.grid_points(s, fr.REGIMES[name], lrs, o["tune_seeds"]))
                run_stage(s, fr.report_plan(s, fr.REGIMES[name], {m: [picks["best"][m], picks["matched"][m]]
                                                                  for m in picks["best"]}, o["seeds"]),
                          jobs, update, f"{name}: report seeds", pool)
    report.mkdir(parents=True, exist_ok=True)
    for name in chosen:
        with one_line_errors():
            result = fr.regime_result(s, fr.REGIMES[name], only, o["tune_seeds"], o["seeds"])
        table = markdown(result)
        path = report / f"{stem}-{name}"
        path.with_suffix(".md").write_text(table)
        path.with_suffix(".json").write_text(json.dumps(result, indent=1, default=str))
        plot(result, path.with_suffix(".png"), list(fr.METHODS))
        typer.echo(table)
    # this run's lags and those reported before with the same settings: the picture of staleness
    by_lag, others = lag_results(report, stem, list(fr.LAGS), fr.report_settings(s, o["tune_seeds"], o["seeds"]))
    for path in others:
        typer.echo(f"{stem}-lags: {path.name} left out (made with other settings)")
    if len(by_lag) > 1:
        (report / f"{stem}-lags.md").write_text(lags_markdown(by_lag))
        plot_lags(by_lag, report / f"{stem}-lags.png", list(fr.METHODS))
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
    from softrl.bench.staleness import markdown, plot
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
