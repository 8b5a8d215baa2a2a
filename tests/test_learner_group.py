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
from softrl.train.data_parallel import my_rows  # noqa: E402
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
