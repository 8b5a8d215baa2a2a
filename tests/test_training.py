"""Training: config validation, the Learner on every algorithm, non-finite losses, the local
runtimes, and kill -9 / --resume (tiny budgets on a tiny random model)."""

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch
import yaml

pytest.importorskip("transformers")

from softrl.config import ConfigError, load_config  # noqa: E402
from softrl.config_reference import config_reference  # noqa: E402
from softrl.data import ExperienceStore  # noqa: E402
from softrl.data.io import task_solutions  # noqa: E402
from softrl.models.wrappers import PolicyModel, ReferenceModel, ValueModel  # noqa: E402
from softrl.objectives import REGISTRY  # noqa: E402
from softrl.training.learner import Learner, NonFiniteLossError  # noqa: E402

SOFTRL = shutil.which("softrl", path=os.path.dirname(sys.executable))


def tiny_overrides(model_dir, root, **extra):
    """A run of the tiny model on countdown, offline data = the task's known solutions (source human)."""
    base = {"out_dir": root, "name": "run", "data.store": f"{root}/store", "model.path": model_dir,
            "task.size": 6, "task.eval_size": 3, "q0.k": 4, "sampling.prompts_per_step": 2,
            "sampling.samples_per_prompt": 2, "sampling.max_new_tokens": 8, "optim.steps": 4, "eval.samples": 2,
            "data.offline_sources": "[human]", "log.checkpoint_every": 2, **extra}
    return [f"{k}={v}" for k, v in base.items()]


def seed_store(root, size=6):
    from softrl.tasks.registry import load_task

    ExperienceStore(f"{root}/store").append(task_solutions(load_task("countdown", size=size), "human"))


def test_config_errors_name_the_key_and_reference_is_complete():
    for overrides, message in [
        (["optim.lrr=1"], "unknown key 'optim.lrr'"), (["beta=-1"], "beta: Input should be greater than 0"),
        (["data.mix={online: 0.5, offline: -1}"], "data.mix: weight of 'offline' must be a number >= 0"),
        (["data.mix={online: 0}"], "at least one source needs a weight > 0"),
        (["data.objective.algorithm=rloo", "sampling.samples_per_prompt=1"], "must be >= 2 for rloo"),
    ]:
        with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
            load_config(None, overrides)
    reference = config_reference()
    assert "`optim.lr`" in reference and "`data.mix`" in reference and "`runtime.model_update_interval`" in reference


def make_rows(tiny, n_prompts=2, n=3):
    from softrl.models.loading import encode_prompt, tokenizer_fingerprint
    from softrl.rollout import RolloutSpec, RolloutWorker
    from softrl.models.generation import HFGenerator
    from softrl.tasks.registry import load_task

    _, model, tokenizer = tiny
    task = load_task("countdown", size=n_prompts)
    spec = RolloutSpec(task, HFGenerator(model, tokenizer), lambda ids: tokenizer.decode(ids, skip_special_tokens=True),
                       tokenizer_fingerprint(tokenizer), 6, source="online")
    rows = RolloutWorker(spec, lambda t: encode_prompt(tokenizer, t)).collect(task.prompts(), n, 0, seed=0)
    out = [{**r.to_row(), "mix_source": "online"} for r in rows]
    for i, row in enumerate(out):  # make rewards vary within groups so every loss has a gradient
        row["reward"], row["passed"] = float(i % 2), i % 2 == 1
    return out, tokenizer_fingerprint(tokenizer), task


@pytest.mark.parametrize("algorithm", list(REGISTRY))
def test_learner_steps_every_algorithm(tiny, algorithm):
    from softrl.models.loading import encode_prompt
    from softrl.training.batch import make_batch

    directory, _, _ = tiny
    config = load_config(None, [f"data.objective.algorithm={algorithm}", "sampling.samples_per_prompt=3",
                                "data.mix={online: 1}", "optim.lr=1e-3", "optim.warmup_steps=0",
                                "optim.grad_accum=2"])
    policy = PolicyModel.load(directory)
    reference = ReferenceModel.from_policy(policy)
    learner = Learner(policy, reference, config, ValueModel(reference.model) if algorithm == "ppo" else None)
    rows, fingerprint, task = make_rows(tiny)
    tok = policy.tokenizer
    batch = make_batch(rows, fingerprint, tok.pad_token_id, lambda t: encode_prompt(tok, t),
                       lambda t: tok(t)["input_ids"], {p.id: 0.5 for p in task.prompts()})
    before = [p.detach().clone() for p in policy.model.parameters()]
    metrics = learner.step(batch)
    assert learner.version == 1 and all(isinstance(v, float) and v == v for v in metrics.values())
    assert any(not torch.equal(a, b) for a, b in zip(before, policy.model.parameters()))
    assert all(torch.equal(a, b) for a, b in zip(ReferenceModel.from_policy(PolicyModel.load(directory)).model.parameters(),
                                                  reference.model.parameters()))  # the reference never moves
    assert "kl_ref" in metrics and "entropy" in metrics and "iw/ess_fraction" in metrics
    if algorithm == "spo":
        assert "spo/q_terminal_minus_r" in metrics


