"""`softrl bench study`: what each study runs, the pts source of the mix, the toy sweep of on-policy
AGRO, reuse of finished runs only with the same settings, and the growing store end to end."""

import json
import math
import shutil

import pytest
from conftest import save_char_llama
from typer.testing import CliRunner

from softrl_bench import agro_sweep, grow
from softrl_bench.learning import WEIGHTS_RECORD, check_same_settings, final, judged, settings_of
from softrl_bench.studies import ARMS, STUDIES, check_claims, plan, study_config
from softrl.cli import app
from softrl.config import config_from
from softrl.data import ExperienceStore, Trajectory
from softrl.tabular import SPO_BETA


def test_every_study_plans_equal_batches(tmp_path):
    for study in STUDIES.values():
        configs = plan(study, 2, tmp_path, 10, 1e-4, 32, 20, 5)
        assert len(configs) == 2 * len(study.arms) and {c.seed for c in configs} == {0, 1}
        for c in configs:
            mix, group = c.data.mix, c.sampling.samples_per_prompt
            online = mix.get("online", 0) / sum(mix.values())
            assert c.sampling.prompts_per_step * group == round(32 * online)  # the generated share of 32 rows
    loss, reverse = STUDIES["loss"], STUDIES["reverse"]
    # an arm in two studies is one run: the same directory and the same settings
    a = study_config(loss, "terminal-squared", 0, tmp_path, 10, 1e-4, 32, 20, 5)
    b = study_config(reverse, "terminal-squared", 0, tmp_path, 10, 1e-4, 32, 20, 5)
    assert a.run_dir == b.run_dir and a.model_dump() == b.model_dump()
    assert a.data.objective.loss == "squared" and a.data.objective.terminal == 1.0
    rev = study_config(reverse, "reverse-bce", 0, tmp_path, 10, 1e-4, 32, 20, 5).data.objective
    assert (rev.terminal, rev.reverse, rev.loss) == (0.0, 1.0, "bce")
    mc = study_config(STUDIES["mc"], "mc-targets", 0, tmp_path, 10, 1e-4, 32, 20, 5)
    assert mc.data.mix == {"online": 0.5, "offline": 0.25, "mc": 0.25} and mc.data.objective_for("mc").mc == 1.0
    assert mc.data.objective_for("offline").mc == 0.0
    agro = [c for c in plan(STUDIES["agro"], 1, tmp_path, 10, 1e-4, 64, 20, 5) if c.data.objective.algorithm == "agro-on"]
    assert all(c.sampling.prompts_per_step * c.sampling.samples_per_prompt == 64 for c in agro)
    assert {c.beta for c in agro} == {0.2, 0.5, 1.0}
    assert len({(c.beta, c.sampling.samples_per_prompt, c.optim.lr) for c in agro}) == len(agro)


def test_claims_follow_the_paired_curves():
    def curve(*pass1):
        return [{"pass@1": p, "pass@10": 0.9} for p in pass1]

    runs = {"terminal-squared": {s: curve(0.4, 0.5 + s / 100, 0.6 + s / 100) for s in range(3)},
            "terminal-bce": {s: curve(0.4, 0.45, 0.5 + s / 50) for s in range(3)},
            "advantage-bce": {s: curve(0.4, 0.5 + s / 100, 0.6 + s / 100) for s in range(3)}}
    claims = {(c["b"], c["compared"]): c for c in check_claims(STUDIES["loss"], runs)}
    faster = claims[("terminal-bce", "pass@1 averaged over the evaluations")]
    assert faster["verdict"] == "higher" and faster["reproduced"] and faster["seeds"] == 3
    assert claims[("advantage-bce", "final pass@1")]["diff"] == 0 and not claims[("advantage-bce", "final pass@1")]["reproduced"]
    assert all(c["verdict"] == "not run" for c in check_claims(STUDIES["reverse"], {}))


def test_finished_run_reused_only_with_its_settings(tmp_path):
    config = config_from({"name": "r", "out_dir": str(tmp_path), "optim.lr": 1e-4})
    config.run_dir.mkdir(parents=True)
    import yaml

    (config.run_dir / "config.yaml").write_text(yaml.safe_dump(config.model_dump(mode="json")))
    weights = settings_of(config).get("model.weights")  # "bootstrap": the cache's build, where there is one
    if weights:
        (config.run_dir / WEIGHTS_RECORD).write_text(weights)
    check_same_settings(config)
    other = config_from({"name": "r", "out_dir": str(tmp_path), "optim.lr": 3e-4})
    with pytest.raises(ValueError, match=r"finished with optim.lr=0.0001, this benchmark asks optim.lr=0.0003: give another --runs"):
        check_same_settings(other)
    # a run saved before an objective gained an option ran at that option's default: still the same settings
    saved = config.model_dump(mode="json")
    del saved["data"]["objective"]["is_correction"]
    (config.run_dir / "config.yaml").write_text(yaml.safe_dump(saved))
    check_same_settings(config)
    saved["data"]["objective"]["eps"] = 0.1
    (config.run_dir / "config.yaml").write_text(yaml.safe_dump(saved))
    with pytest.raises(ValueError, match=r"finished with data.objective=.*'eps': 0.1"):
        check_same_settings(config)


