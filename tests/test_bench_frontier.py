"""`softrl bench frontier`: the plan (regimes, grids, seeds), the choice of points (frontier, best, matched
KL), the one-line refusals, and the quick variant end to end on a tiny model (tuning, report seeds,
reports, resuming without rerunning)."""

import json
import math
import re
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from softrl_bench import frontier as fr
from softrl.cli import app


def test_plan_covers_every_grid_point_of_every_regime(tmp_path):
    s = fr.Settings(tmp_path, steps=10)
    plan = fr.tuning_plan(s, ["lag64", "human"], None, 2)
    lrs = len(fr.LRS)
    per_seed = 11 * 2 * lrs + 3 * 3 * lrs + 3 * 5 * lrs + lrs + (2 * 2 * lrs + lrs)  # lag64: 11 methods x 2
    # strengths (spo-behavior's betas among them), spo-moving's, spo-moving-is's and agro-moving's 3 intervals,
    # spo-ema-is's, agro-ema's and spo-ema-failed's 5 taus, topr; human: 2 and topr
    assert len(plan) == 2 * per_seed and len({c.run_dir for c in plan}) == len(plan)
    lagged = [c for c in plan if Path(c.out_dir).name == "lag64"]
    assert {c.runtime.policy_lag for c in lagged} == {64} and all(c.data.mix == {"online": 1.0} for c in lagged)
    assert {c.seed for c in plan} == {100, 101}  # tuning seeds, apart from the report seeds 0..
    human = [c for c in plan if Path(c.out_dir).name == "human"]
    assert all(c.data.offline_sources == ["human"] and not c.generates and c.runtime.policy_lag == 0 for c in human)
    spo = [c for c in lagged if c.data.objective.algorithm == "spo" and not c.data.objective.reference_update]
    # spo, spo-is and spo-sq
    assert {c.data.objective.loss for c in spo} == {"bce", "squared"}
    assert sorted({(c.optim.lr, round(c.beta, 4)) for c in spo}) == [(lr, b) for lr in fr.LRS for b in (0.0869, 0.25)]
    moving = [c for c in lagged if c.data.objective.algorithm == "spo" and c.data.objective.reference_update]
    # the moving reference's knob; the behaviour reference's is beta
    assert {c.data.objective.reference_update.every for c in moving} == {10, 25, 100, None}
    weighed = [c for c in moving if c.data.objective.is_correction == "sequence_truncate"]
    assert {c.data.objective.reference_update.every for c in weighed} == {10, 25, 100, None}
    assert {c.data.objective.reference_update.ema for c in weighed} == {0.8, 0.9, 0.93, 0.96, 0.99, None}
    assert len(weighed) == 2 * (3 + 5 + 5) * lrs  # spo-moving-is, spo-ema-is and spo-ema-failed
    failed = [c for c in weighed if c.data.objective.is_rows == "failed"]
    assert {c.data.objective.reference_update.ema for c in failed} == {0.8, 0.9, 0.93, 0.96, 0.99}
    assert sorted({round(c.beta, 4) for c in moving if c.data.objective.reference_update.behavior}) == [0.0869, 0.25]
    agro_moving = [c for c in lagged if c.data.objective.algorithm == "agro-off" and c.data.objective.reference_update]
    assert {c.data.objective.reference_update.every for c in agro_moving} == {10, 25, 100, None}
    assert {c.data.objective.reference_update.ema for c in agro_moving} == {0.8, 0.9, 0.93, 0.96, 0.99, None}
    assert len(agro_moving) == 2 * (3 + 5) * lrs and {round(c.beta, 4) for c in agro_moving} == {0.0869}
    for method in fr.MOVING:
        assert method in fr.REGIMES["half"].methods and method not in fr.REGIMES["lag4"].methods
    m2po = [c for c in lagged if c.data.objective.algorithm == "m2po"]
    assert {c.data.objective.tau for c in m2po} == {0.04, 0.2}
    assert all(c.data.store != d.data.store for c, d in zip(plan, plan[1:]))  # a private store each
    half = fr.run_config(s, fr.REGIMES["half"], "cispo", 1e-4, {}, 0)
    assert half.sampling.prompts_per_step == 4 and half.data.offline_sources == ["reference", "earlier", "human"]
    with pytest.raises(ValueError, match="--regimes: unknown regime 'lag2'"):
        fr.tuning_plan(s, ["lag2"], None, 1)
    with pytest.raises(ValueError, match="--methods: unknown method 'ppo'"):
        fr.tuning_plan(s, ["lag1"], ["ppo"], 1)


def test_replay_is_set_against_the_same_batch_all_generated(tmp_path):
    """Replay's pair of regimes: the same 32 rows a step, half generated and half replayed against all
    generated, both evaluated every 25 steps (or as often as the benchmark asks, if more); the same methods."""
    s = fr.Settings(tmp_path, steps=10)
    fresh = fr.run_config(s, fr.REGIMES["fresh"], "agro-off", 1e-4, {}, 0)
    replay = fr.run_config(s, fr.REGIMES["replay"], "agro-off", 1e-4, {}, 0)
    assert fresh.data.mix == {"online": 1.0} and replay.data.mix == {"online": 0.5, "replay": 0.5}
    assert (fresh.sampling.prompts_per_step, replay.sampling.prompts_per_step) == (8, 4)
    assert fresh.eval.every == replay.eval.every == 25 and fresh.runtime.policy_lag == replay.runtime.policy_lag == 1
    often = fr.run_config(fr.Settings(tmp_path, steps=10, eval_every=5), fr.REGIMES["replay"], "grpo-tis", 1e-4, {}, 0)
    assert often.eval.every == 5
    assert fr.REGIMES["fresh"].methods == fr.REGIMES["replay"].methods
    plan = fr.tuning_plan(s, ["replay"], None, 1)
    assert len(plan) == (3 + 2 + 2) * len(fr.LRS) and all(c.data.mix.get("replay") == 0.5 for c in plan)


