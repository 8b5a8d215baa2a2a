"""Every `softrl` command that opens a store, given a damaged one, and every command that loads a model,
given a damaged model directory, ends in one line: exit status 1 or 2, one `error:` line on stderr
naming the store's table or the model's folder, no traceback and no third party's source path. The
commands are found by walking the CLI (every command with a --store or --model option), so a new
one cannot escape: each must have its call below."""

import json
import os
import shutil
import subprocess
import sys

import pytest
from typer.main import get_command

from softrl.cli import app
from softrl.data import ExperienceStore
from softrl.data.io import task_solutions
from softrl.tasks.registry import load_task

pytest.importorskip("transformers")

# what the walk leaves out, and why
NOT_WALKED = {"bench systems": "a benchmark: its --model names one of its fixed model sizes",
              "data tag": "a damaged store is tagged like any (tags are how to mark a version to restore)",
              "data restore": "the way back from a damaged store (tests/test_damaged_store.py)",
              "data q0": "the older spelling of q0 --from-store, walked as that"}


def commands_with(option: str) -> set[str]:
    found = set()

    def walk(command, path):
        for name, sub in (getattr(command, "commands", None) or {}).items():
            walk(sub, [*path, name])
        if not getattr(command, "commands", None) and any(option in getattr(p, "opts", []) for p in command.params):
            found.add(" ".join(path))
    walk(get_command(app), [])
    return found - set(NOT_WALKED)


def store_calls(store, model, records, out):
    return {
        "q0": ["q0", "countdown", "--model", model, "--size", "2", "--k", "1", "--store", store],
        "q0 --from-store": ["q0", "--from-store", "--source", "human", "--store", store],
        "pts": ["pts", "countdown", "--model", model, "--size", "2", "--store", store],
        "serve": ["serve", "--model", model, "--port", "0", "--store", store],
        "data import": ["data", "import", records, "--store", store],
        "data export": ["data", "export", out, "--store", store],
        "data stats": ["data", "stats", "--store", store],
        "data dedupe": ["data", "dedupe", "--store", store],
        "data compact": ["data", "compact", "--store", store],
        "train": ["train", f"model.path={model}", f"data.store={store}", "task.size=2", "optim.steps=1",
                  f"out_dir={out}-runs"],
    }


def model_calls(model, store, records, out):
    return {
        "eval": ["eval", "--model", model, "--size", "2", "--samples", "1"],
        "q0": ["q0", "countdown", "--model", model, "--size", "2", "--k", "1", "--store", store],
        "pts": ["pts", "countdown", "--model", model, "--size", "2", "--store", store],
        "serve": ["serve", "--model", model, "--port", "0", "--store", store],
        "data import": ["data", "import", records, "--model", model, "--store", store],
        "train": ["train", f"model.path={model}", f"data.store={store}", "task.size=2", "optim.steps=1",
                  f"out_dir={out}-runs"],
    }


def one_line(args, *named):
    proc = subprocess.run([sys.executable, "-m", "softrl", *map(str, args)], capture_output=True, text=True,
                          timeout=300)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode in (1, 2) and len(lines) == 1 and lines[0].startswith("error: "), (args, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr and ".rs:" not in lines[0] and "site-packages" not in lines[0], lines[0]
    assert any(name in lines[0] for name in named), (args, lines[0])
    return lines[0]


@pytest.fixture
def setting(tmp_path, tiny):
    """(a store whose newest trajectories data file is gone, a good store, a good model, a cut model,
    records to import, an output path)."""
    import lance

    good, bad = tmp_path / "good", tmp_path / "bad"
    for root in (good, bad):
        s = ExperienceStore(root)
        s.append(task_solutions(load_task("countdown", size=6), "human"))
        s.append(task_solutions(load_task("countdown", size=8, seed=3), "human"))
    dataset = lance.dataset(str(bad / "trajectories.lance"))
    older = {f.path for fr in dataset.checkout_version(2).get_fragments() for f in fr.data_files()}
    victim = next(f.path for fr in dataset.get_fragments() for f in fr.data_files() if f.path not in older)
    (bad / "trajectories.lance" / "data" / victim).unlink()
    cut, garbled = tmp_path / "cut-weights", tmp_path / "garbled-config"
    for folder in (cut, garbled):
        shutil.copytree(tiny[0], folder)
    weights = next(cut.glob("*.safetensors"))
    os.truncate(weights, weights.stat().st_size // 2)
    (garbled / "config.json").write_text('{"model_type": "llama", "vocab_size": ')
    records = tmp_path / "r.jsonl"
    records.write_text(json.dumps({"prompt": "1 2 -> 3", "response": "1+2", "reward": 1.0}) + "\n")
    return bad, good, tiny[0], (cut, garbled), records, tmp_path / "out.jsonl"


def test_every_store_command_names_a_damaged_store_in_one_line(setting):
    bad, _, model, _, records, out = setting
    calls = store_calls(bad, model, records, out)
    assert commands_with("--store") <= {c.split(" --")[0] for c in calls}, "a command with --store is not walked"
    for name, args in calls.items():
        one_line(args, f"{bad}/trajectories.lance: damaged, ")


def test_every_model_command_names_a_damaged_model_in_one_line(setting):
    """Weights cut short, and a config.json cut short; `data import --model` reads the model's
    vocabulary, not its weights, so only the second is its damage."""
    _, good, _, damaged, records, out = setting
    for model in damaged:
        calls = model_calls(model, good, records, out)
        assert commands_with("--model") <= set(calls), "a command with --model is not walked"
        for name, args in calls.items():
            if name != "data import" or model.name == "garbled-config":
                one_line(args, str(model))
