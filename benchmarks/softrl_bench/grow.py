"""`softrl bench study grow`: experience that grows across runs (the SPO paper's closing argument).

Per lineage (seeds 0, 1, 2), every run SPO half-online on countdown, each in its own store copied
from the store it starts from just before it runs (so a killed run's rows never feed its rerun):

- A (seed s) starts from the reference: its offline half is the reference's passed Q0 samples;
  it leaves its rollouts in its store.
- baseline (seed 100 + s): A's settings again, from the reference's samples only.
- B (seed 100 + s): offline data the reference's passed samples and A's passed rollouts (A's store).
- C (seed 100 + s): the reference's, A's and B's passed rollouts (B's store after B).
- B-only and C-only: B and C with the earlier runs' passed rollouts alone as offline data (no
  reference samples), C-only on B-only's store.

Reported: the samples each of baseline, B and C generates before an evaluation reaches A's final
pass@1 and pass@10, their pass@1 curves paired against the baseline's, and every store's size and
sources at the run's start (`ExperienceStore.stats`, what `softrl data stats` prints).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

from softrl_bench.learning import base_overrides, curves, final, finished, generated_prompts, judged, mean_over_training, with_base
from softrl.config import RunConfig, config_from

ROLES = ("A", "baseline", "B", "C", "B-only", "C-only")
# whose store a run's store copies; the -only runs learn from the earlier runs' successes alone
STARTS_FROM = {"A": "base", "baseline": "base", "B": "A", "C": "B", "B-only": "A", "C-only": "B-only"}
OFFLINE_SOURCES = {"A": ["reference"], "baseline": ["reference"], "B": ["reference", "online"],
                   "C": ["reference", "online"], "B-only": ["online"], "C-only": ["online"]}


def role_config(role: str, lineage: int, runs: Path, steps: int, later_steps: int, lr: float, rows: int,
                eval_size: int, eval_every: int, extra: dict | None = None) -> RunConfig:
    seed = lineage if role == "A" else 100 + lineage
    overrides = base_overrides("countdown", seed, steps if role == "A" else later_steps, lr, rows // 4, 4, eval_size,
                               eval_every, 20, extra)
    where = runs / "countdown" / "grow" / f"lineage{lineage}"
    half = {"online": 0.5, "offline": 0.5}
    overrides.update({
        "name": role, "out_dir": str(where), "data.store": str(where / f"{role}-store"),
        "data.mix": half, "data.objective": {"algorithm": "spo"},
        "sampling.prompts_per_step": generated_prompts(rows, half, 4),
        "data.offline_sources": OFFLINE_SOURCES[role],
    })
    return config_from(with_base(overrides, extra))


def base_store(runs: Path) -> Path:
    return runs / "countdown" / "grow" / "base-store"


def prepare_base(config: RunConfig, runs: Path, log: Callable[[str], None] = lambda m: None) -> Path:
    """The store every lineage starts from: Q0 and the reference's samples of the training prompts."""
    from softrl.assemble import RunParts

    target = base_store(runs)
    marker = target / "q0.done"
    if not marker.is_file():
        shutil.rmtree(target, ignore_errors=True)
        RunParts(config.model_copy(update={"data": config.data.model_copy(update={"store": str(target)})})).q0()
        marker.write_text("")
        log(f"base store: {target}")
    return target


def store_census(store: Path) -> dict:
    """`ExperienceStore.stats()` (each trajectory once, under the source that stored it first) with the
    online rows among them counted per run: the rows a run added that the store did not hold already."""
    from softrl.data import ExperienceStore

    s = ExperienceStore(store, create=False)
    rows = s.trajectories(columns=["source", "run_id", "passed"]).to_pylist()
    runs: dict[str, dict] = {}
    for row in (r for r in rows if r["source"] == "online"):
        r = runs.setdefault(row["run_id"], {"trajectories": 0, "passed": 0})
        r["trajectories"] += 1
        r["passed"] += bool(row["passed"])
    return {**s.stats(), "online_by_run": runs}


def starts_from(config: RunConfig, runs: Path) -> Path:
    """The store a run's store is a copy of (unchanged once its own run has finished)."""
    role = STARTS_FROM[config.name]
    return base_store(runs) if role == "base" else Path(config.data.store).parent / f"{role}-store"