def test_samples_to_the_target_are_read_between_evaluations():
    from softrl_bench.frontier_runs import average, samples_to

    evals = [{"samples": 0, "pass@1": 0.4}, {"samples": 800, "pass@1": 0.45}, {"samples": 1600, "pass@1": 0.55}]
    assert samples_to(evals, 0.5) == pytest.approx(1200)  # halfway from 0.45 to 0.55
    assert samples_to(evals, 0.4) == 0.0 and samples_to(evals, 0.56) is None
    # on a grid of 1600 the 800 evaluation is not read: the line from 0 to 1600 reaches 0.5 at 1067
    assert samples_to(evals, 0.5, grid=1600) == pytest.approx(1600 * 0.1 / 0.15)
    run = {"pass@k": [0.5], "pass@1": 0.55, "pass@10": None, "kl": 0.3, "distinct": 1.0, "samples": 1600,
           "curve": [(0, 0.4, 0.0)], "lag": None, "clipped_or_masked": 0.0, "evals": evals}
    slower = {**run, "evals": [{**e, "samples": 2 * e["samples"]} for e in evals]}
    never = {**run, "curve": [(0, 0.5, 0.0)]}  # its own reference is higher: 0.6 is never reached
    both = average([run, slower, never])
    assert (both["samples_to_target"], both["reached_target"], both["seeds"]) == (pytest.approx(1800), 2, 3)
    flat = [v for point in both["pass@1_by_samples"] for v in point]
    assert flat == pytest.approx([0, 0.4, 3200 / 3, 0.45, 6400 / 3, 0.55])


def test_the_replay_report_sets_each_method_against_itself_all_generated(tmp_path):
    from softrl_bench.frontier_report import plot_replay, replay_markdown

    def point(name, to_target, reached=4):
        return {"point": name, "pass@1": 0.6, "pass@1_sd": 0.01, "seeds": 4, "of_seeds": 4, "samples": 4800,
                "samples_to_target": to_target, "samples_to_target_sd": 100.0, "reached_target": reached,
                "pass@1_by_samples": [(0, 0.4), (2400, 0.5), (4800, 0.6)]}

    fresh = {"regime": "fresh", "reference_pass@1": 0.4, "target_grid": 800,
             "best": {"agro-off": point("agro-off_lr0.0001", 2000.0), "spo-moving": point("spo-moving_lr3e-05", 0, 0)}}
    replay = {"regime": "replay", "reference_pass@1": 0.4, "best": {"agro-off": point("agro-off_lr0.0003", 1500.0)}}
    fresh["best"]["agro-off"]["to_target_by_seed"] = {"0": 2000.0, "1": 1000.0, "2": None, "3": 3000.0}
    replay["best"]["agro-off"]["to_target_by_seed"] = {"0": 1000.0, "1": 900.0, "2": 800.0}
    table = replay_markdown(fresh, replay)
    assert "| agro-off | agro-off_lr0.0001 | 2000 ± 100 |" in table
    # seed by seed where both of a seed's runs reached it: seeds 0 and 1
    assert "| 1500 ± 100 | 0.600 ± 0.010 (4800) | 0.75 | 0.50, 0.90 (median 0.70) |" in table
    assert "| spo-moving | spo-moving_lr3e-05 | not reached (0 of 4) |" in table and table.rstrip().endswith("| not run | - | not run (-) | - | - |")
    assert plot_replay(fresh, replay, tmp_path / "r.png", ["agro-off", "spo-moving"]).stat().st_size > 10_000


def test_a_replay_pair_of_other_settings_is_named_not_compared(tmp_path):
    """Fresh and replay reports made with other settings (say, another --steps) are not set against each
    other: the lines to show say which settings differ."""
    from softrl_bench.frontier_report import write_reports

    s = fr.Settings(tmp_path / "runs", steps=300)
    for name, steps in (("fresh", 300), ("replay", 30)):
        result = {"regime": name, "reference_pass@1": 0.4, "best": {}, "target_grid": 800,
                  "settings": {**fr.report_settings(s, 1, 4), "steps": steps}}
        (tmp_path / f"frontier-{name}.json").write_text(json.dumps(result))
    lines = write_reports(s, [], None, 1, 4, tmp_path, "frontier")
    assert lines == ["frontier-replay-samples: not rewritten, frontier-fresh.json and frontier-replay.json were made "
                     "with other settings (steps): rerun the one that differs"]
    assert not (tmp_path / "frontier-replay-samples.md").exists()


