"""Q0 estimation: `Q0_hat(x) = beta * log mean_k exp(r_k / beta)` from the task rewards of K samples
of the reference policy (docs/ALGORITHMS.md, "Rewards and Q0: one unit"): the soft value of the
prompt under pi0, in the task's units (0 when nothing succeeds, 1 when everything does). The K
rewards are kept with it, so a run at another beta gets its Q0 from the same rewards by the same
formula (`soft_values`).

Prompts are processed a few at a time; after each chunk its samples go to the store (source
"reference": offline data too) and then its Q0 to the prompts table, so a killed run resumes at the
first prompt without a Q0 for this model and K.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable

import pyarrow as pa
import torch

from softrl.algorithms.spo import q0_from_rewards
from softrl.data.store import ExperienceStore, Snapshot
from softrl.rollout import EpisodeLimits, RolloutSpec, contexts_of, graded_samples, refuse_long_prompts
from softrl.tasks.base import Prompt


def q0_row(prompt: Prompt, task: str, rewards: list[float], passed: list[bool], beta: float, model: str,
           episodes: int = 0) -> dict:
    """The prompts-table row for one prompt's K samples (task rewards in [0, 1]); `episodes`: the samples
    were episodes of up to that many policy turns (0: single responses), kept in `meta`."""
    return {"prompt_id": prompt.id, "task": task, "text": prompt.text, "q0_k": len(rewards),
            "q0_hat": soft_value(rewards, beta), "q0_rewards": [float(r) for r in rewards],
            "q0_success": sum(passed) / len(passed), "q0_beta": beta, "q0_model": model,
            "meta": {"episodes": episodes} if episodes else {}}


def soft_value(rewards: list[float], beta: float) -> float:
    """`beta * log mean_k exp(r_k / beta)`, in float64."""
    return q0_from_rewards(torch.tensor(rewards, dtype=torch.float64), beta).item()


def soft_values(rows: dict[str, dict], beta: float) -> dict[str, float]:
    """Q0 of every prompt row at `beta`, from its stored rewards."""
    return {pid: soft_value(row["q0_rewards"], beta) for pid, row in rows.items()}


def binomial_stderr(success: float, k: int) -> float:
    return math.sqrt(max(success * (1 - success), 1.0 / k) / k)


def is_done(row: dict | None, k: int, model: str, episodes: int = 0) -> bool:
    """Whether the store has Q0 for this model from K samples of the same kind: single responses, or
    episodes of up to `episodes` policy turns (the value of a first turn is not an episode's). Rows
    written before the rewards were kept are estimated again."""
    meta = (row or {}).get("meta")
    kind = meta.get("episodes", 0) if isinstance(meta, dict) else 0
    return (row is not None and row.get("q0_model") == model and (row.get("q0_k") or 0) >= k
            and bool(row.get("q0_rewards")) and kind == episodes)


def usable(rows: dict[str, dict], k: int, model: str, episodes: int = 0) -> dict[str, dict]:
    """The prompts rows that hold Q0 for this model, K and kind of sample (`is_done`)."""
    return {pid: row for pid, row in rows.items() if is_done(row, k, model, episodes)}


def plan(prompts: int, k: int, known: int) -> str:
    """The line said before Q0 is estimated: how much sampling is to come."""
    return (f"Q0: sampling the reference model on {prompts:,} prompts x {k} samples = {prompts * k:,} samples"
            + (f" ({known:,} prompts have Q0 in the store already)" if known else ""))


def q0_from_samples(rewards: pa.Table, beta: float, model: str, min_k: int = 1) -> list[dict]:
    """Prompts-table rows from samples already in a store (`ExperienceStore.rewards_by_prompt`'s table:
    prompt, task, text and its samples' rewards and pass flags), for the prompts with at least `min_k`
    samples: Q0 without sampling, e.g. from reference samples another sampler made and `softrl data
    import` brought in. `model`: the model they came from, as runs name it (their Q0 is reused by its runs)."""
    return [q0_row(Prompt(r["prompt_id"], r["text"] or ""), r["task"], r["rewards"], [bool(p) for p in r["passed"]],
                   beta, model) for r in rewards.to_pylist() if len(r["rewards"]) >= min_k]


class Q0Conflict(ValueError):
    """Prompts hold Q0 from another model already: replacing it needs asking (`force`)."""


def store_q0_from_samples(store: ExperienceStore, rewards: pa.Table, beta: float, model: str, min_k: int = 1,
                          force: bool = False) -> list[dict]:
    """Q0 from samples already stored (`rewards`: `rewards_by_prompt`'s table, read by one process or on Ray
    Data) written to the prompts table, as `estimate_q0` leaves it; returns the rows written. Prompts
    whose Q0 came from another model are a Q0Conflict (nothing written) unless `force`."""
    rows = q0_from_samples(rewards, beta, model, min_k)
    had = store.prompts(ids=[r["prompt_id"] for r in rows])
    other = [r for r in rows if (had.get(r["prompt_id"]) or {}).get("q0_model") not in (None, model)]
    if other and not force:
        before = had[other[0]["prompt_id"]]["q0_model"]
        raise Q0Conflict(f"{len(other)} prompts have Q0 from another model already (prompt {other[0]['prompt_id']}: "
                         f"{before!r}, not {model!r}): --force replaces it")
    store.put_prompts(rows)
    return rows


def estimate_q0(spec: RolloutSpec, prompts: list[Prompt], encode: Callable[[str], list[int]], store: ExperienceStore,
                k: int, beta: float, model: str, seed: int = 0, chunk: int = 4,
                progress: Callable[[int, int], None] | None = None,
                log: Callable[[str], None] | None = None, snapshot: Snapshot | None = None, env=None,
                limits: EpisodeLimits | None = None) -> dict[str, dict]:
    """Q0 rows for every prompt: those in the store (at `snapshot`, a pinned or resumed run's; else the
    newest) for this model and K are kept, the others sampled and written. Every prompt is checked to
    fit the model before any is sampled; `log` gets one line saying how many samples are to come,
    `progress` (prompts done, prompts) from the start and after every chunk. With an environment `env`,
    the K samples are episodes within `limits` (their value is Q0 of a multi-turn run), kept apart from
    single-response Q0 of the same prompts."""
    if k < 1:
        raise ValueError(f"k must be >= 1 samples per prompt, got k={k}")
    limits = limits or EpisodeLimits()
    episodes_of = limits.max_turns if env is not None else 0
    found = usable(store.prompts(snapshot, ids=[p.id for p in prompts]), k, model, episodes_of)
    missing = [p.id for p in prompts if p.id not in found]
    if snapshot is not None and missing:  # none at the snapshot: one written since (by this run's first start)
        found.update(usable(store.prompts(ids=missing), k, model, episodes_of))
    todo = [p for p in prompts if p.id not in found]
    refuse_long_prompts(spec, todo)
    done = len(prompts) - len(todo)
    if log is not None and todo:
        log(plan(len(todo), k, done))
    if progress is not None:
        progress(done, len(prompts))
    for start in range(0, len(todo), chunk):
        rows, trajectories = [], []
        for prompt in todo[start : start + chunk]:
            # the seed depends on the prompt, not on where a resumed run starts
            seeded = seed + zlib.crc32(prompt.id.encode())
            drawn = graded_samples(spec, contexts_of(spec, [prompt], encode), k, seeded, env, limits)
            trajectories += drawn
            rows.append(q0_row(prompt, spec.task.name, [s.reward for s in drawn], [s.passed for s in drawn],
                               beta, model, episodes_of))
        store.append(trajectories)
        store.put_prompts(rows)
        done += len(rows)
        if progress is not None:
            progress(done, len(prompts))
    if todo:  # the rows written here, as the store keeps them
        found.update(store.prompts(ids=[p.id for p in todo]))
    return {p.id: found[p.id] for p in prompts if p.id in found}