def test_feed_draws_the_pts_source_from_pts_rollouts_only(tiny, tmp_path):
    from softrl.models.loading import tokenizer_fingerprint
    from softrl.runtime.feed import DataFeed
    from softrl.tasks.registry import load_task

    task = load_task("countdown", size=4)
    prompts = task.prompts()
    store = ExperienceStore(tmp_path / "store")
    rows = [Trajectory(p.id, f"{source} {i}", reward=float(i % 2), passed=bool(i % 2), task="countdown",
                       source=source, prompt_tokens=[3, 4], response_tokens=[5, 6, 7 + i, 9 + len(source)],
                       tokenizer=tokenizer_fingerprint(tiny[2]))
            for p in prompts for source in ("reference", "pts") for i in range(4)]
    store.append(rows)
    config = config_from({"task.name": "countdown", "task.size": 4, "data.store": str(tmp_path / "store"),
                          "data.mix": {"online": 0.5, "offline": 0.25, "pts": 0.25}})
    feed = DataFeed(config, store, task, {p.id: 0.5 for p in prompts}, tiny[2], log=lambda m: None)
    pts, offline = (feed.mixture.sources[s].fetch(list(range(len(feed.mixture.sources[s])))) for s in ("pts", "offline"))
    assert {r["source"] for r in pts} == {"pts"} and len(pts) == 16  # failed rollouts too
    assert {r["source"] for r in offline} == {"reference"} and all(r["passed"] for r in offline)


def test_agro_toy_sweep_converges_at_large_beta_and_collapses_at_spo_beta():
    big = agro_sweep.run_one(("agro-on", 1.0, 8, 0.1, 0, 300, 0.25))
    small = agro_sweep.run_one(("agro-on", SPO_BETA, 8, 0.1, 0, 300, 0.25))
    assert agro_sweep.verdict(big["final_kl"], big["start_kl"], big["success_final"], big["success_ref"]) == "converges"
    assert agro_sweep.verdict(small["final_kl"], small["start_kl"], small["success_final"], small["success_ref"]) \
        == "collapses"
    assert agro_sweep.verdict(0.3, 0.1, 0.9, 0.25) == "overshoots" and agro_sweep.verdict(0.05, 0.1, 0.4, 0.25) == "partial"
    assert small["success_final"] < small["success_ref"] < small["success_optimal"]  # it fled the successes
    # the reason: at small beta it minimises Var_pi[R], which a mostly-succeeding reference escapes upwards
    up = agro_sweep.run_one(("agro-on", SPO_BETA, 8, 0.1, 0, 300, 0.75))
    assert up["success_ref"] > 0.5 and up["success_final"] > 0.99
    assert "| 0.810 |" in agro_sweep.mechanism_markdown([small, up])
    cells = agro_sweep.summarise([big, small])
    assert {c["verdict"] for c in cells} == {"converges", "collapses"}
    assert "| 1 | 8 | 0.1 |" in agro_sweep.markdown(cells)


def test_first_reaching_and_roles(tmp_path):
    curve = [{"samples": 0, "pass@1": 0.4}, {"samples": 160, "pass@1": 0.5}, {"samples": 320, "pass@1": 0.55}]
    assert grow.first_reaching(curve, "pass@1", 0.5) == 160 and grow.first_reaching(curve, "pass@1", 0.6) is None
    configs = {r: grow.role_config(r, 1, tmp_path, 10, 15, 1e-4, 32, 20, 5) for r in grow.ROLES}
    assert configs["A"].seed == 1 and {configs[r].seed for r in ("baseline", "B", "C")} == {101}
    assert configs["A"].optim.steps == 10 and configs["C"].optim.steps == 15
    assert configs["baseline"].data.offline_sources == ["reference"]
    assert configs["B"].data.offline_sources == ["reference", "online"] and configs["B"].data.offline_passed_only
    assert configs["C-only"].data.offline_sources == ["online"]
    assert len({configs[r].data.store for r in grow.ROLES}) == len(grow.ROLES)


