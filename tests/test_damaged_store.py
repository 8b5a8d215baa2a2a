"""A damaged table is read-only (docs/DATA.md, "A damaged table"): with a data file of its newest version
missing or cut short, or its newest manifest unreadable, every `softrl data` command says so in one line
naming the table (and the file), with no third party's source path; every write is refused and leaves
the store's files as they were; a run refuses the store before it starts; `softrl data restore` brings
back an intact version, after which reads and writes work, and refuses a version that is damaged too."""

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from softrl.cli import app
from softrl.data import ExperienceStore
from softrl.data.io import task_solutions
from softrl.tasks.registry import load_task


def files(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_size for p in sorted(root.rglob("*")) if p.is_file()}


def newest_data_file(store: Path) -> Path:
    """The data file the table's newest commit added (the one version 2 does not have)."""
    import lance

    dataset = lance.dataset(str(store / "trajectories.lance"))
    older = {f.path for fr in dataset.checkout_version(2).get_fragments() for f in fr.data_files()}
    newer = [f.path for fr in dataset.get_fragments() for f in fr.data_files() if f.path not in older]
    return store / "trajectories.lance" / "data" / newer[0]


def damage(store: Path, kind: str) -> str:
    """Damage `store`'s trajectories table; returns what the one line must say."""
    if kind == "manifest":
        manifest = min((store / "trajectories.lance" / "_versions").glob("*.manifest"), key=lambda p: int(p.stem))
        manifest.write_bytes(b"not a manifest")
        return "damaged, its newest manifest cannot be read: move that file"
    victim = newest_data_file(store)
    if kind == "missing":
        victim.unlink()
        return f"damaged, data file data/{victim.name} is missing"
    os.truncate(victim, 100)
    return "is cut short"  # a read meets it before knowing which file; a write's check names it


@pytest.fixture
def store(tmp_path):
    """Two commits of countdown's solutions (trajectories versions 2 and 3)."""
    root = tmp_path / "store"
    s = ExperienceStore(root)
    s.append(task_solutions(load_task("countdown", size=6), "human"))
    s.append(task_solutions(load_task("countdown", size=8, seed=3), "human"))
    return root


def run(*args):
    result = CliRunner().invoke(app, [str(a) for a in args])
    return result.exit_code, result.output


def one_line(code_output, *expected):
    code, output = code_output
    assert code == 2 and output.count("\n") == 1 and output.startswith("error: "), output
    assert ".rs:" not in output and "/home/runner" not in output and "External error" not in output, output
    for text in expected:
        assert text in output, output
    return output


@pytest.mark.parametrize("kind", ["missing", "cut", "manifest"])
def test_every_data_command_names_the_damage_and_writes_nothing(store, tmp_path, kind):
    said = damage(store, kind)
    records = tmp_path / "r.jsonl"
    records.write_text(json.dumps({"prompt": "1 2 -> 3", "response": "1+2", "reward": 1.0}) + "\n")
    before = files(store)
    table = f"{store}/trajectories.lance: "
    reads = [("stats",), ("export", tmp_path / "out.jsonl"), ("q0", "--source", "human")]
    writes = [("import", records), ("dedupe",), ("compact",)]
    for command in reads + writes:
        output = one_line(run("data", *command, "--store", store), table + "damaged, ", said)
        if command in writes and kind != "manifest":
            assert "softrl data restore" in output
    assert files(store) == before and not (tmp_path / "out.jsonl").exists()


