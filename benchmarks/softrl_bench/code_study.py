"""`softrl bench study code`: the SPO paper's central comparison on code with headroom (tinycode-loops,
held-out combinations the reference rarely solves).

Arms, each generating the same samples per learner step (`prompts x samples_per_prompt`; a half arm's
batch is twice that, its other half from the store):
- spo-online; spo-half (the other half: the reference's passed samples); spo-human (the other half: the
  problems' known, human-written solutions);
- ppo and grpo, online;
- cispo-half: of the off-policy baselines (GRPO with TIS, CISPO, TOPR) the one with the best pass@1 at lag 1
  in `bench frontier`, on spo-half's data.

Each arm's learning rate is tuned on a tuning seed (the best final pass@1 over `lrs`, extended by up to
`extend` points of the 1-3-10 ladder past an edge where the best lies) and reported on seeds 0..N-1. The
study's pool (a store with the training prompts' Q0 from the reference's samples, and the known
solutions as rows of source "human") is made once; every run trains on its own copy of it
(`softrl_bench.frontier.run`: several at once with `jobs`), and its outcome with every evaluation is kept as one
JSON line in `kept` (`bench.frontier_runs`), so a study resumes on any machine from that file.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from softrl_bench import reference
from softrl_bench.frontier_runs import outcome
from softrl_bench.learning import base_overrides, best_lr, final, judged, grown_lrs, settings_of, slug, with_base
from softrl.config import ConfigError, RunConfig, config_from

TASK = "tinycode-loops"
TUNE_SEED = 100
SPO = {"algorithm": "spo"}
HALF = {"online": 0.5, "offline": 0.5}


@dataclass(frozen=True)
class Arm:
    objective: dict
    mix: dict
    sources: tuple[str, ...] = ("reference",)  # where the offline half comes from


ARMS: dict[str, Arm] = {
    "spo-online": Arm(SPO, {"online": 1.0}),
    "spo-half": Arm(SPO, HALF),
    "spo-human": Arm(SPO, HALF, ("human",)),
    "ppo": Arm({"algorithm": "ppo"}, {"online": 1.0}),
    "grpo": Arm({"algorithm": "grpo"}, {"online": 1.0}),
    "cispo-half": Arm({"algorithm": "cispo"}, HALF),
}


@dataclass(frozen=True)
class Settings:
    root: Path
    steps: int = 100
    prompts: int = 4
    samples_per_prompt: int = 4
    lrs: tuple[float, ...] = (3e-5, 1e-4, 3e-4)  # online SPO collapsed at 3e-4 already (pass@1 0.02)
    extend: int = 1  # ladder points each arm's grid may grow past the edge its best lies on
    seeds: int = 4
    eval_size: int = 100
    eval_every: int = 50
    eval_samples: int = 10  # so pass@10 is the share of problems solved (`distinct_per_problem`)
    task_size: int = 300
    extra: dict | None = None
    kept: Path | None = None  # the finished runs' outcomes, one JSON line each

    @property
    def where(self) -> Path:
        return self.root / slug(TASK)

    @property
    def pool(self) -> Path:
        return self.where / "pool"


# what the pool's rows depend on: a pool made with other values is refused, not silently reused
POOL_KEYS = ("model.path", "model.weights", "task.name", "task.size", "task.seed", "task.options", "q0.k", "beta",
             "seed")
QUICK = dict(steps=1, lrs=(1e-4, 1e-3), extend=0, seeds=2, eval_size=2, eval_every=1, eval_samples=10, task_size=6)


def reference_dir() -> Path:
    """The bootstrap reference's folder, named by its recipe's key (installed or built by `install_reference`): a
    run names it rather than "bootstrap", so outcomes kept from another recipe's reference are refused."""
    return reference.reference_dir(TASK)


def kept_reference(s: Settings) -> Path | None:
    """Where the reference that the kept outcomes were made with is kept, beside them."""
    return s.kept.parent / "study-code-reference" if s.kept is not None else None


