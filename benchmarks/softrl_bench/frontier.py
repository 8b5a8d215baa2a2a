"""`softrl bench frontier`: learning from any data, compared fairly. Every method is tuned on its own
grid (learning rate x its strength knob) on tuning seeds, then run on report seeds at its best point
and at the point nearest a KL common to all methods; per regime, pass@1 against KL(pi || pi0) with
each method's frontier, pass@k (k = 1..20) at matched KL, and each method's best pass@1 and its KL.

Regimes (the data each run learns from):
- lagL: online rows only, each exactly L learner updates stale (`runtime.policy_lag`);
- half: half of every batch online (lag 1), half from a pool of the reference's samples, an earlier
  run's rollouts and the task's known solutions (as human data, mu unknown);
- offline: only a fixed data set made by another policy (the earlier run's rollouts, mu known);
- human: only the task's known solutions (mu unknown, all correct).

Every run gets its own copy of the pool's store (its own rows never join another run's data), made
before it starts and removed when it ends. The pool is anydata's (`prepare_pool`).
"""

from __future__ import annotations

import math
import shutil
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from softrl.algorithms.common import SPO_BETA
from softrl_bench import reference
from softrl_bench.anydata import POOL_SOURCES, prepare_pool
from softrl_bench.frontier_runs import EVAL_SAMPLES, average, keep, key, mean, outcome, to_target
from softrl_bench.learning import SPO, base_overrides, grown_grid, run_all, slug, with_base
from softrl_bench.start_eval import SharedStartEval
from softrl.config import RunConfig, config_from

LRS = (3e-5, 1e-4, 3e-4)  # 3e-5: the baselines' grids reach no KL as low as SPO's without it; 1e-3 is reached by
# growing a grid whose best lies at 3e-4 (`method_grid`): at lag 1 it was no method's best and 6 of 10 collapsed there
EARLIER_LR = 2e-4  # the earlier run whose rollouts are the "other policy's" data: anydata's learning rate
TUNE_SEED = 100  # tuning seeds are 100, 101, ...; report seeds 0, 1, ...


@dataclass(frozen=True)
class Method:
    objective: dict
    strengths: tuple[dict, ...] = ({},)  # the strength knob's grid: config overrides, one dict a value
    # the knob's next rungs past its first and past its last value, nearest first (`Settings.extend_strength`:
    # a grid grows there where its best point lies on that edge); a knob that is no ladder has none
    past: tuple[tuple[dict, ...], tuple[dict, ...]] = ((), ())

    def label(self, strength: dict) -> str:
        return ",".join(f"{k.rsplit('.', 1)[-1]}={v:g}" for k, v in strength.items()) or "default"


def knob(key: str, *values: float) -> tuple[dict, ...]:
    return tuple({key: v} for v in values)


def rungs(key: str, below: float, above: float | None) -> tuple[tuple[dict, ...], tuple[dict, ...]]:
    """A knob's next rung each way (`Method.past`); None: no rung that way."""
    return knob(key, below), knob(key, above) if above is not None else ()


