"""`softrl bench learning`: every method on a built-in task from the same reference, the same
batch size, learner steps and learning rate, over several seeds; pass@1 / pass@10 curves against
samples generated and wall time, reward against KL(pi || pi0), and the papers' claims checked.

Equal budgets: every fully online method generates `prompts x samples_per_prompt` samples per step.
SPO half-online keeps the batch size but draws half of it from the store's passed reference
samples, so it generates half as many (the claim is that it matches online at half the cost).
AGRO off-policy and KL-regularised PG learn from fixed reference data only (the Q0 samples, passed
or not) and generate nothing.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import shutil
import statistics
from collections.abc import Callable
from pathlib import Path

import softrl.objectives as registry
from softrl.config import RunConfig, config_from

SPO = {"algorithm": "spo", "terminal": 1.0, "loss": "bce"}
ONLINE = {"online": 1.0}
FIXED_DATA = {"data.mix": {"offline": 1.0}, "data.offline_passed_only": False}

# method -> config overrides on top of the task's base: SPO online and half-online, every other
# registered objective online on its defaults, and the two whose claim is about fixed data
FIXED_DATA_METHODS = {
    "agro-off": {**FIXED_DATA, "data.objective": {"algorithm": "agro-off"}},
    "kl-pg": {**FIXED_DATA, "data.objective": {"algorithm": "kl-pg"}},
}
OFF_POLICY_BASELINES = {"cispo", "topr"}  # compared where they belong, on stale and mixed data: bench anydata
METHODS: dict[str, dict] = {
    "spo-online": {"data.mix": ONLINE, "data.objective": SPO},
    "spo-half": {"data.mix": {"online": 0.5, "offline": 0.5}, "data.objective": SPO},
    **{name: {"data.mix": ONLINE, "data.objective": {"algorithm": name}} for name in registry.REGISTRY
       if name != "spo" and name not in FIXED_DATA_METHODS and name not in OFF_POLICY_BASELINES},
    **FIXED_DATA_METHODS,
}
HALF_ONLINE = {"spo-half"}  # the same batch size, half of it generated: half the prompts per step

# per task: what the base run looks like (the reference is the task's bootstrap model)
TASK_BASES = {
    "countdown": {"task.size": 1000, "q0.k": 32},
    "tinycode": {"task.size": 300, "q0.k": 16},
    "tinycode-loops": {"task.size": 300, "q0.k": 16},
    "tinycode-feedback": {"task.size": 200, "q0.k": 8},  # an episode costs about 3 samples: Q0 of 1,600 of them
}


def slug(task: str) -> str:
    return task.replace(":", "-").replace("/", "-")


def base_overrides(task: str, seed: int, steps: int, lr: float, prompts: int, samples_per_prompt: int,
                   eval_size: int, eval_every: int, eval_samples: int, extra: dict | None) -> dict:
    """What every benchmark run of `task` shares: the task's base, batch, optimiser and evaluation."""
    if task not in TASK_BASES and not extra:
        raise ValueError(f"--task: no built-in base for {task!r} (use {', '.join(TASK_BASES)}, or give --base FILE)")
    return {
        "seed": seed, "task.name": task, "task.eval_size": eval_size, **TASK_BASES.get(task, {}),
        "sampling.prompts_per_step": prompts, "sampling.samples_per_prompt": samples_per_prompt,
        "optim.steps": steps, "optim.lr": lr, "optim.warmup_steps": max(1, steps // 20),
        "eval.every": eval_every, "eval.samples": eval_samples, "eval.stats": True,
        "log.checkpoint_every": steps, "log.keep_checkpoints": 1,
    }


def with_base(overrides: dict, extra: dict | None) -> dict:
    """A run's `overrides` with a `--base` file's settings `extra` over them; the base's objective options
    merge into the run's objective, so a base that sets `is_correction` keeps each method's algorithm and loss
    (applied as a whole section, it would replace the method's objective)."""
    extra = dict(extra or {})
    base_objective = dict(extra.pop("data.objective")) if isinstance(extra.get("data.objective"), dict) else {}
    section = extra.get("data")
    if isinstance(section, dict) and isinstance(section.get("objective"), dict):
        base_objective.update(section["objective"])
        extra["data"] = {k: v for k, v in section.items() if k != "objective"}
    own = overrides.get("data.objective", {})
    if "algorithm" in base_objective and own.get("algorithm", base_objective["algorithm"]) != base_objective["algorithm"]:
        raise ValueError(f"--base: data.objective.algorithm={base_objective['algorithm']} would run every method as "
                         f"{base_objective['algorithm']} under its own name; leave the algorithm to the benchmark")
    merged = dict(overrides)
    if base_objective:  # before the base's other keys, so that a dotted `data.objective.eps` still lands on it
        merged["data.objective"] = {**own, **base_objective}
    return {**merged, **extra}


def ladder_step(lr: float, up: bool) -> float:
    """The next learning rate on the 1-3-10 ladder (1e-5, 3e-5, 1e-4, ...) above or below `lr`."""
    exponent = math.floor(math.log10(lr) + 1e-9)
    low_rung = lr / 10 ** exponent < 2  # 1eX, else 3eX
    if up:
        return float(f"{3 if low_rung else 1}e{exponent if low_rung else exponent + 1}")
    return float(f"{3 if low_rung else 1}e{exponent - 1 if low_rung else exponent}")


def grown_grid(lrs, strengths, past, extend: int, extend_strength: int, score) -> tuple[list, list, dict | None]:
    """A tuning grid, learning rates x strengths, as far as its finished runs decide it, and its scores
    `{(lr, strength index): score}` (None until every point finished). Once all finished, the best point
    (the highest finite score; on a tie the lower rate, then the first strength) is read: on an edge of
    the rates, one more rung of the 1-3-10 ladder there (up to `extend` each way); on an edge of the
    strengths, the next of `past` there (`past`: the rungs below the first and above the last, nearest
    first; up to `extend_strength` each way). Both may grow in one round. A grid only grows, so no finished
    point ever leaves it; it settles when its best lies inside, or every rung it may take was taken. The
    rates alone grow one way only (a new rate that is not the best leaves the best inside), so `1 + extend`
    rounds of runs settle them. `score(lr, strength)`: a finished point's score (non-finite: never best),
    None before it finished."""
    lrs, strengths = sorted(set(lrs)), list(strengths)  # a repeated rate would read as both edges
    grown = {("lr", False): 0, ("lr", True): 0, ("strength", False): 0, ("strength", True): 0}
    while True:
        scores = {}
        for lr in lrs:
            for i, strength in enumerate(strengths):
                scores[lr, i] = score(lr, strength)
                if scores[lr, i] is None:
                    return lrs, strengths, None
        usable = [k for k, v in scores.items() if math.isfinite(v)]
        if not usable:
            return lrs, strengths, scores
        lr, i = max(usable, key=lambda k: (scores[k], -k[0], -k[1]))
        grew = False
        if len(lrs) > 1 and lr in (lrs[0], lrs[-1]) and grown["lr", up := lr == lrs[-1]] < extend:
            grown["lr", up] += 1
            lrs, grew = sorted([*lrs, ladder_step(lr, up)]), True
        last = i == len(strengths) - 1
        if len(strengths) > 1 and i in (0, len(strengths) - 1) and \
                grown["strength", last] < min(extend_strength, len(past[last])):
            rung = past[last][grown["strength", last]]
            grown["strength", last] += 1
            strengths, grew = ([*strengths, rung] if last else [rung, *strengths]), True
        if not grew:
            return lrs, strengths, scores


def grown_lrs(lrs, extend: int, score) -> tuple[list[float], dict[float, float] | None]:
    """A learning-rate grid alone (`grown_grid` with one strength), and its scores `{lr: score}` once every
    rate finished. `score(lr)`: a finished rate's score, None before it finished."""
    lrs, _, scores = grown_grid(lrs, [None], ((), ()), extend, 0, lambda lr, _: score(lr))
    return lrs, None if scores is None else {lr: v for (lr, _), v in scores.items()}


def best_lr(scores: dict[float, float]) -> float | None:
    """The learning rate with the highest finite score (the lower one on a tie); None if no score is finite."""
    usable = sorted(lr for lr, v in scores.items() if math.isfinite(v))
    return max(usable, key=scores.get) if usable else None


def generated_prompts(rows: int, mix: dict[str, float], samples_per_prompt: int) -> int:
    """Prompts sampled online per step when `rows` rows a step are mixed by `mix`: its online share."""
    return max(1, round(rows * mix.get("online", 0) / sum(mix.values()) / samples_per_prompt))


def method_config(method: str, task: str, seed: int, steps: int, runs: Path, lr: float = 1e-4,
                  prompts: int = 16, samples_per_prompt: int = 4, eval_size: int = 100, eval_every: int = 25,
                  eval_samples: int = 20, extra: dict | None = None) -> RunConfig:
    """The run of `method` on `task` with `seed`, under `runs/TASK/METHOD-sSEED`; `extra` overrides
    come last (e.g. `model.path`)."""
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r} (use {', '.join(METHODS)})")
    overrides = base_overrides(task, seed, steps, lr, prompts, samples_per_prompt, eval_size, eval_every, eval_samples,
                               extra)
    overrides.update({"name": f"{method}-s{seed}", "out_dir": str(runs / slug(task)),
                      "data.store": str(runs / slug(task) / "store")})
    overrides.update(METHODS[method])
    if method in HALF_ONLINE:
        overrides["sampling.prompts_per_step"] = max(1, prompts // 2)
    return config_from(with_base(overrides, extra))


WEIGHTS_RECORD = "model-weights.txt"  # in a finished run's folder: the digest of the weights it started from


def run_all(configs: list[RunConfig], on_step: Callable[[int, RunConfig, dict], None] | None = None,
            log: Callable[[str], None] = lambda m: None, before: Callable[[RunConfig], None] | None = None,
            after: Callable[[RunConfig], None] | None = None, shared=None) -> None:
    """Train each config in turn; a finished run (a summary.json, or diverged) is done and kept (a killed benchmark
    resumes where it stopped), a run without one starts over, after `before(config)` (e.g. its store);
    `after(config)` once it has finished. `shared`: a `softrl_bench.start_eval.SharedStartEval`, where runs
    that start alike share their evaluation before training."""
    from softrl.runtime.local import train
    from softrl.training.learner import NonFiniteLossError

    for i, config in enumerate(configs):
        if finished(config.run_dir):
            check_same_settings(config)
            continue
        shutil.rmtree(config.run_dir, ignore_errors=True)
        if before is not None:
            before(config)
        try:
            train(config, on_step=(lambda r, i=i, c=config: on_step(i, c, r)) if on_step else None, log=log,
                  start_eval=shared.for_run(config) if shared is not None else None)
        except NonFiniteLossError as error:  # an outcome of its learning rate, not a failure of the benchmark
            (config.run_dir / DIVERGED).write_text(json.dumps({"error": str(error)}))
        weights = settings_of(config).get("model.weights")  # after training: a bootstrap may be built by it
        if weights:
            (config.run_dir / WEIGHTS_RECORD).write_text(weights)
        if after is not None:
            after(config)


def _same(a, b) -> bool:
    """Equal, mappings (an objective's options) on the keys both have: an option added since is at its default."""
    if isinstance(a, dict) and isinstance(b, dict):
        return all(_same(a[k], b[k]) for k in a.keys() & b.keys())
    return a == b


def settings_of(config: RunConfig) -> dict:
    """A run's settings, section.key -> value, and `model.weights`, the digest of the model folder's weights
    where it is a folder (a bootstrap reference's, named "bootstrap", once built): a folder is rebuilt in
    place (a bootstrap's training is not bit-identical across machines), so its path alone does not say
    which model a kept outcome was made with."""
    from softrl.assemble import model_folder
    from softrl.config import flatten

    out = {".".join(k): v for k, v in flatten(config.model_dump(mode="json"))}
    digest = weights_digest(model_folder(config.model.path, config.task.name))
    return {**out, "model.weights": digest} if digest else out


def weights_digest(path: str | Path) -> str | None:
    """A digest of the weight files (*.safetensors, *.bin) of the model folder `path`; None for no such folder."""
    folder = Path(path)
    files = sorted(f for f in folder.glob("*") if f.suffix in (".safetensors", ".bin") and f.is_file()) \
        if folder.is_dir() else []
    return _digest(tuple((str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in files)) if files else None


@functools.lru_cache(maxsize=32)
def _digest(files: tuple[tuple[str, int, int], ...]) -> str:
    """Of the files' names and contents (size and time only key the cache: a rewritten file is read again)."""
    digest = hashlib.blake2b(digest_size=12)
    for name, _, _ in files:
        digest.update(Path(name).name.encode())
        with open(name, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def difference(before: dict, now: dict) -> tuple[str, object, object] | None:
    """The first setting (on the keys both know) where `before` differs from `now` (`settings_of` both):
    (key, before, now)."""
    for name, value in now.items():
        if name in before and not _same(before[name], value):
            return name, before[name], value
    return None


def check_same_settings(config: RunConfig) -> None:
    """A finished run is reused only if it ran with `config`'s settings (keys both versions know) and, where
    the model is a folder, from the same weights (its `WEIGHTS_RECORD`; a folder without one is refused)."""
    import yaml

    from softrl.config import flatten

    saved = config.run_dir / "config.yaml"
    if not saved.is_file():
        return
    settings = settings_of(config)
    differs = difference({".".join(k): v for k, v in flatten(yaml.safe_load(saved.read_text()) or {})}, settings)
    now = settings.get("model.weights")
    record = config.run_dir / WEIGHTS_RECORD
    before = record.read_text().strip() if record.is_file() else None
    if differs is None and now and before != now:  # a folder path's model rebuilt (or one never recorded)
        differs = ("model.weights", before, now)
    if differs:
        name, before, now = differs
        raise ValueError(f"{config.run_dir} finished with {name}={before!r}, this benchmark asks "
                         f"{name}={now!r}: give another --runs directory, or delete that run")


EVAL_KEYS = ("pass@1", "pass@10", "success_per_sample", "kl_to_reference", "mean_token_entropy",
             "distinct_correct_per_solved", "tokens_per_sample", "turns_per_episode", "first_turn_pass@1",
             "first_turn_pass@10")  # the last three: episodes only


DIVERGED = "diverged.json"  # a run whose loss stopped being finite (`NonFiniteLossError`): its error


def finished(run_dir: Path) -> bool:
    """Whether a run ended: trained to its last step (summary.json), or diverged."""
    return (run_dir / "summary.json").is_file() or (run_dir / DIVERGED).is_file()


def run_records(run_dir: Path) -> list[dict]:
    """The run's metrics records; a diverged run's end with one more evaluation, at the samples generated
    by then: its policy, no longer a finite function of its data, solves nothing (every pass@k and success
    rate 0, the other figures unknown; `diverged` holds the error)."""
    log = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()] \
        if (run_dir / "metrics.jsonl").is_file() else []
    if (run_dir / DIVERGED).is_file():
        last = log[-1] if log else {}
        shown = next((r for r in reversed(log) if "eval/pass@1" in r), {"eval/pass@1": 0.0})
        solved = {k: 0.0 for k in shown if k.startswith(("eval/pass@", "eval/first_turn_pass@"))
                  or k in ("eval/success_per_sample", "eval/solved_problems")}
        log.append({"step": last.get("step", 0), "samples": last.get("samples", 0), "time": last.get("time", 0.0),
                    **solved, "diverged": json.loads((run_dir / DIVERGED).read_text())["error"]})
    return log


def curves(run_dir: Path) -> list[dict]:
    """The run's evaluation points: step, samples and policy tokens generated (None where the run's steps
    did not count them), training wall time and the eval numbers."""
    points, tokens = [], {0: 0}
    for r in run_records(run_dir):
        if "tokens" in r:
            tokens[r["step"]] = r["tokens"]
        if "eval/pass@1" in r:
            points.append({"step": r["step"], "samples": r["samples"], "tokens": tokens.get(r["step"]),
                           "time": r["time"], **{k: r.get(f"eval/{k}") for k in EVAL_KEYS}})
    return points


def mean_sd(values: list[float]) -> tuple[float, float]:
    values = [v for v in values if v is not None]
    if not values:
        return math.nan, math.nan
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def aggregate(runs: dict[str, dict[int, list[dict]]]) -> dict[str, list[dict]]:
    """method -> per evaluation point, the mean and sd over seeds of every number (seeds aligned by step)."""
    out = {}
    for method, by_seed in runs.items():
        series = list(by_seed.values())
        length = min(len(s) for s in series)
        points = []
        for j in range(length):
            at = [s[j] for s in series]
            point = {}
            for key in ("step", "samples", "tokens", "time", *EVAL_KEYS):
                point[key], point[f"{key}_sd"] = mean_sd([p.get(key) for p in at])  # older outcomes lack newer keys
            points.append(point)
        out[method] = points
    return out


def paired(runs: dict[str, dict[int, list[dict]]], a: str, b: str, value: Callable[[list[dict]], float],
           margin: float = 0.0) -> dict:
    """`value(a's curve) - value(b's curve)` per common seed: mean, standard error and verdict, which judges
    the difference less `margin` (a claim that a beats b by `margin` holds when the mean difference is more
    than `margin` plus 2 standard errors). The difference is kept as measured, so a report shows it with
    its error and the margin beside it, not a shifted number."""
    seeds = sorted(set(runs.get(a, {})) & set(runs.get(b, {})))
    diffs = [value(runs[a][s]) - value(runs[b][s]) for s in seeds]
    if not diffs:
        return {"seeds": 0, "verdict": "not run"}
    mean = statistics.fmean(diffs)
    se = statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else math.nan
    beyond = mean - margin
    if len(diffs) == 1:  # no spread to judge by: the sign only
        verdict = "higher" if beyond > 0 else "lower" if beyond < 0 else "within 2 SE"
    elif beyond > 2 * se:
        verdict = "higher"
    elif beyond < -2 * se:
        verdict = "lower"
    else:
        verdict = "within 2 SE"
    return {"seeds": len(diffs), "diff": mean, "se": se, "margin": margin, "verdict": verdict, "per_seed": diffs}


def final(key: str) -> Callable[[list[dict]], float]:
    return lambda curve: curve[-1][key]


def gap_change(curve: list[dict]) -> float:
    """How much pass@10 - pass@1 grew from the first to the last evaluation (negative: it shrank)."""
    return (curve[-1]["pass@10"] - curve[-1]["pass@1"]) - (curve[0]["pass@10"] - curve[0]["pass@1"])


def mean_over_training(key: str) -> Callable[[list[dict]], float]:
    """The mean of `key` over the evaluations after the first: the area under the learning curve."""
    return lambda curve: statistics.fmean(p[key] for p in curve[1:]) if len(curve) > 1 else math.nan


# (claim, paper, method a, method b, what is compared, expected verdict)
CLAIMS = [
    ("SPO's pass@10 beats PPO's", "SPO", "spo-online", "ppo", "final pass@10", final("pass@10"), "higher"),
    ("half-online SPO matches or beats online SPO at half the sampling cost (pass@1)", "SPO", "spo-half",
     "spo-online", "final pass@1", final("pass@1"), "higher|within 2 SE"),
    ("half-online SPO matches or beats online SPO at half the sampling cost (pass@10)", "SPO", "spo-half",
     "spo-online", "final pass@10", final("pass@10"), "higher|within 2 SE"),
    ("PPO's pass@10 - pass@1 gap shrinks while SPO's stays", "SPO", "spo-online", "ppo",
     "growth of the pass@10 - pass@1 gap", gap_change, "higher"),
    ("on-policy AGRO learns faster per epoch than RLOO", "AGRO", "agro-on", "rloo",
     "pass@1 averaged over the evaluations (area under the curve)", mean_over_training("pass@1"), "higher"),
    ("off-policy AGRO beats KL-regularised PG on fixed reference data", "AGRO", "agro-off", "kl-pg",
     "final pass@1", final("pass@1"), "higher"),
]


def judged(runs: dict[str, dict[int, list[dict]]], claim: str, paper: str, a: str, b: str, compared: str,
           value: Callable[[list[dict]], float], expected: str, margin: float = 0.0) -> dict:
    """`paired(runs, a, b, value, margin)` as a row of the claims table (`softrl_bench.report.markdown`): reproduced
    when the verdict is one of `expected` ("|"-separated), None where a side did not run."""
    result = paired(runs, a, b, value, margin)
    holds = None if result["verdict"] == "not run" else result["verdict"] in expected.split("|")
    return {"claim": claim, "paper": paper, "a": a, "b": b, "compared": compared, **result, "expected": expected,
            "reproduced": holds}


def check_claims(runs: dict[str, dict[int, list[dict]]]) -> list[dict]:
    return [judged(runs, *claim) for claim in CLAIMS]


def collect(configs: list[RunConfig]) -> dict[str, dict[int, list[dict]]]:
    """method -> seed -> curve, for the finished runs among `configs`."""
    runs: dict[str, dict[int, list[dict]]] = {}
    for config in configs:
        if finished(config.run_dir):
            method = config.name.rsplit("-s", 1)[0]
            runs.setdefault(method, {})[config.seed] = curves(config.run_dir)
    return runs
