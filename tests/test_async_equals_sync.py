"""Async equals sync where it should: the local async runtime and Ray, held to no staleness
(`runtime.max_staleness: 0`), sample, learn and end exactly as local sync on the same seed; a bound
of S keeps every step's measured lag (recorded in every run) within S."""

import json

import pytest
import torch

pytest.importorskip("transformers")

from softrl.config import ConfigError, load_config  # noqa: E402
from softrl.data import ExperienceStore  # noqa: E402
from softrl.models.wrappers import PolicyModel  # noqa: E402
from test_training import seed_store, tiny_overrides  # noqa: E402


def trained(tiny, root, **runtime):
    """(online rows as (policy version, prompt, response), per-step records, final weights) of a
    4-step run of the tiny model with these `runtime.` settings, in `root`."""
    seed_store(root)
    config = load_config(None, tiny_overrides(str(tiny[0]), str(root), **{
        "sampling.prompts_per_step": 4, "optim.steps": 4, "log.checkpoint_every": 4,
        **{f"runtime.{k}": v for k, v in runtime.items()}}))
    if config.runtime.kind == "ray":
        from softrl.runtime.ray_runtime import train
    else:
        from softrl.runtime.local import train
    train(config, log=lambda m: None)
    online = ExperienceStore(root / "store").trajectories(source="online", run_id="run").to_pylist()
    rows = sorted((r["policy_version"], r["prompt_id"], r["response_text"]) for r in online)
    records = [json.loads(line) for line in (root / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "loss" in r]
    return rows, steps, PolicyModel.load(root / "run" / "final").model.state_dict()


def assert_same_run(a, b):
    rows_a, steps_a, weights_a = a
    rows_b, steps_b, weights_b = b
    assert rows_a == rows_b and len(rows_a) == 4 * 4 * 2  # every step's samples, and no batch sampled ahead
    for x, y in zip(steps_a, steps_b, strict=True):
        assert x["loss"] == y["loss"] and x["staleness/max"] == y["staleness/max"]
    assert all(torch.equal(weights_a[k], weights_b[k]) for k in weights_a)


@pytest.mark.parametrize("interval", [1, 2])
def test_async_held_to_no_staleness_trains_exactly_as_sync(tiny, tmp_path, interval):
    sync = trained(tiny, tmp_path / "sync", mode="sync", model_update_interval=interval)
    held = trained(tiny, tmp_path / "async", mode="async", model_update_interval=interval, max_staleness=0)
    assert_same_run(sync, held)
    # with updates every 2 steps sync itself samples with weights one update old every other step
    assert [s["staleness/max"] for s in held[1]] == ([0, 0, 0, 0] if interval == 1 else [0, 1, 0, 1])


def test_ray_held_to_no_staleness_trains_exactly_as_local_sync(tiny, tmp_path):
    pytest.importorskip("ray")
    sync = trained(tiny, tmp_path / "sync", mode="sync")
    held = trained(tiny, tmp_path / "ray", kind="ray", workers=1, max_staleness=0)
    assert_same_run(sync, held)
    assert [s["staleness/max"] for s in held[1]] == [0, 0, 0, 0]


def test_a_staleness_bound_holds_and_every_step_records_its_lag(tiny, tmp_path):
    free = trained(tiny, tmp_path / "free", mode="async")
    bound = trained(tiny, tmp_path / "bound", mode="async", max_staleness=1)
    for steps in (free[1], bound[1]):
        assert all({"staleness/mean", "staleness/min", "staleness/max"} <= s.keys() for s in steps)
    assert max(s["staleness/max"] for s in bound[1]) <= 1


def test_a_staleness_bound_on_sync_is_refused(tiny, tmp_path):
    with pytest.raises(ConfigError, match="runtime.max_staleness"):
        load_config(None, tiny_overrides(str(tiny[0]), str(tmp_path), **{"runtime.max_staleness": 0}))