SPO_IS = {**SPO, "is_correction": "sequence_truncate"}  # its stale rows weighed by their truncated ratio pi/mu
BETAS = knob("beta", round(SPO_BETA, 4), 0.25)  # the regularisation to pi0 (to mu for OAPL)
KL_COEFS = knob("beta", 0.01, 0.1)  # the PPO family's k3 penalty
# a moving reference's knob: learner steps between moves. 10: the first tuning grid's best points at lags 1 and
# 64 lay on its edge, 25
INTERVALS = knob("data.objective.reference_update.every", 10, 25, 100)
INTERVAL_RUNGS = rungs("data.objective.reference_update.every", 5, None)  # past 100: one move in 300 steps, or none
# a moving average's knob, tau: an anchor about 1 / (1 - tau) steps behind, the intervals' 10, 25 and 100 at
# 0.9, 0.96 and 0.99. 0.8 (5 steps): the best points at lags 1 and 64 and half online lay on the edge at 0.9;
# 0.93: at lag 64 the two tuning seeds put 0.9 and 0.96 within 0.01 of each other
TAUS = knob("data.objective.reference_update.ema", 0.8, 0.9, 0.93, 0.96, 0.99)
# one rung further each way (`--extend-strength`): an anchor about 3 steps behind, and one about 333 (a 300-step
# run's whole length); the other knobs a rung of their own spacing on, within the option's range
TAU_RUNGS = rungs("data.objective.reference_update.ema", 0.7, 0.997)
BETA_RUNGS = rungs("beta", 0.03, 0.75)
KL_RUNGS = rungs("beta", 0.001, 1.0)
METHODS: dict[str, Method] = {
    "spo": Method(SPO, BETAS, BETA_RUNGS),
    # a candidate fix the diagnosis tests (docs/BENCHMARKS.md): stale rows weighed by their truncated ratio pi/mu
    "spo-is": Method(SPO_IS, BETAS, BETA_RUNGS),
    # the paper's other terminal loss: BCE's push on a failed row fades as pi/pi0 falls, squared's does not
    "spo-sq": Method({**SPO, "loss": "squared"}, BETAS, BETA_RUNGS),
    "agro-off": Method({"algorithm": "agro-off"}, BETAS, BETA_RUNGS),
    "oapl": Method({"algorithm": "oapl"}, BETAS, BETA_RUNGS),
    "kl-pg": Method({"algorithm": "kl-pg"}, BETAS, BETA_RUNGS),
    "grpo-tis": Method({"algorithm": "grpo", "is_correction": "token_truncate"}, KL_COEFS, KL_RUNGS),
    "decoupled-ppo": Method({"algorithm": "decoupled-ppo"}, KL_COEFS, KL_RUNGS),
    "m2po": Method({"algorithm": "m2po"}, knob("data.objective.tau", 0.04, 0.2),
                   rungs("data.objective.tau", 0.008, 1.0)),
    "gspo": Method({"algorithm": "gspo"}, ({"data.objective.clip_low": 3e-4, "data.objective.clip_high": 4e-4},
                                           {"data.objective.clip_low": 0.2, "data.objective.clip_high": 0.28})),
    "cispo": Method({"algorithm": "cispo"}, knob("data.objective.cap", 2.0, 5.0),
                    rungs("data.objective.cap", 1.25, 10.0)),
    "topr": Method({"algorithm": "topr"}),  # no strength knob: its grid is the learning rate alone
    # SPO with a reference that moves (issue 51): its knob is the interval, at SPO's beta; Q0 of each new
    # reference from the run's own samples, so only where the run generates
    "spo-moving": Method(SPO, INTERVALS, INTERVAL_RUNGS),
    # SPO anchored to each row's own sampler (issue 51): at lag L the policy that made the data, not a snapshot
    # the data never saw; Q0 from the row's own group, no importance weights. Its knob is beta, as SPO's
    "spo-behavior": Method({**SPO, "reference_update": {"behavior": True}}, BETAS, BETA_RUNGS),
    # spo-moving with its stale rows weighed by their truncated sequence ratio pi/mu, as spo-is: at lag 64 a short
    # interval ran away without it (docs/BENCHMARKS.md, "A moving reference on stale data")
    "spo-moving-is": Method(SPO_IS, INTERVALS, INTERVAL_RUNGS),
    # AGRO with a reference that moves (issue 51): its consistency needs no Q0, so a new reference is used
    # at once, with no estimate from samples of policies older than it; its knob is the interval, at beta 1/ln 1e5
    # (agro-off's best at every lag and half online)
    "agro-moving": Method({"algorithm": "agro-off"}, INTERVALS, INTERVAL_RUNGS),
    # spo-moving-is with a reference that trails the policy as a moving average of its weights (issue 51's
    # `{ema: tau}`), with no jump at a move: after a snapshot every stale row's target moves at once
    "spo-ema-is": Method(SPO_IS, TAUS, TAU_RUNGS),
    # agro-moving's reference as a moving average: AGRO needs no Q0, so this tells apart what spo-ema-is's
    # lagging Q0 estimate costs from what the trailing anchor gives; no importance weights (AGRO has none): at
    # lag 64 its faster averages ran away as agro-moving's short intervals did (docs/BENCHMARKS.md)
    "agro-ema": Method({"algorithm": "agro-off"}, TAUS, TAU_RUNGS),
    # spo-ema-is weighing only its failed rows by pi/mu, a solved row at weight 1 as TOPR keeps its positive
    # rows: on spo-moving-is at lag 64 that kept pass@10 0.07 higher at the same pass@1 (docs/BENCHMARKS.md,
    # "A reference that trails the policy"), and pass@10 is what spo-ema-is lacks there
    "spo-ema-failed": Method({**SPO_IS, "is_rows": "failed"}, TAUS, TAU_RUNGS),
}
# set against every other method's frontier (OAPL: SPO's relative)
OURS = ("spo", "spo-is", "spo-sq", "agro-off", "oapl", "spo-moving", "spo-behavior", "spo-moving-is", "agro-moving",
        "spo-ema-is", "agro-ema", "spo-ema-failed")
