"""ExperienceStore: round trip, concurrent writers, a writer killed mid-write, bad files, filters,
prompts, annotations, dedupe, stats; and the samplers."""

import random
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from softrl.data import ExperienceStore, GroupSampler, MixtureSampler, StoreError, Trajectory, TrajectoryPool, replay
from softrl.data.samplers import split_counts

WRITER = """
import sys
from softrl.data import ExperienceStore, Trajectory
store, worker, total, chunk = ExperienceStore(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
i = 0
while total < 0 or i < total:
    rows = [Trajectory(f"p{(i + j) % 97}", f"w{worker} r{i + j}", reward=float((i + j) % 2), passed=(i + j) % 2 == 1,
                       response_tokens=[worker, i + j, (i + j) % 40], source=f"w{worker}") for j in range(chunk)]
    store.append(rows)
    i += chunk
    print(i, flush=True)
"""


def full_trajectory(**overrides):
    base = dict(prompt_id="p1", response_text="2+2=4", reward=1.0, passed=True, task="countdown", prompt_text="2 2 -> 4",
                prompt_tokens=[5, 6, 7], response_tokens=[8, 9, 10, 11], tokenizer="chartok-abc", source="online",
                run_id="run-1", policy_version=7, behavior_logprobs=[-0.5, -0.25, -1.0, -0.125],
                decoding={"temperature": 0.5, "top_p": 0.75}, mc_targets=[{"t": 2, "success": 0.3, "k": 10}],
                created_at=datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=timezone.utc))
    return Trajectory(**{**base, **overrides})


def test_round_trip_keeps_every_field(tmp_path):
    store = ExperienceStore(tmp_path / "s")
    written = [full_trajectory(), full_trajectory(response_tokens=[1], behavior_logprobs=None, decoding=None, mc_targets=[])]
    assert store.append(written) == 2
    back = [Trajectory.from_row(r) for r in store.trajectories().to_pylist()]
    assert back == written and not store.problems
    assert written[0].id != written[1].id  # the id is a content hash of prompt id + response tokens
    assert Trajectory("p", "text only", 0.0, False).id != Trajectory("p", "other text", 0.0, False).id


def test_filters_and_unknown_filter(tmp_path):
    store = ExperienceStore(tmp_path)
    store.append([full_trajectory(response_tokens=[i], source=s, passed=i % 2 == 0, policy_version=i, task=t)
                  for i, (s, t) in enumerate([("online", "a"), ("reference", "a"), ("online", "b"), ("human", "b")])])
    assert store.trajectories(source="online").num_rows == 2
    assert store.trajectories(source=["online", "human"], passed=False)["policy_version"].to_pylist() == [3]
    assert store.trajectories(task="b", policy_version=3)["source"].to_pylist() == ["human"]
    assert store.trajectories(tokenizer="other").num_rows == 0
    with pytest.raises(ValueError, match="unknown filter 'colour'"):
        store.trajectories(colour="red")


def test_four_writers_at_once_lose_and_duplicate_nothing(tmp_path):
    root = tmp_path / "store"
    ExperienceStore(root)
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(root), str(w), "10000", "500"], stdout=subprocess.PIPE)
             for w in range(4)]
    assert all(p.wait(timeout=300) == 0 for p in procs)
    store = ExperienceStore(root)
    table = store.trajectories(columns=["source", "response_text"], unique=False)
    assert table.num_rows == 40_000 and len(set(table["id"].to_pylist())) == 40_000
    texts = set(table["response_text"].to_pylist())
    assert all(f"w{w} r{i}" in texts for w in range(4) for i in (0, 4_999, 9_999))
    assert store.stats()["sources"]["w2"]["trajectories"] == 10_000 and not store.problems