def test_nonfinite_loss_skips_then_stops(tiny, monkeypatch):
    from softrl.models.loading import encode_prompt
    from softrl.training import learner as learner_module
    from softrl.training.batch import make_batch

    directory, _, _ = tiny
    config = load_config(None, ["optim.max_nonfinite=2", "data.mix={online: 1}"])
    policy = PolicyModel.load(directory)
    learner = Learner(policy, ReferenceModel.from_policy(policy), config)
    rows, fingerprint, task = make_rows(tiny)
    tok = policy.tokenizer
    batch = make_batch(rows, fingerprint, tok.pad_token_id, lambda t: encode_prompt(tok, t), lambda t: tok(t)["input_ids"],
                       {p.id: 0.5 for p in task.prompts()})
    monkeypatch.setattr(learner_module, "objective_loss", lambda *a: (torch.tensor(float("nan"), requires_grad=True), {}))
    before = [p.detach().clone() for p in policy.model.parameters()]
    assert learner.step(batch)["skipped_nonfinite"] == 1.0 and learner.version == 0
    assert all(torch.equal(a, b) for a, b in zip(before, policy.model.parameters()))
    with pytest.raises(NonFiniteLossError, match="2 steps in a row"):
        learner.step(batch)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_local_runtime_runs_and_logs(tiny, tmp_path, mode):
    from softrl.runtime.local import train

    seed_store(tmp_path)
    config = load_config(None, tiny_overrides(str(tiny[0]), str(tmp_path), **{"runtime.mode": mode,
                                                                              "runtime.model_update_interval": 2}))
    summary = train(config, log=lambda m: None)
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in records if "loss" in r]
    assert steps == [1, 2, 3, 4] and summary["steps"] == 4 and summary["pass@1_before"] is not None
    assert all(r["batch_rows"] > 4 for r in records if "loss" in r)  # online and offline rows
    assert (tmp_path / "run" / "training.png").stat().st_size > 10_000 and (tmp_path / "run" / "final").is_dir()
    online = ExperienceStore(tmp_path / "store").trajectories(source="online", run_id="run")
    # async may generate up to two batches ahead; those rows are stored too (every trajectory is)
    assert 4 * 4 <= online.num_rows <= (4 * 4 if mode == "sync" else 6 * 4)
    assert set(online["policy_version"].to_pylist()) <= {0, 1, 2, 3, 4}
    assert max(r.get("staleness/max", 0) for r in records) <= (3 if mode == "async" else 1)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_online_rows_reach_the_store_in_a_commit_every_ten_steps(tiny, tmp_path, mode):
    """A run makes about steps / 10 commits of its online rows, not one per step, and no row is lost:
    every step's samples are in the store when the run ends (async: those sampled ahead too)."""
    from softrl.assemble import RunParts
    from softrl.runtime.local import train

    seed_store(tmp_path)
    config = load_config(None, tiny_overrides(str(tiny[0]), str(tmp_path), **{
        "runtime.mode": mode, "optim.steps": 20, "log.checkpoint_every": 20, "eval.samples": 1}))
    RunParts(config).q0()  # its commit before the run's
    store = ExperienceStore(tmp_path / "store")
    before = store.snapshot().versions["trajectories"]
    train(config, log=lambda m: None)
    commits = store.snapshot().versions["trajectories"] - before
    online = store.trajectories(source="online", run_id="run")
    # async samples no batch past the run's end; one sampled ahead may make a commit of its own at the end
    assert commits in ((2,) if mode == "sync" else (2, 3)) and online.num_rows == 20 * 4
    if mode == "sync":  # one batch per policy version, each stored
        assert sorted(online["policy_version"].to_pylist()) == [v for v in range(20) for _ in range(4)]


def test_a_run_holds_the_store_version_it_reads_through_a_compaction(tiny, tmp_path):
    """Another process compacts the store (keep 1 version) after every step of a run that draws offline
    rows from it: the run's snapshot survives (its hold is a tag, which compaction keeps) and every step
    reads it; the hold goes when the run finishes, and then so do the versions."""
    from softrl.data.versions import compact, hold_name, holds
    from softrl.runtime.local import train

    seed_store(tmp_path)
    config = load_config(None, tiny_overrides(str(tiny[0]), str(tmp_path), **{"optim.steps": 3,
                                                                              "log.checkpoint_every": 1}))
    store, seen = ExperienceStore(tmp_path / "store"), []

    def maintenance(record):
        seen.append(holds(store))
        compact(store, keep=1)

    assert train(config, log=lambda m: None, on_step=maintenance)["steps"] == 3
    recorded = json.loads((tmp_path / "run" / "store.json").read_text())
    assert seen == [{hold_name(tmp_path / "run"): recorded["versions"]["trajectories"]}] * 3
    assert holds(store) == {} and compact(store, keep=1)["trajectories"]["versions_removed"] > 0


def test_a_pinned_run_reads_q0_at_its_version(tiny, tmp_path, monkeypatch):
    """`data.store_version` reproduces the data a run saw, Q0 included: the prompts' Q0 replaced after
    the tag (another sampler's, `q0 --from-store --force`), a run pinned to the tag trains on the Q0 of then,
    an unpinned one on today's."""
    from softrl.assemble import RunParts
    from softrl.data.versions import tag
    from softrl.runtime.local import train

    seed_store(tmp_path)
    overrides = tiny_overrides(str(tiny[0]), str(tmp_path), **{"optim.steps": 1, "eval.samples": 1})
    then = RunParts(load_config(None, overrides)).q0()
    store = ExperienceStore(tmp_path / "store")
    tag(store, "then")
    rows = store.prompts()
    store.put_prompts([{**row, "q0_rewards": [1.0] * len(row["q0_rewards"])} for row in rows.values()])
    used = []
    q0 = RunParts.q0
    monkeypatch.setattr(RunParts, "q0", lambda self, *a, **k: used.append(q0(self, *a, **k)) or used[-1])
    for name, pin in (("pinned", ["data.store_version=then"]), ("newest", [])):
        train(load_config(None, [*overrides, f"name={name}", *pin]), log=lambda m: None)
    assert used[0] == then and used[1] == pytest.approx({pid: 1.0 for pid in then}) != then