def test_bench_study_grow_end_to_end(tiny, tmp_path):
    base = tmp_path / "base.yaml"
    base.write_text(f"model:\n  path: {tiny[0]}\ntask:\n  size: 6\nq0:\n  k: 4\nsampling:\n  max_new_tokens: 8\n")
    report = tmp_path / "report"
    args = ["bench", "study", "grow", "--seeds", "1", "--steps", "2", "--later-steps", "3", "--rows", "16",
            "--eval-size", "3", "--eval-every", "1", "--base", str(base), "--runs", str(tmp_path / "runs"),
            "--report", str(report)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    data = json.loads((report / "study-grow.json").read_text())
    lineage = data["lineages"][0]
    census = {role: lineage[role]["store_at_start"] for role in grow.ROLES}
    assert set(census["baseline"]["online_by_run"]) == set() == set(census["A"]["online_by_run"])
    assert set(census["B"]["online_by_run"]) == {"A"} and set(census["C"]["online_by_run"]) == {"A", "B"}
    assert set(census["B-only"]["online_by_run"]) == {"A"} and set(census["C-only"]["online_by_run"]) == {"A", "B-only"}
    assert census["B"]["online_by_run"]["A"]["trajectories"] == 2 * 2 * 4  # 2 steps x 2 prompts x 4 samples
    assert census["C"]["sources"]["reference"] == census["A"]["sources"]["reference"]
    assert {c["a"] for c in data["comparisons"]} == {"B", "C", "B-only", "C-only"}
    table = (report / "study-grow.md").read_text()
    assert "online of A 16" in table and "| 0 | C |" in table and (report / "study-grow.png").stat().st_size > 10_000
    # rerun: everything finished is reused; other settings for a finished run are refused in one line
    again = CliRunner().invoke(app, args)
    assert again.exit_code == 0 and json.loads((report / "study-grow.json").read_text())["lineages"] == data["lineages"]
    refused = CliRunner().invoke(app, [*args[:-2], "--lr", "0.01", "--report", str(report)])
    assert refused.exit_code == 2 and "finished with optim.lr=0.0002" in refused.output


def test_bench_study_unknown_name_is_one_line():
    result = CliRunner().invoke(app, ["bench", "study", "fig9"])
    assert result.exit_code == 2 and "unknown study 'fig9'" in result.output and "Traceback" not in result.output


def test_every_arm_is_a_valid_config(tmp_path):
    study = STUDIES["loss"]
    for arm in ARMS:
        config = study_config(study, arm, 0, tmp_path, 10, 1e-4, 32, 20, 5)
        assert config.name == f"{arm}-s0"


def test_bench_study_mc_end_to_end_on_the_bootstrap(tmp_path):
    """PTS prepared once over the reference's passed samples, then MC targets and PTS's rollouts each
    a quarter of the batch (their losses logged per source), the claims and plot written."""
    base = tmp_path / "base.yaml"
    base.write_text("task:\n  size: 6\nq0:\n  k: 8\n")
    report = tmp_path / "report"
    args = ["bench", "study", "mc", "--seeds", "1", "--steps", "2", "--eval-size", "3", "--eval-every", "1",
            "--base", str(base), "--runs", str(tmp_path / "runs"), "--report", str(report)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    prepared = json.loads((report / "study-mc.json").read_text())["prepared"]
    assert prepared["annotated"] > 0 and prepared["rollouts"] > 0
    store = ExperienceStore(tmp_path / "runs/countdown/store")
    passed = [r for r in store.trajectories(source="reference", passed=True).to_pylist()]
    annotated = [r for r in passed if r["mc_targets"]]
    assert len(annotated) == prepared["annotated"] == len(passed)  # fewer than the limit: every one
    metrics = {arm: (tmp_path / f"runs/countdown/{arm}-s0/metrics.jsonl").read_text()
               for arm in ("terminal-bce", "mc-targets", "pts-rollouts")}
    assert '"loss/mc"' in metrics["mc-targets"] and '"loss/pts"' in metrics["pts-rollouts"]
    assert '"loss/mc"' not in metrics["terminal-bce"]
    assert "| mc-targets | " in (report / "study-mc.md").read_text() and (report / "study-mc.png").is_file()


# --- the code study (softrl_bench.code_study) -----------------------------------------------------------------
def test_the_code_study_keeps_its_reference_beside_its_outcomes(tmp_path, monkeypatch):
    """Bootstrap training is not bit-identical across machines: a study resumed on another machine must not
    mix outcomes of two references. The first build is kept beside the kept outcomes; a fresh machine
    installs that one instead of building its own; a different model already in the cache is refused."""
    from dataclasses import asdict

    from softrl_bench import code_study as cs
    from softrl_bench.learning import settings_of, weights_digest
    from softrl.bootstrap import TASK_DEFAULTS, BootstrapConfig
    from softrl.config import ConfigError, config_from

    monkeypatch.setenv("SOFTRL_CACHE", str(tmp_path / "cache"))
    builds = []

    def fake_bootstrap(task):  # a "model": one weights file whose bytes say which build it is
        final = cs.reference_dir(s)
        final.mkdir(parents=True, exist_ok=True)
        (final / "model.safetensors").write_bytes(f"build {len(builds)}".encode())
        (final / "softrl.json").write_text(json.dumps({"config": asdict(BootstrapConfig(task=task, **TASK_DEFAULTS[task]))}))
        builds.append(task)
        return final

    monkeypatch.setattr("softrl.bootstrap.bootstrap", fake_bootstrap)
    s = cs.Settings(tmp_path / "runs", kept=tmp_path / "report" / "study-code-runs.jsonl")
    assert cs.install_reference(s) == cs.reference_dir(s) and builds == ["tinycode-loops"]
    kept = tmp_path / "report" / "study-code-reference"
    assert weights_digest(kept) == weights_digest(cs.reference_dir(s)) is not None
    config = cs.run_config(s, "spo-online", s.lrs[0], cs.TUNE_SEED)
    assert settings_of(config)["model.weights"] == weights_digest(kept)  # kept outcomes name the weights
    by_alias = config_from({"task.name": "countdown", "model.path": "bootstrap:tinycode-loops"})
    assert settings_of(by_alias)["model.weights"] == weights_digest(kept)  # so do those naming "bootstrap"
    shutil.rmtree(tmp_path / "cache")  # another machine: the kept reference is installed, not rebuilt
    cs.install_reference(s)
    assert builds == ["tinycode-loops"] and weights_digest(cs.reference_dir(s)) == weights_digest(kept)
    (cs.reference_dir(s) / "model.safetensors").write_bytes(b"another machine's build")
    with pytest.raises(ConfigError, match="reference is not the one the kept outcomes were made with"):
        cs.install_reference(s)
    (kept / "softrl.json").write_text(json.dumps({"config": {"task": "tinycode-loops", "steps": 1}}))
    with pytest.raises(ConfigError, match="the kept reference was built by another recipe"):
        cs.install_reference(s)


def test_code_study_arms_generate_the_same_samples(tmp_path):
    from softrl_bench import code_study as cs

    s = cs.Settings(tmp_path)
    tuning = cs.tuning_plan(s, list(s.study.arms))
    assert len(tuning) == len(s.study.arms) * len(s.lrs) and {c.seed for c in tuning} == {cs.TUNE_SEED}
    assert {c.task.name for c in tuning} == {"tinycode-loops"}
    # the reference by its recipe's folder, so that outcomes kept from another recipe's are refused
    assert {c.model.path for c in tuning} == {str(cs.reference_dir(s))} and "tinycode-loops-s0-" in tuning[0].model.path
    generated = {c.sampling.prompts_per_step * c.sampling.samples_per_prompt for c in tuning}
    assert generated == {s.prompts * s.samples_per_prompt}  # equal generation; the half arms' batches are larger
    by_arm = {c.name.split("-lr")[0]: c for c in tuning}
    assert by_arm["spo-human"].data.offline_sources == ["human"] and by_arm["spo-half"].data.offline_sources == [
        "reference"]
    assert by_arm["cispo-half"].data.mix == by_arm["spo-half"].data.mix == {"online": 0.5, "offline": 0.5}
    assert len({c.run_dir for c in tuning}) == len({c.data.store for c in tuning}) == len(tuning)  # own stores


def test_a_code_arm_grid_grows_past_the_edge_its_best_lies_on(tmp_path, monkeypatch):
    """Online SPO's best rate was the grid's lowest: the grid gets the ladder's next point below, once
    (extend=1), and the arm is tuned only when that run finished too; a best inside the grid adds nothing."""
    from softrl_bench import code_study as cs

    finals = {"spo-online": {3e-5: 0.15, 1e-4: 0.11, 3e-4: 0.0}, "ppo": {3e-5: 0.10, 1e-4: 0.14, 3e-4: 0.12},
              "grpo": {3e-5: 0.05, 1e-4: 0.08, 3e-4: 0.09}}
    monkeypatch.setattr(cs, "curve", lambda s, c: ([{"pass@1": finals[c.name.split("-lr")[0]][c.optim.lr]}]
                                                   if c.optim.lr in finals[c.name.split("-lr")[0]] else None))
    s = cs.Settings(tmp_path)
    lrs = lambda arm: sorted(c.optim.lr for c in cs.tuning_plan(s, [arm]))  # noqa: E731
    assert lrs("spo-online") == [1e-5, 3e-5, 1e-4, 3e-4] and lrs("ppo") == [3e-5, 1e-4, 3e-4]
    assert lrs("grpo") == [3e-5, 1e-4, 3e-4, 1e-3]
    assert set(cs.tuned_lrs(s, ["spo-online", "ppo", "grpo"])) == {"ppo"}  # the others wait for their new point
    finals["spo-online"][1e-5], finals["grpo"][1e-3] = 0.16, 0.02
    tuned = cs.tuned_lrs(s, ["spo-online", "ppo", "grpo"])
    # 1e-5 is best now, on the new edge, but the grid grows once: it is the choice, 3e-6 is never run
    assert tuned["spo-online"]["lr"] == 1e-5 and lrs("spo-online") == [1e-5, 3e-5, 1e-4, 3e-4]
    assert tuned["grpo"]["lr"] == 3e-4 and tuned["ppo"]["lr"] == 1e-4


def test_a_learning_rate_grid_grows_only_where_its_finished_scores_say(tmp_path):
    """The one rule both the code study and the frontier grow their grids by (`grown_grid`), on learning
    rates alone (`grown_lrs`)."""
    from softrl_bench.learning import grown_lrs, ladder_step

    assert [ladder_step(lr, up) for lr, up in ((1e-4, True), (3e-4, True), (1e-4, False), (3e-5, False))] == [
        3e-4, 1e-3, 3e-5, 1e-5]
    table = {1e-5: 0.3, 3e-5: 0.2, 1e-4: 0.2, 3e-4: math.nan, 1e-3: 0.9}
    scores = table.get  # a rate not in it has not finished
    # a collapsed (NaN) top edge is never the best; the tie (0.2, 0.2) would go to the lower rate
    assert grown_lrs((3e-5, 1e-4, 3e-4), 1, scores)[0] == [1e-5, 3e-5, 1e-4, 3e-4]
    assert grown_lrs((3e-5, 1e-4, 3e-4), 0, scores)[0] == [3e-5, 1e-4, 3e-4]
    assert grown_lrs((1e-4,), 2, scores) == ([1e-4], {1e-4: 0.2})  # one rate: no edge to read
    assert grown_lrs((1e-4, 1e-4), 1, scores) == ([1e-4], {1e-4: 0.2})  # a repeated one is one rate
    assert grown_lrs((1e-4, 3e-4, 1e-3), 2, scores)[0] == [1e-4, 3e-4, 1e-3, 3e-3]  # not run yet:
    assert grown_lrs((1e-4, 3e-4, 1e-3), 2, scores)[1] is None  # unfinished, it stops there
    table[3e-5] = 0.4
    assert grown_lrs((3e-5, 1e-4, 3e-4), 3, scores)[0] == [1e-5, 3e-5, 1e-4, 3e-4]  # the new point is not best


def test_code_tuning_runs_in_rounds_until_every_grid_settles(tmp_path, monkeypatch):
    """`tune` trains each round's new runs: an arm whose best keeps to the grid's low edge gets 1e-5, then
    (extend=2) 3e-6 in the next round; one whose best is inside gets nothing more; nothing runs twice."""
    from softrl_bench import code_study as cs

    quality = {"spo-online": lambda lr: -lr, "ppo": lambda lr: -abs(lr - 1e-4)}  # lower is better / 1e-4 best
    finished: dict[tuple[str, float], float] = {}
    monkeypatch.setattr(cs, "curve", lambda s, c: [{"pass@1": finished[key]}] if (key := (
        c.name.split("-lr")[0], c.optim.lr)) in finished else None)
    rounds = []

    def train(plan):
        new = [(c.name.split("-lr")[0], c.optim.lr) for c in plan if (c.name.split("-lr")[0], c.optim.lr) not in finished]
        rounds.append(sorted(new))
        finished.update({key: quality[key[0]](key[1]) for key in new})

    chosen = cs.tune(cs.Settings(tmp_path, extend=2), ["spo-online", "ppo"], train)
    assert rounds[0] == sorted((arm, lr) for arm in ("spo-online", "ppo") for lr in (3e-5, 1e-4, 3e-4))
    assert rounds[1:] == [[("spo-online", 1e-5)], [("spo-online", 3e-6)]]  # 1 + extend rounds settle it
    assert chosen["spo-online"]["lr"] == 3e-6 and chosen["ppo"]["lr"] == 1e-4
    assert sorted(chosen["spo-online"]["grid"]) == [3e-6, 1e-5, 3e-5, 1e-4, 3e-4]


def test_claim_with_a_margin_holds_only_beyond_it():
    """The margin moves the verdict, not the difference: the report shows a - b as measured."""
    from softrl_bench.report import markdown

    runs = {"a": {s: [{"pass@10": 0.5 + 0.05 + 0.001 * s}] for s in range(4)},
            "b": {s: [{"pass@10": 0.5}] for s in range(4)}}
    value = final("pass@10")
    holds = judged(runs, "c", "SPO", "a", "b", "x", value, "higher", margin=0.03)
    assert holds["reproduced"] and holds["diff"] == pytest.approx(0.0515)
    missed = judged(runs, "c", "SPO", "a", "b", "x", value, "higher", margin=0.06)
    assert not missed["reproduced"] and missed["verdict"] == "lower" and missed["diff"] == pytest.approx(0.0515)
    three = judged({**runs, "b": {s: runs["b"][s] for s in range(3)}}, "c", "SPO", "a", "b", "x", value, "higher",
                   margin=0.06)
    table = markdown({}, [missed, three], 4)
    assert "| +0.052 ± 0.001 | +0.050, +0.051, +0.052, +0.053 | no (lower than the margin +0.060) |" in table
    assert "+0.051 ± 0.001 (3 seeds)" in table


def test_code_study_diversity_counts_every_problem():
    """Distinct correct programs per problem: an arm that solves more problems, each once, is not rated
    lower than one that solves fewer, as it is per solved problem."""
    from softrl_bench import code_study as cs

    few = [{"distinct_correct_per_solved": 2.0, "pass@10": 0.2}]  # 20 of 100 solved, 2 programs each
    more = [{"distinct_correct_per_solved": 1.5, "pass@10": 0.4}]  # 40 solved: 20 with 2, 20 with 1
    assert cs.distinct_per_problem(more) == pytest.approx(0.6) and cs.distinct_per_problem(few) == pytest.approx(0.4)
    assert cs.distinct_per_solved(more) < cs.distinct_per_solved(few)
    div = cs.diversity({"a": {0: few, 1: more}})
    assert div["a"]["distinct per problem"] == pytest.approx([0.4, 0.6])
    assert div["a"]["distinct per solved"] == [2.0, 1.5]


def test_bench_study_code_quick(tmp_path):
    """--quick end to end on a tiny model: every arm tuned over two learning rates, then two report seeds;
    the report keeps the study's form (a reference row, pass@1 and pass@10, the claims); the known
    solutions joined the pool once, as source "human"; the kept outcomes alone rebuild the report."""
    import shutil

    # positions for the known solutions (up to 330 character tokens): a run refuses rows longer than its model's
    model = save_char_llama(tmp_path / "model", positions=1024, hidden=64, layers=2, heads=4)
    base = tmp_path / "base.yaml"
    base.write_text(f"model:\n  path: {model}\nsampling:\n  max_new_tokens: 8\n")
    report = tmp_path / "report"
    args = ["bench", "study", "code", "--quick", "--base", str(base), "--runs", str(tmp_path / "runs"),
            "--report", str(report)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    data = json.loads((report / "study-code.json").read_text())
    assert set(data["tuned"]) == set(data["runs"]) == {"spo-online", "spo-half", "spo-human", "ppo", "grpo",
                                                         "cispo-half"}
    assert all(set(t["grid"]) == {"0.0001", "0.001"} for t in data["tuned"].values())
    assert all(set(seeds) == {"0", "1"} for seeds in data["runs"].values())
    table = (report / "study-code.md").read_text()
    assert "| reference (step 0) |" in table and "pass@10" in table and "Learning rates" in table
    assert "| SPO | learning from the known solutions raises pass@1" in table
    pool = ExperienceStore(tmp_path / "runs/tinycode-loops/pool")
    human = pool.trajectories(source="human").to_pylist()
    assert human and all(r["passed"] for r in human) and len({r["prompt_id"] for r in human}) == 6
    assert pool.trajectories(source="online", columns=["id"]).num_rows == 0  # runs train on copies of it
    shutil.rmtree(tmp_path / "runs")  # another machine: only the kept outcomes
    again = CliRunner().invoke(app, args)
    assert again.exit_code == 0, again.output
    assert json.loads((report / "study-code.json").read_text())["runs"] == data["runs"]
    assert not (tmp_path / "runs/tinycode-loops/code").exists()  # nothing retrained
    other = tmp_path / "other.yaml"  # another Q0 budget: the kept runs and the pool are refused, in one line
    other.write_text(base.read_text() + "q0:\n  k: 3\n")
    refused = CliRunner().invoke(app, [*args[:4], "--base", str(other), *args[6:]])
    assert refused.exit_code == 2 and "q0.k" in refused.output and "Traceback" not in refused.output


# --- the feedback study (softrl_bench.code_study.FEEDBACK): issue 50's benchmark --------------------------------
def test_feedback_study_arms_generate_alike_and_the_logged_ones_nothing(tmp_path):
    """Online arms generate the same episodes a step; the four arms from logged traces read every logged row
    (passed or not: the traces carry rewards, not log-probs) and generate none; GRPO with TIS sees
    spo-half's data; the arms that generate nothing come first, so a study cut short has them whole."""
    from softrl_bench import code_study as cs

    s = cs.Settings(tmp_path, cs.FEEDBACK)
    tuning = cs.tuning_plan(s, list(s.study.arms))
    assert {c.task.name for c in tuning} == {"tinycode-feedback"} and {c.seed for c in tuning} == {cs.TUNE_SEED}
    assert "tinycode-feedback-s0-" in tuning[0].model.path and tuning[0].data.store.startswith(str(tmp_path))
    by_arm = {c.name.split("-lr")[0]: c for c in tuning}
    logged = [arm for arm in s.study.arms if arm.endswith("-logged")]
    assert list(s.study.arms)[:4] == logged
    assert {by_arm[a].data.objective.algorithm for a in logged} == {"spo", "agro-off", "topr", "kl-pg"}
    for arm in logged:
        c = by_arm[arm]
        assert c.data.mix == {"offline": 1.0} and c.data.offline_sources == ["logged"] and not c.data.offline_passed_only
    online = [by_arm[a] for a in s.study.arms if a not in logged]
    assert {c.sampling.prompts_per_step * c.sampling.samples_per_prompt for c in online} == {s.prompts * s.samples_per_prompt}
    tis, half = by_arm["grpo-tis-half"], by_arm["spo-half"]
    assert tis.data.objective.is_correction == "token_truncate" and tis.data.mix == half.data.mix
    assert tis.data.offline_sources == half.data.offline_sources == ["reference"] and half.data.offline_passed_only
    assert not tis.data.offline_passed_only  # GRPO needs whole groups: the passed episodes alone give none
    assert len({c.data.store for c in tuning}) == len(tuning)
    # the single-turn comparison: one answer, no feedback, more steps for the same tokens, its own pool's Q0
    one_turn = [a for a in s.study.arms if a.endswith("-one-turn")]
    assert one_turn == list(s.study.arms)[-2:] and {by_arm[a].data.objective.algorithm for a in one_turn} == {"spo", "ppo"}
    for arm in s.study.arms:
        c = by_arm[arm]
        single = arm in one_turn
        assert c.task.max_turns == (1 if single else 3)
        assert c.optim.steps == (round(s.steps * cs.ONE_TURN_STEPS) if single else s.steps) == c.log.checkpoint_every
        assert s.pool_of(c) == (s.where / "pool-1-turns" if single else s.pool)


def test_logged_traces_are_another_agents_conversations_graded_by_the_task(tmp_path):
    """The logged data: chat records with no log-probs, each an episode whose environment turns are the
    sandbox's real feedback, rewarded by the task's own grading of the last program; read back as
    `softrl data import` reads a chat file, as episodes of the training prompts."""
    from softrl_bench import code_study as cs
    from softrl.config import config_from
    from softrl.assemble import load_tasks

    s = cs.Settings(tmp_path, cs.FEEDBACK, task_size=6)
    task = load_tasks(config_from({"task.name": "tinycode-feedback", "task.size": 6}))[0]
    rows = cs.logged_rows(task, s)
    records = [json.loads(line) for line in (s.where / "logged-traces.jsonl").read_text().splitlines()]
    assert len(rows) == len(records) == 6 * cs.LOGGED_PER_PROMPT
    assert len({json.dumps(r["messages"]) for r in records}) == len(records)  # distinct: each prompt keeps a group
    assert all(set(r) == {"messages", "reward", "passed", "prompt_id", "task"} for r in records)  # no log-probs
    prompts = {p.id: p for p in task.prompts()}
    revised = 0
    for record, row in zip(records, rows):
        messages = record["messages"]
        assert messages[0] == {"role": "user", "content": prompts[record["prompt_id"]].text}
        assert [m["role"] for m in messages[1:]] == ["assistant", "user"] * (len(messages) // 2 - 1) + ["assistant"]
        for m in messages[2:-1:2]:
            assert m["content"].startswith("Failed on input") or "Error" in m["content"]
        revised += len(messages) > 2
        grade = task.grade(prompts[record["prompt_id"]], messages[-1]["content"])
        assert (record["reward"], record["passed"]) == (grade.reward, grade.passed)
        assert row.source == "logged" and row.policy_version == -1 and row.prompt_id == record["prompt_id"]
        if len(messages) == 2:  # right at once: a single-turn row, as any one-answer chat record is
            assert row.turns is None and row.response_text == messages[1]["content"]
        else:
            assert [t["content"] for t in row.turns] == [m["content"] for m in messages[1:]]
        assert row.reward == record["reward"]
    assert revised and {r.passed for r in rows} == {True, False}  # revisions happen; both outcomes are there


def test_bench_study_feedback_quick(tmp_path, monkeypatch):
    """--quick end to end on a small random model, two of the study's arms (one from logged traces, one
    online): the pool holds Q0 from the reference's episodes and the logged traces as source "logged";
    the report has the episodes' table (turns, first-turn pass@1, tokens per solved episode);
    `--report-only` rebuilds it from the kept outcomes alone, and refuses in one line where there are none."""
    from softrl_bench import code_study as cs

    model = save_char_llama(tmp_path / "model", positions=1024)
    two = {arm: cs.FEEDBACK.arms[arm] for arm in ("spo-logged", "spo-online", "spo-one-turn")}
    monkeypatch.setitem(cs.STUDIES, "feedback", cs.Study("feedback", "tinycode-feedback", two, [
        c for c in cs.FEEDBACK.claims if {c[1], c[2]} <= set(two)], cs.logged_rows, cs.FEEDBACK.defaults,
        cs.FEEDBACK.pool_recipe))
    base = tmp_path / "base.yaml"
    base.write_text(f"model:\n  path: {model}\nsampling:\n  max_new_tokens: 8\nq0:\n  k: 2\n")
    report = tmp_path / "report"
    args = ["bench", "study", "feedback", "--quick", "--seeds", "1", "--base", str(base), "--runs",
            str(tmp_path / "runs"), "--report", str(report)]
    missing = CliRunner().invoke(app, [*args, "--report-only"])
    assert missing.exit_code == 2 and "no finished runs" in missing.output and "Traceback" not in missing.output
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    data = json.loads((report / "study-feedback.json").read_text())
    assert set(data["tuned"]) == set(data["runs"]) == set(two)
    final_point = data["runs"]["spo-online"]["0"][-1]
    assert final_point["turns_per_episode"] >= 1 and final_point["tokens_per_sample"] > 0
    assert data["runs"]["spo-logged"]["0"][-1]["samples"] == 0  # learns from the logs alone
    table = (report / "study-feedback.md").read_text()
    assert "Episodes at the end" in table and "| spo-logged |" in table and "tokens per solved episode" in table
    pool = ExperienceStore(tmp_path / "runs/tinycode-feedback/pool")
    logged = pool.trajectories(source="logged").to_pylist()
    assert 6 < len(logged) <= 6 * cs.LOGGED_PER_PROMPT and any(r["turns"] for r in logged)  # a repeat is one row
    made = json.loads((tmp_path / "runs/tinycode-feedback/pool/pool.json").read_text())
    assert made["rows"]["logged"] == len(logged) and made["settings"]["logged"]["per_prompt"] == cs.LOGGED_PER_PROMPT
    assert all(r["turns"] for r in pool.trajectories(source="reference").to_pylist())  # Q0 from episodes
    # the one-turn arm: its own pool, Q0 from single answers; its runs answer once, and count their tokens
    one = ExperienceStore(tmp_path / "runs/tinycode-feedback/pool-1-turns").trajectories(source="reference").to_pylist()
    assert one and all([t["role"] for t in r["turns"]] == ["assistant"] for r in one)
    assert json.loads((tmp_path / "runs/tinycode-feedback/pool-1-turns/pool.json").read_text())["settings"][
        "task.max_turns"] == 1
    single = data["runs"]["spo-one-turn"]["0"]
    assert single[-1]["turns_per_episode"] == 1 and single[-1]["step"] == round(cs.ONE_TURN_STEPS)
    assert single[0]["tokens"] == 0 < single[-1]["tokens"] and data["runs"]["spo-online"]["0"][-1]["tokens"] > 0
    assert "tokens generated in training" in table
    shutil.rmtree(tmp_path / "runs")
    again = CliRunner().invoke(app, [*args, "--report-only"])
    assert again.exit_code == 0, again.output
    assert json.loads((report / "study-feedback.json").read_text())["runs"] == data["runs"]
    assert not (tmp_path / "runs/tinycode-feedback/feedback").exists()  # nothing trained


def test_report_only_never_trains_nor_empties_a_report(tmp_path):
    """`--report-only` on a study that keeps no outcomes file started its whole training silently; with an
    empty outcomes file it replaced a good report with a table of nothing. Both are refused in one line,
    before anything is made, and the report is left as it was."""
    report = tmp_path / "report"
    report.mkdir()
    (report / "study-code.md").write_text("a good table")
    (report / "study-code-runs.jsonl").write_text("\n")
    runs = tmp_path / "runs"
    for name, said in (("loss", "keeps no outcomes file"), ("grow", "keeps no outcomes file"),
                       ("code", "no finished runs")):
        out = CliRunner().invoke(app, ["bench", "study", name, "--report-only", "--runs", str(runs), "--report",
                                       str(report)])
        assert out.exit_code == 2 and said in out.output and "Traceback" not in out.output, out.output
        assert len(out.output.strip().splitlines()) == 1
    assert not runs.exists() and (report / "study-code.md").read_text() == "a good table"


def test_a_diverged_run_is_a_finished_outcome_that_solves_nothing(tiny, tmp_path, monkeypatch):
    """A learning rate whose loss stops being finite ends its run, not the benchmark: the run is kept as
    finished (not trained again), its last evaluation solves nothing at the samples generated by then."""
    from softrl_bench.frontier_runs import keep, kept, measured
    from softrl_bench.learning import DIVERGED, curves, run_all

    from softrl.training import learner as learner_module

    objective_loss, calls = learner_module.objective_loss, []

    def diverging(*args):  # the loss of a policy that blew up, from the third learner step on
        calls.append(1)
        loss, parts = objective_loss(*args)
        return (loss * float("nan") if len(calls) > 2 else loss), parts

    monkeypatch.setattr(learner_module, "objective_loss", diverging)

    config = config_from({
        "name": "huge-lr", "out_dir": str(tmp_path / "runs"), "model.path": str(tiny[0]), "task.name": "countdown",
        "task.size": 6, "task.eval_size": 3, "q0.k": 2, "sampling.prompts_per_step": 2, "sampling.samples_per_prompt": 2,
        "sampling.max_new_tokens": 6, "data.store": str(tmp_path / "store"), "data.mix": {"online": 1.0},
        "optim.steps": 6, "optim.max_nonfinite": 1, "eval.samples": 2,
        "eval.every": 3})
    run_all([config])
    assert json.loads((config.run_dir / DIVERGED).read_text())["error"].startswith("the loss was not finite")
    assert not (config.run_dir / "summary.json").exists()
    result = measured(config)
    assert result is not None and result["pass@1"] == 0.0 and result["pass@k"] == [0.0, 0.0]
    assert result["samples"] == 8 and curves(config.run_dir)[-1]["pass@1"] == 0.0  # two steps of 4 samples
    keep(tmp_path / "kept.jsonl", config)
    assert kept(tmp_path / "kept.jsonl")["runs/huge-lr"]["outcome"]["pass@1"] == 0.0
    before = (config.run_dir / "metrics.jsonl").read_text()
    run_all([config])  # finished: not trained again
    assert (config.run_dir / "metrics.jsonl").read_text() == before