def test_a_base_objective_merges_into_each_methods_own(tmp_path):
    """A --base that sets objective options (the diagnosis's `eps`, `is_correction`) changes those in each
    method's objective (a method without such an option is refused when its config is built) and no others;
    applied as a whole section it once replaced spo-sq's objective with BCE SPO's, under spo-sq's name."""
    base = {"data": {"objective": {"is_correction": "sequence_truncate"}, "offline_passed_only": True}}
    s = fr.Settings(tmp_path, steps=10, extra=base)
    sq = fr.run_config(s, fr.REGIMES["lag64"], "spo-sq", 1e-4, {"beta": 0.25}, 0)
    assert (sq.data.objective.loss, sq.data.objective.is_correction) == ("squared", "sequence_truncate")
    assert sq.data.offline_passed_only and sq.beta == 0.25  # the rest of the base still applies over the run's
    dotted = fr.Settings(tmp_path, steps=10, extra={"data.objective": {"eps": 0.1}})  # what read_settings gives
    objective = fr.run_config(dotted, fr.REGIMES["lag1"], "spo-sq", 1e-4, {}, 0).data.objective
    assert (objective.loss, objective.eps, objective.is_correction) == ("squared", 0.1, "none")
    leaf = fr.Settings(tmp_path, steps=10, extra={"data.objective": {"is_correction": "sequence_truncate"},
                                                  "data.objective.eps": 0.1})
    assert fr.run_config(leaf, fr.REGIMES["lag1"], "spo-sq", 1e-4, {}, 0).data.objective.eps == 0.1
    renamed = fr.Settings(tmp_path, steps=10, extra={"data.objective": {"algorithm": "topr"}})
    with pytest.raises(ValueError, match="^--base: data.objective.algorithm=topr would run every method as topr"):
        fr.run_config(renamed, fr.REGIMES["lag1"], "agro-off", 1e-4, {}, 0)
    squared = fr.Settings(tmp_path, steps=10, extra={"data": {"objective": {"loss": "squared"}}})
    assert fr.run_config(squared, fr.REGIMES["lag1"], "spo", 1e-4, {}, 0).data.objective.loss == "squared"


def test_frontier_best_and_matched_points():
    points = {"a": [{"point": "a1", "kl": 0.1, "pass@1": 0.40}, {"point": "a2", "kl": 0.5, "pass@1": 0.38},
                    {"point": "a3", "kl": 1.0, "pass@1": 0.60}],
              "b": [{"point": "b1", "kl": 0.3, "pass@1": 0.50}, {"point": "b2", "kl": 2.0, "pass@1": 0.55}],
              "c": [{"point": "c1", "kl": 0.6, "pass@1": 0.45}]}
    assert [p["point"] for p in fr.frontier(points["a"])] == ["a1", "a3"]  # a2 beaten by a1 at less KL
    assert fr.at_kl(fr.frontier(points["a"]), 0.7) == 0.40 and math.isnan(fr.at_kl(fr.frontier(points["b"]), 0.2))
    best, target, matched = fr.tuned(points)
    assert {m: p["point"] for m, p in best.items()} == {"a": "a3", "b": "b2", "c": "c1"}
    assert target == 1.0  # the median of 1.0, 2.0, 0.6
    # nearest on a log scale: b's 2.0 is as near 1.0 as 0.5 would be, nearer than 0.3
    assert {m: p["point"] for m, p in matched.items()} == {"a": "a3", "b": "b2", "c": "c1"}
    collapsed = {"a": points["a"] + [{"point": "a4", "kl": math.nan, "pass@1": 0.0}]}
    assert [p["point"] for p in fr.frontier(collapsed["a"])] == ["a1", "a3"]  # a run without a KL is left out
    # equal pass@1 but for float noise (the half regime's SPO: 0.5139999999999999 at KL 0.39, 0.514 at
    # 0.80, whose lr collapsed on report seeds): the point at less KL is the best
    tie = {"s": [{"point": "s1", "kl": 0.39, "pass@1": 0.5139999999999999}, {"point": "s2", "kl": 0.80, "pass@1": 0.514}]}
    assert fr.tuned(tie)[0]["s"]["point"] == "s1"


@pytest.mark.parametrize("args, message", [
    (["--regimes", "lag1,stale"], "--regimes: unknown regime 'stale'"),
    (["--methods", "spo,ppo"], "--methods: unknown method 'ppo'"),
    (["--regimes", "human", "--methods", "spo,m2po"], "--methods: 'm2po' runs in none of the regimes asked (human)"),
    (["--lrs", "1e-4,fast"], "--lrs: '1e-4,fast' is not a comma-separated list of numbers"),
    (["--lrs", "0,1e-4"], "--lrs: '0,1e-4' must list numbers > 0"),
])
def test_bad_names_are_one_line(tmp_path, args, message):
    result = CliRunner().invoke(app, ["bench", "frontier", "--runs", str(tmp_path), *args])
    assert result.exit_code == 2 and message in result.output and "Traceback" not in result.output