@pytest.mark.parametrize("algorithm", ["spo", "grpo"])  # a pool; groups of a prompt (GroupSampler, own rng)
def test_stored_rows_drawn_ahead_are_the_rows_drawn_in_step(tiny, tmp_path, algorithm):
    """`DataFeed.prefetch` draws the next step's stored rows in the background from the state `batch`
    would draw them from: the same rows, step by step, as a feed that does not prefetch; a prefetch
    for another number of online rows is undone and drawn again; a checkpoint taken while a prefetch
    waits holds the state before it; `batch` starts the next one."""
    from softrl.runtime.feed import DataFeed
    from softrl.tasks.registry import load_task

    from softrl.data import Trajectory

    task = load_task("countdown", size=6)
    store = ExperienceStore(tmp_path / "store")
    store.append([Trajectory(p.id, f"{k}+{k}", float(k % 2), k % 2 == 1, task="countdown", prompt_text=p.text,
                             source="human") for p in task.prompts() for k in range(3)])
    config = load_config(None, [f"data.store={tmp_path}/store", "task.size=6", "data.offline_sources=[human]",
                                "data.offline_passed_only=false", f"data.objective.algorithm={algorithm}",
                                "sampling.samples_per_prompt=2"])
    q0 = {p.id: 0.5 for p in task.prompts()}
    plain, ahead = (DataFeed(config, store, task, q0, tiny[2], log=lambda m: None) for _ in range(2))
    ids = lambda rows: [r["id"] for r in rows]  # noqa: E731
    try:
        assert ahead.online_rows_per_step() == 6 * 2  # 6 prompts, fewer than prompts_per_step
        for online, prefetched_for in ((8, 8), (8, 4), (4, 4)):
            before = plain.state_dict()
            ahead.prefetch(prefetched_for)
            assert ahead._prefetched is not None and ahead.state_dict() == before  # a checkpoint now: as if undrawn
            drawn = ids(ahead._stored_rows(online))
            assert drawn == ids(plain.extra_rows(online)) and len(drawn) == online
            assert ahead.state_dict() == plain.state_dict()
        online = [{**r, "mix_source": "online"} for r in store.trajectories().to_pylist()[:4]]  # standing in
        state = plain.state_dict()
        assert len(ahead.batch(online)) == len(plain.batch(online)) and ahead._prefetched is not None
        assert ahead.state_dict() == plain.state_dict() != state
    finally:
        ahead.close()
        plain.close()


def test_a_step_logs_its_draw_and_the_wait_prefetching_hid(tiny, tmp_path, monkeypatch):
    """`DataFeed.draw_seconds`: a step's draw from the store, its own seconds and those the step waited
    for it. Drawn in the step, it waits the whole draw; prefetched during a step as long as the draw,
    it waits almost none. A run's step records carry both (`time/store_draw`, `time/store_wait`)."""
    from softrl.data import Trajectory
    from softrl.runtime import feed as feed_module
    from softrl.runtime.feed import DataFeed
    from softrl.runtime.local import train
    from softrl.tasks.registry import load_task

    task = load_task("countdown", size=6)
    store = ExperienceStore(tmp_path / "store")
    store.append([Trajectory(p.id, f"{k}+{k}", float(k % 2), k % 2 == 1, task="countdown", prompt_text=p.text,
                             source="human") for p in task.prompts() for k in range(3)])
    config = load_config(None, [f"data.store={tmp_path}/store", "task.size=6", "data.offline_sources=[human]",
                                "data.offline_passed_only=false"])
    draw = feed_module.DataFeed.extra_rows

    def slow_draw(self, online_rows):
        time.sleep(0.3)
        return draw(self, online_rows)

    monkeypatch.setattr(feed_module.DataFeed, "extra_rows", slow_draw)
    feed = DataFeed(config, store, task, {p.id: 0.5 for p in task.prompts()}, tiny[2], log=lambda m: None)
    try:
        feed._stored_rows(8)  # nothing prefetched: drawn now
        assert feed.draw_seconds["time/store_draw"] >= 0.3 and feed.draw_seconds["time/store_wait"] >= 0.3
        feed.prefetch(8)
        time.sleep(0.5)  # the learner step, during which the draw finishes
        feed._stored_rows(8)
        assert feed.draw_seconds["time/store_draw"] >= 0.3 and feed.draw_seconds["time/store_wait"] < 0.1
    finally:
        feed.close()
    monkeypatch.setattr(feed_module.DataFeed, "extra_rows", draw)
    seed_store(tmp_path)
    records, said = [], []  # a run's, from the local copy of its pool (`data.pool_copy`)
    mixed = load_config(None, tiny_overrides(str(tiny[0]), str(tmp_path), **{
        "data.mix": "{online: 0.5, offline: 0.5}", "name": "draws", "optim.steps": 2, "data.pool_copy": "true"}))
    train(mixed, log=said.append, on_step=records.append)
    assert len(records) == 2 and all(0 <= r["time/store_wait"] and 0 < r["time/store_draw"] for r in records)
    assert any(m.startswith("offline pool:") and "copied to local disk" in m for m in said)


