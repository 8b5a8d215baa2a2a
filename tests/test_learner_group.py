"""A data-parallel learner group (runtime/group.py, train/data_parallel.py): each rank's share of a
batch, and a 2-process group on gloo that trains exactly as one process does, across kill -9 and
--resume (tiny random model, a few steps)."""

import json
import os
import signal
import subprocess
import time

from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from softrl.models.wrappers import PolicyModel  # noqa: E402
from softrl.training.data_parallel import my_rows  # noqa: E402
from test_training import SOFTRL, kill_mid_run, seed_store, tiny_overrides  # noqa: E402


def test_each_rank_takes_whole_groups_and_together_all_rows():
    sources = ["online"] * 12 + ["offline"] * 3
    size = {"online": 4, "offline": 1}.get
    for world in (1, 2, 3, 4):
        shares = [my_rows(sources, rank, world, size) for rank in range(world)]
        assert sorted(sum(shares, [])) == list(range(15))  # every row once
        for share in shares:
            online = [i for i in share if i < 12]
            assert all(online[g : g + 4] == list(range(online[g], online[g] + 4)) for g in range(0, len(online), 4))
    assert [my_rows(["online"] * 4, r, 2, lambda s: 4) for r in (0, 1)] == [[], [0, 1, 2, 3]]  # one group, two ranks


def curve(root):
    records = [json.loads(x) for x in (root / "run" / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["loss"], r["grad_norm"]) for r in records if "loss" in r]


def final_weights(root):
    return PolicyModel.load(root / "run" / "final").model.state_dict()


def train(root, tiny, learners: int, extra=(), **overrides):
    seed_store(root)
    args = [SOFTRL, "train", *tiny_overrides(str(tiny[0]), str(root), **{"runtime.learners": learners, **overrides}),
            *extra]
    return args


@pytest.mark.skipif(SOFTRL is None, reason="softrl console script not installed")
@pytest.mark.parametrize("algorithm", ["spo", "grpo"])
def test_two_learners_train_as_one(tmp_path, tiny, algorithm):
    """The same seed and batches: a 2-process group's loss curve and final weights equal one process's."""
    roots = {}
    for learners in (1, 2):
        roots[learners] = tmp_path / f"learners{learners}"
        mix = {"spo": "{online: 0.5, offline: 0.5}", "grpo": "{online: 1.0}"}[algorithm]
        args = train(roots[learners], tiny, learners, **{"data.objective.algorithm": algorithm, "data.mix": mix,
                                                         "optim.steps": 4})
        out = subprocess.run(args, capture_output=True, text=True)
        assert out.returncode == 0, out.stderr[-2000:]
    one, two = curve(roots[1]), curve(roots[2])
    assert [s for s, _, _ in two] == [1, 2, 3, 4]
    assert all(a[1] == pytest.approx(b[1], abs=1e-5) and a[2] == pytest.approx(b[2], abs=1e-5) for a, b in zip(one, two))
    a, b = final_weights(roots[1]), final_weights(roots[2])
    assert all(torch.allclose(a[k], b[k], atol=1e-5) for k in a)


