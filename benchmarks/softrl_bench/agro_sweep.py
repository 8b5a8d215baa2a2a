"""On-policy AGRO on the exact tabular problem (`softrl toy`'s), swept over beta, group size and
learning rate, against RLOO at the same settings: where it reaches pi*, where it collapses, and why.

Every run samples the same number of responses per step (groups of `group` from the current
policy), so the group size changes the estimator, not the amount of data. A run *converges* when its
final KL(pi || pi*) is under a tenth of the reference's and is *partial* when it ends between that and
the reference's; one that ends further from pi* than the reference *collapses* (onto failures: its
success rate fell) or *overshoots* (past pi* onto a few successes).
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

import torch

from softrl.tabular import SPO_BETA, TabularProblem, train
from softrl.toy import METHODS

BETAS = (SPO_BETA, 0.2, 0.5, 1.0)
GROUPS = (3, 8, 16)
LRS = (0.03, 0.1, 0.3)
ALGORITHMS = ("agro-on", "rloo")
SAMPLES = 48  # responses per step: a multiple of every group size


def verdict(final_kl: float, start_kl: float, success_final: float, success_ref: float) -> str:
    """converges, partial, or (ending further from pi* than pi0) collapses onto failures or overshoots."""
    if final_kl < 0.1 * start_kl:
        return "converges"
    if final_kl <= start_kl:
        return "partial"
    return "collapses" if success_final < success_ref else "overshoots"


def run_one(job: tuple) -> dict:
    """One (algorithm, beta, group, lr, seed, steps, reference success rate) run: KL(pi || pi*) at the
    start and the end, and the success rates of pi0, the final pi and pi*."""
    algorithm, beta, group, lr, seed, steps, success_rate = job
    torch.set_num_threads(1)
    problem = TabularProblem.make(vocab=2, length=5, success_rate=success_rate, beta=beta, seed=0)
    result = train(problem, METHODS[algorithm].loss, data="on-policy", steps=steps, lr=lr, samples=SAMPLES,
                   group_size=group, seed=seed, max_grad_norm=1.0)
    pi_star = [t.detach() for t in problem.optimal_logits()]
    return {"algorithm": algorithm, "beta": beta, "group": group, "lr": lr, "seed": seed,
            "target_success": success_rate,
            "start_kl": result.kl[0], "final_kl": result.kl[-1], "skipped": result.skipped_steps,
            "success_ref": 1 + problem.expected_reward(problem.ref_logits),
            "success_final": 1 + problem.expected_reward(result.policy.policy_parameters()),
            "success_optimal": 1 + problem.expected_reward(pi_star)}


def sweep(seeds: int = 3, steps: int = 600, workers: int = 2, betas=BETAS, groups=GROUPS, lrs=LRS,
          progress: Callable[[int, int], None] | None = None) -> list[dict]:
    return run_jobs([(a, b, g, lr, s, steps, 0.25) for a, b, g, lr, s
                     in itertools.product(ALGORITHMS, betas, groups, lrs, range(seeds))], workers, progress)


def run_jobs(jobs: list[tuple], workers: int, progress: Callable[[int, int], None] | None = None) -> list[dict]:
    """`run_one` over `jobs` in `workers` processes, results in the jobs' order."""
    out = []
    with ProcessPoolExecutor(workers, mp_context=get_context("spawn")) as pool:
        for i, row in enumerate(pool.map(run_one, jobs)):
            out.append(row)
            if progress is not None:
                progress(i + 1, len(jobs))
    return out


def mechanism(seeds: int = 3, steps: int = 600, workers: int = 2) -> list[dict]:
    """On-policy AGRO at the SPO paper's beta from a reference that mostly fails and from one that mostly
    succeeds: minimising Var_pi[R] at small beta moves pi towards whichever outcome is already the majority."""
    return run_jobs([("agro-on", SPO_BETA, 8, 0.1, s, steps, rate) for rate in (0.25, 0.75) for s in range(seeds)],
                    workers)


def mechanism_markdown(rows: list[dict]) -> str:
    lines = ["| reference success | final success (per seed) | pi* success | KL(pi0‖pi*) | final KL(pi‖pi*) (median) |",
             "|---|---|---|---|---|"]
    for rate in sorted({r["target_success"] for r in rows}):
        runs = [r for r in rows if r["target_success"] == rate]
        finals = ", ".join(f"{r['success_final']:.4f}" for r in runs)
        lines.append(f"| {runs[0]['success_ref']:.3f} | {finals} | "
                     f"{runs[0]['success_optimal']:.3f} | {runs[0]['start_kl']:.3g} | "
                     f"{statistics.median(r['final_kl'] for r in runs):.3g} |")
    return "\n".join(lines) + "\n"