def test_the_training_clock_ends_each_step_after_its_learner_step(tiny, tmp_path, monkeypatch):
    """A step's logged time (and so samples/s, the run's seconds) includes its own learner step: with a
    learner step of at least 0.3 s, step k's time is at least 0.3 k."""
    from softrl.runtime.local import train

    step = Learner.step

    def slow_step(self, batch):
        time.sleep(0.3)
        return step(self, batch)

    monkeypatch.setattr(Learner, "step", slow_step)
    seed_store(tmp_path)
    summary = train(load_config(None, tiny_overrides(str(tiny[0]), str(tmp_path), **{"optim.steps": 2})),
                    log=lambda m: None)
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["time"] >= 0.3 * r["step"] for r in records if "loss" in r] == [True, True]
    assert summary["seconds"] >= 0.6


@pytest.mark.skipif(SOFTRL is None, reason="softrl console script not installed")
def test_invalid_configs_fail_in_one_line_and_create_nothing(tmp_path, tiny):
    good = yaml.safe_dump({"model": {"path": str(tiny[0])}, "out_dir": str(tmp_path / "runs"),
                           "data": {"store": str(tmp_path / "store")}})
    cases = [({"optim": {"lrr": 1}}, "unknown key 'optim.lrr'"), ({"beta": -0.5}, "beta: Input should be greater than 0"),
             ({"model": {"path": str(tmp_path / "missing")}}, "does not exist"),
             ({"data": {"mix": {"online": 1, "offline": "lots"}}}, "data.mix")]
    for i, (change, message) in enumerate(cases):
        config = yaml.safe_load(good)
        for key, value in change.items():
            config[key] = {**config.get(key, {}), **value} if isinstance(value, dict) else value
        path = tmp_path / f"bad{i}.yaml"
        path.write_text(yaml.safe_dump(config))
        proc = subprocess.run([SOFTRL, "train", str(path)], capture_output=True, text=True)
        assert proc.returncode == 2 and message in proc.stderr, (change, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert not (tmp_path / "runs").exists() and not (tmp_path / "store").exists()


def kill_mid_run(args: list[str], metrics) -> None:
    """Start `softrl train` and SIGKILL it once it has logged a random step from 3 to 6."""
    kill_after = random.Random(os.getpid()).randint(3, 6)
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while proc.poll() is None:
        done = [json.loads(x) for x in metrics.read_text().splitlines()] if metrics.exists() else []
        if any(r.get("step", 0) >= kill_after and "loss" in r for r in done):
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.05)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the run ended before it could be killed"


@pytest.mark.skipif(SOFTRL is None, reason="softrl console script not installed")
def test_kill_9_and_resume_continue_the_run(tmp_path, tiny):
    """An uninterrupted run and a run killed at a random step then resumed end with the same
    weights, the same trajectories in the store (none lost, none twice) and one continuous curve."""
    runs = {}
    for name in ("straight", "killed"):
        root = tmp_path / name
        seed_store(root)
        args = [SOFTRL, "train", *tiny_overrides(str(tiny[0]), str(root), **{"optim.steps": 8})]
        if name == "straight":
            assert subprocess.run(args, capture_output=True).returncode == 0
        else:
            kill_mid_run(args, root / "run" / "metrics.jsonl")
            resumed = subprocess.run(args + ["--resume"], capture_output=True, text=True)
            assert resumed.returncode == 0, resumed.stderr
        runs[name] = root
    curves = {}
    for name, root in runs.items():
        records = [json.loads(x) for x in (root / "run" / "metrics.jsonl").read_text().splitlines()]
        curves[name] = [(r["step"], round(r["loss"], 5)) for r in records if "loss" in r]
    assert [s for s, _ in curves["killed"]] == list(range(1, 9))  # continuous: no step twice, none missing
    assert curves["killed"] == curves["straight"]  # the optimizer and the sampler continued exactly
    ids = {name: ExperienceStore(root / "store").trajectories(unique=False)["id"].to_pylist() for name, root in runs.items()}
    assert set(ids["killed"]) == set(ids["straight"])  # nothing lost; regenerated rows are the same rows
    assert len(set(ids["straight"])) == len(ids["straight"])
    a = PolicyModel.load(runs["straight"] / "run" / "final").model.state_dict()
    b = PolicyModel.load(runs["killed"] / "run" / "final").model.state_dict()
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)


@pytest.mark.parametrize("weight_sync,learners", [("broadcast", 1), ("object_store", 1), ("broadcast", 2)])
def test_ray_runtime_survives_a_killed_worker(tiny, tmp_path, weight_sync, learners):
    """A SIGKILLed worker is restarted by Ray, rejoins (over a new weight channel) and gets the current
    weights; with 2 learners (Ray actors in one torch.distributed group) too."""
    pytest.importorskip("ray")
    from softrl.runtime import ray_runtime

    seed_store(tmp_path)
    config = load_config(None, tiny_overrides(str(tiny[0]), str(tmp_path), **{
        "runtime.kind": "ray", "runtime.workers": 2, "optim.steps": 6, "sampling.prompts_per_step": 4,
        "runtime.weight_sync": weight_sync, "runtime.learners": learners}))
    killed = []

    def on_step(record):
        if record["step"] == 2 and not killed:  # a worker process dies mid-run, as in a crash
            killed.append(record["worker_pids"][0])
            os.kill(record["worker_pids"][0], signal.SIGKILL)

    phases, said = [], []
    summary = ray_runtime.train(config, on_step=on_step, on_phase=lambda *p: phases.append(p), log=said.append)
    assert killed and summary["steps"] == 6 and summary["worker_restarts"] >= 1
    assert ("q0", 6, 6) in phases and any(line.startswith("Q0: sampling the reference model on 6 prompts")
                                          for line in said)  # Q0's progress and plan reach the driver
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "loss" in r] == [1, 2, 3, 4, 5, 6]
    online = ExperienceStore(tmp_path / "store").trajectories(source="online", run_id="run")
    assert online.num_rows >= 6 * 4 * 2  # every step's rows, written by the workers