def test_writer_killed_mid_write_leaves_a_readable_store(tmp_path):
    root = tmp_path / "store"
    ExperienceStore(root)
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(root), "0", "-1", "3000"], stdout=subprocess.PIPE, text=True)
    committed = 0
    while committed < 9000:  # at least three parts committed, then kill at a random moment of a write
        committed = int(proc.stdout.readline())
    time.sleep(random.Random(0).uniform(0.0, 0.3))
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    store = ExperienceStore(root)
    table = store.trajectories(columns=["response_text"], unique=False)
    assert not store.problems  # a hidden temporary file is not a part, nor a problem
    assert table.num_rows >= committed and table.num_rows % 3000 == 0
    assert len(set(table["id"].to_pylist())) == table.num_rows
    assert {f"w0 r{i}" for i in range(committed)} <= set(table["response_text"].to_pylist())


def test_bad_files_are_reported_by_name_and_skipped(tmp_path):
    store = ExperienceStore(tmp_path)
    store.append([full_trajectory()])
    parts = tmp_path / "trajectories"
    (parts / "part-corrupt.parquet").write_bytes(b"PAR1 this is not parquet")
    pq.write_table(pa.table({"x": [1, 2]}), parts / "part-foreign.parquet")
    (parts / "notes.txt").write_text("hello")
    table = store.trajectories()
    assert table.num_rows == 1
    reported = "\n".join(map(str, store.problems))
    assert "part-corrupt.parquet: unreadable" in reported
    assert "part-foreign.parquet: not a softrl trajectories part (missing column 'id')" in reported
    assert "notes.txt: not a Parquet part file" in reported
    before, after = store.dedupe()
    assert (before, after) == (1, 1) and (parts / "part-corrupt.parquet").exists()  # never deleted
    with pytest.raises(StoreError, match="holds other files"):
        (tmp_path / "other").mkdir()
        (tmp_path / "other" / "data.csv").write_text("a,b")
        ExperienceStore(tmp_path / "other")


def test_prompts_annotations_and_dedupe(tmp_path):
    store = ExperienceStore(tmp_path)
    a, b = full_trajectory(mc_targets=[]), full_trajectory(response_tokens=[3], source="human", passed=False, reward=0.0)
    store.append([a, b])
    store.append([a])  # the same content again, later
    assert store.trajectories(unique=False).num_rows == 3 and store.trajectories().num_rows == 2
    store.annotate({a.id: [{"t": 1, "success": 0.1, "k": 10}, {"t": 4, "success": 1.0, "k": 10}]})
    store.annotate({a.id: [{"t": 2, "success": 0.5, "k": 20}]})  # the newest annotation wins
    rows = {r["id"]: r for r in store.trajectories().to_pylist()}
    assert rows[a.id]["mc_targets"] == [{"t": 2, "success": 0.5, "k": 20}] and rows[b.id]["mc_targets"] == b.mc_targets
    store.put_prompts([{"prompt_id": "p1", "task": "countdown", "text": "x", "meta": {"n": 1}}])
    store.put_prompts([{"prompt_id": "p1", "task": "countdown", "text": "x", "q0_hat": -0.5, "q0_k": 800}])
    assert store.prompts()["p1"]["q0_k"] == 800
    stats = store.stats()
    assert stats["duplicates"] == 1 and stats["sources"]["human"]["pass_rate"] == 0.0
    assert stats["sources"]["online"]["with_mc_targets"] == 1
    assert store.dedupe() == (3, 2)
    assert store.trajectories(unique=False).num_rows == 2 and len(list((tmp_path / "annotations").iterdir())) == 0
    assert {r["id"]: r for r in store.trajectories().to_pylist()}[a.id]["mc_targets"][0]["k"] == 20


def test_two_dedupes_at_once_one_is_refused(tmp_path):
    store = ExperienceStore(tmp_path)
    store.append([full_trajectory()])
    store.append([full_trajectory()])  # the same row again
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, sys, time\n"
                               "f = open(sys.argv[1], 'a'); fcntl.flock(f, fcntl.LOCK_EX); print('held', flush=True)\n"
                               "time.sleep(60)", str(tmp_path / ".dedupe.lock")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"  # another dedupe is under way
        with pytest.raises(StoreError, match="another dedupe of this store is running"):
            store.dedupe()
        assert store.trajectories(unique=False).num_rows == 2  # untouched
    finally:
        holder.kill()
        holder.wait()
    assert store.dedupe() == (2, 1)  # the lock dies with its holder