def test_quick_end_to_end_and_resumed(tiny, tmp_path):
    base = tmp_path / "base.yaml"
    base.write_text(f"model:\n  path: {tiny[0]}\ntask:\n  size: 6\nq0:\n  k: 4\nsampling:\n  max_new_tokens: 8\n")
    report = tmp_path / "report"
    args = ["bench", "frontier", "--quick", "--steps", "2", "--eval-size", "3", "--eval-every", "2",
            "--earlier-steps", "2", "--prompts", "2", "--base", str(base), "--runs", str(tmp_path / "runs"),
            "--report", str(report)]
    result = CliRunner().invoke(app, [*args, "--jobs", "2"])
    assert result.exit_code == 0, result.output
    # off a terminal each finished run is a timed line: a log says how far a long study got
    assert re.search(r"^\d\d:\d\d:\d\d tuning: lag1/spo_lr\S+-s100 done \d+/\d+$", result.output, re.M), result.output
    lag = json.loads((report / "frontier-lag16.json").read_text())
    assert set(lag["grid"]) == {"spo", "oapl", "grpo-tis", "topr"}
    assert len(lag["grid"]["spo"]) == 4 and len(lag["grid"]["topr"]) == 2  # 2 lr x 2 strengths; topr lr only
    assert set(lag["best"]) == set(lag["matched"]) == set(lag["grid"]) and all(lag["best"].values())
    spo = lag["best"]["spo"]
    assert len(spo["pass@k"]) == 20 and spo["samples"] == 2 * 2 * 4 and spo["seeds"] == 1
    assert spo["lag"]["max"] == 1  # 2 steps: the lag grows 0, 1 towards its setting, 16
    assert {v["baseline"] for v in lag["against_frontiers"]} == {"grpo-tis", "topr"}
    human = json.loads((report / "frontier-human.json").read_text())
    assert set(human["grid"]) == {"spo", "topr"} and human["best"]["spo"]["samples"] == 0
    assert (report / "frontier-lag1.png").stat().st_size > 10_000
    assert "| spo | spo_lr" in (report / "frontier-human.md").read_text()
    across = (report / "frontier-lags.md").read_text()  # the lags side by side, each method's best point
    assert "| method | lag 1 | lag 16 | lag 16 - lag 1 |" in across and across.count("\n| ") == 1 + 4
    spo_row = next(line for line in across.splitlines() if line.startswith("| spo |"))
    assert spo_row.split(" | ")[2] == f"{spo['pass@1']:.3f} ({spo['kl']:.2f})"  # lag 16's column: its best point
    assert (report / "frontier-lags.png").stat().st_size > 10_000
    # every run starts from the same reference: one evaluation before training per seed (tuning, report)
    assert len(list((tmp_path / "runs/countdown/start-evals").glob("*.json"))) == 2
    runs = tmp_path / "runs/countdown/frontier/lag1"
    stores = tmp_path / "runs/countdown/frontier-stores"
    assert not [p for p in stores.rglob("*") if p.is_file()]  # each run's private store removed when it ended
    first = {p.name: (p / "summary.json").stat().st_mtime for p in runs.iterdir()}
    reported = json.loads((report / "frontier-lag1.json").read_text())
    again = CliRunner().invoke(app, [*args, "--regimes", "lag1"])
    assert again.exit_code == 0, again.output
    assert {p.name: (p / "summary.json").stat().st_mtime for p in runs.iterdir()} == first  # nothing rerun
    assert json.loads((report / "frontier-lag1.json").read_text()) == reported
    assert (report / "frontier-lags.md").read_text() == across  # lag 16 read back from its report
    kept = report / "frontier-runs.jsonl"
    assert len(kept.read_text().splitlines()) == len(list(tmp_path.glob("runs/countdown/frontier/*/*-s*")))
    shutil.rmtree(tmp_path / "runs")  # a fresh machine: only the committed outcomes are left
    fresh = CliRunner().invoke(app, [*args, "--regimes", "lag1"])
    assert fresh.exit_code == 0, fresh.output
    assert not (tmp_path / "runs/countdown/frontier").exists()  # nothing trained, not even the pool
    assert json.loads((report / "frontier-lag1.json").read_text()) == reported
    changed = CliRunner().invoke(app, [*args, "--regimes", "lag1", "--report-only", "--eval-size", "4"])
    assert changed.exit_code != 0 and "was kept with task.eval_size=3, this benchmark asks task.eval_size=4" in changed.output
    assert "Traceback" not in changed.output


def test_replay_end_to_end_on_a_tiny_model(tiny, tmp_path):
    """Replay's pair of regimes through the command: half of each batch replayed, and the comparison of
    samples to the target written beside their reports."""
    base = tmp_path / "base.yaml"
    base.write_text(f"model:\n  path: {tiny[0]}\ntask:\n  size: 6\nq0:\n  k: 4\nsampling:\n  max_new_tokens: 8\n")
    report = tmp_path / "report"
    result = CliRunner().invoke(app, [
        "bench", "frontier", "--quick", "--regimes", "fresh,replay", "--methods", "grpo-tis", "--lrs", "1e-4",
        "--steps", "3", "--eval-size", "3", "--eval-every", "1", "--earlier-steps", "1", "--prompts", "2",
        "--base", str(base), "--runs", str(tmp_path / "runs"), "--report", str(report)])
    assert result.exit_code == 0, result.output
    replay = json.loads((report / "frontier-replay.json").read_text())
    best = replay["best"]["grpo-tis"]
    assert best["samples"] == 3 * 1 * 4 and len(best["pass@1_by_samples"]) == 4  # one prompt of 2 generated a step
    assert json.loads((report / "frontier-fresh.json").read_text())["best"]["grpo-tis"]["samples"] == 3 * 2 * 4
    table = (report / "frontier-replay-samples.md").read_text()
    assert "| grpo-tis | grpo-tis_lr0.0001_beta=" in table and (report / "frontier-replay-samples.png").is_file()
    metrics = [json.loads(line) for line in next((tmp_path / "runs").rglob("replay/*/metrics.jsonl")).read_text().splitlines()]
    assert any("loss/replay" in r for r in metrics[2:]) and not any("loss/replay" in r for r in metrics[:2])  # from step 2