def test_a_stopped_ray_run_keeps_the_samples_it_asked_for(tiny, tmp_path):
    """Ctrl-C during step 2 of a Ray run: the run stops after that step with a checkpoint, and the
    store keeps every row sampled, the next step's batch (already asked of the workers) included."""
    pytest.importorskip("ray")
    from softrl.runtime import ray_runtime
    from softrl.runtime.stop import RunStopped

    seed_store(tmp_path)
    config = load_config(None, tiny_overrides(str(tiny[0]), str(tmp_path), **{
        "runtime.kind": "ray", "runtime.workers": 2, "optim.steps": 6, "sampling.prompts_per_step": 4,
        "log.checkpoint_every": 10}))

    def on_step(record):
        if record["step"] == 2:
            os.kill(os.getpid(), signal.SIGINT)

    with pytest.raises(RunStopped) as stopped:
        ray_runtime.train(config, on_step=on_step, log=lambda m: None)
    assert stopped.value.step == 2
    # every stored copy (an id is the content's: two equal samples share one), none committed twice
    rows = ExperienceStore(tmp_path / "store").trajectories(source="online", run_id="run", unique=False,
                                                            columns=["id"])
    assert rows.num_rows == 3 * 4 * 2


def test_usage_configuration_reference_is_current(tmp_path):
    from pathlib import Path

    from softrl.config_reference import write_reference

    doc = Path(__file__).parent.parent / "docs" / "USAGE.md"
    copy = tmp_path / "USAGE.md"
    copy.write_text(doc.read_text())
    assert not write_reference(copy), "docs/USAGE.md is stale: run python -m softrl.config_reference docs/USAGE.md"


def test_optional_sinks_need_their_package():
    import importlib.util

    from softrl.runtime.session import optional_sinks

    for key, module in (("log.tensorboard", "tensorboard"), ("log.wandb", "wandb")):
        config = load_config(None, [f"{key}=true"])
        if importlib.util.find_spec(module) is None:
            with pytest.raises(ConfigError, match=f"{key} needs"):
                optional_sinks(config)
        else:
            assert len(optional_sinks(config)) == 1


def test_empty_offline_sources(tiny, tmp_path):
    from softrl.runtime.local import train

    offline_only = load_config(None, tiny_overrides(str(tiny[0]), str(tmp_path), **{"data.mix": "{offline: 1}"}))
    with pytest.raises(ConfigError, match="no trajectories for offline"):
        train(offline_only, log=lambda m: None)
    said = []
    mixed = load_config(None, tiny_overrides(str(tiny[0]), str(tmp_path), **{"name": "mixed", "optim.steps": 1}))
    assert train(mixed, log=said.append)["steps"] == 1  # the empty offline share falls back to online
    assert any("online samples only" in m for m in said)


def test_a_grouped_objective_refuses_an_offline_pool_without_groups(tiny, tmp_path):
    """Known solutions hold one row a prompt: AGRO and KL-PG, which compare a prompt's responses, found no
    group and ended the first step in 'every source is empty'; the run now refuses at setup, saying why."""
    from softrl.runtime.local import train

    seed_store(tmp_path)
    for algorithm in ("agro-off", "kl-pg"):
        config = load_config(None, tiny_overrides(str(tiny[0]), str(tmp_path), **{
            "data.mix": "{offline: 1}", "data.objective.algorithm": algorithm, "name": algorithm}))
        with pytest.raises(ConfigError, match=rf"^data.objective: {algorithm} learns from groups of "
                                              r"sampling.samples_per_prompt = 2 responses to a prompt \(at least "
                                              r"2\), and no prompt of the offline pool has 2: add responses"):
            train(config, log=lambda m: None)
    said = []  # with an online share the run goes on, on its online samples, and says so
    mixed = load_config(None, tiny_overrides(str(tiny[0]), str(tmp_path), **{
        "data.mix": "{online: 0.5, offline: 0.5}", "data.objective.algorithm": "agro-off", "name": "mixed",
        "optim.steps": 1}))
    assert train(mixed, log=said.append)["steps"] == 1
    assert any("no prompt of the offline pool has 2; training on the other sources only" in m for m in said)


