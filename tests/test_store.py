"""ExperienceStore on both backends (a local directory and s3:// on a SeaweedFS server): round trip,
filters, concurrent writers, a writer killed mid-write, prompts, annotations, commit order, dedupe
racing readers and writers, bad locations as one line, migration of an old-format store; and the
samplers."""

import errno
import hashlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from datetime import datetime, timedelta, timezone

import lance
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from softrl.data import ExperienceStore, GroupSampler, MixtureSampler, StoreError, Trajectory, TrajectoryPool, replay
from softrl.data.samplers import split_counts
from softrl.data.schema import ANNOTATION_SCHEMA, PROMPT_SCHEMA, TRAJECTORY_SCHEMA
from softrl.data.storage import HANDLE

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


def softrl(*args, env=None):
    return subprocess.run([sys.executable, "-m", "softrl", *args], capture_output=True, text=True, timeout=300, env=env)


def one_line_error(proc) -> str:
    """The refusal of a command: exit status 2 and exactly one line on stderr."""
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr[-2000:]
    return lines[0]


def test_round_trip_keeps_every_field(root):
    store = ExperienceStore(root)
    written = [full_trajectory(), full_trajectory(response_tokens=[1], behavior_logprobs=None, decoding=None, mc_targets=[])]
    assert store.append(written) == 2
    back = [Trajectory.from_row(r) for r in store.trajectories().to_pylist()]
    assert back == written
    assert written[0].id != written[1].id  # the id is a content hash of prompt id + response tokens
    assert Trajectory("p", "text only", 0.0, False).id != Trajectory("p", "other text", 0.0, False).id


def test_filters_and_unknown_filter(root):
    store = ExperienceStore(root)
    store.append([full_trajectory(response_tokens=[i], source=s, passed=i % 2 == 0, policy_version=i, task=t)
                  for i, (s, t) in enumerate([("online", "a"), ("reference", "a"), ("online", "b"), ("human", "b")])])
    assert store.trajectories(source="online").num_rows == 2
    assert store.trajectories(source=["online", "human"], passed=False)["policy_version"].to_pylist() == [3]
    assert store.trajectories(task="b", policy_version=3)["source"].to_pylist() == ["human"]
    assert store.trajectories(tokenizer="other").num_rows == 0
    with pytest.raises(ValueError, match="unknown filter 'colour'"):
        store.trajectories(colour="red")


def test_four_writers_and_a_dedupe_at_once_lose_and_duplicate_nothing(root):
    store = ExperienceStore(root)
    seed = [full_trajectory(response_tokens=[i]) for i in range(50)]
    store.append(seed)
    store.append(seed[:20])  # duplicates for the dedupe to remove while the writers commit
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, root, str(w), "10000", "500"], stdout=subprocess.PIPE)
             for w in range(4)]
    while len(store) <= 50:  # some writers' commits first, so the dedupe's rewrite races the rest
        time.sleep(0.05)
    assert store.dedupe()[1] > 50
    assert all(p.wait(timeout=600) == 0 for p in procs)
    table = store.trajectories(columns=["source", "response_text"], unique=False)
    assert table.num_rows == 40_050 and len(set(table["id"].to_pylist())) == 40_050
    texts = set(table["response_text"].to_pylist())
    assert all(f"w{w} r{i}" in texts for w in range(4) for i in (0, 4_999, 9_999))
    assert store.stats()["sources"]["w2"]["trajectories"] == 10_000