STALE = ("spo", "spo-is", "spo-sq", "agro-off", "oapl", "grpo-tis", "decoupled-ppo", "m2po", "gspo", "cispo", "topr")


@dataclass(frozen=True)
class Regime:
    name: str
    mix: dict
    methods: tuple[str, ...]
    lag: int = 1
    sources: tuple[str, ...] = ()  # the pool's sources it learns from (none: online only)
    eval_every: int | None = None  # evaluate at least this often (learner steps); see target_grid

    @property
    def generates(self) -> bool:
        return self.mix.get("online", 0) > 0


LAGS = (1, 4, 16, 64, 256)
MOVING_LAGS = (1, 64, 256)  # where issue 51 measures the moving reference
# a reference other than pi0 (issue 51)
MOVING = ("spo-moving", "spo-behavior", "spo-moving-is", "agro-moving", "spo-ema-is", "agro-ema", "spo-ema-failed")
REPLAY_METHODS = ("spo-moving", "agro-off", "grpo-tis")  # softrl's best two at lag 1 and the most lag-robust baseline
REGIMES: dict[str, Regime] = {
    **{f"lag{k}": Regime(f"lag{k}", {"online": 1.0}, STALE + (MOVING if k in MOVING_LAGS else ()), lag=k)
       for k in LAGS},
    "half": Regime("half", {"online": 0.5, "offline": 0.5}, (*STALE, *MOVING), sources=tuple(POOL_SOURCES)),
    # replay (issue 51): the same batch with half of it generated and half this run's earlier groups (FIFO,
    # each replayed once), against all of it generated (`fresh`: lag 1 evaluated as often); generated samples
    # to reach the reference's pass@1 + frontier_runs.TARGET_GAIN, read between the evaluations of `target_grid`
    "fresh": Regime("fresh", {"online": 1.0}, REPLAY_METHODS, eval_every=25),
    "replay": Regime("replay", {"online": 0.5, "replay": 0.5}, REPLAY_METHODS, eval_every=25),
    "offline": Regime("offline", {"offline": 1.0}, (*STALE, "kl-pg"), lag=0, sources=("earlier",)),
    # one known solution a prompt: AGRO, KL-PG and the group methods have no group to compare, nor mu to weigh
    "human": Regime("human", {"offline": 1.0}, ("spo", "spo-sq", "topr"), lag=0, sources=("human",)),
}


