"""Issue 52's categories, each tested from the category (not the hidden cases): one line for every bad
input, never a default silently taken for a value given."""

import pytest
from conftest import save_char_llama
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


def test_input_that_contradicts_itself_is_refused_whole(tmp_path):
    """One response with three grades, or one prompt id with two texts: refused naming them, nothing
    written; the same response twice with one grade is a repeat."""
    import json

    runner = CliRunner()
    store = tmp_path / "store"
    graded = tmp_path / "graded.jsonl"
    graded.write_text("".join(json.dumps({"prompt_id": "p1", "prompt": "2+2", "response": "4", "reward": r}) + "\n"
                              for r in (1.0, 0.0, 0.5)))
    result = runner.invoke(app, ["data", "import", str(graded), "--store", str(store)])
    assert result.exit_code == 2 and "1 response is given different grades" in result.output
    assert "rewards 0, 0.5, 1" in result.output and "nothing imported" in result.output and not store.exists()
    texts = tmp_path / "texts.jsonl"
    texts.write_text("".join(json.dumps({"prompt_id": "p1", "prompt": p, "response": "4", "reward": 1}) + "\n"
                             for p in ("2+2", "3+1")))
    result = runner.invoke(app, ["data", "import", str(texts), "--store", str(store)])
    assert result.exit_code == 2 and "1 prompt id names different prompt texts (the first: 'p1', 2 texts)" in result.output
    repeat = tmp_path / "repeat.jsonl"
    repeat.write_text(graded.read_text().splitlines()[0] + "\n" + graded.read_text().splitlines()[0] + "\n")
    result = runner.invoke(app, ["data", "import", str(repeat), "--store", str(store)])
    assert result.exit_code == 0 and "imported 1 trajectories (1 repeated" in result.output


@pytest.fixture(scope="module")
def damaged_models(tmp_path_factory):
    """A small model directory, and three damaged copies: weights cut in half, no tokenizer files, and a
    config.json of another size than its weights."""
    import json
    import shutil

    root = tmp_path_factory.mktemp("models")
    good = save_char_llama(root / "good")
    cut = shutil.copytree(good, root / "cut")
    weights = cut / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    untokenized = shutil.copytree(good, root / "untokenized")
    for f in untokenized.iterdir():
        if "token" in f.name or "vocab" in f.name or "special" in f.name:
            f.unlink()
    resized = shutil.copytree(good, root / "resized")
    config = json.loads((resized / "config.json").read_text())
    (resized / "config.json").write_text(json.dumps({**config, "hidden_size": 64, "intermediate_size": 128}))
    return {"cut": (cut, "damaged or cut short"), "untokenized": (untokenized, "cannot load a tokenizer"),
            "resized": (resized, "shapes do not fit its config.json")}


@pytest.mark.parametrize("kind", ["cut", "untokenized", "resized"])
@pytest.mark.parametrize("command", [
    ["eval", "--task", "countdown", "--size", "2", "--samples", "1", "--model"],
    ["q0", "countdown", "--size", "2", "--k", "1", "--model"],
])
def test_a_damaged_model_directory_is_one_line_naming_it(damaged_models, tmp_path, kind, command):
    path, says = damaged_models[kind]
    result = CliRunner().invoke(app, [*command, str(path), "--store", str(tmp_path / "store")]
                                if command[0] == "q0" else [*command, str(path)])
    assert result.exit_code != 0
    lines = [line for line in result.output.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and says in lines[0] and str(path) in lines[0], result.output
    assert "--debug shows where" not in result.output and "MISMATCH" not in result.output