def test_two_dedupes_and_a_compaction_at_once_leave_every_id_once(root):
    """Processes deduplicating and compacting one table at once: the losers of each commit race read
    again and retry; every id stays, once, in commit order."""
    store = ExperienceStore(root)
    rows = [full_trajectory(response_tokens=[i]) for i in range(300)]
    for start in range(0, 300, 50):  # six commits, each repeating part of the one before
        store.append(rows[max(0, start - 20):start + 50])
    work = {"dedupe": "print(ExperienceStore(sys.argv[1]).dedupe())",
            "compact": "print(ExperienceStore(sys.argv[1]).tables['trajectories'].compact())"}
    procs = [subprocess.Popen([sys.executable, "-c", f"import sys\nfrom softrl.data import ExperienceStore\n{work[w]}",
                               root], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for w in ("dedupe", "dedupe", "compact")]
    for p in procs:
        out, errors = p.communicate(timeout=300)
        assert p.returncode == 0, errors[-2000:]
    assert store.trajectories(unique=False)["id"].to_pylist() == [r.id for r in rows]


def test_a_lost_commit_race_is_retried_however_lance_raises_it():
    """Lance raises a lost race as CommitConflictError, except its compaction commit, which raises a plain
    OSError saying "Retryable commit conflict" (a dedupe's delete landed first; seen in the test above):
    both are tried again; any other error, or a conflict Lance says retrying cannot solve, is not."""
    from lance.commit import CommitConflictError

    from softrl.data.lance_table import with_retries

    def failing(*errors):
        left = list(errors)

        def attempt():
            if left:
                raise left.pop(0)
            return "done"
        return attempt, left

    raced = OSError("Retryable commit conflict for version 8: This Rewrite transaction was preempted by "
                    "concurrent transaction Delete at version 8. Please retry.")
    attempt, left = failing(raced, CommitConflictError("lost"))
    assert with_retries(attempt, "s3://b/t.lance") == "done" and not left
    for error in (OSError("No such file or directory"), CommitConflictError("incompatible", retryable=False)):
        attempt, left = failing(error)
        with pytest.raises(StoreError, match=r"^s3://b/t.lance: ") as caught:
            with_retries(attempt, "s3://b/t.lance")
        assert "\n" not in str(caught.value) and not left


def test_writer_killed_mid_write_leaves_a_readable_store(root):
    ExperienceStore(root)
    proc = subprocess.Popen([sys.executable, "-c", WRITER, root, "0", "-1", "3000"], stdout=subprocess.PIPE, text=True)
    committed = 0
    while committed < 9000:  # at least three commits, then kill at a random moment of a write
        committed = int(proc.stdout.readline())
    time.sleep(random.Random(0).uniform(0.0, 0.3))
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    store = ExperienceStore(root)
    table = store.trajectories(columns=["response_text"], unique=False)
    assert table.num_rows >= committed and table.num_rows % 3000 == 0
    assert len(set(table["id"].to_pylist())) == table.num_rows
    assert {f"w0 r{i}" for i in range(committed)} <= set(table["response_text"].to_pylist())
    store.append([full_trajectory()])  # and writable
    assert len(store) == table.num_rows + 1


def test_prompts_annotations_and_dedupe(root):
    store = ExperienceStore(root)
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
    assert store.prompts()["p1"]["q0_k"] == 800 and len(store.prompts()) == 1
    stats = store.stats()
    assert stats["duplicates"] == 1 and stats["sources"]["human"]["pass_rate"] == 0.0
    assert stats["sources"]["online"]["with_mc_targets"] == 1
    assert store.dedupe() == (3, 2) and store.dedupe() == (2, 2)
    assert store.trajectories(unique=False).num_rows == 2
    assert {r["id"]: r for r in store.trajectories().to_pylist()}[a.id]["mc_targets"][0]["k"] == 20


def test_later_copies_spilled_to_disk_are_those_found_in_memory():
    """`LaterCopies` past its memory bound writes its pairs to files by key and sorts each alone: the
    same handles as with everything held, whatever order the batches come in; the files are removed."""
    import numpy as np

    from softrl.data.pool import LaterCopies

    rng = np.random.default_rng(0)
    keys = rng.integers(0, 40, size=(500, 2), dtype=np.uint64)  # many repeats, some sharing one word only
    handles = rng.permutation(10_000).astype(np.uint64)[:500]
    expected = sorted(int(h) for i, h in enumerate(handles)
                      if any((keys[j] == keys[i]).all() and handles[j] < h for j in range(500)))
    for bound in (10**9, 7):
        copies = LaterCopies(spill_rows=bound)
        for start in range(0, 500, 33):
            copies.add(handles[start:start + 33], keys[start:start + 33])
        folder = copies.folder.name if copies.folder else None
        assert copies.handles().tolist() == expected
        assert (folder is None) == (bound > 500) and (folder is None or not os.path.exists(folder))


def test_stats_and_dedupe_stream_and_agree_with_the_rows(root, monkeypatch):
    """stats counts each id's first copy (sources, prompts, means with nulls left out, annotations) from
    the ids and five small columns a batch at a time; with the later copies found on disk the figures
    and dedupe's deletions are the same."""
    import softrl.data.pool as pool

    store = ExperienceStore(root)
    rows = [full_trajectory(prompt_id=f"p{i % 5}", response_tokens=[i], source=("human", "online")[i % 2],
                            reward=float(i % 3 == 0), passed=i % 3 == 0, mc_targets=[],
                            behavior_logprobs=None) for i in range(30)]
    store.append(rows[:20])
    store.append(rows[10:25] + [full_trajectory(prompt_id="p9", response_tokens=[0], source="online", mc_targets=[],
                                                   behavior_logprobs=None)])
    store.annotate({rows[3].id: [{"t": 1, "success": 0.5, "k": 4}]})
    table = store.trajectories().to_pylist()  # first copies
    expected = {}
    for source in ("human", "online"):
        mine = [r for r in table if r["source"] == source]
        expected[source] = {"trajectories": len(mine), "prompts": len({r["prompt_id"] for r in mine}),
                            "pass_rate": sum(r["passed"] for r in mine) / len(mine),
                            "mean_reward": sum(r["reward"] for r in mine) / len(mine),
                            "with_mc_targets": sum(bool(r["mc_targets"]) for r in mine)}
    for bound in (pool.SPILL_ROWS, 3):
        monkeypatch.setattr(pool, "SPILL_ROWS", bound)
        monkeypatch.setattr(pool.LaterCopies.__init__, "__defaults__", (bound,))
        stats = store.stats()
        assert {k: pytest.approx(v) for k, v in expected.items()} == stats["sources"] and stats["trajectories"] == 26
        assert stats["duplicates"] == 10 and stats["prompts"] == 6
    assert store.dedupe() == (36, 26) and store.stats()["duplicates"] == 0
    assert sorted(r["id"] for r in store.trajectories(unique=False).to_pylist()) == sorted(r["id"] for r in table)


@pytest.mark.parametrize("name", ["out.parquet", "out.jsonl.gz"])
def test_an_export_is_whole_or_not_at_all_and_never_among_the_parts(tmp_path, monkeypatch, name):
    import errno
    import json as jsonlib

    from softrl.data import io

    store = ExperienceStore(tmp_path / "store")
    store.append([full_trajectory(), full_trajectory(response_tokens=[3])])
    table = store.trajectories()
    with pytest.raises(ValueError, match="inside the store"):
        io.export(table, tmp_path / "store" / name, tmp_path / "store")
    assert store.trajectories(unique=False).num_rows == 2
    (tmp_path / "folder" / name).mkdir(parents=True)  # a rename onto it named the hidden work file
    with pytest.raises(ValueError, match=f"^cannot export to {tmp_path}/folder/{name}: it is a directory"):
        io.export(table, tmp_path / "folder" / name)
    shutil.rmtree(tmp_path / "folder")
    out = tmp_path / name
    assert io.export(table, out, tmp_path / "store") == 2
    before = out.read_bytes()

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    real = jsonlib.dumps
    monkeypatch.setattr(io.pq, "ParquetWriter", full)
    monkeypatch.setattr(io.json, "dumps", lambda row, **k: full() if row.get("response_tokens") == [3] else
                        real(row, **k))  # the second row finds the disk full
    with pytest.raises(OSError, match="No space left"):
        io.export(table, out, tmp_path / "store")
    assert out.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == [name, "store"]


def test_export_streams_the_pool_and_writes_a_hugging_face_dataset(tmp_path):
    """`softrl data export` takes rows 10,000 at a time from a pool (no whole-store read); the same rows,
    first copies with annotations, reach Parquet, JSONL and a Hugging Face dataset directory."""
    datasets = pytest.importorskip("datasets")
    from softrl.data.io import export

    store = ExperienceStore(tmp_path / "store")
    rows = [full_trajectory(response_tokens=[i], source=("online", "human")[i % 2]) for i in range(25)]
    store.append(rows[:20])
    store.append(rows[10:])  # 10 repeats
    store.annotate({rows[3].id: [{"t": 0, "success": 1.0, "k": 2}]})
    expected = store.trajectories(source="human")
    pool = store.pool(source="human")
    assert export(pool.tables(4), tmp_path / "a.parquet") == expected.num_rows == 12
    assert pq.read_table(tmp_path / "a.parquet").to_pylist() == expected.to_pylist()
    proc = softrl("data", "export", str(tmp_path / "b.hf"), "--source", "human", "--store", str(tmp_path / "store"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    loaded = datasets.load_from_disk(str(tmp_path / "b.hf"))
    assert list(loaded["id"]) == expected["id"].to_pylist()
    assert [r["mc_targets"] for r in loaded] == [r["mc_targets"] for r in expected.to_pylist()]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.parquet", "b.hf", "store"]  # nothing left beside


def test_newest_wins_by_commit_order_not_by_the_clock(root, monkeypatch):
    store = ExperienceStore(root)
    clock = iter(datetime(2030, 1, 1, tzinfo=timezone.utc) - timedelta(hours=h) for h in range(100))
    monkeypatch.setattr("softrl.data.store.now", lambda: next(clock))  # every write earlier than the one before
    for k in (8, 16, 32):
        store.put_prompts([{"prompt_id": "p1", "task": "t", "text": "x", "q0_k": k}])
        store.annotate({"t1": [{"t": 1, "success": 0.5, "k": k}]})
    assert store.prompts()["p1"]["q0_k"] == 32
    store.append([full_trajectory(id="t1", mc_targets=[])])
    assert store.trajectories()["mc_targets"].to_pylist() == [[{"t": 1, "success": 0.5, "k": 32}]]


def test_a_reader_keeps_its_snapshot_whatever_dedupe_and_writers_do(root):
    store = ExperienceStore(root)
    a, b, c = (full_trajectory(response_tokens=[i]) for i in range(3))
    store.append([a, b])
    store.append([a])
    store.put_prompts([{"prompt_id": "p1", "q0_k": 1}])
    snapshot = store.snapshot()
    assert store.dedupe() == (3, 2)
    store.append([c])
    store.put_prompts([{"prompt_id": "p1", "q0_k": 2}])
    assert store.trajectories(snapshot, unique=False).num_rows == 3 and store.prompts(snapshot)["p1"]["q0_k"] == 1
    assert store.trajectories(unique=False)["id"].to_pylist() == [a.id, b.id, c.id]
    # a dedupe's deletion commits over rows appended after the version it read: they stay, in place
    table = store.tables["trajectories"]
    version = table.latest()
    d = full_trajectory(response_tokens=[9])
    store.append([d])
    table.delete(version, table.read(version, handles=True)[HANDLE].to_numpy()[1:])
    assert store.trajectories(unique=False)["id"].to_pylist() == [a.id, d.id]
    assert store.trajectories(snapshot, unique=False).num_rows == 3  # still


def old_format_store(where, parts):
    """A store as softrl wrote it before Lance: a marker and Parquet part files per table."""
    (where / "softrl-store.json").parent.mkdir(parents=True)
    (where / "softrl-store.json").write_text(json.dumps({"kind": "softrl-experience-store", "version": 1}))
    for i, (table, rows, schema) in enumerate(parts):
        (where / table).mkdir(exist_ok=True)
        pq.write_table(pa.Table.from_pylist(rows, schema=schema), where / table / f"part-2026010{i}T000000000000-1-ab.parquet")
    return where


def files_of(where):
    return {str(p.relative_to(where)): hashlib.sha256(p.read_bytes()).hexdigest() for p in where.rglob("*") if p.is_file()}


def test_bad_local_locations_are_one_line_and_write_nothing(tmp_path):
    old = old_format_store(tmp_path / "old", [("trajectories", [full_trajectory().to_row()], TRAJECTORY_SCHEMA)])
    before = files_of(old)
    line = one_line_error(softrl("data", "import", "--solutions", "countdown", "--store", str(old)))
    assert "old format (Parquet parts)" in line and f"softrl data migrate {old} NEW" in line
    assert files_of(old) == before
    (tmp_path / "file").write_text("x")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "data.csv").write_text("a,b")
    for where, message in ((tmp_path / "file", "is a file"), (tmp_path / "other", "holds other files")):
        with pytest.raises(StoreError, match=message):
            ExperienceStore(where)
    with pytest.raises(StoreError, match="is not an experience store"):
        ExperienceStore(tmp_path / "nowhere", create=False)
    for bare in ("s3://", "s3:///prefix"):  # Lance's "Could not parse bucket" of a path the user never typed
        with pytest.raises(StoreError, match=f"^{bare} names no bucket: give s3://BUCKET"):
            ExperienceStore(bare)
    assert not (tmp_path / "nowhere").exists() and files_of(tmp_path / "other") == {"data.csv": files_of(tmp_path / "other")["data.csv"]}
    if os.geteuid() != 0:  # root writes anywhere
        (tmp_path / "ro").mkdir(mode=0o555)
        with pytest.raises(StoreError, match="permission denied"):
            ExperienceStore(tmp_path / "ro" / "store")


def test_a_table_of_a_newer_softrl_is_refused(root):
    store = ExperienceStore(root)
    store.append([full_trajectory()])
    from softrl.data.lance_table import FORMAT

    lance.dataset(f"{root}/trajectories.lance", storage_options=store.tables["trajectories"].options) \
        .update_schema_metadata({"softrl.store_format": str(FORMAT + 1)})
    with pytest.raises(StoreError, match=rf"trajectories.lance: written by a newer softrl \(store format {FORMAT + 1}"):
        ExperienceStore(root)


def test_bad_s3_locations_are_one_line_and_write_nothing(s3_env, tmp_path, monkeypatch):
    records = tmp_path / "r.jsonl"
    records.write_text(json.dumps({"prompt": "1 2 -> 3", "response": "1+2", "reward": 1.0}) + "\n")
    store = f"s3://{s3_env.bucket}/bad-{uuid.uuid4().hex[:8]}"
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    cases = [
        ({"AWS_ENDPOINT_URL": f"http://127.0.0.1:{closed}"}, store, f"the S3 server at http://127.0.0.1:{closed} (AWS_ENDPOINT_URL): refused: nothing listens there"),
        ({"AWS_SECRET_ACCESS_KEY": "wrong"}, store, "the server refused the credentials"),
        ({"AWS_ACCESS_KEY_ID": "AKIANOSUCHKEY"}, store, "the server refused the credentials"),
        ({}, "s3://no-such-bucket/store", "bucket 'no-such-bucket' does not exist"),
        (s3_env.reader, store, "permission denied (a read-only location?)"),
    ]
    for change, where, message in cases:
        env = {**os.environ, **change}
        assert message in one_line_error(softrl("data", "import", str(records), "--store", where, env=env))
    with pytest.raises(StoreError, match="is not an experience store"):  # none of them wrote a thing
        ExperienceStore(store, create=False)
    ExperienceStore(store).append([full_trajectory()])  # a store there now: the reader may read, not write
    reader = {**os.environ, **s3_env.reader}
    assert json.loads(softrl("data", "stats", "--json", "--store", store, env=reader).stdout)["trajectories"] == 1
    assert "permission denied" in one_line_error(softrl("data", "import", str(records), "--store", store, env=reader))
    assert len(ExperienceStore(store)) == 1


def test_data_commands_on_s3_with_the_aws_variables_only(s3_env, tmp_path):
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), **s3_env.env()}
    if "PYTHONPATH" in os.environ:
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    store = f"s3://{s3_env.bucket}/cli-{uuid.uuid4().hex[:8]}/store"
    records = tmp_path / "r.jsonl"
    records.write_text("".join(json.dumps({"prompt": f"p{i}", "response": "r", "reward": i % 2}) + "\n" for i in range(5)))
    assert json.loads(softrl("data", "import", str(records), "--json", "--store", store, env=env).stdout)["imported"] == 5
    assert json.loads(softrl("data", "stats", "--json", "--store", store, env=env).stdout)["trajectories"] == 5
    proc = softrl("data", "export", str(tmp_path / "out.jsonl"), "--passed", "--store", store, env=env)
    assert proc.returncode == 0 and len((tmp_path / "out.jsonl").read_text().splitlines()) == 2