@dataclass(frozen=True)
class Settings:
    """What every run of one benchmark shares."""

    root: Path
    task: str = "countdown"
    steps: int = 300
    prompts: int = 8
    samples_per_prompt: int = 4
    eval_size: int = 50
    eval_every: int = 100
    earlier_steps: int = 100
    lrs: tuple[float, ...] = LRS
    extend: int = 1  # ladder points a method's learning rates may grow past the edge its best point lies on
    extend_strength: int = 0  # rungs of `Method.past` its strengths may grow so (0: the grids as declared)
    extra: dict = field(default_factory=dict)
    kept: Path | None = None  # the finished runs' outcomes, one JSON line each (frontier_runs.keep)

    @property
    def where(self) -> Path:
        return self.root / slug(self.task)

    def pool_of(self, _config: RunConfig) -> Path:
        """The pool every run copies: one for all (the code study's arms may differ)."""
        return self.where / "pool"


def kept_reference(s: Settings) -> Path | None:
    """Where the reference the kept outcomes were made with is kept: beside them (frontier-runs.jsonl:
    frontier-reference/)."""
    return s.kept.with_name(s.kept.stem.removesuffix("-runs") + "-reference") if s.kept is not None else None


def install_reference(s: Settings) -> None:
    """The runs' bootstrap reference, the one kept beside the kept outcomes (`softrl_bench.reference.install`),
    before any outcome is read: they name its weights. Nothing for a model that is not a bootstrap reference."""
    from softrl.assemble import bootstrap_task

    probe = run_config(s, REGIMES["lag1"], "spo", s.lrs[0], {}, TUNE_SEED)
    task = bootstrap_task(probe.model.path, probe.task.name)
    if task is not None:
        reference.install(task, kept_reference(s), s.kept)


def point_name(method: str, lr: float, strength: dict) -> str:
    return f"{method}_lr{lr:g}_{METHODS[method].label(strength)}"


@dataclass(frozen=True)
class Grid:
    """A method's grid in one regime as far as its finished tuning runs decide it (`method_grid`)."""
    lrs: tuple[float, ...]
    strengths: tuple[dict, ...]

    def points(self) -> list[tuple[float, dict]]:
        return [(lr, s) for lr in self.lrs for s in self.strengths]


def eval_steps(s: Settings, regime: Regime) -> int:
    return min(regime.eval_every or s.eval_every, s.eval_every)


def target_grid(s: Settings, regime: Regime) -> int | None:
    """Generated samples between the evaluations that samples to the target are read on, in a regime of
    its own evaluation schedule (replay's pair): those of an all-generated run. A run generating half its
    rows evaluates twice as often in samples, and a straight line over a finer grid of a concave curve
    reaches the target sooner (replay's reading was so favoured for two of three methods). Other
    regimes read every evaluation."""
    return s.prompts * s.samples_per_prompt * eval_steps(s, regime) if regime.eval_every else None


def run_config(s: Settings, regime: Regime, method: str, lr: float, strength: dict, seed: int) -> RunConfig:
    """One run, under ROOT/TASK/frontier/REGIME/POINT-sSEED, with its private store beside it."""
    overrides = base_overrides(s.task, seed, s.steps, lr, s.prompts, s.samples_per_prompt, s.eval_size,
                               eval_steps(s, regime), EVAL_SAMPLES, s.extra or None)
    name = f"{point_name(method, lr, strength)}-s{seed}"
    overrides.update({
        "name": name, "out_dir": str(s.where / "frontier" / regime.name),
        "data.store": str(s.where / "frontier-stores" / regime.name / name), "data.mix": regime.mix,
        "data.objective": METHODS[method].objective, "runtime.policy_lag": regime.lag if regime.generates else 0,
        "data.offline_sources": list(regime.sources or ["reference"]), "data.offline_passed_only": False,
    })
    if regime.generates and regime.mix["online"] < 1:  # the same batch of rows, the online share generated
        overrides["sampling.prompts_per_step"] = max(1, int(s.prompts * regime.mix["online"]))  # half: prompts // 2
    return config_from({**with_base(overrides, s.extra), **strength})


