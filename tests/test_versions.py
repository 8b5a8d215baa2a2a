"""Versions of the experience store, on a local directory and on S3 (SeaweedFS): a Snapshot pinned to a
trajectories version or a tag reads exactly the rows of then, unknown versions and tags are one line
naming those that exist, and `softrl data compact` keeps rows, commit order and sampling unchanged
while tagged versions stay readable after cleanup."""

import pytest

from softrl.data import ExperienceStore, GroupSampler, StoreError, Trajectory, TrajectoryPool
from softrl.data.versions import compact, hold, hold_name, holds, pinned, release, spans, tag


def rows(start, count, source="online"):
    return [Trajectory(f"p{i % 5}", f"r{i}", reward=float(i % 2), passed=i % 2 == 1, source=source,
                       response_tokens=[i, i % 7]) for i in range(start, start + count)]


def draw(table, seed=3):
    return [r["id"] for r in GroupSampler(TrajectoryPool(table), 2, seed=seed).sample(8)]


def test_spans():
    assert spans([1, 2, 3, 7, 9, 10]) == "1-3, 7, 9-10" and spans([]) == ""


class VersionsOnly:
    """A table as `pinned` reads it: its versions' commit times, no tags."""

    def __init__(self, versions):
        self._versions = versions

    def versions(self):
        return dict(self._versions)

    def tags(self):
        return {}


def test_a_pinned_number_never_reads_a_newer_version_of_another_table():
    """A version number pins the other tables by commit time. Where compaction removed every version of
    a table as old as that, the pin is refused (it silently read a newer one: a later Q0, say); a
    table created after it (only versions from 1 on, all newer) is read at its first, empty version."""
    from types import SimpleNamespace

    store = SimpleNamespace(root="s", tables={"trajectories": VersionsOnly({3: 10, 4: 20}),
                                              "prompts": VersionsOnly({5: 30, 6: 40}),
                                              "annotations": VersionsOnly({1: 25, 2: 35})})
    with pytest.raises(StoreError, match="the prompts table has no version as old as version 3 of trajectories"):
        pinned(store, 3)
    store.tables["prompts"] = VersionsOnly({5: 15, 6: 40})
    assert pinned(store, 3).versions == {"trajectories": 3, "prompts": 5, "annotations": 1}


def test_pinned_version_and_tag_read_the_rows_of_then(root):
    store = ExperienceStore(root)
    store.append(rows(0, 10))
    store.put_prompts([{"prompt_id": "p0", "q0_hat": 0.25}])
    then = store.snapshot()
    tag(store, "first")
    store.append(rows(10, 10))
    store.put_prompts([{"prompt_id": "p0", "q0_hat": 0.75}])
    before = store.trajectories(then)
    for at in (then.versions["trajectories"], "first"):
        snapshot = pinned(store, at)
        assert snapshot.versions == then.versions
        assert store.trajectories(snapshot).equals(before)
        assert store.prompts(snapshot)["p0"]["q0_hat"] == 0.25
    assert pinned(store, None) == store.snapshot() and len(store.trajectories(pinned(store, None))) == 20
    with pytest.raises(StoreError, match=r"has no version 99 \(versions: 1-\d+; tags: first\)$"):
        pinned(store, 99)
    with pytest.raises(StoreError, match=r"has no tag 'nope' \(versions: 1-\d+; tags: first\)$"):
        pinned(store, "nope")
    with pytest.raises(StoreError, match="tag 'first' exists already"):
        tag(store, "first")


