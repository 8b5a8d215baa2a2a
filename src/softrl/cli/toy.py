"""`softrl toy`: every registered objective on the exact tabular problem (no model, no data)."""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

import typer
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from softrl.cli.common import err, fail, out as stdout
from softrl.limits import MAX_SEED, MAX_TOY_SEQUENCES


def toy(
    steps: int = typer.Option(600, min=1, help="optimizer steps per method"),
    lr: float = typer.Option(0.3, min=0.0, help="Adam learning rate (cosine-decayed to 1%)"),
    samples: int = typer.Option(0, min=0, max=2**20, help="sequences sampled per step; 0 = exact expectations"),
    max_grad_norm: float = typer.Option(0.0, min=0.0, help="clip the gradient norm to this; 0 = no clipping"),
    vocab: int = typer.Option(2, min=2, help="vocabulary size V"),
    length: int = typer.Option(5, min=1, help="sequence length L (V**L sequences)"),
    success_rate: float = typer.Option(0.25, help="success rate of the reference policy"),
    turns: int = typer.Option(1, min=1, max=8, help="policy turns of an episode; between two, an environment token"),
    env: str = typer.Option("deterministic", help="with --turns 2 or more: the environment answers each history "
                            "with one token (deterministic: a tool, a test run) or draws it (stochastic: a game, a user)"),
    beta: float = typer.Option(0.0, help="regularisation strength; 0 = the SPO paper's 1/ln(1e5)"),
    methods: str = typer.Option("all", help="comma-separated method names, or 'all'"),
    seed: int = typer.Option(0, min=0, max=MAX_SEED, help="seed of the problem and of the sampling"),
    workers: int = typer.Option(0, min=0, max=256, help="processes; 0 = one per CPU core"),
    out: Path = typer.Option(Path("runs/toy"), help="directory for the plot and results.json"),
    as_json: bool = typer.Option(False, "--json", help="print the table as JSON on stdout"),
    reference_moves: int = typer.Option(0, min=0, max=20, help="instead: this many rounds of each method, the "
                                        "reference moved to the policy after each, against the closed form "
                                        "pi0 exp(k r / beta); Q0 exact and estimated from groups of --group (--beta 0 means 0.5 here: at the "
                                        "paper's beta one round already leaves 2e-4 of the mass on failures)"),
    group: int = typer.Option(4, min=2, max=8, help="with --reference-moves: samples a group's Q0 estimate uses"),
) -> None:
    """Train every loss on an exact tabular problem and report KL(pi || pi*) (no model, no data); with
    --turns, on episodes where an environment answers between the policy's turns."""
    from softrl.tabular import SPO_BETA, TabularProblem
    from softrl.tabular.problem import ENVIRONMENTS
    from softrl.toy import METHODS, plot_runs, run_all

    if length * math.log(vocab) > math.log(MAX_TOY_SEQUENCES):  # every sequence is enumerated
        fail(f"--vocab {vocab} --length {length} make {vocab}**{length} sequences, over the "
             f"{MAX_TOY_SEQUENCES:,} the exact problem enumerates: lower --vocab or --length")
    if env not in ENVIRONMENTS:
        fail(f"--env {env!r}: choose from {', '.join(ENVIRONMENTS)}")
    if reference_moves:
        return _reference_moves(reference_moves, group, steps, lr, vocab, length, success_rate, beta, seed,
                                "spo-terminal-bce" if methods == "all" else methods, as_json)
    names = list(METHODS) if methods == "all" else [m.strip() for m in methods.split(",") if m.strip()]
    unknown = [n for n in names if n not in METHODS]
    if unknown or not names:
        fail(f"unknown method {unknown[0] if unknown else methods!r} in --methods; choose from {', '.join(METHODS)}")
    try:
        problem = TabularProblem.make(vocab=vocab, length=length, success_rate=success_rate,
                                      beta=beta or SPO_BETA, seed=seed, turns=turns, env=env)
        total = sum(len(METHODS[n].data) for n in names)
        started = time.time()
        with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                      TimeElapsedColumn(), console=err, transient=True) as bar:
            task = bar.add_task("toy", total=total)

            def advance(label: str) -> None:
                bar.update(task, description=f"done: {label}", advance=1)

            runs = run_all(problem, names, steps=steps, lr=lr, samples=samples or None, seed=seed,
                           max_grad_norm=max_grad_norm or None, workers=workers or os.cpu_count() or 1,
                           progress=advance)
    except ValueError as e:
        fail(str(e))
    mode = f"{samples} samples/step" if samples else "exact expectations"
    mode += f", grad norm <= {max_grad_norm:g}" if max_grad_norm else ""
    episode = f", {turns} turns, {env} environment" if turns > 1 else ""
    title = (f"V={vocab}, L={length}{episode}, beta={problem.beta:.4g}, reference success "
             f"{problem.success_rate:.2f}, {mode}, {steps} steps, lr {lr}")
    rows = [{"method": r.method, "data": r.data, "final_kl": r.final_kl} for r in runs]
    out.mkdir(parents=True, exist_ok=True)
    plot_runs(runs, str(out / "kl.png"), title)
    (out / "results.json").write_text(json.dumps({"setting": title, "rows": rows,
                                                  "curves": {f"{r.method}/{r.data}": r.kl for r in runs}}))
    if as_json:
        typer.echo(json.dumps(rows))
        return
    table = Table(title=f"KL(pi || pi*) after training: {title}")
    for col in ("method", "data", "final KL"):
        table.add_column(col, justify="right" if col == "final KL" else "left")
    for row in rows:
        table.add_row(row["method"], row["data"], f"{row['final_kl']:.3g}")
    stdout.print(table)
    err.print(f"plot: {out / 'kl.png'}   results: {out / 'results.json'}   ({time.time() - started:.0f} s)")