def check_names(regimes: list[str], methods: list[str] | None) -> None:
    for name in regimes:
        if name not in REGIMES:
            raise ValueError(f"--regimes: unknown regime {name!r} (use {', '.join(REGIMES)})")
    for name in methods or []:
        if name not in METHODS:
            raise ValueError(f"--methods: unknown method {name!r} (use {', '.join(METHODS)})")
        if not any(name in REGIMES[r].methods for r in regimes):
            raise ValueError(f"--methods: {name!r} runs in none of the regimes asked ({', '.join(regimes)})")


def tuning_outcomes(s: Settings, regime: Regime, method: str, lr: float, strength: dict,
                    tune_seeds: int) -> list[dict | None]:
    return [outcome(s.kept, run_config(s, regime, method, lr, strength, TUNE_SEED + k)) for k in range(tune_seeds)]


def method_grid(s: Settings, regime: Regime, method: str, tune_seeds: int) -> Grid:
    """A method's grid in a regime as far as its finished tuning runs decide it (`grown_grid`: the learning
    rates grown past an edge where its best point lies, and its strengths by `Method.past`, up to
    `s.extend_strength` rungs each way), each point scored by its pass@1 averaged over the tuning seeds
    (finite points only, as `tuned` chooses)."""
    m = METHODS[method]

    def score(lr: float, strength: dict) -> float | None:
        done = tuning_outcomes(s, regime, method, lr, strength, tune_seeds)
        if not all(done):
            return None
        point = average(done)
        return point["pass@1"] if finite([point]) else math.nan
    lrs, strengths, _ = grown_grid(s.lrs, m.strengths, m.past, s.extend, s.extend_strength, score)
    return Grid(tuple(lrs), tuple(strengths))


def tuning_plan(s: Settings, regimes: list[str], methods: list[str] | None, tune_seeds: int) -> list[RunConfig]:
    """Every grid point of every method of every regime, on the tuning seeds (seeds outermost), as far as
    the finished runs decide the grids (`method_grid`); finished runs included, to be skipped. Rerun it after
    they finish: a method whose best lies on an edge of its learning rates (or strengths) gets one more there."""
    check_names(regimes, methods)
    return [run_config(s, REGIMES[r], m, lr, strength, TUNE_SEED + k) for k in range(tune_seeds) for r in regimes
            for m in REGIMES[r].methods if methods is None or m in methods
            for lr, strength in method_grid(s, REGIMES[r], m, tune_seeds).points()]


def tuning_rounds(s: Settings) -> int:
    """Rounds of `tuning_plan` that settle every grid (`method_grid`): the learning rates alone grow one way
    (a new rate that is not the best leaves the best inside), up to `extend` rounds; each grown strength may
    move the best to a rate's edge, and the rates grow again."""
    return (1 + s.extend) * (1 + 2 * s.extend_strength)


def finite(points: list[dict]) -> list[dict]:
    return [p for p in points if math.isfinite(p["kl"]) and math.isfinite(p["pass@1"])]


def frontier(points: list[dict]) -> list[dict]:
    """The points no other point beats at lower or equal KL: pass@1 rising with KL, by KL."""
    best, out = -math.inf, []
    for p in sorted(finite(points), key=lambda p: (p["kl"], -p["pass@1"])):
        if p["pass@1"] > best:
            out.append(p)
            best = p["pass@1"]
    return out


def at_kl(front: list[dict], kl: float) -> float:
    """The frontier's pass@1 at `kl` (the best pass@1 reached at KL <= kl; nan below its first point)."""
    reached = [p["pass@1"] for p in front if p["kl"] <= kl]
    return max(reached) if reached else math.nan


