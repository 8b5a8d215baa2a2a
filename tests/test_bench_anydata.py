"""`softrl bench anydata`: what each setting runs, the mixed pool, the report; and the off-policy
baselines end to end through `softrl train`, including the refusal of a pool without mu."""

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from softrl_bench.anydata import SETTINGS, plan
from softrl_bench.learning import weights_digest
from softrl.cli import app
from softrl.data import ExperienceStore


def test_plan_of_each_setting(tmp_path):
    configs = plan("countdown", ["stale", "half", "offline"], 2, tmp_path, 10, 1e-4, 8, 4, 20, 5)
    stale, half, offline = configs["stale"], configs["half"], configs["offline"]
    assert len(stale) == 2 * 3 * 6 and len(half) == 2 * 5 and len(offline) == 2 * 4
    assert {c.runtime.model_update_interval for c in stale} == {1, 4, 16}
    assert all(c.data.mix == {"online": 1.0} and c.data.store.endswith("countdown/store") for c in stale)
    tis = next(c for c in stale if c.name == "grpo-tis-i16-s1")
    assert tis.data.objective.is_correction == "token_truncate" and tis.runtime.model_update_interval == 16
    # half: the same 32-row batch, half of it generated; both pool settings read the pool's store
    assert all(c.sampling.prompts_per_step == 4 and c.data.mix == {"online": 0.5, "offline": 0.5} for c in half)
    assert all(c.data.offline_sources == ["reference", "earlier", "human"] and not c.data.offline_passed_only
               and c.data.store.endswith("countdown/pool") for c in half + offline)
    assert {c.data.objective.algorithm for c in offline} == {"spo", "agro-off", "topr", "kl-pg"}
    assert not any(c.generates for c in offline)
    assert [c.name for c in plan("countdown", ["half"], 1, tmp_path, 10, 1e-4, 8, 4, 20, 5, methods=["topr"])["half"]] \
        == ["topr-s0"]
    with pytest.raises(ValueError, match="unknown setting 'fresh'"):
        plan("countdown", ["fresh"], 1, tmp_path, 10, 1e-4, 8, 4, 20, 5)
    assert SETTINGS["stale"].intervals == (1, 4, 16)


def test_bench_anydata_end_to_end(tiny, tmp_path):
    model = tmp_path / "model"  # a copy: rebuilt in place below
    shutil.copytree(tiny[0], model)
    base = tmp_path / "base.yaml"
    base.write_text(f"model:\n  path: {model}\ntask:\n  size: 6\nq0:\n  k: 4\nsampling:\n  max_new_tokens: 8\n")
    report = tmp_path / "report"
    args = ["bench", "anydata", "--settings", "half,offline", "--methods", "spo,cispo,topr", "--seeds", "1",
            "--steps", "2", "--earlier-steps", "2", "--eval-size", "3", "--eval-every", "2", "--prompts", "2",
            "--base", str(base), "--runs", str(tmp_path / "runs"), "--report", str(report)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    marker = json.loads((tmp_path / "runs/countdown/pool/pool.json").read_text())
    counts = marker["rows"]
    assert marker["model.weights"] == weights_digest(model) is not None  # the pool names its reference
    assert counts["reference"] > 0 and counts["earlier"] == 2 * 2 * 4 and counts["human"] == 6
    pool = ExperienceStore(tmp_path / "runs/countdown/pool").trajectories().to_pylist()
    by_source = {s: [r for r in pool if r["source"] == s] for s in ("reference", "earlier", "human")}
    assert all(r["behavior_logprobs"] for r in by_source["earlier"] + by_source["reference"])
    assert not any(r["behavior_logprobs"] for r in by_source["human"])
    assert {r["run_id"] for r in by_source["earlier"]} == {"earlier"}
    half = json.loads((report / "anydata-countdown-half.json").read_text())
    assert set(half["runs"]) == {"spo", "cispo", "topr"}  # grpo-tis and agro-off left out by --methods
    assert {c["b"] for c in half["comparisons"]} == {"topr", "cispo"}
    offline = json.loads((report / "anydata-countdown-offline.json").read_text())
    assert set(offline["runs"]) == {"spo", "topr"} and all(p["samples"] == 0 for p in offline["curves"]["topr"])
    assert (report / "anydata-countdown-half.png").stat().st_size > 10_000
    assert "| spo | " in (report / "anydata-countdown-offline.md").read_text()
    metrics = (tmp_path / "runs/countdown/half/cispo-s0/metrics.jsonl").read_text()
    assert "cispo/skipped_fraction" in metrics
    again = CliRunner().invoke(app, args)  # finished runs and the pool are reused
    assert again.exit_code == 0 and json.loads((tmp_path / "runs/countdown/pool/pool.json").read_text()) == marker
    weights = model / "model.safetensors"  # the same model rebuilt: other weights at the same path
    weights.write_bytes(weights.read_bytes()[:-4] + b"\0\0\0\0")
    refused = CliRunner().invoke(app, [*args, "--seeds", "2"])
    assert refused.exit_code != 0 and "the pool and the earlier run beside it were made with the reference" \
        in refused.output and "Traceback" not in refused.output


@pytest.mark.parametrize("algorithm, extra", [("topr", []), ("cispo", []), *[
    (algorithm, [f"data.objective.is_correction={how}"]) for algorithm in ("grpo", "rloo", "ppo")
    for how in ("token_truncate", "sequence_truncate", "sequence_mask")]])
def test_train_runs_each_off_policy_baseline(tiny, tmp_path, algorithm, extra):
    from test_training import seed_store, tiny_overrides

    seed_store(tmp_path)
    args = ["train", *tiny_overrides(str(tiny[0]), str(tmp_path), **{"optim.steps": 2, "data.mix": "{online: 1}"}),
            f"data.objective.algorithm={algorithm}", *extra]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in Path(tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "loss" in r] == [1, 2]


def test_a_pool_without_mu_is_refused_in_one_line(tiny, tmp_path):
    from test_training import seed_store, tiny_overrides

    seed_store(tmp_path)  # the task's solutions only: source human, no behaviour log-probs
    args = ["train", *tiny_overrides(str(tiny[0]), str(tmp_path), **{"data.mix": "{offline: 1}"}),
            "data.objective.algorithm=cispo"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and "Traceback" not in result.output
    line = result.output.strip().splitlines()[-1]
    assert "cispo weighs offline rows by pi/mu and none of the 6 offline rows has its sampler's log-probs" in line
    topr = CliRunner().invoke(app, args[:-1] + ["data.objective.algorithm=topr"])  # positives need no mu
    assert topr.exit_code == 0, topr.output
