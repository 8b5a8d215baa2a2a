"""`softrl bench study NAME`: the papers' claims `bench learning` does not cover, one study per name.

- loss (SPO figure 2a): terminal Q-regression with squared loss vs cross-entropy, and the
  sigmoid-warped advantage regression; the paper: squared learns fastest.
- reverse (figure 2b): reverse-Q (non-terminal) targets against the terminal loss, squared and
  cross-entropy; the paper: no effect with squared, clearly worse with cross-entropy.
- mc (figure 2c): a quarter of the batch from PTS-annotated trajectories with Monte-Carlo targets
  against the same quarter of PTS's plain rollouts under the terminal loss; the paper: MC targets
  help, the rollouts alone do not.
- code (SPO's domain) has its own module, `softrl_bench.code_study` (tuned learning rates, more arms).
- agro (AGRO): on-policy AGRO against RLOO at the beta and group sizes the toy sweep
  (`bench.agro_sweep`) says it learns at.
- grow: experience that grows across runs, `softrl_bench.grow`.

The SPO ablations run in the paper's ablation setting, half online: half of every batch generated,
half the reference's passed samples from the store. Every study's runs share one store (Q0 once) and
an arm's runs are shared by the studies naming it, so `loss` and `reverse` run terminal-squared
and terminal-bce once. A finished run is reused only with the same settings (`run_all`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from softrl_bench.learning import base_overrides, final, generated_prompts, judged, mean_over_training, slug, with_base
from softrl.config import RunConfig, config_from

HALF = {"online": 0.5, "offline": 0.5}
QUARTERS = {"online": 0.5, "offline": 0.25}


def spo(**options) -> dict:
    return {"algorithm": "spo", **options}


# arm -> its overrides on top of the study's base; one definition per arm, so studies share its runs
ARMS: dict[str, dict] = {
    "terminal-bce": {"data.mix": HALF, "data.objective": spo(terminal=1.0, loss="bce")},
    "terminal-squared": {"data.mix": HALF, "data.objective": spo(terminal=1.0, loss="squared")},
    "advantage-bce": {"data.mix": HALF, "data.objective": spo(terminal=0.0, advantage=1.0)},
    "reverse-squared": {"data.mix": HALF, "data.objective": spo(terminal=0.0, reverse=1.0, loss="squared")},
    "reverse-bce": {"data.mix": HALF, "data.objective": spo(terminal=0.0, reverse=1.0, loss="bce")},
    # a quarter of the batch: PTS-annotated rows regressed on their MC targets (and their reward) ...
    "mc-targets": {"data.mix": {**QUARTERS, "mc": 0.25}, "data.objective": spo(),
                   "data.objectives": {"mc": spo(terminal=1.0, mc=1.0)}},
    # ... or PTS's own rollouts, passed or not, under the terminal loss
    "pts-rollouts": {"data.mix": {**QUARTERS, "pts": 0.25}, "data.objective": spo()},
}
# on-policy AGRO and RLOO at (beta, samples per prompt, lr): across the toy's border (`bench.agro_sweep`:
# it collapses at beta <= 0.2 and converges at 0.5 and 1 whatever the group); beta 1/ln(1e5) with
# groups of 4 is `bench learning`'s agro-on
AGRO_SETTINGS = [(0.2, 8, 1e-4), (0.5, 8, 1e-4), (1.0, 8, 1e-4)]


def agro_arm(algorithm: str, beta: float, group: int, lr: float) -> str:
    return f"{algorithm}-b{beta:g}-g{group}-lr{lr:g}"


ARMS.update({agro_arm(algorithm, beta, group, lr): {
    "data.mix": {"online": 1.0}, "data.objective": {"algorithm": algorithm}, "beta": beta,
    "sampling.samples_per_prompt": group, "optim.lr": lr}
    for beta, group, lr in AGRO_SETTINGS for algorithm in ("agro-on", "rloo")})

AUC = mean_over_training("pass@1")


@dataclass(frozen=True)
class Claim:
    text: str
    paper: str
    a: str
    b: str
    compared: str
    value: Callable[[list[dict]], float]
    expected: str  # verdicts of `paired` that reproduce it, "|"-separated


@dataclass(frozen=True)
class Study:
    name: str
    title: str
    arms: tuple[str, ...]
    claims: tuple[Claim, ...]
    task: str = "countdown"
    seeds: int = 3
    steps: int = 120
    lr: float = 2e-4
    rows: int = 32  # the batch of every learner step; its online share is generated
    eval_size: int = 80
    eval_every: int = 20
    settings: dict = field(default_factory=dict)  # overrides every arm of this study shares


def _faster(a: str, b: str, paper: str, text: str, expected: str = "higher") -> tuple[Claim, Claim]:
    """`a` against `b`: pass@1 averaged over the evaluations (the speed), and the final pass@1."""
    return (Claim(text, paper, a, b, "pass@1 averaged over the evaluations", AUC, expected),
            Claim(text, paper, a, b, "final pass@1", final("pass@1"), expected))


STUDIES: dict[str, Study] = {s.name: s for s in [
    Study("loss", "SPO figure 2(a): the loss", ("terminal-squared", "terminal-bce", "advantage-bce"), (
        *_faster("terminal-squared", "terminal-bce", "SPO", "squared terminal loss learns faster than cross-entropy"),
        *_faster("terminal-squared", "advantage-bce", "SPO",
                 "squared terminal loss learns faster than the sigmoid-warped advantage regression"))),
    Study("reverse", "SPO figure 2(b): terminal vs non-terminal (reverse-Q) targets",
          ("terminal-squared", "reverse-squared", "terminal-bce", "reverse-bce"), (
              *_faster("reverse-squared", "terminal-squared", "SPO", "reverse-Q targets change nothing with squared loss",
                       "within 2 SE"),
              *_faster("reverse-bce", "terminal-bce", "SPO", "reverse-Q targets hurt with cross-entropy", "lower"))),
    Study("mc", "SPO figure 2(c): Monte-Carlo targets from PTS", ("terminal-bce", "mc-targets", "pts-rollouts"), (
        *_faster("mc-targets", "terminal-bce", "SPO", "MC targets at PTS's prefixes help"),
        *_faster("pts-rollouts", "terminal-bce", "SPO", "PTS's rollouts under the terminal loss alone do not help",
                 "within 2 SE"))),
    Study("agro", "AGRO on-policy: where it learns", tuple(
        agro_arm(a, *s) for s in AGRO_SETTINGS for a in ("agro-on", "rloo")), tuple(
        Claim(f"on-policy AGRO learns faster per epoch than RLOO (beta {b:g}, group {g}, lr {lr:g})", "AGRO",
              agro_arm("agro-on", b, g, lr), agro_arm("rloo", b, g, lr), "pass@1 averaged over the evaluations",
              AUC, "higher|within 2 SE") for b, g, lr in AGRO_SETTINGS), lr=1e-4),
]}


def study_config(study: Study, arm: str, seed: int, runs: Path, steps: int, lr: float, rows: int, eval_size: int,
                 eval_every: int, extra: dict | None = None) -> RunConfig:
    """The run of `arm` with `seed` under RUNS/TASK/ARM-sSEED, all of a task's runs in RUNS/TASK/store.
    Every learner step trains on `rows` rows, of which the online share is generated."""
    arm_settings = {**study.settings, **ARMS[arm]}
    group = arm_settings.get("sampling.samples_per_prompt", 4)
    overrides = base_overrides(study.task, seed, steps, lr, max(1, rows // group), group, eval_size, eval_every, 20,
                               extra)
    overrides.update({"name": f"{arm}-s{seed}", "out_dir": str(runs / slug(study.task)),
                      "data.store": str(runs / slug(study.task) / "store"), **arm_settings})
    overrides["sampling.prompts_per_step"] = generated_prompts(rows, overrides["data.mix"], group)
    return config_from(with_base(overrides, extra))


def plan(study: Study, seeds: int, runs: Path, steps: int, lr: float, rows: int, eval_size: int,
         eval_every: int, extra: dict | None = None) -> list[RunConfig]:
    """The study's runs, seeds outermost (a killed study has whole seeds to report)."""
    return [study_config(study, arm, seed, runs, steps, lr, rows, eval_size, eval_every, extra)
            for seed in range(seeds) for arm in study.arms]