def tuned(grid_points: dict[str, list[dict]]) -> tuple[dict[str, dict], float, dict[str, dict]]:
    """From each method's tuning-grid points: its best (highest pass@1, averaged over tuning seeds; of
    equal ones the one at the lowest KL), the common KL (the median of the best points' KLs) and each
    method's point nearest to it, on a log scale (KLs span orders of magnitude, and a collapsed run's is
    in the hundreds)."""
    usable = {m: finite(points) for m, points in grid_points.items() if finite(points)}
    # pass@1 is a mean of whole counts: equal ones differ only in their last bits, which must not choose
    best = {m: max(points, key=lambda p: (round(p["pass@1"], 9), -p["kl"])) for m, points in usable.items()}
    target = statistics.median(p["kl"] for p in best.values()) if best else math.nan

    def distance(p: dict) -> float:
        return abs(math.log(max(p["kl"], 1e-6)) - math.log(max(target, 1e-6)))

    matched = {m: min(points, key=distance) for m, points in usable.items()}
    return best, target, matched


def prepare(s: Settings, on_step=None, log=lambda m: None) -> dict:
    """The pool's store (the earlier run first, once), which every run's private store copies."""
    return prepare_pool(s.task, s.root, s.earlier_steps, EARLIER_LR, s.prompts, s.samples_per_prompt, s.extra or None,
                        on_step=on_step, log=log)


def copy_pool(pool: Path, config: RunConfig) -> None:
    """A run's store: a fresh copy of the pool's."""
    store = Path(config.data.store)
    shutil.rmtree(store, ignore_errors=True)
    store.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(pool, store)


def remove_store(config: RunConfig) -> None:
    shutil.rmtree(config.data.store, ignore_errors=True)


def _run_alone(config: RunConfig, pool: Path, threads: int, shared: SharedStartEval) -> str:
    import torch

    torch.set_num_threads(threads)
    run_all([config], before=lambda c: copy_pool(pool, c), after=remove_store, shared=shared)
    return config.name


def pending(s: Settings, configs: list[RunConfig]) -> list[RunConfig]:
    """The runs still to train (a run finished in its folder is kept on the way)."""
    for config in configs:
        keep(s.kept, config)
    return [c for c in configs if outcome(s.kept, c) is None]