def _reference_moves(rounds: int, group: int, steps: int, lr: float, vocab: int, length: int, success_rate: float,
                     beta: float, seed: int, methods: str, as_json: bool) -> None:
    """`softrl toy --reference-moves K`: SPO (or `methods`) with a reference that moves (tabular/moving.py):
    KL to the closed form after each round, with the exact Q0 and with the estimates from each group of
    `group` samples (plain and jackknifed), exact expectations; then the plain estimate's exact bias."""
    import torch

    import softrl.objectives as registry
    from softrl.tabular import TabularProblem
    from softrl.tabular.moving import q0_bias, reference_rounds
    from softrl.toy import METHODS

    torch.set_num_threads(1)  # tiny tensors: a second thread only waits on the first (16x slower on a busy machine)
    names = [m.strip() for m in methods.split(",") if m.strip()]
    unknown = [n for n in names if n not in METHODS or registry.get(METHODS[n].algorithm).data != "any"]
    if unknown or not names:
        fail(f"--methods {unknown[0] if unknown else methods!r}: --reference-moves takes objectives valid on any "
             f"data (e.g. spo-terminal-bce, agro-off)")
    try:
        problem = TabularProblem.make(vocab=vocab, length=length, success_rate=success_rate, beta=beta or 0.5,
                                      seed=seed)
        rows = []
        with Progress(TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(), console=err,
                      transient=True) as bar:
            task = bar.add_task("rounds", total=len(names) * 3)
            for name in names:
                for q0 in ("exact", "group", "jackknife"):
                    bar.update(task, description=f"{name}, Q0 {q0}")
                    size = 1 if q0 == "exact" else group
                    for r in reference_rounds(problem, METHODS[name].loss, rounds, q0=q0, group_size=size,
                                              steps=steps, lr=lr, seed=seed):
                        rows.append({"method": name, "q0": q0 if q0 == "exact" else f"{q0} of {group}",
                                     "round": r.round, "kl_to_closed_form": r.kl_to_closed_form,
                                     "kl_to_round_optimum": r.kl_to_round_optimum, "reward": r.reward})
                    bar.update(task, advance=1)
    except ValueError as e:
        fail(str(e))
    bias = [{"group": k, "bias": q0_bias(problem.success_rate, k, problem.beta),
             "jackknife_bias": q0_bias(problem.success_rate, k, problem.beta, "jackknife")} for k in (2, 4, 8, 16, 64)]
    if as_json:
        typer.echo(json.dumps({"beta": problem.beta, "success_rate": problem.success_rate, "rounds": rows,
                               "q0_bias": bias}))
        return
    title = (f"V={vocab}, L={length}, beta={problem.beta:.4g}, reference success {problem.success_rate:.2f}, "
             f"exact expectations, {steps} steps a round, lr {lr}")
    table = Table(title=f"A reference moved after each round: {title}")
    for col in ("method", "Q0", "round", "KL to pi0 exp(k r/beta)", "KL to the round's optimum", "reward"):
        table.add_column(col, justify="left" if col in ("method", "Q0") else "right")
    for r in rows:
        table.add_row(r["method"], r["q0"], str(r["round"]), f"{r['kl_to_closed_form']:.3g}",
                      f"{r['kl_to_round_optimum']:.3g}", f"{r['reward']:.4f}")
    stdout.print(table)
    table = Table(title="E[Q0 estimate] - Q0 from K samples of the reference (exact)")
    for col in ("K", "plain", "jackknife"):
        table.add_column(col, justify="right")
    for b in bias:
        table.add_row(str(b["group"]), f"{b['bias']:+.4f}", f"{b['jackknife_bias']:+.4f}")
    stdout.print(table)


COMMANDS = {"toy": toy}
GROUPS: dict[str, typer.Typer] = {}