def test_report_seeds_are_averaged_as_they_finish(tmp_path):
    """A benchmark in chunks: a point with some of its report seeds kept is reported on those, and says so."""
    from softrl_bench.frontier_report import _pm
    from softrl_bench.frontier_runs import key
    from softrl_bench.learning import settings_of

    kept = tmp_path / "kept.jsonl"
    s = fr.Settings(tmp_path, steps=10, kept=kept)
    regime, point = fr.REGIMES["lag1"], {"point": "p", "lr": 1e-4, "strength": {"beta": 0.25}}
    assert fr.reported(s, regime, point, "spo", 2) is None
    result = {"pass@k": [0.5, 0.7], "pass@1": 0.5, "pass@10": None, "kl": 0.3, "distinct": 2.0, "samples": 320,
              "curve": [(0, 0.4, 0.0), (10, 0.5, 0.3)], "lag": None, "clipped_or_masked": 0.0}
    config = fr.run_config(s, regime, "spo", 1e-4, {"beta": 0.25}, 1)
    named = {k: v for k, v in settings_of(config).items() if k == "model.weights"}  # as every kept outcome does
    kept.write_text(json.dumps({"key": key(config), "settings": named, "outcome": result}) + "\n")
    partial = fr.reported(s, regime, point, "spo", 2)
    assert (partial["seeds"], partial["of_seeds"], partial["pass@1"]) == (1, 2, 0.5)
    assert _pm(partial, "pass@1") == "0.500 (1 of 2 seeds)"


def test_the_frontier_keeps_its_reference_beside_its_outcomes(tmp_path, monkeypatch):
    """A bootstrap's training differs across machines, so the frontier keeps the reference its outcomes
    were made with beside them (frontier-runs.jsonl: frontier-reference/) and installs it on the next
    machine; an outcome kept without naming its model's weights is refused, not mixed in."""
    from dataclasses import asdict

    from softrl_bench.frontier_runs import key, outcome
    from softrl_bench.learning import weights_digest
    from softrl_bench.reference import reference_dir
    from softrl.bootstrap import TASK_DEFAULTS, BootstrapConfig
    from softrl.config import ConfigError

    monkeypatch.setenv("SOFTRL_CACHE", str(tmp_path / "cache"))
    builds = []

    def fake_bootstrap(task):  # a "model": one weights file whose bytes say which build it is
        final = reference_dir(task)
        final.mkdir(parents=True, exist_ok=True)
        (final / "model.safetensors").write_bytes(f"build {len(builds)}".encode())
        recipe = asdict(BootstrapConfig(task=task, **TASK_DEFAULTS.get(task, {})))
        (final / "softrl.json").write_text(json.dumps({"config": recipe}))
        builds.append(task)
        return final

    monkeypatch.setattr("softrl.bootstrap.bootstrap", fake_bootstrap)
    report = tmp_path / "report"
    s = fr.Settings(tmp_path / "runs", kept=report / "frontier-runs.jsonl")
    assert fr.kept_reference(s) == report / "frontier-reference"
    fr.install_reference(s)
    assert builds == ["countdown"] and weights_digest(report / "frontier-reference") == weights_digest(
        reference_dir("countdown")) is not None
    shutil.rmtree(tmp_path / "cache")  # another machine: the kept reference is installed, not rebuilt
    fr.install_reference(s)
    assert builds == ["countdown"] and (reference_dir("countdown") / "model.safetensors").read_bytes() == b"build 0"
    config = fr.run_config(s, fr.REGIMES["lag1"], "spo", 1e-4, {"beta": 0.25}, 0)
    result = {"pass@1": 0.5, "curve": [(0, 0.4, 0.0)]}
    s.kept.write_text(json.dumps({"key": key(config), "settings": {"seed": 0}, "outcome": result}) + "\n")
    with pytest.raises(ConfigError, match="was kept with model.weights=None, this benchmark asks model.weights="):
        outcome(s.kept, config)
    shutil.rmtree(report / "frontier-reference")  # outcomes whose reference was not committed with them
    shutil.rmtree(tmp_path / "cache")
    with pytest.raises(ConfigError, match="holds outcomes but the reference they were made with is not beside them"):
        fr.install_reference(s)
    assert builds == ["countdown"]  # no new build kept in its place
    tiny_base = fr.Settings(tmp_path / "runs", kept=s.kept, extra={"model.path": str(tmp_path / "model")})
    fr.install_reference(tiny_base)  # a model that is not a bootstrap reference: nothing to install
    assert builds == ["countdown"]


def test_a_method_grid_grows_past_the_edge_its_best_lies_on(tmp_path):
    """A method whose best tuning point lies at an edge of the learning rates gets the next rung of the
    1-3-10 ladder there (up to `extend` each way), once every point of its grid finished; inside, nothing."""
    from softrl_bench.frontier_runs import key
    from softrl_bench.learning import settings_of

    kept = tmp_path / "kept.jsonl"
    s = fr.Settings(tmp_path, lrs=(1e-4, 3e-4), extend=1, kept=kept)
    lag1 = fr.REGIMES["lag1"]

    def finish(method, lr, strength, pass1):
        config = fr.run_config(s, lag1, method, lr, strength, fr.TUNE_SEED)
        named = {k: v for k, v in settings_of(config).items() if k == "model.weights"}
        result = {"pass@1": pass1, "pass@k": [pass1], "kl": 1.0, "curve": [(0, 0.4, 0.0)], "lag": None}
        with kept.open("a") as f:
            f.write(json.dumps({"key": key(config), "settings": named, "outcome": result}) + "\n")

    assert fr.method_grid(s, lag1, "topr", 1).lrs == (1e-4, 3e-4)
    finish("topr", 1e-4, {}, 0.5)
    assert fr.method_grid(s, lag1, "topr", 1).lrs == (1e-4, 3e-4)  # not before the whole grid finished
    finish("topr", 3e-4, {}, 0.6)
    assert fr.method_grid(s, lag1, "topr", 1).lrs == (1e-4, 3e-4, 1e-3)
    assert [c.optim.lr for c in fr.tuning_plan(s, ["lag1"], ["topr"], 1)] == [1e-4, 3e-4, 1e-3]
    finish("topr", 1e-3, {}, 0.7)  # the edge again, but it grew once that way already
    assert fr.method_grid(s, lag1, "topr", 1).lrs == (1e-4, 3e-4, 1e-3)
    for lr, strength, pass1 in ((1e-4, {"beta": 0.0869}, 0.4), (1e-4, {"beta": 0.25}, 0.55),
                                (3e-4, {"beta": 0.0869}, 0.5), (3e-4, {"beta": 0.25}, 0.3)):
        finish("spo", lr, strength, pass1)
    assert fr.method_grid(s, lag1, "spo", 1).lrs == (3e-5, 1e-4, 3e-4)  # its best, at either strength, at the low edge
    for lr, pass1 in ((1e-4, math.nan), (3e-4, 0.2), (1e-3, 0.1)):  # a point that diverged is never the best
        finish("cispo", lr, {"data.objective.cap": 2.0}, pass1)
        finish("cispo", lr, {"data.objective.cap": 5.0}, 0.1)
    assert fr.method_grid(fr.Settings(tmp_path, lrs=(1e-4, 3e-4, 1e-3), kept=kept), lag1, "cispo", 1).lrs == (1e-4, 3e-4, 1e-3)
    assert fr.regime_result(s, lag1, ["spo", "topr"], 1, 1)["grid_finished"] == "7 of 9"
    assert fr.choose(fr.grid_points(s, lag1, fr.regime_grids(s, lag1, ["spo", "topr"], 1), 1))["best"]["topr"]["lr"] == 1e-3