def test_migrate_copies_an_old_store_checks_it_and_keeps_the_old_one(root, tmp_path):
    a, b = full_trajectory(), full_trajectory(response_tokens=[1], source="human")
    old_prompt = {"prompt_id": "p1", "task": "t", "text": "x", "q0_hat": -0.5, "q0_k": 8, "meta": "{}"}
    no_rewards = pa.schema([f for f in PROMPT_SCHEMA if f.name != "q0_rewards"])  # written before the column existed
    note = {"trajectory_id": a.id, "mc_targets": [{"t": 1, "success": 0.5, "k": 4}], "source": "pts"}
    old = old_format_store(tmp_path / "old", [
        ("trajectories", [a.to_row(), b.to_row()], TRAJECTORY_SCHEMA), ("trajectories", [a.to_row()], TRAJECTORY_SCHEMA),
        ("prompts", [old_prompt], no_rewards), ("prompts", [{**old_prompt, "q0_k": 16, "q0_rewards": [1.0]}], PROMPT_SCHEMA),
        ("annotations", [note], ANNOTATION_SCHEMA)])
    (old / "trajectories" / "part-corrupt.parquet").write_bytes(b"PAR1 not parquet")
    before = files_of(old)
    proc = softrl("data", "migrate", str(old), root, "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)["tables"]
    assert {name: t["rows"] for name, t in report.items()} == {"trajectories": 3, "prompts": 1, "annotations": 1}
    assert "part-corrupt.parquet: unreadable" in " ".join(proc.stderr.split())
    store = ExperienceStore(root)
    assert store.trajectories(unique=False).num_rows == 3 and store.prompts()["p1"]["q0_k"] == 16
    assert {r["id"]: r["mc_targets"] for r in store.trajectories().to_pylist()}[a.id] == note["mc_targets"]
    assert files_of(old) == before  # nothing deleted, nothing added
    assert "already holds rows" in one_line_error(softrl("data", "migrate", str(old), root))
    assert "is not an old-format store" in one_line_error(softrl("data", "migrate", str(tmp_path), root))

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


@pytest.mark.parametrize("copy", [False, True, "given up"])
def test_a_stored_pool_draws_what_the_rows_in_memory_would_and_keeps_its_version(root, monkeypatch, copy):
    """The store's pool holds row addresses and narrow columns, not whole rows: every draw, group and row (first copies, the
    newest annotation joined, a prompt and an MC-target filter) is the one an in-memory pool of the
    same read gives, and it keeps drawing its version's rows after appends and a dedupe. Scans of 7
    rows a batch, so keys and annotations are matched across batches. The same with the wide columns
    copied to local disk at the scan, and with a copy given up for want of disk (draws by handle)."""
    from softrl.data import lance_table, packed

    monkeypatch.setattr(lance_table, "BATCH_ROWS", 7)
    if copy == "given up":
        monkeypatch.setattr(packed, "COPY_CHECK_BYTES", 2000)
        monkeypatch.setattr(packed, "COPY_RESERVE_BYTES", 1 << 62)
    store = ExperienceStore(root)

    def pool_of(*args, **filters):
        return store.pool(*args, copy=bool(copy), **filters)

    rows = [full_trajectory(prompt_id=f"p{i % 5}", response_tokens=[i], task="t" if i % 4 else "u", mc_targets=[],
                            passed=i % 3 == 0) for i in range(120)]
    store.append(rows[:80])
    store.append(rows[40:])  # 40 repeated ids: the first committed copies are the pool's
    store.append([full_trajectory(**{**rows[5].to_row(), "mc_targets": [{"t": 1, "success": 0.5, "k": 4}]}),
                  full_trajectory(prompt_id="p9", response_tokens=[500], task="t", mc_targets=None),  # null: none
                  full_trajectory(prompt_id="p9", response_tokens=[501], task="t"),  # targets of its own...
                  Trajectory("p9", "custom id", 1.0, True, task="t", id="not-a-hex-id")])  # ... emptied below
    store.annotate({rows[1].id: [{"t": 1, "success": 0.5, "k": 4}], rows[2].id: [{"t": 0, "success": 1.0, "k": 2}],
                    "not-a-hex-id": []})
    store.annotate({rows[2].id: [], full_trajectory(prompt_id="p9", response_tokens=[501], task="t").id: []})
    pool, memory = pool_of(task="t", prompt_ids=["p1", "p2", "p3"]), \
        TrajectoryPool(store.trajectories(task="t", prompt_id=["p1", "p2", "p3"]))
    assert (pool.local is not None) == bool(copy)
    assert bool(pool.local and pool.local.given_up) == (copy == "given up")
    assert len(pool) == len(memory) == sum(1 for i in range(120) if i % 4 and i % 5 in (1, 2, 3))
    assert pool.fetch(list(range(len(pool)))) == memory.rows
    a, b = random.Random(7), random.Random(7)
    assert pool.draw(50, a) == memory.draw(50, b) and pool.prompts_with(20) == memory.prompts_with(20)
    assert pool.of_prompt("p2", 4, a) == memory.of_prompt("p2", 4, b)
    assert GroupSampler(pool, 3, seed=1).sample(5) == GroupSampler(memory, 3, seed=1).sample(5)
    # rows[5]'s later copy has targets of its own, but its first copy (none) decides; an emptied
    # annotation outweighs a row's own targets; a null list is none
    annotated = pool_of(task="t", annotated=True)
    assert [r["id"] for r in annotated.fetch(list(range(len(annotated))))] == [rows[1].id]
    expected = [r["id"] for r in store.trajectories(task="t").to_pylist() if r["mc_targets"]]
    assert expected == [rows[1].id]
    snapshot, before = store.snapshot(), pool.fetch(list(range(len(pool))))
    store.append([full_trajectory(prompt_id="p1", response_tokens=[999], task="t")])
    store.dedupe()
    assert pool.fetch(list(range(len(pool)))) == before and len(pool_of(snapshot, task="t")) == 93
    assert len(pool_of(task="t")) == 94
    assert (store.pool(task="t").local is not None) == root.startswith("s3://")  # by default: on object stores
    with_targets = sum(bool(r["mc_targets"]) for r in store.trajectories(source="online").to_pylist())
    assert store.stats()["sources"]["online"]["with_mc_targets"] == with_targets == 2  # rows[1], the last append


@pytest.mark.parametrize("copy", [False, True])
def test_a_pool_reads_only_the_columns_a_draw_needs(tmp_path, copy):
    """`Reads`: a draw takes the columns named always, and the later ones only for the rows that want
    them (a run's: texts only where its tokenizer did not make the row's ids); the rest come back null
    and everything else is what the whole row has. Its tables stream the columns it reads, of every row."""
    from softrl.data import Reads
    from softrl.training.batch import tokens_usable

    store = ExperienceStore(tmp_path / "store")
    rows = [full_trajectory(prompt_id=f"p{i % 3}", response_tokens=[i, 1], tokenizer="ours" if i % 4 else "theirs")
            for i in range(40)]
    rows.append(full_trajectory(prompt_id="p0", response_tokens=[], tokenizer="ours"))  # no ids: its texts, then
    rows.append(full_trajectory(prompt_id="p1", response_tokens=[77], tokenizer="ours", action_mask=None,  # an episode
                                turns=[{"role": "assistant", "content": "x"}]))  # without its mask: texts too
    store.append(rows)
    texts = ("prompt_text", "response_text")
    reads = Reads(tuple(n for n in TRAJECTORY_SCHEMA.names if n not in texts + ("mc_targets",)), texts,
                  lambda row: not tokens_usable(row, "ours"))
    whole, lean = store.pool(copy=copy), store.pool(copy=copy, reads=reads)
    everything = whole.fetch(list(range(len(whole))))
    drawn = lean.fetch(list(range(len(lean))))
    assert len(drawn) == len(rows) == len(everything)
    wanted = [not tokens_usable(row, "ours") for row in everything]
    assert sum(wanted) == 10 + 2
    for row, full, wants in zip(drawn, everything, wanted):
        assert row["mc_targets"] is None and full["mc_targets"]
        assert row == {**full, "mc_targets": None, **({} if wants else {"prompt_text": None, "response_text": None})}
    assert lean.draw(5, random.Random(3)) == [{**r, "mc_targets": None} | (
        {} if not tokens_usable(r, "ours") else {"prompt_text": None, "response_text": None})
        for r in whole.draw(5, random.Random(3))]
    assert [t for table in whole.tables() for t in table.to_pylist()] == everything
    # a lean pool's tables hold the columns it reads, whole: the texts of every row, no MC targets
    assert [t for table in lean.tables() for t in table.to_pylist()] == [{**r, "mc_targets": None} for r in everything]


def test_packed_rows_give_back_every_column_kind_as_written():
    """A pool's local copy, packed row by row: strings (empty and non-ASCII), lists of ints, floats and
    booleans (empty, null, holding a null, with bytes that read as JSON), lists of structs; from sliced
    batches; rows taken in any order with repeats are the rows written, and each costs one read."""
    from unittest import mock

    from softrl.data import packed

    names = ("id", "prompt_text", "prompt_tokens", "behavior_logprobs", "mc_targets", "turns", "action_mask")
    fields = [TRAJECTORY_SCHEMA.field(n) for n in names]
    turn = {"role": "assistant", "content": "x", "tool_calls": None, "tool_call_id": None, "name": None, "reward": 0.5}
    rows = [{"id": f"{i:032x}", "prompt_text": [None, "", "é" * i][i % 3],
             "prompt_tokens": [None, [], [91, 0, i], [1, None]][i % 4],  # 91 is "[": its bytes are not JSON
             "behavior_logprobs": None if i % 2 else [-0.5, -1.25, float(-i)],
             "mc_targets": [None, [], [{"t": i, "success": 0.25, "k": 4}]][i % 3],
             "turns": None if i % 5 else [turn, {**turn, "role": "user", "reward": None}],
             "action_mask": [None, [True, False], [], [None, True]][i % 4]} for i in range(40)]
    table = pa.Table.from_pylist(rows, schema=pa.schema(fields))
    copy = packed.PackedRows(fields)
    copy.write(iter(table.slice(3).to_batches(max_chunksize=6)))
    assert copy.bytes == copy.path.stat().st_size
    taken = [0, 36, 5, 5, 17]
    with mock.patch.object(packed.os, "pread", wraps=packed.os.pread) as reads:
        got = copy.take(np.array(taken), list(names))
    assert reads.call_count == len(set(taken))
    expected = table.slice(3).take(taken)
    assert {n: got[n].to_pylist() for n in names} == {n: expected[n].to_pylist() for n in names}
    # a disk that fills, or a value too long for its header, gives the copy up (the pool reads the store)
    for error, says in ((OSError(errno.ENOSPC, "full"), "is full"), (ValueError("too long to pack"), "too long")):
        with mock.patch.object(packed, "pack", side_effect=error):
            full = packed.PackedRows(fields)
            full.write(iter(table.to_batches()))
        assert says in full.given_up and full.bytes == 0 and not full.path.parent.exists()
    with mock.patch.object(packed, "pack", side_effect=OSError(errno.EIO, "broken")), pytest.raises(OSError):
        packed.PackedRows(fields).write(iter(table.to_batches()))


def test_a_keyed_table_keeps_an_index_on_its_key_and_lookups_stay_exact(root, monkeypatch):
    """Past INDEX_ROWS prompts the prompts table has a BTREE index on prompt_id, brought up to date when
    more than a tenth of its rows are not in it; lookups by id give what a scan gives, rows updated or
    added since the index was made included."""
    import lance

    from softrl.data import lance_table

    monkeypatch.setattr(lance_table, "INDEX_ROWS", 20)
    store = ExperienceStore(root)
    table = store.tables["prompts"]

    def index():
        dataset = lance.dataset(table.uri, storage_options=table.options)
        named = [i.name for i in dataset.describe_indices() if list(i.field_names) == ["prompt_id"]]
        return dataset.stats.index_stats(named[0]) if named else None

    def q0s(ids):
        return {k: v["q0_hat"] for k, v in store.prompts(ids=ids).items()}

    store.put_prompts([{"prompt_id": f"p{i}", "task": "t", "q0_hat": -i / 10} for i in range(10)])
    assert index() is None  # 10 rows: none yet
    store.put_prompts([{"prompt_id": f"p{i}", "task": "t", "q0_hat": -i / 10} for i in range(10, 30)])
    assert index()["num_indexed_rows"] == 30 and index()["num_unindexed_rows"] == 0
    store.put_prompts([{"prompt_id": "p3", "task": "t", "q0_hat": 0.75}, {"prompt_id": "p30", "task": "t", "q0_hat": -3.0}])
    stale = index()
    assert stale["num_unindexed_rows"] == 2  # a fifteenth: left until more are
    assert q0s(["p3", "p30", "p4", "p99"]) == {"p3": 0.75, "p30": -3.0, "p4": -0.4}  # the update and the new row found
    store.put_prompts([{"prompt_id": f"p{i}", "task": "t", "q0_hat": 1.0} for i in range(31, 35)])
    assert index()["num_unindexed_rows"] == 0 and index()["num_indexed_rows"] == 35  # brought up to date
    assert q0s(["p3", "p33", "p0"]) == {"p3": 0.75, "p33": 1.0, "p0": -0.0}
    assert len(store.prompts()) == 35


def test_held_columns_give_back_what_was_scanned():
    """A pool's narrow columns held as codes and arrays: the rows kept (in any order given, a null string
    its own value, codes across batches of different values) come back equal, with their own types."""
    from softrl.data.pool import HeldColumns

    schema = pa.schema([("finish", pa.string()), ("reward", pa.float64()), ("decoding", pa.struct([("t", pa.float32())]))])
    batches = [pa.record_batch([pa.array(["stop", None, "length"]), pa.array([1.0, None, 0.5]),
                                pa.array([{"t": 1.0}, None, {"t": 0.5}], schema.field("decoding").type)], schema=schema),
               pa.record_batch([pa.array([None, "tool"]), pa.array([0.0, 2.0]),
                                pa.array([{"t": 0.7}, {"t": 0.7}], schema.field("decoding").type)], schema=schema)]
    whole = pa.Table.from_batches(batches)
    for kept in (np.arange(5), np.array([4, 1, 3])):
        held = HeldColumns(list(schema))
        for batch in batches:
            held.add(batch)
        held.keep(kept)
        assert held.columns["finish"].dtype == np.uint8 and held.names("finish") == ["stop", None, "length", "tool"]
        positions = np.array([0, len(kept) - 1])
        got = pa.table(held.take(positions), schema=schema)
        assert got.equals(whole.take(pa.array(kept[positions]))), got.to_pylist()


def test_repeated_ids_are_found_by_their_whole_key():
    """Ids sorted by their first 64 bits; two that share them are still two (and ids of any form work)."""
    from softrl.data.pool import KeySet, first_copies, id_keys

    a, b = "0" * 16 + "1" * 16, "0" * 16 + "2" * 16
    ids = pa.array([a, b, a, "not-hex", b, "not-hex", "f" * 32])
    keys = id_keys(ids)
    assert (id_keys(pa.array([a]))[0] == keys[0]).all()  # an id's key does not depend on the other ids
    assert first_copies(keys).tolist() == [0, 1, 3, 6]
    assert KeySet(id_keys(pa.array([b, "not-hex"]))).members(keys).tolist() == [False, True, False, True, True, True, False]
    many = [f"{random.Random(i).getrandbits(128):032x}" for i in range(300)]
    drawn = random.Random(0).choices(many, k=2000)
    expected = sorted({x: i for i, x in reversed(list(enumerate(drawn)))}.values())
    assert first_copies(id_keys(pa.array(drawn))).tolist() == expected


def test_first_copies_by_handle_in_scan_order_or_any_other():
    """Each id's copy of the lowest row handle, in handle order, whether the rows come in handle order (a
    pool's scan: no reordering) or shuffled; runs of three or more ids that share their first word too."""
    from softrl.data.pool import first_by_handle, id_keys

    shared_first_words = [f"{random.Random(i % 40).getrandbits(64):016x}{i % 3:016x}" for i in range(120)]
    sequential = [f"{i:032x}" for i in range(300)]  # first halves all 0
    for many in (shared_first_words, sequential):
        drawn = random.Random(1).choices(many, k=1500)
        keys, handles = id_keys(pa.array(drawn)), np.arange(1500, dtype=np.uint64) * 7 + 3
        expected = sorted({x: i for i, x in reversed(list(enumerate(drawn)))}.values())
        assert first_by_handle(handles, keys).tolist() == expected
        shuffled = np.random.default_rng(0).permutation(1500)
        got = first_by_handle(handles[shuffled], keys[shuffled])
        assert shuffled[got].tolist() == expected


def test_stats_on_ray_data_are_the_local_scan_s(root):
    """`softrl data stats --ray` (Ray Data: reads by fragment, first copies by a distributed group-by)
    gives the figures of the one-process scan: repeats, annotations (the newest wins), Q0 counted; on a
    directory and on an S3 server (Ray's readers get the store's S3 options)."""
    pytest.importorskip("ray")
    store = ExperienceStore(root)
    rows = [full_trajectory(prompt_id=f"p{i % 7}", response_tokens=[i], source=("online", "human", "pts")[i % 3],
                            reward=(i % 4) / 4, passed=i % 4 == 3, **({"mc_targets": []} if i % 5 else {}))
            for i in range(60)]
    store.append(rows[:40])
    store.append([full_trajectory(**{**rows[i].to_row(), "source": "human"}) for i in range(30, 60)])  # 10 repeats
    store.annotate({rows[1].id: [{"t": 1, "success": 0.5, "k": 4}], rows[5].id: []})
    store.put_prompts([{"prompt_id": "p1", "q0_hat": 0.2}, {"prompt_id": "p2"}])
    proc = softrl("data", "stats", "--ray", "--json", "--store", str(root))
    assert proc.returncode == 0, proc.stderr[-2000:]
    on_ray = json.loads(proc.stdout)
    assert on_ray == json.loads(json.dumps(store.stats())) and on_ray["duplicates"] == 10
    assert on_ray["sources"]["human"]["trajectories"] == 13 + 20 and on_ray["prompts_with_q0"] == 1


def reference_samples(where) -> tuple[ExperienceStore, dict[str, list[float]]]:
    """A store of reference rows of 3 prompts, one repeated later with another reward, and an online row;
    with each prompt's first-copy rewards in commit order."""
    store = ExperienceStore(where)
    rows = [full_trajectory(prompt_id=f"p{i % 3}", prompt_text=f"prompt {i % 3}", response_tokens=[i],
                            source="reference", reward=float(i % 4 == 0), passed=i % 4 == 0) for i in range(12)]
    store.append(rows[:8])
    store.append([full_trajectory(**{**rows[0].to_row(), "reward": 0.0, "passed": False}), *rows[8:],  # a copy
                  full_trajectory(prompt_id="p0", response_tokens=[99], source="online", reward=1.0)])
    return store, {f"p{k}": [float(i % 4 == 0) for i in range(12) if i % 3 == k] for k in range(3)}


def test_rewards_by_prompt_are_first_copies_in_commit_order(root):
    store, expected = reference_samples(root)
    local = store.rewards_by_prompt("reference")
    assert local["prompt_id"].to_pylist() == ["p0", "p1", "p2"] and local["text"].to_pylist() == [
        "prompt 0", "prompt 1", "prompt 2"] and set(local["task"].to_pylist()) == {"countdown"}
    assert dict(zip(local["prompt_id"].to_pylist(), local["rewards"].to_pylist())) == expected
    assert local["passed"].to_pylist() == [[r == 1.0 for r in expected[p]] for p in ("p0", "p1", "p2")]
    assert store.rewards_by_prompt("human").num_rows == 0


def q0_from_store(where, extra: list[str], expected: dict[str, list[float]]) -> None:
    """`softrl q0 --from-store` (with `extra` options) at `where` writes each prompt's Q0 of `expected`."""
    from softrl.annotate.q0 import soft_value

    proc = softrl("q0", "--from-store", "--store", str(where), "--model", "my-sampler", "--beta", "0.5", "--json",
                  *extra)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout)["prompts"] == 3 and json.loads(proc.stdout)["samples"] == 12
    stored = ExperienceStore(where).prompts()
    assert {p: r["q0_rewards"] for p, r in stored.items()} == expected
    assert all(r["q0_hat"] == pytest.approx(soft_value(expected[p], 0.5)) and r["q0_model"] == "my-sampler"
               and r["q0_k"] == 4 and r["text"] == f"prompt {p[1]}" and r["task"] == "countdown"
               for p, r in stored.items())