def test_a_run_refuses_stored_token_ids_outside_the_model_vocabulary(tiny, tmp_path):
    """A stored row whose token ids (of the run's tokenizer) go beyond the model's embeddings ended the
    first step in an index error: the run refuses it before, naming store, row, prompt, id and vocabulary."""
    from softrl.data import Trajectory
    from softrl.models.loading import tokenizer_fingerprint
    from softrl.runtime.local import train
    from softrl.tasks.registry import load_task

    n = tiny[1].get_input_embeddings().num_embeddings
    prompt = load_task("countdown", size=6).prompts()[1]
    bad = Trajectory(prompt.id, "1+2", 1.0, True, task="countdown", prompt_text=prompt.text, source="human",
                     prompt_tokens=[3], response_tokens=[4, n + 7], tokenizer=tokenizer_fingerprint(tiny[2]))
    seed_store(tmp_path)
    ExperienceStore(tmp_path / "store").append([bad])
    config = load_config(None, tiny_overrides(str(tiny[0]), str(tmp_path), **{"optim.steps": 1}))
    with pytest.raises(ConfigError, match=rf"^data.store: offline pool of {tmp_path}/store: row '{bad.id}' \(prompt "
                                          rf"'{prompt.id}', source 'human'\) holds token id {n + 7} in response_tokens, "
                                          rf"outside the model's vocabulary \(ids 0 to {n - 1}\)"):
        train(config, log=lambda m: None)
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_a_run_refuses_a_stored_row_longer_than_the_model_positions(tiny, tmp_path):
    """An imported row far longer than the model's positions was trained on without a word (82 s and 3 GB
    for one row): the run refuses it before any step, naming store, row, its length and the positions;
    a text row is measured as the batch would tokenise it, a row of the run's tokens by its ids."""
    from softrl.data import Trajectory
    from softrl.models.loading import tokenizer_fingerprint
    from softrl.runtime.local import train
    from softrl.tasks.registry import load_task

    positions = tiny[1].config.max_position_embeddings
    prompt = load_task("countdown", size=6).prompts()[1]
    text = Trajectory(prompt.id, "1+2" * 200, 1.0, True, task="countdown", prompt_text=prompt.text, source="human")
    tokens = Trajectory(prompt.id, "3+4", 1.0, True, task="countdown", prompt_text=prompt.text, source="human",
                        prompt_tokens=[3] * 10, response_tokens=[4] * positions, tokenizer=tokenizer_fingerprint(tiny[2]))
    for name, bad in (("text", text), ("tokens", tokens)):
        root = tmp_path / name
        seed_store(root)
        ExperienceStore(root / "store").append([bad])
        config = load_config(None, tiny_overrides(str(tiny[0]), str(root), **{"optim.steps": 1}))
        with pytest.raises(ConfigError, match=rf"^data.store: offline pool of {root}/store: row '{bad.id}' \(prompt "
                                              rf"'{prompt.id}', source 'human'\) is [\d,]+ tokens long, over the "
                                              rf"model's {positions} positions"):
            train(config, log=lambda m: None)
        assert not (root / "run" / "metrics.jsonl").exists()


def test_row_lengths_are_measured_as_the_batch_tokenises_and_short_text_is_not_tokenised(tiny):
    from softrl.models.loading import encode_prompt, encode_response, tokenizer_fingerprint
    from softrl.training.batch import row_tokens, too_long_row

    tok, fingerprint = tiny[2], tokenizer_fingerprint(tiny[2])
    seen = []

    def tokens(row):
        seen.append(row["response_text"])
        return row_tokens(row, fingerprint, lambda t: encode_prompt(tok, t), lambda t: encode_response(tok, t))

    rows = [{"prompt_text": "p", "response_text": "a" * n} for n in (10, 300, 40)]
    prompt = len(encode_prompt(tok, "p"))
    assert too_long_row(rows, 10_000, tokens, fingerprint) is None and seen == []  # 4 x chars + 512 fit
    # 300 characters of the character tokenizer, its EOS and the prompt: over 256
    assert too_long_row(rows, 256, tokens, fingerprint) == (1, 300 + 1 + prompt)
    assert too_long_row(rows, 0, tokens, fingerprint) is None  # positions unknown: nothing refused


def test_a_pool_too_large_to_check_whole_refuses_a_bad_row_when_it_is_drawn(tiny, tmp_path, monkeypatch):
    """Before a run, a pool is checked whole up to `CHECKED_ROWS` rows, else a sample of it: a bad row
    outside the sample is refused when it is drawn, with the same line, not an index error mid-step."""
    import softrl.runtime.feed as feed
    from softrl.data import Trajectory
    from softrl.models.loading import tokenizer_fingerprint
    from softrl.runtime.local import train
    from softrl.tasks.registry import load_task

    n = tiny[1].get_input_embeddings().num_embeddings
    prompt = load_task("countdown", size=6).prompts()[1]
    bad = Trajectory(prompt.id, "1+2", 1.0, True, task="countdown", prompt_text=prompt.text, source="human",
                     prompt_tokens=[3], response_tokens=[4, n + 7], tokenizer=tokenizer_fingerprint(tiny[2]))
    ExperienceStore(tmp_path / "store").append([bad])  # first of 7 rows: the one checked is the 7th (seed 0)
    seed_store(tmp_path)
    monkeypatch.setattr(feed, "CHECKED_ROWS", 1)
    steps = []
    config = load_config(None, tiny_overrides(str(tiny[0]), str(tmp_path), **{"optim.steps": 12}))
    with pytest.raises(ConfigError, match=rf"^data.store: offline pool of {tmp_path}/store: row '{bad.id}' .* holds "
                                          rf"token id {n + 7} in response_tokens, outside the model's vocabulary"):
        train(config, log=lambda m: None, on_step=steps.append)
    assert 0 < len(steps) < 12  # refused on the way, when drawn