def install_reference(s: Settings) -> Path:
    """The runs' reference in the cache (`reference_dir()`), the one kept beside the kept outcomes
    (`softrl_bench.reference.install`)."""
    return reference.install(TASK, kept_reference(s), s.kept)


def run_config(s: Settings, arm: str, lr: float, seed: int) -> RunConfig:
    """One run, RUNS/tinycode-loops/code/ARM-lrLR-sSEED, on its own copy of the pool beside it."""
    a = ARMS[arm]
    overrides = base_overrides(TASK, seed, s.steps, lr, s.prompts, s.samples_per_prompt, s.eval_size, s.eval_every,
                               s.eval_samples, s.extra)
    overrides.update({
        "model.path": str(reference_dir()),
        "name": (name := f"{arm}-lr{lr:g}-s{seed}"), "out_dir": str(s.where / "code"),
        "data.store": str(s.where / "code-stores" / name),
        "task.size": s.task_size, "data.mix": a.mix, "data.objective": a.objective,
        "data.offline_sources": list(a.sources),
        # on this task's long samples (200 new tokens, prompts of 130-180) the static cache measured 1.2-1.65x
        # (16 rows) to 3.8-4.0x (250 rows, the evaluation's) hf's speed: docs/MODELS.md
        "sampling.backend": "static",
    })
    return config_from(with_base(overrides, s.extra))


def arm_grid(s: Settings, arm: str) -> tuple[list[float], dict[float, float] | None]:
    """An arm's tuning grid as far as its finished runs decide it (`grown_lrs`), and their final pass@1 by lr
    once all finished."""
    def scores(lrs):
        done = {lr: c[-1]["pass@1"] for lr in lrs if (c := curve(s, run_config(s, arm, lr, TUNE_SEED)))}
        return done if len(done) == len(lrs) else None
    return grown_lrs(s.lrs, s.extend, scores)


def tuning_plan(s: Settings, arms: list[str]) -> list[RunConfig]:
    """The tuning runs every arm's grid needs so far; finished ones included (to be skipped). Rerun it after
    they finish: an arm whose best lies on an edge gets one more point there."""
    return [run_config(s, arm, lr, TUNE_SEED) for arm in arms for lr in arm_grid(s, arm)[0]]


def tune(s: Settings, arms: list[str], run) -> dict[str, dict]:
    """Every arm's tuning runs, in rounds (`run(configs)` trains a round's runs still to train): a round
    grows each grid whose best lies on an edge by one point, one way only (`grown_lrs`), so `1 + extend`
    rounds settle every grid. Returns `tuned_lrs`."""
    for _ in range(1 + s.extend):
        run(tuning_plan(s, arms))
    return tuned_lrs(s, arms)


def curve(s: Settings, config: RunConfig) -> list[dict] | None:
    """A finished run's evaluations (from its folder or the kept outcomes); None before it finished."""
    found = outcome(s.kept, config)
    return found["evals"] if found else None


def tuned_lrs(s: Settings, arms: list[str]) -> dict[str, dict]:
    """arm -> {lr: the best final pass@1 on the tuning seed (the lower lr on a tie), grid: lr -> pass@1}, for
    the arms whose grid is finished."""
    out = {}
    for arm in arms:
        _, grid = arm_grid(s, arm)
        if grid is not None and (best := best_lr(grid)) is not None:  # as `grown_lrs` chooses
            out[arm] = {"lr": best, "grid": grid}
    return out


def report_plan(s: Settings, chosen: dict[str, dict]) -> list[RunConfig]:
    """The report seeds at each arm's tuned learning rate, seeds outermost (a killed study has whole seeds)."""
    return [run_config(s, arm, c["lr"], seed) for seed in range(s.seeds) for arm, c in chosen.items()]


def collect(s: Settings, chosen: dict[str, dict]) -> dict[str, dict[int, list[dict]]]:
    """arm -> seed -> its curve, for the finished report runs."""
    out: dict[str, dict[int, list[dict]]] = {}
    for arm, c in chosen.items():
        for seed in range(s.seeds):
            found = curve(s, run_config(s, arm, c["lr"], seed))
            if found:
                out.setdefault(arm, {})[seed] = found
    return out


