"""A frontier run's outcome: measured from its folder, or read from the kept outcomes.

A benchmark longer than a machine's life: a run's outcome is a few numbers, its folder megabytes on
one machine. Each finished run appends its outcome, with its settings, to one JSON-lines file that
can be committed beside the reports; a run found there is not trained again, and the reports need
nothing else.
"""

from __future__ import annotations

import functools
import json
import math
import statistics
from pathlib import Path

from softrl_bench.learning import check_same_settings, curves, difference, finished, run_records, settings_of
from softrl.config import ConfigError, RunConfig

EVAL_SAMPLES = 20  # per held-out prompt: pass@k for k = 1..20


def mean(values: list[float]) -> float:
    values = [v for v in values if v is not None and math.isfinite(v)]
    return statistics.fmean(values) if values else math.nan


DIAGNOSTICS = ("iw/ess_fraction", "iw/kl_behavior", "kl_ref", "grad_norm")


def measured(config: RunConfig) -> dict | None:
    """A finished run's final evaluation (pass@k for every k, KL(pi || pi0), distinct), samples generated,
    its lag's distribution over the learner steps, and the last third's per-step diagnostics; None if
    the run has not finished."""
    if not finished(config.run_dir):
        return None
    try:  # a folder finished with other settings (another preset, another grid) is not this run
        check_same_settings(config)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    log = run_records(config.run_dir)
    evals = [r for r in log if "eval/pass@1" in r]
    last = evals[-1]
    steps = [r for r in log if "loss" in r]
    tail = steps[-max(1, len(steps) // 3):]
    lags = sorted(r["staleness/mean"] for r in steps if "staleness/mean" in r)
    out = {
        "pass@k": [last[f"eval/pass@{k}"] for k in range(1, EVAL_SAMPLES + 1) if f"eval/pass@{k}" in last],
        "pass@1": last["eval/pass@1"], "pass@10": last.get("eval/pass@10"), "kl": last.get("eval/kl_to_reference"),
        "distinct": last.get("eval/distinct_correct_per_solved"), "samples": last["samples"],
        "curve": [(r["step"], r["eval/pass@1"], r.get("eval/kl_to_reference")) for r in evals],
        "evals": curves(config.run_dir),  # every evaluation's numbers, for reports drawn over training
        "lag": ({"mean": statistics.fmean(lags), "p10": lags[len(lags) // 10], "median": lags[len(lags) // 2],
                 "max": lags[-1]} if lags else None),
        "clipped_or_masked": mean([sum(v for k, v in r.items() if k.endswith(("clipped_fraction", "masked_fraction")))
                                    for r in tail]),
    }
    out.update({k: mean([r.get(k) for r in tail]) for k in DIAGNOSTICS})
    return out


PLACE_KEYS = ("name", "out_dir", "data.store")  # where a run lives, not how it ran


def key(config: RunConfig) -> str:
    return f"{Path(config.out_dir).name}/{config.name}"


def kept(path: Path | None) -> dict[str, dict]:
    """The kept outcomes by `key`; the last line of a key wins."""
    if path is None or not path.is_file():
        return {}
    return _read_kept(path, path.stat().st_mtime_ns)


@functools.lru_cache(maxsize=4)
def _read_kept(path: Path, _mtime: int) -> dict[str, dict]:
    out = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        try:
            entry = json.loads(line)
            out[entry["key"]] = entry
        except (ValueError, KeyError, TypeError):
            raise ConfigError(f"{path}: line {number} is not a kept outcome (a JSON object with key, settings and "
                             "outcome): mend or delete that line") from None
    return out


def keep(path: Path | None, config: RunConfig) -> None:
    """Append a run finished in its folder to the kept outcomes in `path` (once)."""
    if path is None or key(config) in kept(path):
        return
    result = measured(config)
    if result is not None:
        settings = {k: v for k, v in settings_of(config).items() if k not in PLACE_KEYS}
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as f:
            f.write(json.dumps({"key": key(config), "settings": settings, "outcome": result}) + "\n")


def outcome(path: Path | None, config: RunConfig) -> dict | None:
    """A finished run's outcome: from its folder, else from the kept outcomes in `path` (made with the
    same settings); None if it has not finished."""
    found = measured(config)
    if found is not None:
        return found
    entry = kept(path).get(key(config))
    if entry is None:
        return None
    settings = settings_of(config)
    differs = difference(entry["settings"], settings)
    if differs is None and "model.weights" not in entry["settings"]:
        now = settings.get("model.weights")
        differs = ("model.weights", None, now) if now else None  # kept before outcomes named their model
    if differs:
        name, before, now = differs
        raise ConfigError(f"{path}: {key(config)} was kept with {name}={before!r}, this benchmark asks "
                         f"{name}={now!r}: give another --kept file, or delete that line")
    return entry["outcome"]


TARGET_GAIN = 0.10  # samples generated to reach the reference's pass@1 + this (issue 51: replay)


def samples_to(evals: list[dict], target: float, grid: int | None = None) -> float | None:
    """Samples generated when pass@1 first reached `target`, read on the straight line between the two
    evaluations around it (those at multiples of `grid` samples only, when given, and the last); None if
    it never did."""
    before = None
    for e in (e for k, e in enumerate(evals) if not grid or e["samples"] % grid == 0 or k == len(evals) - 1):
        if e["pass@1"] >= target:
            if before is None:
                return float(e["samples"])
            share = (target - before["pass@1"]) / (e["pass@1"] - before["pass@1"])
            return before["samples"] + share * (e["samples"] - before["samples"])
        before = e
    return None


def to_target(outcome: dict, grid: int | None = None) -> float | None:
    """`samples_to` the run's own reference's pass@1 (its step 0) + TARGET_GAIN."""
    return samples_to(outcome.get("evals", []), outcome["curve"][0][1] + TARGET_GAIN, grid)


def average(outcomes: list[dict], grid: int | None = None) -> dict:
    """Seed-mean (and sd) of the numbers of one grid point; samples to the target read on `grid`
    (`samples_to`)."""
    out: dict = {"seeds": len(outcomes)}
    for key in ("pass@1", "pass@10", "kl", "distinct", "samples", *DIAGNOSTICS, "clipped_or_masked"):
        values = [o.get(key) for o in outcomes]
        values = [v for v in values if v is not None and math.isfinite(v)]
        out[key] = statistics.fmean(values) if values else math.nan
        out[f"{key}_sd"] = statistics.stdev(values) if len(values) > 1 else 0.0
    out["pass@1_start"] = statistics.fmean(o["curve"][0][1] for o in outcomes)  # the reference's, at step 0
    # each run against its own seed's reference; the mean over the runs that reached it, and how many did
    reached = [n for o in outcomes if (n := to_target(o, grid)) is not None]
    out["samples_to_target"] = statistics.fmean(reached) if reached else math.nan
    out["samples_to_target_sd"] = statistics.stdev(reached) if len(reached) > 1 else 0.0
    out["reached_target"] = len(reached)
    points = min(len(o.get("evals", [])) for o in outcomes)  # pass@1 against samples generated, the seeds' mean
    out["pass@1_by_samples"] = [(statistics.fmean(o["evals"][i]["samples"] for o in outcomes),
                                 statistics.fmean(o["evals"][i]["pass@1"] for o in outcomes)) for i in range(points)]
    ks = min(len(o["pass@k"]) for o in outcomes)
    out["pass@k"] = [statistics.fmean(o["pass@k"][k] for o in outcomes) for k in range(ks)]
    lags = [o["lag"] for o in outcomes if o["lag"]]
    out["lag"] = {k: statistics.fmean(lag[k] for lag in lags) for k in lags[0]} if lags else None
    return out