def test_compact_keeps_rows_order_and_sampling_and_tagged_versions(root):
    store = ExperienceStore(root)
    for start in range(0, 60, 6):  # many small fragments, with duplicates of earlier ids in between
        store.append(rows(start, 6))
        store.append(rows(start // 2, 2, source="again"))
    store.annotate({"r3": [{"t": 1, "success": 0.5, "k": 4}]})
    store.annotate({"r3": [{"t": 1, "success": 0.75, "k": 4}]})
    tagged = tag(store, "kept")
    store.append(rows(100, 3))
    before, raw = store.trajectories(), store.trajectories(unique=False)
    old_version = tagged.versions["trajectories"] - 1  # untagged: removed by the cleanup
    report = compact(store, keep=1)
    assert report["trajectories"]["rewritten"] == 1 and report["trajectories"]["versions_removed"] > 0
    store = ExperienceStore(root)
    assert store.tables["trajectories"].parts(store.snapshot().versions["trajectories"]) == 1
    assert store.trajectories().equals(before) and store.trajectories(unique=False).equals(raw)
    assert draw(store.trajectories()) == draw(before)
    assert store.trajectories(pinned(store, "kept")).num_rows == 60 and pinned(store, "kept") == tagged
    with pytest.raises(StoreError, match=f"has no version {old_version} "):
        pinned(store, old_version)
    assert compact(store, keep=1)["trajectories"] == {"rewritten": 0, "versions_removed": 0}
    store.append(rows(200, 2))  # appends after a compaction come after its rows
    assert store.trajectories()["id"].to_pylist()[-2:] == [r.id for r in rows(200, 2)]
    with pytest.raises(StoreError, match="keep-versions must be at least 1, got 0"):
        compact(store, keep=0)


def test_a_runs_hold_moves_to_the_snapshot_of_its_new_start(root, tmp_path):
    """A run that failed before its first checkpoint starts over on the newest snapshot: its hold (same
    name) moves there, so compaction keeps what it reads now, not what it read before; a run directory
    whose name Lance would refuse as a tag (two dots) still gets one."""
    store = ExperienceStore(root)
    store.append(rows(0, 4))
    name = hold_name(tmp_path / "run..v2")
    first = store.snapshot()
    hold(store, first, name)
    store.append(rows(4, 4))
    store.put_prompts([{"prompt_id": "p0", "q0_hat": 0.5}])
    again = store.snapshot()
    hold(store, again, name)
    assert holds(store) == {name: again.versions["trajectories"]}
    assert {t: table.tags()[name] for t, table in store.tables.items()} == again.versions
    compact(store, keep=1)
    assert store.trajectories(again).num_rows == 8
    with pytest.raises(StoreError, match=f"has no version {first.versions['trajectories']} "):
        pinned(store, first.versions["trajectories"])
    release(store, name)
    assert holds(store) == {}


def test_cli_tag_and_compact(tmp_path):
    import json
    import subprocess
    import sys

    root = str(tmp_path / "store")
    store = ExperienceStore(root)
    store.append(rows(0, 4))
    store.append(rows(4, 4))

    def softrl(*args):
        return subprocess.run([sys.executable, "-m", "softrl", "data", *args, "--store", root], capture_output=True,
                              text=True, timeout=300)

    done = softrl("tag", "v1", "--version", "2", "--json")
    assert done.returncode == 0 and json.loads(done.stdout)["versions"]["trajectories"] == 2
    refused = softrl("tag", "v2", "--version", "9")
    assert refused.returncode != 0 and refused.stderr.strip().splitlines()[-1].endswith("(versions: 1-3; tags: v1)")
    name = hold_name(tmp_path / "run")  # a run that reads the store and has not finished
    hold(store, pinned(store, 1), name)
    done = softrl("compact", "--keep-versions", "1", "--json")
    assert done.returncode == 0 and json.loads(done.stdout)["tables"]["trajectories"]["rewritten"] == 1
    assert json.loads(done.stdout)["held_by_runs"] == {name: 1}
    assert ExperienceStore(root).trajectories(pinned(ExperienceStore(root), "v1")).num_rows == 4
    assert ExperienceStore(root).trajectories(pinned(ExperienceStore(root), 1)).num_rows == 0  # held: readable
    done = softrl("tag", name, "--delete", "--json")  # the run will not be resumed: its hold goes
    assert done.returncode == 0 and json.loads(done.stdout)["versions"]["trajectories"] == 1
    refused = softrl("tag", name, "--delete")
    assert refused.returncode != 0 and refused.stderr.strip().splitlines()[-1].endswith("(tags: v1)")
    assert softrl("compact").returncode == 0
    with pytest.raises(StoreError, match="has no version 1 "):
        pinned(ExperienceStore(root), 1)