def test_q0_from_stored_samples_locally_and_on_ray_data(tmp_path):
    """`softrl q0 --from-store`: each prompt's Q0 from the reference rows already in the store (first copies
    only: a later copy's other reward does not count; other sources are left out), the same by the
    one-process scan and on Ray Data, written to the prompts table with its rewards; another model's Q0
    is replaced only when asked. `softrl data q0` is its older spelling, the same command."""
    _, expected = reference_samples(tmp_path / "store")
    ray_store = tmp_path / "ray-store"
    shutil.copytree(tmp_path / "store", ray_store)
    for where, extra in ((tmp_path / "store", []), *([(ray_store, ["--ray"])] if has_ray() else [])):
        q0_from_store(where, extra, expected)
    proc = softrl("q0", "--from-store", "--store", str(tmp_path / "store"), "--model", "another-sampler")
    assert proc.returncode != 0 and proc.stderr.strip().endswith(
        "3 prompts have Q0 from another model already (prompt p0: 'my-sampler', not 'another-sampler'): --force "
        "replaces it")
    assert ExperienceStore(tmp_path / "store").prompts()["p0"]["q0_model"] == "my-sampler"  # nothing written
    proc = softrl("data", "q0", "--store", str(tmp_path / "store"), "--model", "another-sampler", "--force")
    assert proc.returncode == 0 and ExperienceStore(tmp_path / "store").prompts()["p0"]["q0_model"] == "another-sampler"
    proc = softrl("data", "q0", "--store", str(tmp_path / "store"), "--source", "human")
    assert proc.returncode != 0 and proc.stderr.strip().endswith("no trajectories of source 'human'")