def run(configs: list[RunConfig], s: Settings, jobs: int = 1, on_step=None, on_done=None) -> None:
    """Train `configs` (finished ones are kept): in this process with `on_step(i, config, record)`, or
    `jobs` processes at once, each with its share of the CPU threads, `on_done(config)` as each ends.
    On 2 cores two one-thread runs make about 1.5x the samples of one two-thread run (0.24 vs 0.18 s
    a step of a lagged run each): the benchmark's runs are small."""
    shared = SharedStartEval(s.where / "start-evals")
    configs = pending(s, configs)

    def finished(config: RunConfig) -> None:
        remove_store(config)
        keep(s.kept, config)

    if jobs <= 1:
        run_all(configs, on_step=on_step, before=lambda c: copy_pool(s.pool_of(c), c), after=finished, shared=shared)
        return
    import multiprocessing
    import os
    from concurrent.futures import ProcessPoolExecutor, as_completed

    threads = max(1, (os.cpu_count() or 1) // jobs)
    with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as ex:
        futures = {ex.submit(_run_alone, c, s.pool_of(c), threads, shared): c for c in configs}
        try:
            for future in as_completed(futures):
                future.result()
                keep(s.kept, futures[future])
                if on_done is not None:
                    on_done(futures[future])
        except BaseException:  # a failed run (or Ctrl-C) ends the stage now, not after every queued run
            ex.shutdown(wait=False, cancel_futures=True)
            raise


def methods_of(regime: Regime, methods: list[str] | None) -> list[str]:
    return [m for m in regime.methods if methods is None or m in methods]


def regime_grids(s: Settings, regime: Regime, methods: list[str] | None, tune_seeds: int) -> dict[str, Grid]:
    """method -> its grid in `regime` so far (`method_grid`)."""
    return {m: method_grid(s, regime, m, tune_seeds) for m in methods_of(regime, methods)}


def grid_points(s: Settings, regime: Regime, grids: dict[str, Grid], tune_seeds: int) -> dict[str, list[dict]]:
    """method -> its grid points (see `method_grid`) that finished on every tuning seed,
    averaged over them."""
    out: dict[str, list[dict]] = {}
    for m, g in grids.items():
        for lr, strength in g.points():
            done = tuning_outcomes(s, regime, m, lr, strength, tune_seeds)
            if all(done):
                out.setdefault(m, []).append({"point": point_name(m, lr, strength), "lr": lr, "strength": strength,
                                              **average(done, target_grid(s, regime))})
    return out


def report_plan(s: Settings, regime: Regime, chosen: dict[str, list[dict]], seeds: int) -> list[RunConfig]:
    """The report seeds' runs at each method's chosen points (best and matched, once if the same)."""
    configs = []
    for k in range(seeds):
        for m, points in chosen.items():
            for p in {p["point"]: p for p in points}.values():
                configs.append(run_config(s, regime, m, p["lr"], p["strength"], k))
    return configs


def choose(points: dict[str, list[dict]]) -> dict:
    """The tuning stage's choices: each method's best point, the common KL and the matched points."""
    best, target, matched = tuned(points)
    return {"best": best, "target_kl": target, "matched": matched,
            "frontiers": {m: frontier(p) for m, p in points.items()}}


def reported(s: Settings, regime: Regime, point: dict, method: str, seeds: int) -> dict | None:
    """The report seeds' average at a chosen point, over the seeds finished so far (its `seeds` says how
    many: a benchmark in chunks reports as it goes); None before the first."""
    runs = {k: outcome(s.kept, run_config(s, regime, method, point["lr"], point["strength"], k)) for k in range(seeds)}
    done, grid = {k: o for k, o in runs.items() if o is not None}, target_grid(s, regime)
    # by seed, so that two regimes' runs of one seed can be compared pair by pair (replay / fresh)
    return {"point": point["point"], "lr": point["lr"], "strength": point["strength"], "of_seeds": seeds,
            **average(list(done.values()), grid), "to_target_by_seed": {k: to_target(o, grid) for k, o in done.items()}} \
        if done else None


def report_settings(s: Settings, tune_seeds: int, seeds: int) -> dict:
    """What a run's reports were made with, the same for each of its regimes: reports of other settings
    (a quick run's) are not set beside them."""
    return {"task": s.task, "steps": s.steps, "rows_per_step": s.prompts * s.samples_per_prompt, "lrs": list(s.lrs),
            "extend": s.extend, **({"extend_strength": s.extend_strength} if s.extend_strength else {}),
            "tune_seeds": [TUNE_SEED + k for k in range(tune_seeds)],
            "report_seeds": list(range(seeds)), "eval_size": s.eval_size}


def regime_result(s: Settings, regime: Regime, methods: list[str] | None, tune_seeds: int, seeds: int) -> dict:
    """Everything the report of one regime shows: the grid on tuning seeds, the choices, and the report
    seeds at each method's best and matched points; SPO's and AGRO's place against every baseline's
    frontier at their matched KL."""
    grids = regime_grids(s, regime, methods, tune_seeds)
    points = grid_points(s, regime, grids, tune_seeds)
    chosen = choose(points)
    best = {m: reported(s, regime, p, m, seeds) for m, p in chosen["best"].items()}
    matched = {m: reported(s, regime, p, m, seeds) for m, p in chosen["matched"].items()}
    verdicts = []  # on the tuning seeds, both sides: the baselines' frontiers are maxima over their grids
    for ours in OURS:
        mine = chosen["matched"].get(ours)
        if mine is None:
            continue
        for other, front in chosen["frontiers"].items():
            if other in OURS:
                continue
            along = [{"kl": p["kl"], "pass@1": p["pass@1"], "margin": p["pass@1"] - at_kl(front, p["kl"])}
                     for p in chosen["frontiers"][ours]]  # nan where the baseline has no point that low
            theirs = at_kl(front, mine["kl"])
            verdicts.append({"method": ours, "point": mine["point"], "baseline": other, "kl": mine["kl"],
                             "pass@1": mine["pass@1"], "baseline_pass@1": theirs, "margin": mine["pass@1"] - theirs,
                             "along_frontier": along, "baseline_lowest_kl": min(p["kl"] for p in front)})
    planned = sum(len(g.points()) for g in grids.values())
    grown = {m: [METHODS[m].label(st) for st in g.strengths]
             for m, g in grids.items() if g.strengths != METHODS[m].strengths}
    return {"regime": regime.name, "lag": regime.lag if regime.generates else None, "mix": regime.mix,
            "grid_finished": f"{sum(map(len, points.values()))} of {planned}",
            "reference_pass@1": mean([p["pass@1_start"] for ps in points.values() for p in ps]),
            "sources": list(regime.sources), "method_lrs": {m: list(g.lrs) for m, g in grids.items()},
            **({"method_strengths": grown} if grown else {}), "grid": points, "target_kl": chosen["target_kl"],
            "frontiers": {m: [p["point"] for p in f] for m, f in chosen["frontiers"].items()},
            "best": best, "matched": matched, "against_frontiers": verdicts,
            "target_grid": target_grid(s, regime), "settings": report_settings(s, tune_seeds, seeds)}


def run_stage(s, configs: list[RunConfig], jobs: int, update, what: str, prepare, say) -> None:
    """One stage's runs still to train under a progress bar (`update`: learner steps, or runs when several
    run at once), each on its own copy of its pool (`s.pool_of`): `prepare(update, configs)` makes the pools
    first, once, and returns their rows per source (`say` tells them). `s`: this benchmark's Settings or the
    code study's."""
    configs = pending(s, configs)
    if not configs:
        return
    counts = prepare(update, configs)
    say(f"pool: {', '.join(f'{n} {k}' for k, n in counts.items())} rows")
    if jobs <= 1:
        before = [sum(c.optim.steps for c in configs[:i]) for i in range(len(configs) + 1)]  # runs' steps differ
        update(0, total=before[-1], description=what)
        run(configs, s, on_step=lambda i, c, r: update(before[i] + r["step"],
                                                       description=f"{what}: {key(c)} ({i + 1}/{len(configs)})"))
        return
    done = [0]
    update(0, total=len(configs), description=f"{what} ({jobs} at once)")

    def finished(config) -> None:
        done[0] += 1
        update(done[0], description=f"{what}: {key(config)} done")  # with its regime: a log's line names the run

    run(configs, s, jobs=jobs, on_done=finished)


def train(s: Settings, regimes: list[str], methods: list[str] | None, tune_seeds: int, seeds: int, jobs: int,
          update, say) -> None:
    """Every run the reports need and no finished one: the tuning grids, grown round by round where a
    best point lies on an edge, then each regime's report seeds at its best and matched points. The
    earlier run (the other policy's data) and the pool are made once, before the first run that needs them."""
    def pool(update, _configs) -> dict:  # one pool for all
        return prepare(s, on_step=lambda _, __, r: update(r["step"], total=s.earlier_steps,
                                                          description="earlier run (the other policy's data)"))

    for _ in range(tuning_rounds(s)):
        run_stage(s, tuning_plan(s, regimes, methods, tune_seeds), jobs, update, "tuning", pool, say)
    for name in regimes:
        picks = choose(grid_points(s, REGIMES[name], regime_grids(s, REGIMES[name], methods, tune_seeds), tune_seeds))
        run_stage(s, report_plan(s, REGIMES[name], {m: [picks["best"][m], picks["matched"][m]] for m in picks["best"]},
                                 seeds), jobs, update, f"{name}: report seeds", pool, say)