def test_a_method_grid_grows_its_strengths_past_an_edge_only_when_asked(tmp_path):
    """With `extend_strength`, a knob whose best value lies at an edge of its values gets the next rung of
    `Method.past` there once every point finished on every tuning seed; the rates are read again over the
    grown knob, and nothing leaves the grid. Without it, inside the grid, or past the rungs it may take,
    nothing grows."""
    from softrl_bench.frontier_report import markdown
    from softrl_bench.frontier_runs import key
    from softrl_bench.learning import settings_of

    kept = tmp_path / "kept.jsonl"
    s = fr.Settings(tmp_path, lrs=(1e-4, 3e-4, 1e-3), extend=1, extend_strength=1, kept=kept)
    lag1, tau = fr.REGIMES["lag1"], "data.objective.reference_update.ema"

    def finish(lr, value, pass1, seeds=(0, 1)):
        for k in seeds:
            config = fr.run_config(s, lag1, "spo-ema-is", lr, {tau: value}, fr.TUNE_SEED + k)
            named = {n: v for n, v in settings_of(config).items() if n == "model.weights"}
            result = {"pass@1": pass1 + 0.01 * k, "pass@k": [pass1], "kl": 1.0, "curve": [(0, 0.4, 0.0)], "lag": None}
            with kept.open("a") as f:
                f.write(json.dumps({"key": key(config), "settings": named, "outcome": result}) + "\n")

    def taus(grid):
        return [st[tau] for st in grid.strengths]

    declared = taus(fr.METHODS["spo-ema-is"])
    for lr in s.lrs:
        for i, v in enumerate(declared):
            finish(lr, v, 0.6 - 0.01 * i if lr == 3e-4 else 0.3, seeds=(0,) if (lr, i) == (1e-3, 4) else (0, 1))
    grid = fr.method_grid(s, lag1, "spo-ema-is", 2)
    assert taus(grid) == declared  # one point has one tuning seed of two: nothing is read yet
    finish(1e-3, declared[4], 0.3, seeds=(1,))
    grid = fr.method_grid(s, lag1, "spo-ema-is", 2)
    assert grid.lrs == s.lrs and taus(grid) == [0.7, *declared]  # best at the fast edge, at the middle rate
    assert fr.method_grid(fr.Settings(tmp_path, lrs=s.lrs, kept=kept), lag1, "spo-ema-is", 2).strengths \
        == fr.METHODS["spo-ema-is"].strengths  # not asked: the grid as declared
    assert sorted({(c.optim.lr, c.data.objective.reference_update.ema)
                   for c in fr.tuning_plan(s, ["lag1"], ["spo-ema-is"], 2)}) \
        == sorted((lr, v) for lr in s.lrs for v in (0.7, *declared))
    finish(1e-4, 0.7, 0.2)
    finish(3e-4, 0.7, 0.5)
    assert fr.method_grid(s, lag1, "spo-ema-is", 2).lrs == s.lrs  # not before every rate has the rung
    finish(1e-3, 0.7, 0.7)  # the best at two edges: the rate grows up; the knob took its one rung that way
    grid = fr.method_grid(s, lag1, "spo-ema-is", 2)
    assert taus(grid) == [0.7, *declared] and grid.lrs == (1e-4, 3e-4, 1e-3, 3e-3)
    finish(3e-3, 0.7, 0.1)
    for v in declared:
        finish(3e-3, v, 0.1)
    grid = fr.method_grid(s, lag1, "spo-ema-is", 2)  # settled: the best inside the rates, the rung taken
    assert taus(grid) == [0.7, *declared] and grid.lrs == (1e-4, 3e-4, 1e-3, 3e-3)
    result = fr.regime_result(s, lag1, ["spo-ema-is"], 2, 1)
    assert result["method_strengths"] == {"spo-ema-is": [f"ema={v:g}" for v in (0.7, *declared)]}
    assert result["settings"]["extend_strength"] == 1 and result["grid_finished"] == "24 of 24"
    assert "strength knobs grown so: spo-ema-is ['ema=0.7', 'ema=0.8'" in markdown(result)
    assert "extend_strength" not in fr.report_settings(fr.Settings(tmp_path), 1, 1)
    assert "method_strengths" not in fr.regime_result(fr.Settings(tmp_path, lrs=s.lrs, kept=kept), lag1,
                                                      ["spo-ema-is"], 2, 1)
    assert fr.tuning_rounds(fr.Settings(tmp_path, extend=1)) == 2  # as before the knobs could grow
    assert fr.tuning_rounds(s) == 6

    slow = fr.Settings(tmp_path / "slow", lrs=s.lrs, extend_strength=2, kept=tmp_path / "slow.jsonl")
    s, kept = slow, slow.kept
    for lr in s.lrs:
        for i, v in enumerate(declared):
            finish(lr, v, 0.6 if (lr, i) == (3e-4, 4) else 0.3)
    # the slow edge's one rung (0.997), though two were allowed; none at the fast edge
    assert taus(fr.method_grid(s, lag1, "spo-ema-is", 2)) == [*declared, 0.997]
    for lr in s.lrs:
        finish(lr, 0.997, 0.7)
    assert taus(fr.method_grid(s, lag1, "spo-ema-is", 2)) == [*declared, 0.997]  # no rung left that way
    inside = fr.Settings(tmp_path / "inside", lrs=s.lrs, extend_strength=1, kept=tmp_path / "inside.jsonl")
    s, kept = inside, inside.kept
    for lr in s.lrs:
        for i, v in enumerate(declared):
            finish(lr, v, 0.6 if (lr, i) == (3e-4, 2) else 0.3)
    assert fr.method_grid(s, lag1, "spo-ema-is", 2) == fr.Grid(s.lrs, fr.METHODS["spo-ema-is"].strengths)