def test_q0_from_stored_samples_on_ray_data_on_an_s3_server(s3_env):
    """Ray Data's readers of an s3:// store get its S3 options (endpoint, credentials): `q0 --from-store
    --ray` on SeaweedFS writes what the one-process scan writes."""
    pytest.importorskip("ray")
    where = f"s3://{s3_env.bucket}/{uuid.uuid4().hex[:12]}"
    _, expected = reference_samples(where)
    q0_from_store(where, ["--ray"], expected)


def has_ray() -> bool:
    try:
        import ray  # noqa: F401
    except ImportError:
        return False
    return True


def test_batched_appender_commits_every_nth_call_and_on_flush(root):
    """A run's rows, and the rows its workers staged elsewhere, reach readers in one commit per
    `every` calls (and on flush), never before; nothing is lost or written twice."""
    from softrl.data.batched import BatchedAppender, StagedWriter

    store = ExperienceStore(root)
    table, rows = store.tables["trajectories"], [full_trajectory(response_tokens=[i]) for i in range(8)]
    batched, worker, start = BatchedAppender(store, every=3), StagedWriter(ExperienceStore(root)), table.latest()
    assert [batched.append([rows[i]]) for i in range(2)] == [0, 0]
    assert worker.append([rows[2], rows[3]]) == 2 and worker.append([rows[4]]) == 1
    assert len(store) == 0 and table.latest() == start  # written by the worker, seen by nobody yet
    assert batched.add_staged(worker.take()) == 2 and worker.take() == [] and table.latest() == start + 1
    assert store.trajectories()["id"].to_pylist() == [rows[i].id for i in (2, 3, 4, 0, 1)]
    assert [batched.append([rows[i]]) for i in (5, 6, 7)] == [0, 0, 3] and table.latest() == start + 2
    assert batched.flush() == 0 and table.latest() == start + 2 and batched.commits == 2
    batched.append([rows[0]])  # a repeat is stored again (reads keep the first copy)
    assert batched.flush() == 1 and batched.commits == 3 and len(store) == 8
    assert store.trajectories(unique=False).num_rows == 9  # each row written once, the repeat once more
    with pytest.raises(ValueError, match="every must be >= 1"):
        BatchedAppender(store, every=0)