def test_the_offline_pool_names_stored_rows_of_none_of_the_task_prompts(tiny, tmp_path):
    """Human records imported without the task keep prompt ids made from their text, which no task
    prompt has: a run trained on none of them, saying only "offline pool: 0 trajectories". Now the
    run is refused when that leaves the offline pool empty, and warned when it leaves some out; the
    records imported with --task's prompts (`task_prompt_ids`) are the task's prompts."""
    from softrl.data import Trajectory
    from softrl.data.io import read_trajectories, task_prompt_ids
    from softrl.runtime.feed import DataFeed
    from softrl.tasks.registry import load_task

    task = load_task("countdown", size=6)
    prompts = task.prompts()
    records = tmp_path / "human.jsonl"
    records.write_text("".join(json.dumps({"prompt": p.text.strip(), "response": "1+2", "reward": 1}) + "\n"
                               for p in prompts))
    store = ExperienceStore(tmp_path / "store")
    store.append(read_trajectories(records, "human"))
    config = load_config(None, [f"data.store={tmp_path}/store", "task.size=6", "data.offline_sources=[human]"])
    q0 = {p.id: 0.5 for p in prompts}
    with pytest.raises(ConfigError, match=rf"^data.offline_sources: the offline pool would be empty: 6 human rows in "
                                          rf"{tmp_path}/store are not trained on: their prompt ids are none of task "
                                          r"countdown's 6 prompt ids \(e.g. 'prompt-\w+' in the store, 'countdown-0-0' in "
                                          r"the task\); they name no task: import them again with `softrl data import "
                                          r"FILE --source human --task countdown`"):
        DataFeed(config, store, task, q0, tiny[2], log=lambda m: None)
    keyed = read_trajectories(records, "human", "countdown", task_prompt_ids(load_task("countdown")))
    assert [r.prompt_id for r in keyed] == [p.id for p in prompts] and keyed[0].prompt_text == prompts[0].text
    other = load_task("countdown", size=60).prompts()[50]  # a prompt of a run of another task.size: not warned of
    store.append(keyed + [Trajectory(other.id, "1+2", 1.0, True, task="countdown", prompt_text=other.text, source="human")])
    said = []
    feed = DataFeed(config, store, task, q0, tiny[2], log=said.append)
    assert len(feed.mixture.sources["offline"]) == 6
    assert [m.split(" are not trained on")[0] for m in said if m.startswith("warning")] == [
        f"warning: offline pool: 6 human rows in {tmp_path}/store"]


def test_a_run_on_an_s3_store(tiny, tmp_path, s3_env):
    """data.store as an s3:// URI: Q0, the offline pool and the online samples go there (AWS_* variables only);
    the pool's columns are copied to local disk once and drawn from there."""
    from softrl.runtime.local import train
    from softrl.tasks.registry import load_task

    store = f"s3://{s3_env.bucket}/run-{tmp_path.name}"
    ExperienceStore(store).append(task_solutions(load_task("countdown", size=6), "human"))
    config = load_config(None, tiny_overrides(str(tiny[0]), str(tmp_path), **{"data.store": store, "optim.steps": 1}))
    said = []
    assert train(config, log=said.append)["steps"] == 1
    # the offline pool's wide columns were copied to local disk, so a draw asks the server for nothing
    assert any(line.startswith("offline pool: 6 trajectories (their columns copied to local disk") for line in said), said
    stats = ExperienceStore(store).stats()
    assert stats["sources"]["online"]["trajectories"] > 0 and stats["prompts_with_q0"] == 6