def test_lags_side_by_side_only_of_one_settings(tmp_path):
    """The across-lags table reads the lag reports of the same settings back from the folder (a quick run's
    are left out and named); a method not run at a lag says so, and the change needs both ends."""
    from softrl_bench.frontier_report import lag_results, lags_markdown

    full = {"steps": 300, "lrs": [3e-5, 1e-4], "report_seeds": [0, 1]}
    point = {"pass@1": 0.5, "pass@1_sd": 0.01, "seeds": 2, "of_seeds": 2, "kl": 0.25}
    reports = {1: (full, {"spo": point, "topr": {**point, "pass@1": 0.6}}),
               4: ({**full, "steps": 30}, {"spo": point}),  # a quick run's, in the same folder
               16: (full, {"spo": {**point, "pass@1": 0.4}, "topr": None})}
    for lag, (settings, best) in reports.items():
        (tmp_path / f"frontier-lag{lag}.json").write_text(json.dumps({"regime": f"lag{lag}", "lag": lag,
                                                                      "settings": settings, "best": best}))
    (tmp_path / "frontier-half.json").write_text("not a lag report")
    by_lag, others = lag_results(tmp_path, "frontier", [1, 4, 16, 64], {**full, "lrs": (3e-5, 1e-4)})
    assert list(by_lag) == [1, 16] and others == [tmp_path / "frontier-lag4.json"]
    table = lags_markdown(by_lag)
    assert "| spo | 0.500 ± 0.010 (0.25) | 0.400 ± 0.010 (0.25) | -0.100 |" in table
    assert "| topr | 0.600 ± 0.010 (0.25) | not run | - |" in table


def test_lags_picture_joins_lags_of_other_tuning_seeds_and_is_not_narrowed_by_other_settings(tmp_path):
    """A lag retuned on two tuning seeds is drawn beside lags tuned on one, the picture naming each lag's
    seeds. A lag report of other settings (a quick run's) leaves a picture already drawn as it was: redrawn,
    it would drop that lag's column. With no picture yet, the lags that match are drawn."""
    from softrl_bench.frontier_report import write_reports

    s = fr.Settings(tmp_path / "runs", kept=tmp_path / "frontier-runs.jsonl")
    ours = json.loads(json.dumps(fr.report_settings(s, 2, 4)))
    point = {"pass@1": 0.5, "pass@1_sd": 0.01, "seeds": 4, "of_seeds": 4, "kl": 0.25}

    def lag_report(lag, settings):
        (tmp_path / f"frontier-lag{lag}.json").write_text(json.dumps(
            {"regime": f"lag{lag}", "lag": lag, "settings": settings, "best": {"spo": point},
             "reference_pass@1": 0.4}))

    for lag, settings in ((1, {**ours, "tune_seeds": [100]}), (64, ours), (256, ours)):
        lag_report(lag, settings)
    lines = write_reports(s, [], None, 2, 4, tmp_path, "frontier")
    table = (tmp_path / "frontier-lags.md").read_text()
    assert "| method | lag 1 | lag 64 | lag 256 |" in table and not any(line.startswith("frontier-lags:") for line in lines)
    assert "Tuning seeds: lag 1: 1, lag 64: 2, lag 256: 2." in table
    figure = (tmp_path / "frontier-lags.png").read_bytes()
    assert len(figure) > 10_000
    lag_report(4, {**ours, "steps": 30})  # a quick run's lag in the same folder
    (tmp_path / "frontier-lags.md").write_text("three lags, one benchmark")
    lines = write_reports(s, [], None, 2, 4, tmp_path, "frontier")
    assert (tmp_path / "frontier-lags.md").read_text() == "three lags, one benchmark"
    assert (tmp_path / "frontier-lags.png").read_bytes() == figure
    assert any("frontier-lags: left as it was: frontier-lag4.json made with other settings" in line for line in lines)
    (tmp_path / "frontier-lags.md").unlink()  # no picture yet: the matching lags are drawn, the other named
    lines = write_reports(s, [], None, 2, 4, tmp_path, "frontier")
    assert "| method | lag 1 | lag 64 | lag 256 |" in (tmp_path / "frontier-lags.md").read_text()
    assert any("frontier-lag4.json left out (made with other settings)" in line for line in lines)