def check_claims(study: Study, runs: dict[str, dict[int, list[dict]]]) -> list[dict]:
    """Each claim as a paired difference over seeds, in `softrl_bench.report.markdown`'s format."""
    return [judged(runs, c.text, c.paper, c.a, c.b, c.compared, c.value, c.expected) for c in study.claims]


PTS_LIMIT, PTS_K = 300, 10  # trajectories annotated for the mc study, rollouts per visited prefix (the paper: 10)


def ensure_q0(config: RunConfig) -> None:
    """Q0 of the training prompts in the run's store (what the first run would do), so that a study's
    preparation (PTS) finds the reference's samples there."""
    from softrl.assemble import RunParts

    RunParts(config).q0()


def prepare(study: Study, config: RunConfig, progress: Callable[[int, int], None] | None = None) -> dict:
    """What a study needs in the store before its runs: for `mc`, PTS over `PTS_LIMIT` of the reference's
    passed samples (MC targets and PTS's rollouts, once; a killed annotation resumes)."""
    if study.name != "mc":
        return {}
    store_dir = Path(config.data.store)
    marker = store_dir.parent / f"pts-{PTS_LIMIT}-k{PTS_K}.json"
    if marker.is_file():
        return json.loads(marker.read_text())
    from softrl.annotate.pts import annotate_store
    from softrl.assemble import task_model
    from softrl.data import ExperienceStore

    ensure_q0(config)
    s = task_model(config.task.name, config.model.path, size=config.task.size, seed=config.task.seed, source="pts",
                   temperature=1.0, dtype=config.model.dtype, device=config.model.device)
    store = ExperienceStore(store_dir)
    done = sum(1 for r in store.trajectories(source="reference", passed=True, columns=["mc_targets"]).to_pylist()
               if r["mc_targets"])  # by a killed earlier preparation
    results = [] if done >= PTS_LIMIT else annotate_store(
        s.spec, store, s.encode_prompt, s.encode_response, s.model_id, PTS_K, 0.2, seed=config.seed,
        limit=PTS_LIMIT - done, sources=["reference"], progress=progress)
    summary = {"annotated": done + len(results),  # pivotal tokens of this preparation's searches only
               "pivotal_tokens": sum(len(r.pivots) for r in results),
               "rollouts": len(store.trajectories(source="pts", columns=["id"]))}
    marker.write_text(json.dumps(summary))
    return summary
