"""`softrl bench anydata`: learning from data that is not the current policy's, in three settings, every
method that can use the data, from the same reference with the same batch, steps and learning rate.

- stale: online rollouts only, the generator's weights refreshed every 1, 4 or 16 learner steps
  (`runtime.model_update_interval`): the rows are up to 15 updates old;
- half: half of every batch online, half from a fixed pool that mixes the reference's samples
  (mu known), an earlier run's rollouts (mu known) and the task solver's solutions, stored as
  "human" data (mu unknown): the same batch of rows, half the generation;
- offline: the pool only, no generation at all.

The pool lives in its own store, built once: the reference's Q0 samples and an earlier SPO run's
rollouts (relabelled source "earlier", so the half-online runs' own rollouts never join it) copied
from the shared store, and `task_solutions` added as "human".
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from softrl_bench.learning import SPO, base_overrides, final, judged, run_all, settings_of, slug, with_base
from softrl.config import ConfigError, RunConfig, config_from

OBJECTIVES = {
    "spo": SPO,
    "agro-off": {"algorithm": "agro-off"},
    "grpo": {"algorithm": "grpo"},
    "grpo-tis": {"algorithm": "grpo", "is_correction": "token_truncate"},
    "cispo": {"algorithm": "cispo"},
    "topr": {"algorithm": "topr"},
    "kl-pg": {"algorithm": "kl-pg"},
}
INTERVALS = (1, 4, 16)
POOL_SOURCES = ["reference", "earlier", "human"]


@dataclass(frozen=True)
class Setting:
    name: str
    methods: tuple[str, ...]
    mix: dict
    intervals: tuple[int, ...] = (1,)
    pool: bool = False  # learns from the mixed pool's store


SETTINGS = {
    "stale": Setting("stale", ("spo", "agro-off", "grpo", "grpo-tis", "cispo", "topr"), {"online": 1.0}, INTERVALS),
    "half": Setting("half", ("spo", "agro-off", "topr", "cispo", "grpo-tis"), {"online": 0.5, "offline": 0.5},
                    pool=True),
    "offline": Setting("offline", ("spo", "agro-off", "topr", "kl-pg"), {"offline": 1.0}, pool=True),
}


def label(method: str, interval: int, setting: Setting) -> str:
    return f"{method}-i{interval}" if len(setting.intervals) > 1 else method


def run_config(setting: Setting, method: str, interval: int, seed: int, root: Path, task: str, steps: int,
               lr: float, prompts: int, samples_per_prompt: int, eval_size: int, eval_every: int,
               extra: dict | None = None) -> RunConfig:
    """One run of the benchmark, under ROOT/TASK/SETTING/LABEL-sSEED."""
    overrides = base_overrides(task, seed, steps, lr, prompts, samples_per_prompt, eval_size, eval_every, 20, extra)
    where = root / slug(task)
    overrides.update({
        "name": f"{label(method, interval, setting)}-s{seed}", "out_dir": str(where / setting.name),
        "data.store": str(where / ("pool" if setting.pool else "store")), "data.mix": setting.mix,
        "data.objective": OBJECTIVES[method], "runtime.model_update_interval": interval,
    })
    if setting.pool:
        overrides.update({"data.offline_sources": POOL_SOURCES, "data.offline_passed_only": False})
    if setting.mix.get("online", 0) and "offline" in setting.mix:  # the same batch of rows, half generated
        overrides["sampling.prompts_per_step"] = max(1, prompts // 2)
    return config_from(with_base(overrides, extra))


def earlier_config(root: Path, task: str, steps: int, lr: float, prompts: int, samples_per_prompt: int,
                   extra: dict | None = None) -> RunConfig:
    """The earlier run whose rollouts join the pool: online SPO in the shared store, no evaluation to speak of."""
    overrides = base_overrides(task, 1000, steps, lr, prompts, samples_per_prompt, 10, steps, 1, extra)
    overrides.update({"name": "earlier", "out_dir": str(root / slug(task)), "data.store": str(root / slug(task) / "store"),
                      "data.mix": {"online": 1.0}, "data.objective": SPO})
    return config_from(with_base(overrides, extra))


def build_pool(earlier: RunConfig, pool_dir: Path) -> dict:
    """The pool's store: the shared store's prompts (with Q0) and reference samples, the earlier run's
    rollouts as source "earlier", and the task's solver solutions as "human"; returns rows per source."""
    from softrl.assemble import load_tasks
    from softrl.data import ExperienceStore
    from softrl.data.io import task_solutions

    shared, pool = ExperienceStore(earlier.data.store), ExperienceStore(pool_dir)
    task = earlier.task.name
    reference = shared.trajectories(task=task, source="reference").to_pylist()
    rollouts = [{**row, "source": "earlier"} for row in shared.trajectories(task=task, run_id="earlier",
                                                                              source="online").to_pylist()]
    human = task_solutions(load_tasks(earlier)[0], "human")
    for rows in (reference, rollouts, human):
        pool.append(rows)
    pool.put_prompts(list(shared.prompts().values()))
    return {"reference": len(reference), "earlier": len(rollouts), "human": len(human)}