def summarise(rows: list[dict]) -> list[dict]:
    """Per (algorithm, beta, group, lr): median final KL over seeds, mean final success, the verdict."""
    cells: dict[tuple, list[dict]] = {}
    for r in rows:
        cells.setdefault((r["algorithm"], r["beta"], r["group"], r["lr"]), []).append(r)
    out = []
    for (algorithm, beta, group, lr), runs in cells.items():
        kl = statistics.median(r["final_kl"] for r in runs)
        success = statistics.fmean(r["success_final"] for r in runs)
        out.append({"algorithm": algorithm, "beta": beta, "group": group, "lr": lr, "seeds": len(runs),
                    "start_kl": runs[0]["start_kl"], "final_kl": kl, "success_final": success,
                    "success_ref": runs[0]["success_ref"], "success_optimal": runs[0]["success_optimal"],
                    "verdict": verdict(kl, runs[0]["start_kl"], success, runs[0]["success_ref"])})
    return out


def markdown(cells: list[dict]) -> str:
    lines = ["| beta | group | lr | pi* success | agro-on: final KL(pi‖pi*) | success | | rloo: final KL | success | |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    by = {(c["algorithm"], c["beta"], c["group"], c["lr"]): c for c in cells}
    for beta, group, lr in sorted({(c["beta"], c["group"], c["lr"]) for c in cells}):
        row = [f"{beta:.3g}", str(group), f"{lr:g}", f"{by[('agro-on', beta, group, lr)]['success_optimal']:.3f}"]
        for algorithm in ALGORITHMS:
            c = by.get((algorithm, beta, group, lr))
            row += [f"{c['final_kl']:.3g}", f"{c['success_final']:.3f}", c["verdict"]] if c else ["-", "-", "-"]
        lines.append(f"| {' | '.join(row)} |")
    start = {c["beta"]: c["start_kl"] for c in cells}
    lines += ["", "KL(pi0‖pi*) at the start: " + ", ".join(f"beta {b:.3g}: {k:.3g}" for b, k in sorted(start.items()))
              + f"; reference success {cells[0]['success_ref']:.3f}."]
    return "\n".join(lines) + "\n"


def plot(cells: list[dict], out: Path, title: str) -> Path:
    """One panel per group size: final KL(pi || pi*) / KL(pi0 || pi*) against beta, a line per lr and
    algorithm (below 0.1: converges, above 1: collapses)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = sorted({c["group"] for c in cells})
    fig, axes = plt.subplots(1, len(groups), figsize=(5 * len(groups), 4.2), sharey=True, squeeze=False)
    for ax, group in zip(axes[0], groups):
        for algorithm, style in zip(ALGORITHMS, ("-", "--")):
            for lr in sorted({c["lr"] for c in cells}):
                pts = sorted((c["beta"], c["final_kl"] / c["start_kl"]) for c in cells
                             if c["algorithm"] == algorithm and c["group"] == group and c["lr"] == lr)
                ax.plot([p[0] for p in pts], [max(p[1], 1e-6) for p in pts], style, marker="o", label=f"{algorithm} lr {lr:g}")
        ax.axhline(1.0, color="red", linewidth=0.8, linestyle=":")
        ax.axhline(0.1, color="green", linewidth=0.8, linestyle=":")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(f"group {group}")
        ax.set_xlabel("beta")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("final KL(pi‖pi*) / KL(pi0‖pi*)")
    axes[0][0].legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def study(seeds: int, report: Path, progress: Callable[[int, int], None]) -> str:
    """The tabular sweep of on-policy AGRO and RLOO over beta, group size and lr, and why AGRO collapses
    at SPO's beta, written under `report`; returns the table."""
    from softrl_bench.report import write_report

    rows = sweep(seeds, progress=progress)
    why = mechanism(seeds)
    cells = summarise(rows)
    table = (f"{markdown(cells)}\nAt beta 1/ln(1e5), groups of 8, lr 0.1, from a reference that mostly "
             f"fails and one that mostly succeeds:\n\n{mechanism_markdown(why)}")
    write_report(report, "study-agro-toy", table, {"cells": cells, "runs": rows, "mechanism": why})
    plot(cells, report / "study-agro-toy.png",
         f"on-policy AGRO vs RLOO on the exact toy (V=2, L=5), {SAMPLES} samples per step, "
         f"600 steps, median of {seeds} seeds")
    return table