@pytest.mark.parametrize("kind", ["missing", "cut"])
def test_restore_brings_back_an_intact_version(store, tmp_path, kind):
    said = damage(store, kind)
    records = tmp_path / "r.jsonl"
    records.write_text(json.dumps({"prompt": "1 2 -> 3", "response": "1+2", "reward": 1.0}) + "\n")
    # the newest version is the damaged one: refused, naming its file
    one_line(run("data", "restore", "3", "--store", store), "trajectories version 3 is damaged too",
             said.removeprefix("damaged, "))
    code, output = run("data", "restore", "2", "--store", store)
    assert code == 0 and "trajectories now version 4" in output, output
    assert len(ExperienceStore(store)) == 6  # version 2's rows: the first commit
    assert run("data", "import", records, "--store", store)[0] == 0 and len(ExperienceStore(store)) == 7
    code, output = run("data", "stats", "--json", "--store", store)
    assert code == 0 and json.loads(output)["trajectories"] == 7


def test_a_run_refuses_a_damaged_store_before_it_starts(store, tmp_path, tiny):
    from softrl.config import load_config
    from softrl.runtime.local import train
    from softrl.data import StoreError
    from test_training import tiny_overrides

    said = damage(store, "missing")
    config = load_config(None, tiny_overrides(str(tiny[0]), str(tmp_path), **{"data.store": str(store),
                                                                              "data.mix": "{online: 1.0}"}))
    with pytest.raises(StoreError, match=said.replace(".", r"\.")):
        train(config, log=lambda m: None)
    assert not (tmp_path / "run").exists()


def test_a_damaged_table_on_s3_is_read_only_until_restored(s3_env, tmp_path):
    """The same on a real S3 server (SeaweedFS): the write's check lists the table's data files there."""
    import uuid

    import boto3
    import lance

    from softrl.data.lance_table import storage_options

    prefix = uuid.uuid4().hex[:12]
    root = f"s3://{s3_env.bucket}/{prefix}"
    s = ExperienceStore(root)
    s.append(task_solutions(load_task("countdown", size=6), "human"))
    s.append(task_solutions(load_task("countdown", size=8, seed=3), "human"))
    table = f"{root}/trajectories.lance"
    dataset = lance.dataset(table, storage_options=storage_options(table))
    older = {f.path for fr in dataset.checkout_version(2).get_fragments() for f in fr.data_files()}
    victim = next(f.path for fr in dataset.get_fragments() for f in fr.data_files() if f.path not in older)
    boto3.client("s3", endpoint_url=s3_env.endpoint, region_name="us-east-1",
                 aws_access_key_id=s3_env.writer["AWS_ACCESS_KEY_ID"],
                 aws_secret_access_key=s3_env.writer["AWS_SECRET_ACCESS_KEY"]).delete_object(
        Bucket=s3_env.bucket, Key=f"{prefix}/trajectories.lance/data/{victim}")
    records = tmp_path / "r.jsonl"
    records.write_text(json.dumps({"prompt": "1 2 -> 3", "response": "1+2", "reward": 1.0}) + "\n")
    one_line(run("data", "import", records, "--store", root), f"{table}: damaged, data file data/{victim} is missing",
             "softrl data restore")
    assert run("data", "restore", "2", "--store", root)[0] == 0
    assert run("data", "import", records, "--store", root)[0] == 0 and len(ExperienceStore(root)) == 7


def test_a_listing_that_leaves_a_file_out_is_not_damage(store, monkeypatch):
    """A listing taken while other processes write may not show every file (CI saw a writer refuse a
    healthy table, with four writers and a dedupe at once, when a file vanished mid-listing): a file the
    listing lacks is looked at on its own before the table is called damaged, and one really gone still is."""
    from softrl.data import lance_table

    real = lance_table.file_sizes
    victim = newest_data_file(store)

    def listing_without_victim(folder, options, names=None):
        sizes = real(folder, options, names)
        return sizes if names is not None else {k: v for k, v in sizes.items() if k != victim.name}

    monkeypatch.setattr(lance_table, "file_sizes", listing_without_victim)
    s = ExperienceStore(store)
    assert s.tables["trajectories"].damage() is None
    s.append(task_solutions(load_task("countdown", size=2, seed=5), "human"))  # a write is not refused
    victim.unlink()
    assert s.tables["trajectories"].damage(3) == f"data file data/{victim.name} is missing"