def comparisons(setting: Setting, runs: dict[str, dict[int, list[dict]]]) -> list[dict]:
    """SPO and off-policy AGRO against every other method of the setting (and interval) that ran: final
    pass@1 and pass@10, paired over seeds; the claims' table format of `softrl_bench.report.markdown`."""
    out = []
    for interval in setting.intervals:
        for ours in ("spo", "agro-off"):
            for other in setting.methods:
                if other in ("spo", ours):
                    continue
                a, b = label(ours, interval, setting), label(other, interval, setting)
                if a not in runs or b not in runs:  # left out by --methods, or not finished
                    continue
                where = f"{setting.name}, interval {interval}" if len(setting.intervals) > 1 else setting.name
                out += [judged(runs, f"{ours} matches or beats {other} ({where})", "SPO" if ours == "spo" else "AGRO",
                               a, b, f"final {key}", final(key), "higher|within 2 SE") for key in ("pass@1", "pass@10")]
    return out


def plan(task: str, settings: list[str], seeds: int, root: Path, steps: int, lr: float, prompts: int,
         samples_per_prompt: int, eval_size: int, eval_every: int, extra: dict | None = None,
         methods: list[str] | None = None) -> dict[str, list[RunConfig]]:
    """setting -> its runs, seeds outermost (a killed benchmark has whole seeds to report)."""
    unknown = [s for s in settings if s not in SETTINGS]
    if unknown:
        raise ValueError(f"--settings: unknown setting {unknown[0]!r} (use {', '.join(SETTINGS)})")
    usable = sorted({m for name in settings for m in SETTINGS[name].methods})
    missing = [m for m in methods or [] if m not in usable]
    if missing or methods == []:  # a name dropped in silence would start a benchmark without it
        raise ValueError(f"--methods: unknown method {(missing or [''])[0]!r} for settings {', '.join(settings)} "
                         f"(use {', '.join(usable)})")
    out = {}
    for name in settings:
        setting = SETTINGS[name]
        chosen = [m for m in setting.methods if methods is None or m in methods]
        out[name] = [run_config(setting, m, k, seed, root, task, steps, lr, prompts, samples_per_prompt, eval_size,
                                eval_every, extra)
                     for seed in range(seeds) for k in setting.intervals for m in chosen]
    return out


def prepare_pool(task: str, root: Path, steps: int, lr: float, prompts: int, samples_per_prompt: int,
                 extra: dict | None = None, on_step=None, log=lambda m: None) -> dict:
    """The earlier run (resumed if killed) and the pool built from it, once; returns rows per source. The
    pool's marker names the reference's weights: a pool made with another build of the reference is
    refused, not reused (`softrl_bench.reference`; so is a finished earlier run, by `run_all`)."""
    pool_dir = root / slug(task) / "pool"
    marker = pool_dir / "pool.json"
    earlier = earlier_config(root, task, steps, lr, prompts, samples_per_prompt, extra)
    if marker.is_file():
        made, weights = json.loads(marker.read_text()), settings_of(earlier).get("model.weights")
        if made.get("model.weights") != weights or "rows" not in made:
            was = repr(made["model.weights"]) if "model.weights" in made else "weights it does not name"
            raise ConfigError(f"{pool_dir}: the pool and the earlier run beside it were made with the reference's "
                              f"{was}, these runs have {weights!r}: use another --runs directory, or delete "
                              f"{root / slug(task)}")
        return made["rows"]
    run_all([earlier], on_step=on_step, log=log)
    shutil.rmtree(pool_dir, ignore_errors=True)  # a pool half built when killed
    counts = build_pool(earlier, pool_dir)
    marker.write_text(json.dumps({"rows": counts, "model.weights": settings_of(earlier).get("model.weights")}))
    return counts