@pytest.mark.parametrize("name", ["out.parquet", "out.jsonl.gz"])
def test_an_export_is_whole_or_not_at_all_and_never_among_the_parts(tmp_path, monkeypatch, name):
    import errno
    import json as jsonlib

    from softrl.data import io

    store = ExperienceStore(tmp_path / "store")
    store.append([full_trajectory(), full_trajectory(response_tokens=[3])])
    table = store.trajectories()
    with pytest.raises(ValueError, match="inside the store"):
        io.export(table, tmp_path / "store" / "trajectories" / name, tmp_path / "store")
    assert store.trajectories(unique=False).num_rows == 2
    out = tmp_path / name
    assert io.export(table, out, tmp_path / "store") == 2
    before = out.read_bytes()

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    real = jsonlib.dumps
    monkeypatch.setattr(io.pq, "write_table", full)
    monkeypatch.setattr(io.json, "dumps", lambda row, **k: full() if row.get("response_tokens") == [3] else
                        real(row, **k))  # the second row finds the disk full
    with pytest.raises(OSError, match="No space left"):
        io.export(table, out, tmp_path / "store")
    assert out.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == [name, "store"]


def rows(prompt, n, **extra):
    return [{"prompt_id": prompt, "response_text": f"{prompt}-{i}", **extra} for i in range(n)]


def test_split_counts_and_mixture():
    rng = random.Random(0)
    for total in (1, 7, 64):
        counts = split_counts(total, {"a": 0.5, "b": 0.25, "c": 0.25}, rng)
        assert sum(counts.values()) == total and abs(counts["a"] - total / 2) <= 1
    online, offline = TrajectoryPool(rows("on", 10)), TrajectoryPool(rows("off", 10))
    sampler = MixtureSampler({"online": online, "offline": offline, "mc": TrajectoryPool([])},
                             {"online": 0.5, "offline": 0.25, "mc": 0.25}, seed=1)
    batch = sampler.sample(40)
    assert len(batch) == 40 and sum(r["mix_source"] == "online" for r in batch) >= 20  # mc is dry: others fill in
    sampler = MixtureSampler({"online": online, "offline": offline}, {"online": 3, "offline": 1}, seed=2)
    tags = [r["mix_source"] for _ in range(200) for r in sampler.sample(6)]
    assert abs(tags.count("online") / len(tags) - 0.75) < 0.01
    with pytest.raises(ValueError, match="unknown source 'replay'"):
        MixtureSampler({"online": online}, {"replay": 1.0})
    with pytest.raises(ValueError, match="every source is empty"):
        MixtureSampler({"x": TrajectoryPool([])}, {"x": 1.0}).sample(4)


def test_group_sampler_and_replay(tmp_path):
    pool = TrajectoryPool(rows("a", 5) + rows("b", 2) + rows("c", 4))
    groups = GroupSampler(pool, n=4, seed=0).sample(10)
    assert len(groups) == 40
    for g in range(10):
        group = groups[4 * g : 4 * g + 4]
        assert len({r["prompt_id"] for r in group}) == 1 and group[0]["prompt_id"] in "ac"
        assert len({r["response_text"] for r in group}) == 4  # without replacement within a group
    with pytest.raises(ValueError, match="no prompt has 9 stored responses"):
        GroupSampler(pool, n=9).sample(1)
    rng = random.Random(0)
    fresh = [{"prompt_id": "a", "response_text": "new"} for _ in range(4000)] + [{"prompt_id": "zzz", "response_text": "new"}]
    mixed = replay(fresh, pool, 0.3, rng)
    assert abs(sum(r.get("replayed", False) for r in mixed) / 4000 - 0.3) < 0.03 and mixed[-1]["response_text"] == "new"
    store = ExperienceStore(tmp_path)  # SPO's offline set: passed only
    store.append([full_trajectory(response_tokens=[i], passed=i % 3 == 0) for i in range(9)])
    assert len(TrajectoryPool(store.trajectories(passed=True))) == 3