def distinct_per_solved(curve_: list[dict]) -> float:
    return curve_[-1]["distinct_correct_per_solved"]


def distinct_per_problem(curve_: list[dict]) -> float:
    """Distinct correct programs per held-out problem at the end (the issue's diversity): the count per
    solved problem times the share solved, which with 10 samples a problem is pass@10. Per solved problem
    alone would rate an arm lower for newly solving a hard problem once."""
    return curve_[-1]["distinct_correct_per_solved"] * curve_[-1]["pass@10"]


DIVERSITY = {"distinct per problem": distinct_per_problem, "distinct per solved": distinct_per_solved}


def diversity(runs: dict[str, dict[int, list[dict]]]) -> dict[str, dict[str, list[float]]]:
    """arm -> each `DIVERSITY` measure -> its final value per seed."""
    return {arm: {m: [f(c) for c in by_seed.values()] for m, f in DIVERSITY.items()} for arm, by_seed in runs.items()}


PAPER_MARGIN = 0.03  # the paper's claim: SPO's pass@10 at least PPO's + 0.03
CLAIMS = [  # (claim, a, b, compared, key, expected, margin)
    ("SPO's pass@10 beats PPO's by 0.03 (online)", "spo-online", "ppo", "final pass@10", "pass@10", "higher",
     PAPER_MARGIN),
    ("SPO's pass@10 beats PPO's by 0.03 (half-online)", "spo-half", "ppo", "final pass@10", "pass@10", "higher",
     PAPER_MARGIN),
    ("SPO's pass@10 beats GRPO's", "spo-online", "grpo", "final pass@10", "pass@10", "higher", 0.0),
    ("SPO's pass@1 is below PPO's (the paper's trade)", "spo-online", "ppo", "final pass@1", "pass@1",
     "lower|within 2 SE", 0.0),
    ("learning from the known solutions raises pass@1 at the same generation budget", "spo-human", "spo-online",
     "final pass@1", "pass@1", "higher", 0.0),
    ("the known solutions beat the reference's own passed samples as offline data", "spo-human", "spo-half",
     "final pass@1", "pass@1", "higher", 0.0),
    ("SPO keeps more distinct correct programs than PPO", "spo-online", "ppo", "distinct per problem",
     "distinct per problem", "higher", 0.0),
    ("SPO keeps more distinct correct programs than PPO", "spo-online", "ppo", "distinct per solved",
     "distinct per solved", "higher", 0.0),
    ("half-online SPO matches the best off-policy baseline on the same data (pass@1)", "spo-half", "cispo-half",
     "final pass@1", "pass@1", "higher|within 2 SE", 0.0),
    ("half-online SPO matches the best off-policy baseline on the same data (pass@10)", "spo-half", "cispo-half",
     "final pass@10", "pass@10", "higher|within 2 SE", 0.0),
]


def check_claims(runs: dict[str, dict[int, list[dict]]]) -> list[dict]:
    return [judged(runs, text, "SPO", a, b, compared, DIVERSITY.get(key) or final(key), expected, margin)
            for text, a, b, compared, key, expected, margin in CLAIMS]