def test_a_commit_whose_answer_was_lost_is_not_made_twice(root, monkeypatch):
    """An object store can land a commit and still answer with a conflict (a repeated conditional put):
    the retry finds the staged rows already committed and does not append them again."""
    from lance.commit import CommitConflictError

    from softrl.data import lance_table

    store = ExperienceStore(root)
    staged = store.stage([full_trajectory(response_tokens=[i]) for i in range(3)])
    real, calls = lance_table.lance.LanceDataset.commit, []

    def landed_but_lost(*args, **kwargs):
        calls.append(1)
        out = real(*args, **kwargs)
        if len(calls) == 1:
            raise CommitConflictError("the answer was lost")
        return out

    monkeypatch.setattr(lance_table.lance.LanceDataset, "commit", landed_but_lost)
    store.commit_staged(staged)
    assert len(calls) == 1 and store.trajectories(unique=False).num_rows == 3


def test_bench_store_quick_measures_every_figure_on_every_backend(tmp_path):
    """`softrl bench store --quick`: each size's figures locally (cold too, as root: the page cache
    dropped) and on both loopback S3 servers (SeaweedFS and moto; there a pool's local copy and a draw
    without it), the writers' rows all arrived once,
    the report, its JSON and its plot written."""
    proc = softrl("bench", "store", "--quick", "--writers", "2", "--runs", str(tmp_path / "runs"),
                  "--report", str(tmp_path / "report"), "--clean")
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads((tmp_path / "report" / "store.json").read_text())
    servers = ("seaweedfs", "moto")
    assert [p["rows"] for p in result["local"]] == [2000, 20000]
    assert all([p["rows"] for p in result[server]] == [2000] for server in servers)
    for point in result["local"] + [p for server in servers for p in result[server]]:
        assert point["pool_rows"] == sum((i // 16) % 4 == 0 for i in range(point["rows"]))  # task0: a quarter of prompts
        assert point["stats_rows"] == point["rows"]
        assert point["dedupe_removed"] == 0 and point["sample_ms"] > 0 and point["q0_ms"] > 0
    for point in [p for server in servers for p in result[server]]:  # an object store's pool copied, and without
        assert point["pool_copy_mib"] > 0 and point["sample_by_request_ms"] > 0
    for point in result["local"]:  # every column, beside the run's draw; and from a copy, made only when asked
        assert point["sample_whole_ms"] > 0 and point["pool_copy_mib"] > 0 and point["sample_copy_ms"] > 0
        assert point["pool_copy_build_s"] > 0
    assert result["cold"] == (os.geteuid() == 0)
    if result["cold"]:
        for point in result["local"]:
            assert point["sample_cold_ms"] > 0 and point["q0_cold_ms"] > 0 and point["stats_cold_s"] > 0
            assert point["sample_cold_read_calls"] > 0 and point["pool_build_cold_s"] > 0
    for backend in ("local", *servers):
        assert result[f"writers_{backend}"]["writers_arrived"] == result[f"writers_{backend}"]["writer_rows"] == 1000
    report = (tmp_path / "report" / "store.md").read_text()
    assert "## Targets (issue 53)" in report and "## S3: SeaweedFS on loopback" in report
    assert "| sample_ms, SeaweedFS, 2,000 rows |" in report
    assert "| sample_ms from the pool's local copy, local, 20,000 rows |" in report
    assert (tmp_path / "report" / "store.png").stat().st_size > 10_000 and not (tmp_path / "runs").exists()