def census_at_start(config: RunConfig, runs: Path) -> dict:
    """What the run's store held at its start, written once (`<ROLE>-store-at-start.json`)."""
    saved = Path(config.data.store).parent / f"{config.name}-store-at-start.json"
    if not saved.is_file():
        saved.write_text(json.dumps(store_census(starts_from(config, runs)), default=str))
    return json.loads(saved.read_text())


def plan(lineages: int, runs: Path, steps: int, later_steps: int, lr: float, rows: int, eval_size: int,
         eval_every: int, extra: dict | None = None) -> list[RunConfig]:
    """Every lineage's runs in the order they run (A first: the others start from its store)."""
    return [role_config(r, i, runs, steps, later_steps, lr, rows, eval_size, eval_every, extra)
            for i in range(lineages) for r in ROLES]


def run_lineages(configs: list[RunConfig], runs: Path, on_step=None, log=lambda m: None) -> None:
    """`plan`'s runs in turn; finished runs are kept, an unfinished one gets a fresh copy of its store."""
    from softrl_bench.learning import run_all

    def fresh_store(config: RunConfig) -> None:
        where = Path(config.data.store)
        shutil.rmtree(where, ignore_errors=True)
        shutil.copytree(starts_from(config, runs), where)
        census_at_start(config, runs)

    prepare_base(configs[0], runs, log)
    run_all(configs, on_step=on_step, log=log, before=fresh_store)


def first_reaching(curve: list[dict], key: str, target: float) -> float | None:
    """Samples generated when an evaluation first reaches `target` (None: never)."""
    return next((p["samples"] for p in curve if p[key] is not None and p[key] >= target - 1e-12), None)


def report(configs: list[RunConfig], runs: Path) -> dict:
    """lineage -> role -> curve and store census, the samples to A's targets, and the paired comparisons,
    for `plan`'s finished runs."""
    by_role: dict[str, dict[int, list[dict]]] = {}
    lineage_rows = []
    for i in range(len(configs) // len(ROLES)):
        row = {"lineage": i}
        for config in configs[i * len(ROLES):(i + 1) * len(ROLES)]:
            if not finished(config.run_dir):
                continue
            curve = curves(config.run_dir)
            by_role.setdefault(config.name, {})[i] = curve
            row[config.name] = {"curve": curve, "store_at_start": census_at_start(config, runs)}
        if "A" in row:
            targets = {k: row["A"]["curve"][-1][k] for k in ("pass@1", "pass@10")}
            row["targets"] = targets
            for role in ROLES[1:]:
                if role in row:
                    row[role]["samples_to"] = {k: first_reaching(row[role]["curve"], k, t) for k, t in targets.items()}
        lineage_rows.append(row)
    comparisons = []
    for a, b, expected in (("B", "baseline", "higher"), ("C", "baseline", "higher"), ("C", "B", "higher|within 2 SE"),
                           ("B-only", "baseline", "higher"), ("C-only", "baseline", "higher")):
        for compared, value in (("pass@1 averaged over the evaluations", mean_over_training("pass@1")),
                                ("final pass@1", final("pass@1")), ("final pass@10", final("pass@10"))):
            comparisons.append(judged(by_role, f"{a} (from {'A' if a.startswith('B') else 'A and B'}'s experience) "
                                      f"vs {b}", "SPO", a, b, compared, value, expected))
    return {"lineages": lineage_rows, "comparisons": comparisons, "runs": by_role}


def total_steps(configs: list[RunConfig]) -> int:
    return sum(c.optim.steps for c in configs)


def study(configs: list[RunConfig], runs: Path, out: Path, update, title: str) -> tuple[str, Path]:
    """Every lineage's runs (`plan`), under a progress bar of learner steps, and the report written under
    `out` (its plot titled `title`); returns its table and the plot's path."""
    from itertools import accumulate

    from softrl_bench.learning import aggregate
    from softrl_bench.report import grow_markdown, plot_learning, write_report

    starts = list(accumulate((c.optim.steps for c in configs), initial=0))  # steps done before each run
    run_lineages(configs, runs, on_step=lambda i, c, r: update(starts[i] + r["step"],
                                                               description=f"{Path(c.out_dir).name}: {c.name}"))
    result = report(configs, runs)
    table = grow_markdown(result)
    write_report(out, "study-grow", table, result)
    return table, plot_learning(aggregate(result["runs"]), out / "study-grow.png", title)