@pytest.mark.skipif(SOFTRL is None, reason="softrl console script not installed")
def test_a_killed_group_resumes_as_one_process_runs(tmp_path, tiny):
    """kill -9 of rank 0 mid-run (its follower exits too), then --resume: the curve and the final
    weights of an uninterrupted one-process run."""
    straight = tmp_path / "straight"
    assert subprocess.run(train(straight, tiny, 1, **{"optim.steps": 8}), capture_output=True).returncode == 0
    killed = tmp_path / "killed"
    args = train(killed, tiny, 2, **{"optim.steps": 8})
    kill_mid_run(args, killed / "run" / "metrics.jsonl")
    resumed = subprocess.run(args + ["--resume"], capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    one, two = curve(straight), curve(killed)
    assert [s for s, _, _ in two] == list(range(1, 9))
    assert all(a[1] == pytest.approx(b[1], abs=1e-5) for a, b in zip(one, two))
    a, b = final_weights(straight), final_weights(killed)
    assert all(torch.allclose(a[k], b[k], atol=1e-5) for k in a)


@pytest.mark.skipif(SOFTRL is None, reason="softrl console script not installed")
def test_a_group_whose_rank_0_fails_at_setup_ends_in_one_line(tmp_path, tiny):
    """Rank 0 fails before the group starts stepping (its run directory exists): one line, and the
    learner processes softrl started are stopped, not left waiting."""
    args = train(tmp_path, tiny, 2, **{"optim.steps": 2})
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.jsonl").write_text("")
    out = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert "--resume" in out.stderr or "exists" in out.stderr


def spawned_children(pid: int) -> list[int]:
    """Processes `pid` started with multiprocessing's spawn (its learner ranks)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (stat.parent / "cmdline").read_bytes()
        except (OSError, ValueError, IndexError):
            continue
        if ppid == pid and b"spawn_main" in cmdline:
            found.append(int(stat.parent.name))
    return found


@pytest.mark.skipif(SOFTRL is None, reason="softrl console script not installed")
def test_a_killed_learner_rank_ends_the_run_in_one_line(tmp_path, tiny):
    """SIGKILL of rank 1 mid-run: rank 0 says which rank died and how to go on, in one line."""

    args = train(tmp_path, tiny, 2, **{"optim.steps": 400})
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    metrics = tmp_path / "run" / "metrics.jsonl"
    while proc.poll() is None and not (metrics.exists() and '"loss"' in metrics.read_text()):
        time.sleep(0.05)
    children = spawned_children(proc.pid)
    assert len(children) == 1, "the second learner process was not found"
    os.kill(children[0], signal.SIGKILL)
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode != 0 and "Traceback" not in stderr
    assert "learner rank 1 of 2 exited" in stderr and "--resume" in stderr


def _sharded_steps(rank: int, world: int, init_method: str, directory: str, overrides: list[str], batch, out: str):
    """One rank of a learner group stepping twice on `batch`; what it holds and rank 0's whole weights to `out`."""
    import torch.distributed as dist

    from softrl.config import load_config
    from softrl.models.wrappers import ReferenceModel, ValueModel
    from softrl.training.learner import Learner

    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world)
    try:
        config = load_config(None, overrides)
        policy = PolicyModel.load(directory)
        reference = ReferenceModel.from_policy(policy)
        value = ValueModel(reference.model) if "ppo" in " ".join(overrides) else None
        learner = Learner(policy, reference, config, value, rank=rank, world=world)
        losses = [learner.step(batch)["loss"] for _ in range(2)]
        held = sum(p.to_local().numel() for p in learner.params)
        moments = sum(s["exp_avg"].to_local().numel() for s in learner.optimizer.state.values())
        state = learner.state_dict()
        torch.save({"losses": losses, "held": held, "moments": moments, "weights": policy.model.state_dict(),
                    "optimizer": state["optimizer"], "value": state["value"]}, f"{out}.{rank}")
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("algorithm", ["spo", "ppo"])
def test_shards_hold_a_share_and_step_as_one_process(tmp_path, tiny, algorithm):
    """Two ranks with FSDP2 shards: each holds about half of the trained weights and of AdamW's moments;
    a rank with fewer micro-batches than the other (3 groups, 2 ranks) repeats one at weight 0; the
    losses, rank 0's whole weights and the gathered optimizer and value states (one process's format)
    equal one process's."""
    import torch.multiprocessing as mp

    from softrl.config import load_config
    from softrl.models.wrappers import ReferenceModel, ValueModel
    from softrl.runtime.group import rendezvous
    from softrl.training.learner import Learner
    from test_device import batch_of

    overrides = [f"data.objective.algorithm={algorithm}", "sampling.samples_per_prompt=3", "data.mix={online: 1}",
                 "optim.warmup_steps=0", "optim.lr=1e-5", "optim.grad_accum=2"]
    batch = batch_of(tiny, n_prompts=3)
    out = str(tmp_path / "rank")
    mp.start_processes(_sharded_steps, args=(2, rendezvous(), str(tiny[0]), overrides, batch, out), nprocs=2,
                       start_method="spawn")
    policy = PolicyModel.load(tiny[0])
    reference = ReferenceModel.from_policy(policy)
    value = ValueModel(reference.model) if algorithm == "ppo" else None
    one = Learner(policy, reference, load_config(None, overrides), value)
    losses = [one.step(batch)["loss"] for _ in range(2)]
    ranks = [torch.load(f"{out}.{r}", weights_only=False) for r in (0, 1)]
    total = sum(p.numel() for p in one.params)
    moments = sum(s["exp_avg"].numel() for s in one.optimizer.state.values())
    for rank in ranks:
        assert rank["losses"] == pytest.approx(losses, abs=1e-6)
        assert 0.4 * total < rank["held"] < 0.6 * total and 0.4 * moments < rank["moments"] < 0.6 * moments
    weights = policy.model.state_dict()
    # to a fifth of AdamW's largest move a step (lr): an embedding row with a gradient near 0 moves by
    # g / sqrt(v), which the order of the ranks' sum changes (1e-6 here; the other weights 1e-8)
    assert all(torch.allclose(ranks[0]["weights"][k], weights[k], atol=2e-6) for k in weights)
    mine, theirs = one.optimizer.state_dict(), ranks[0]["optimizer"]
    assert theirs["param_groups"][0]["params"] == mine["param_groups"][0]["params"] and ranks[1]["optimizer"] is None
    assert all(torch.allclose(theirs["state"][i]["exp_avg_sq"], mine["state"][i]["exp_avg_sq"], rtol=1e-4, atol=1e-12)
               for i in mine["state"])
    if algorithm == "ppo":
        assert all(torch.allclose(ranks[0]["value"][k], v, atol=1e-6) for k, v in value.state_dict().items())


@pytest.mark.skipif(SOFTRL is None, reason="softrl console script not installed")
def test_torchrun_starts_a_group_that_trains_as_one_process(tmp_path, tiny):
    """`torchrun --standalone --nproc-per-node 2 -m softrl train ...` (rendezvous on the loopback): the
    loss curve and final weights of one process."""
    torchrun = Path(SOFTRL).parent / "torchrun"
    one, two = tmp_path / "one", tmp_path / "two"
    assert subprocess.run(train(one, tiny, 1), capture_output=True).returncode == 0
    args = train(two, tiny, 2)
    out = subprocess.run([str(torchrun), "--standalone", "--nproc-per-node", "2", "-m", "softrl", *args[1:]],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert all(a[1] == pytest.approx(b[1], abs=1e-5) for a, b in zip(curve(one), curve(two)))
    assert len(curve(two)) == 4
    a, b = final_weights(one), final_weights(two)
    assert all(torch.allclose(a[k], b[k], atol=1e-5) for k in a)