def prepare_pool(s: Settings, progress=None) -> dict:
    """The store every run copies, once (a marker `pool.json` when whole): the training prompts with Q0
    from the reference's samples, and the known solutions of those prompts as source "human" (each
    checked against its tests), `progress(done, prompts)` while the reference samples. Returns rows per
    source. The reference is installed first (`install_reference`: the CLI does it before anything else)."""
    from softrl.assemble import RunParts, load_tasks
    from softrl.data import ExperienceStore
    from softrl.data.io import task_solutions

    first = run_config(s, "spo-online", s.lrs[0], TUNE_SEED)
    made_with = {k: v for k, v in settings_of(first).items() if k in POOL_KEYS}
    marker = s.pool / "pool.json"
    if marker.is_file():
        made = json.loads(marker.read_text())
        found = made.get("settings", {})
        # a marker that does not name the weights predates them: another build's rows may be in it
        differs = next((k for k in POOL_KEYS if found.get(k) != made_with.get(k)), None)
        if differs:
            raise ConfigError(f"{s.pool}: the pool was made with {differs}={found.get(differs)!r}, this study asks "
                              f"{made_with.get(differs)!r}: use another --runs directory, or delete the pool")
        return made["rows"]
    shutil.rmtree(s.pool, ignore_errors=True)  # one half made when killed
    config = first.model_copy(update={"data": first.data.model_copy(update={"store": str(s.pool)})})
    RunParts(config).q0(progress=progress)
    human = task_solutions(load_tasks(config)[0], "human")
    wrong = [r for r in human if not r.passed]
    if wrong:
        raise ValueError(f"{TASK}: a known solution of prompt {wrong[0].prompt_id} fails its own tests")
    store = ExperienceStore(s.pool)
    store.append(human)
    counts = {"reference": len(store.trajectories(source="reference", columns=["id"])), "human": len(human)}
    marker.write_text(json.dumps({"rows": counts, "settings": made_with}))
    return counts


def reference_card(config: RunConfig) -> dict:
    """How the runs' reference was made and how it does on held-out problems (its `softrl.json`), or {}."""
    from softrl.assemble import resolve_model

    card = Path(resolve_model(config)) / "softrl.json"
    return json.loads(card.read_text()) if card.is_file() else {}


def settings(quick: bool, seeds: int | None, steps: int | None, eval_size: int | None, eval_every: int | None,
             kept: Path | None, base: Path | None, runs: Path, report: Path) -> Settings:
    """The study's Settings from the command line's options (None: the study's default; `quick`: a smoke
    test's), its reference installed where the runs will look for it."""
    from softrl.config import read_settings

    extra = read_settings(base) if base is not None else None
    given = {k: v for k, v in (("seeds", seeds), ("steps", steps), ("eval_size", eval_size),
                               ("eval_every", eval_every)) if v is not None}
    s = Settings(runs, **{**(QUICK if quick else {}), **given}, extra=extra, kept=kept or report / "study-code-runs.jsonl")
    if run_config(s, "spo-online", s.lrs[0], TUNE_SEED).model.path == str(reference_dir()):
        install_reference(s)  # before any kept outcome is read: they name its weights
    return s


def study(s: Settings, jobs: int, report: Path, update, say) -> tuple[str, Path]:
    """SPO vs PPO vs GRPO on tinycode-loops: every arm's learning rate tuned, then the report seeds; the
    report written under `report`. Returns its table and the plot's path."""
    from softrl_bench.frontier import run_stage
    from softrl_bench.learning import aggregate
    from softrl_bench.report import code_markdown, plot_learning, write_report

    def pool(update) -> dict:
        return prepare_pool(s, progress=lambda done, total: update(
            done, total=total, description="pool: Q0 of the training prompts from the reference's samples"))

    chosen = tune(s, list(ARMS), lambda plan: run_stage(s, plan, jobs, update, "tuning", pool, say))
    run_stage(s, report_plan(s, chosen), jobs, update, "report seeds", pool, say)
    by_arm = collect(s, chosen)
    agg, claims, spread = aggregate(by_arm), check_claims(by_arm), diversity(by_arm)
    table = code_markdown(agg, claims, s.seeds, chosen, reference_card(run_config(s, "spo-online", s.lrs[0], TUNE_SEED)),
                          spread)
    write_report(report, "study-code", table, {"study": "code: tinycode-loops", "settings": {
        k: v for k, v in vars(s).items() if k != "root"}, "tuned": chosen, "curves": agg, "claims": claims,
        "diversity": spread, "runs": by_arm})
    png = plot_learning(agg, report / "study-code.png",
                        f"code (tinycode-loops, held-out combinations): {s.steps} steps x "
                        f"{s.prompts * s.samples_per_prompt} generated, tuned lr, {s.seeds} seed(s)")
    return table, png