def test_offline_only_mix_generates_nothing(tiny, tmp_path):
    """agro-off on fixed data: no online sampling, every batch row from the store, eval with KL stats."""
    from softrl.runtime.local import train

    seed_store(tmp_path)
    config = load_config(None, tiny_overrides(str(tiny[0]), str(tmp_path), **{
        "data.mix": "{offline: 1}", "data.objective": "{algorithm: agro-off}", "optim.steps": 2, "eval.stats": "true",
        "data.offline_sources": "[human, reference]", "data.offline_passed_only": "false"}))
    summary = train(config, log=lambda m: None)
    assert summary["samples"] == 0
    assert ExperienceStore(f"{tmp_path}/store").trajectories(source="online").num_rows == 0
    records = [json.loads(line) for line in (config.run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "loss" in r]
    assert [r["batch_rows"] for r in steps] == [4, 4] and all(r["samples"] == 0 for r in steps)
    evals = [r for r in records if "eval/pass@1" in r]
    assert evals[0]["eval/kl_to_reference"] == pytest.approx(0.0, abs=1e-6)  # before training pi == pi0
    assert evals[-1]["eval/kl_to_reference"] > 0 and evals[-1]["eval/mean_token_entropy"] > 0


def test_gym_task_options_and_held_out_split():
    pytest.importorskip("reasoning_gym")
    from softrl.assemble import load_tasks

    config = load_config(None, ["task.name=gym:basic_arithmetic", "task.size=5", "task.eval_size=3",
                                "task.options={min_terms: 2, max_terms: 2, max_digits: 2, prompt_suffix: ' Answer:'}"])
    train_task, eval_task = load_tasks(config)
    assert len(train_task.prompts()) == 5 and len(eval_task.prompts()) == 3
    assert all(p.text.endswith(" Answer:") for p in train_task.prompts())
    assert not {p.id for p in train_task.prompts()} & {p.id for p in eval_task.prompts()}
    bad = load_config(None, ["task.name=gym:basic_arithmetic", "task.options={no_such_key: 1}"])
    with pytest.raises(ConfigError, match="^task: "):
        load_tasks(bad)


def test_ppo_first_step_pushes_up_solved_and_leaves_failed_alone():
    """At the first step (policy = reference, value head at 0) PPO's advantages are the task reward:
    the solved row's log-probs go up and the failed row gets no gradient (with SPO's shifted r - 1 the
    failed row would be pushed down before the value model had learnt anything)."""
    from softrl import objectives
    from softrl.objectives import LossInputs, objective_loss

    B, T = 2, 3
    logp = torch.full((B, T), -1.0, requires_grad=True)
    mask = torch.ones(B, T)
    values = torch.zeros(B, T, requires_grad=True)
    inputs = LossInputs(logp=logp, ref_logp=logp.detach().clone(), old_logp=logp.detach().clone(), mask=mask,
                        reward=torch.tensor([1.0, 0.0]),  # the task's reward: solved, failed
                        q0=torch.zeros(B), beta=0.1, group_size=2, values=values, old_values=values.detach())
    loss, _ = objective_loss(objectives.get("ppo").options(), inputs)
    loss.backward()
    assert (logp.grad[0] < 0).all()  # descending the loss raises the solved row's log-probs
    assert torch.equal(logp.grad[1], torch.zeros(T))


def test_policy_lag_makes_every_online_row_exactly_that_many_updates_stale(tiny, tmp_path, monkeypatch):
    """runtime.policy_lag 2: step n learns on rows of the policy of step n - 3 (the first steps on the
    weights generation started with), logged as the staleness each step; the rows carry that version.
    A step skipped for a non-finite loss (the 3rd) changes no weights and does not shift the lag."""
    import softrl.training.learner as learner_module
    from softrl.runtime.local import train

    calls = [0]
    loss = learner_module.objective_loss

    def nan_on_third(*args):
        calls[0] += 1
        out = loss(*args)
        return (out[0] * float("nan"), out[1]) if calls[0] == 3 else out

    monkeypatch.setattr(learner_module, "objective_loss", nan_on_third)
    seed_store(tmp_path)
    config = load_config(None, tiny_overrides(str(tiny[0]), str(tmp_path), **{
        "runtime.policy_lag": 2, "optim.steps": 7, "optim.lr": 1e-2, "data.mix": {"online": 1.0},
        "data.objective": "{algorithm: topr}"}))  # its negatives move the tiny model, which solves nothing
    train(config, log=lambda m: None)
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    stepped = [r for r in records if "loss" in r]
    assert [(r["staleness/min"], r["staleness/max"]) for r in stepped] == [(0, 0), (1, 1)] + [(2, 2)] * 4
    assert sum("skipped_nonfinite" in r for r in records) == 1
    online = ExperienceStore(tmp_path / "store").trajectories(source="online", run_id="run")
    assert sorted(set(online["policy_version"].to_pylist())) == [0, 1, 2, 3]
    # KL(mu || pi) on mu's samples: 0 while the rows are the policy's own, not once they are stale
    assert stepped[0]["iw/kl_behavior"] == pytest.approx(0, abs=1e-5)
    assert all(abs(r["iw/kl_behavior"]) > 1e-6 for r in stepped[2:])


@pytest.mark.parametrize("overrides", [["runtime.model_update_interval=2"], ["runtime.mode=async"],
                                       ["runtime.kind=ray"]])
def test_policy_lag_is_refused_with_other_sources_of_staleness(overrides):
    with pytest.raises(ConfigError, match="runtime.policy_lag: needs runtime.kind=local, runtime.mode=sync and "
                                          "runtime.model_update_interval=1"):
        load_config(None, ["runtime.policy_lag=4", *overrides])
    with pytest.raises(ConfigError, match="runtime.policy_lag: the run generates nothing"):
        load_config(None, ["runtime.policy_lag=4", "data.mix={offline: 1}"])


def test_the_same_seed_gives_the_same_numbers_with_the_store_made_or_reused(tmp_path, tiny):
    """The first run estimates Q0 and fills the store, the second reuses both: their sampling must not
    depend on that, and PyTorch's deterministic algorithms (runtime.deterministic, on by default) keep
    the reductions' order fixed, so every logged number is the same."""
    from softrl.plots import read_metrics
    from softrl.runtime.local import train

    seed_store(tmp_path)
    runs = []
    for name in ("first", "second"):
        train(load_config(None, tiny_overrides(str(tiny[0]), str(tmp_path), name=name, **{"optim.steps": 3})))
        assert torch.are_deterministic_algorithms_enabled()
        clock = ("time", "seconds", "per_s", "/s", "mem")  # how long it took, not what it computed
        runs.append([{k: v for k, v in r.items() if not any(c in k for c in clock)}
                     for r in read_metrics(tmp_path / name)])
    assert runs[0] == runs[1] and len(runs[0]) >= 4
    train(load_config(None, tiny_overrides(str(tiny[0]), str(tmp_path), name="fast",
                                           **{"optim.steps": 1, "runtime.deterministic": "false"})))
    assert not torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)  # as the other tests' runs leave it


def test_q0_says_how_much_it_samples_and_reports_its_progress(tmp_path, tiny):
    """Before the first step Q0 samples the reference on every training prompt (minutes for 1e5 of
    them): the run says so first in one line (prompts x samples), then its "q0" phase counts the
    prompts done from 0 to the task's size, a chunk at a time rather than once at the end. A second
    run over the same store has Q0 of every prompt already: nothing to say, its phase is done at once."""
    from softrl.runtime.local import train

    seed_store(tmp_path)
    for name, size, fresh in (("first", 10, 10), ("second", 10, 0)):
        events = []
        config = load_config(None, tiny_overrides(str(tiny[0]), str(tmp_path), name=name,
                                                  **{"task.size": size, "optim.steps": 1}))
        train(config, log=lambda m: events.append(("log", m)),
              on_phase=lambda phase, done, total: events.append((phase, done, total)))
        q0 = [e[1:] for e in events if e[0] == "q0"]
        said = [e[1] for e in events if e[0] == "log" and e[1].startswith("Q0")]
        assert q0[0] == (size - fresh, size) and q0[-1] == (size, size), q0
        assert all(total == size for _, total in q0) and [d for d, _ in q0] == sorted(d for d, _ in q0)
        if fresh:
            assert said == [f"Q0: sampling the reference model on {fresh} prompts x 4 samples = {4 * fresh} samples"]
            assert events.index(("log", said[0])) < events.index(("q0", 0, size))  # said before it starts
            assert len({d for d, _ in q0}) >= 3  # counted as it goes (chunks of 4 prompts): 0, 4, 8, 10
        else:
            assert said == [] and q0 == [(size, size)]