def test_a_report_tuned_on_more_seeds_is_not_replaced_by_one_tuned_on_fewer(tmp_path):
    """The default --tune-seeds 1 must not quietly undo a two-seed retune: a regime's report of the same
    benchmark tuned on more seeds is left as it was, in one line naming both; one of other settings, or a
    damaged one, is no such report."""
    from softrl_bench import frontier_report

    s = fr.Settings(tmp_path / "runs", kept=tmp_path / "frontier-runs.jsonl")
    one, two = (json.loads(json.dumps(fr.report_settings(s, k, 4))) for k in (1, 2))
    kept = tmp_path / "frontier-lag64.json"
    kept.write_text(json.dumps({"regime": "lag64", "settings": two, "best": {}}))
    assert frontier_report._more_surely_tuned(kept, one) == [100, 101]
    assert frontier_report._more_surely_tuned(kept, two) is None
    assert frontier_report._more_surely_tuned(kept, {**one, "steps": 30}) is None  # another benchmark: replaced
    lines = frontier_report.write_reports(s, ["lag64"], None, 1, 4, tmp_path, "frontier")
    assert json.loads(kept.read_text())["settings"] == two and not (tmp_path / "frontier-lag64.md").exists()
    assert "frontier-lag64: left as it was: tuned on seeds [100, 101], this run on [100] (give --tune-seeds 2" in lines[0]
    kept.write_text("{damaged")
    assert frontier_report._more_surely_tuned(kept, one) is None


def test_a_method_has_one_colour_in_every_figure(tmp_path, monkeypatch):
    """Each regime lists its own methods in its own order; the across-lags figure, in another: a method's
    colour comes from its place in the benchmark's method list, so it is the same in all of them."""
    from softrl_bench import frontier_report

    seen = []

    def keep_colours(fig, out, *axes):
        seen.append({line.get_label(): line.get_color() for ax in axes for line in ax.get_lines()})
        return out

    monkeypatch.setattr(frontier_report, "save_figure", keep_colours)
    point = {"point": "p", "pass@1": 0.5, "pass@1_sd": 0.0, "kl": 0.3, "kl_sd": 0.0, "pass@k": [0.5, 0.6]}

    def result(methods):
        return {"regime": "lag1", "grid": {m: [point] for m in methods}, "frontiers": {m: ["p"] for m in methods},
                "best": {m: point for m in methods}, "matched": {}, "target_kl": math.nan,
                "reference_pass@1": math.nan, "settings": {"tune_seeds": [100]}}

    order = ["grpo_tis", "spo", "topr"]
    frontier_report.plot(result(["spo", "topr"]), tmp_path / "a.png", order)
    frontier_report.plot(result(["topr", "grpo_tis", "spo"]), tmp_path / "b.png", order)
    frontier_report.plot_lags({1: result(["topr", "spo"]), 4: result(["spo", "extra"])}, tmp_path / "c.png", order)
    assert len({figure["spo"] for figure in seen}) == 1 and len({figure["topr"] for figure in seen}) == 1
    assert seen[0]["spo"] != seen[0]["topr"] and seen[2]["extra"] not in (seen[2]["spo"], seen[2]["topr"])


def test_bench_commands_refuse_unknown_names_and_never_overwrite_a_report_with_nothing(tmp_path):
    """Issue 52's bench commands: an unknown method in --methods stops the command before anything runs;
    --report-only with a mistyped outcomes file says so and leaves the reports alone; a damaged report
    beside them is named in one line."""
    runner = CliRunner()
    for args in (["bench", "learning", "--methods", "spo-online,spo-onlien"],
                 ["bench", "anydata", "--methods", "spo,sop", "--settings", "half"]):
        result = runner.invoke(app, [*args, "--runs", str(tmp_path / "runs")])
        assert result.exit_code == 2 and "unknown method" in result.output and "Traceback" not in result.output, args
        assert not (tmp_path / "runs").exists()
    report = tmp_path / "report"
    report.mkdir()
    (report / "frontier-lag1.md").write_text("a good report")
    missing = runner.invoke(app, ["bench", "frontier", "--report-only", "--regimes", "lag1", "--report", str(report),
                                  "--kept", str(tmp_path / "frontier-runs.jsnol")])
    assert missing.exit_code == 2 and "no finished runs in" in missing.output and "frontier-runs.jsnol" in missing.output
    assert (report / "frontier-lag1.md").read_text() == "a good report"
    (report / "frontier-lag4.json").write_text("{not json")
    from softrl_bench.frontier_report import lag_results
    from softrl.config import ConfigError

    with pytest.raises(ConfigError, match="frontier-lag4.json: not a JSON report"):
        lag_results(report, "frontier", [1, 4], {})
    (report / "frontier-lag4.json").unlink()
    empty = tmp_path / "frontier-runs.jsonl"
    empty.write_text("")
    from softrl_bench.frontier_report import write_reports

    lines = write_reports(fr.Settings(tmp_path / "runs", kept=empty), ["lag1"], ["spo"], 1, 1, report, "frontier")
    assert any("frontier-lag1: no finished run" in line for line in lines)
    assert (report / "frontier-lag1.md").read_text() == "a good report"
