"""`softrl toy`: every registered objective trained on the exact tabular problem, scored by KL(pi || pi*).

The losses are the registry's adapters (`softrl.objectives`), the very code the learner trains
models with; this module only turns a `TabularBatch` into their `LossInputs`.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from functools import cached_property

import torch
from torch import Tensor

import softrl.objectives as registry
from softrl.objectives import LossInputs, objective_loss
from softrl.tabular import TabularBatch, TabularProblem, train

BOTH = ("off-policy", "on-policy")
ON_POLICY = ("on-policy",)


def loss_inputs(b: TabularBatch) -> LossInputs:
    """The tabular problem's rewards are 0 (success) and -1 (failure), SPO's `r - 1`: the registry takes
    the task's units, so both the reward and the soft value `V* = Q0` move up by 1."""
    return LossInputs(b.logp, b.ref_logp, b.old_logp, b.mask, b.reward + 1, b.q0 + 1, b.beta, b.group_size,
                      token_kl=b.token_kl, values=b.values, old_values=b.old_values, weights=b.weights,
                      behavior_logp=b.behavior_logp, has_behavior=torch.ones_like(b.reward, dtype=torch.bool))


@dataclass(frozen=True)
class ToyMethod:
    name: str
    algorithm: str
    options: dict = field(default_factory=dict)  # the objective's options besides `algorithm`
    group_size: int = 1  # generations per prompt the estimator needs (exact mode enumerates tuples)
    data: tuple[str, ...] = BOTH
    epochs: int = 1

    @cached_property
    def objective_options(self) -> registry.Options:
        return registry.get(self.algorithm).options(**self.options)

    def loss(self, b: TabularBatch) -> Tensor:
        return objective_loss(self.objective_options, loss_inputs(b))[0]


def default_method(objective: registry.Objective) -> ToyMethod:
    """A registered objective with its default options, on the data it is valid for."""
    return ToyMethod(objective.name, objective.name, group_size=max(objective.min_group, 1),
                     data=BOTH if objective.data == "any" else ON_POLICY)


# variants worth seeing side by side; every other registered objective runs with its defaults
VARIANTS = [
    ToyMethod("spo-terminal-mse", "spo", {"terminal": 1.0, "loss": "squared"}),
    ToyMethod("spo-terminal-bce", "spo", {"terminal": 1.0, "loss": "bce"}),
    ToyMethod("spo-reverse-mse", "spo", {"terminal": 0.0, "reverse": 1.0, "loss": "squared"}),
    # eps = 1e-2: with 1e-4 the straight-through push (~1/eps) whenever an intermediate Q_t
    # overshoots log 1 dominates the gradient and the run stalls near KL 1e-2 (see docs).
    ToyMethod("spo-reverse-bce", "spo", {"terminal": 0.0, "reverse": 1.0, "loss": "bce", "eps": 1e-2}),
    ToyMethod("spo-advantage-bce", "spo", {"terminal": 0.0, "advantage": 1.0}),
    # KL-PG is run off-policy too: there it has the wrong fixed point (the AGRO paper's figure 1)
    ToyMethod("kl-pg", "kl-pg", {"kl": "sequence"}, group_size=2),
    ToyMethod("kl-pg-token", "kl-pg", {"kl": "token"}, group_size=2),
    ToyMethod("grpo", "grpo", group_size=3, data=ON_POLICY),
    # truncated importance sampling makes GRPO usable on other policies' rows: off-policy here too
    *[ToyMethod(f"grpo-tis-{how.replace('_truncate', '').replace('_', '-')}", "grpo", {"is_correction": how},
                group_size=3) for how in ("token_truncate", "sequence_truncate", "sequence_mask")],
    ToyMethod("rloo", "rloo", group_size=2),
    ToyMethod("rloo-tis-sequence", "rloo", {"is_correction": "sequence_truncate"}, group_size=2),
]
METHODS: dict[str, ToyMethod] = {m.name: m for m in VARIANTS}
METHODS.update({o.name: default_method(o) for o in registry.REGISTRY.values()
                if o.name not in {m.algorithm for m in VARIANTS}})


def run_method(
    problem: TabularProblem, method: ToyMethod, data: str, *, steps: int, lr: float,
    samples: int | None = None, seed: int = 0, max_grad_norm: float | None = None,
) -> list[float]:
    """Train one method on one kind of data; returns KL(pi || pi*) per step (and after the last).

    Sampled mode has one prompt, so a group estimator takes all `samples` generations as its group.
    """
    group = samples if samples is not None and method.group_size > 1 else method.group_size
    result = train(problem, method.loss, data=data, steps=steps, lr=lr, samples=samples, group_size=group,
                   epochs=method.epochs, seed=seed, max_grad_norm=max_grad_norm)
    return result.kl


@dataclass
class ToyRun:
    method: str
    data: str
    kl: list[float]  # KL(pi || pi*) before each step and after the last

    @property
    def final_kl(self) -> float:
        return self.kl[-1]


def _run_one(args: tuple) -> ToyRun:
    problem, name, data, kwargs = args
    torch.set_num_threads(1)  # tiny tensors: processes, not threads, use the cores
    return ToyRun(name, data, run_method(problem, METHODS[name], data, **kwargs))


def run_all(
    problem: TabularProblem, methods: list[str], *, steps: int, lr: float, samples: int | None = None,
    seed: int = 0, max_grad_norm: float | None = None, workers: int = 1,
    progress: Callable[[str], None] | None = None,
) -> list[ToyRun]:
    """Every requested method on every kind of data it supports, in `workers` processes."""
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise ValueError(f"unknown method {unknown[0]!r}; choose from {', '.join(METHODS)}")
    kwargs = dict(steps=steps, lr=lr, samples=samples, seed=seed, max_grad_norm=max_grad_norm)
    jobs = [(problem, name, data, kwargs) for name in methods for data in METHODS[name].data]
    if workers <= 1:
        runs = []
        for job in jobs:
            runs.append(_run_one(job))
            if progress is not None:
                progress(f"{job[1]} ({job[2]})")
        return runs
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {pool.submit(_run_one, job): i for i, job in enumerate(jobs)}
        done: dict[int, ToyRun] = {}
        for future in as_completed(futures):
            run = done.setdefault(futures[future], future.result())
            if progress is not None:
                progress(f"{run.method} ({run.data})")
    return [done[i] for i in range(len(jobs))]


def plot_runs(runs: list[ToyRun], path: str, title: str) -> None:
    """One panel per kind of data: KL(pi || pi*) against steps, log scale, one line per method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = [k for k in ("off-policy", "on-policy") if any(r.data == k for r in runs)]
    fig, axes = plt.subplots(1, len(kinds), figsize=(6.5 * len(kinds), 4.8), sharey=True, squeeze=False)
    for ax, kind in zip(axes[0], kinds):
        for run in (r for r in runs if r.data == kind):
            ax.plot(range(len(run.kl)), [max(k, 1e-12) for k in run.kl], label=run.method,
                    linestyle="-" if run.method.startswith(("spo", "agro")) else "--")
        ax.set_yscale("log")
        ax.set_title(f"{kind} data")
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel("KL(pi || pi*)")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
