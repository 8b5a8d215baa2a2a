"""The reference-model bootstrap: its data, its cache, its determinism (a miniature run)."""

import json

import pytest
import torch

pytest.importorskip("transformers")

from softrl.bootstrap import BootstrapConfig, bootstrap, bootstrap_dir, short_expressions  # noqa: E402
from softrl.tasks.countdown import check  # noqa: E402


def test_short_expressions_are_exact_and_use_each_number_once():
    numbers = [3, 7, 7, 2]
    exprs = short_expressions(numbers)
    assert "3+7" in exprs and "(3*7)-2" in exprs and "2*(7+7)" in exprs
    integral = {t: v for t, v in exprs.items() if v.denominator == 1}
    assert len(integral) > 50
    for text, value in integral.items():  # the exact checker agrees on value and on number use
        assert check(numbers, int(value), text) == (True, "ok"), text


MINI = dict(steps=6, batch_size=8, train_problems=60, eval_problems=4, eval_samples=4, hidden=32, layers=1, heads=2, mlp=64)


def test_mini_bootstrap_caches_loads_and_is_deterministic(tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    monkeypatch.setenv("SOFTRL_CACHE", str(tmp_path))
    calls = []
    directory = bootstrap("countdown", seed=3, progress=lambda *a: calls.append(a), **MINI)
    assert directory == bootstrap_dir(BootstrapConfig(seed=3, **MINI)) and str(directory).startswith(str(tmp_path))
    card = json.loads((directory / "softrl.json").read_text())
    assert card["config"]["steps"] == 6 and 0 <= card["heldout"]["success_per_sample"] <= 1
    assert sum(1 for c in calls if c[0] == "train") == 6
    assert not list(directory.parent.glob("*.tmp*"))  # built atomically
    calls.clear()
    assert bootstrap("countdown", seed=3, progress=lambda *a: calls.append(a), **MINI) == directory and not calls
    model = AutoModelForCausalLM.from_pretrained(directory)
    tokenizer = AutoTokenizer.from_pretrained(directory)
    assert tokenizer.decode(tokenizer("1 2 -> 3")["input_ids"]) == "1 2 -> 3"
    first = {k: v.clone() for k, v in model.state_dict().items()}
    rebuilt = AutoModelForCausalLM.from_pretrained(bootstrap("countdown", seed=3, force=True, **MINI))
    assert all(torch.equal(first[k], v) for k, v in rebuilt.state_dict().items())
    with pytest.raises(ValueError, match="no bootstrap for task 'chess'"):
        bootstrap("chess")


def test_bootstrap_cli_prints_the_folder(tmp_path):
    import os
    import shutil
    import subprocess
    import sys

    softrl = shutil.which("softrl", path=os.path.dirname(sys.executable))
    if softrl is None:
        pytest.skip("softrl console script not installed")
    env = {**os.environ, "SOFTRL_CACHE": str(tmp_path)}
    proc = subprocess.run([softrl, "bootstrap", "countdown", "--steps", "3", "--json"], capture_output=True,
                          text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    assert report["directory"].startswith(str(tmp_path)) and (tmp_path / "bootstrap").exists()
    assert {"success_per_sample", "pass@1", "pass@10", "distinct_correct_per_solved"} <= set(report)
    bad = subprocess.run([softrl, "bootstrap", "chess"], capture_output=True, text=True, timeout=120, env=env)
    assert bad.returncode == 2 and bad.stderr.strip() == (
        "error: no bootstrap for task 'chess'; available: countdown, tinycode, tinycode-loops, tinycode-feedback, countdown-tools")


def test_mini_tinycode_bootstrap_is_graded_in_the_sandbox(tmp_path, monkeypatch):
    from softrl.bootstrap import sft_examples

    monkeypatch.setenv("SOFTRL_CACHE", str(tmp_path))
    examples = sft_examples(BootstrapConfig(task="tinycode", train_problems=20))
    assert len(examples) == 20 and all(len(right) >= 3 and wrong for _, right, wrong in examples)
    directory = bootstrap("tinycode", seed=1, **{**MINI, "batch_size": 4})
    card = json.loads((directory / "softrl.json").read_text())
    assert card["config"]["task"] == "tinycode" and card["heldout"]["problems"] == 4
    assert directory.name.startswith("tinycode-s1-")


def test_mini_tinycode_feedback_bootstrap_is_evaluated_in_episodes(tmp_path, monkeypatch):
    """The multi-turn reference: trained on synthetic episodes (1024 positions for three turns), its card
    has the last turn's pass@k, the first turn's, and the policy turns an episode took."""
    monkeypatch.setenv("SOFTRL_CACHE", str(tmp_path))
    directory = bootstrap("tinycode-feedback", seed=1, **{**MINI, "batch_size": 4, "eval_samples": 2})
    card = json.loads((directory / "softrl.json").read_text())
    heldout = card["heldout"]
    assert card["config"]["task"] == "tinycode-feedback" and heldout["problems"] == 4
    assert 1 <= heldout["turns_per_episode"] <= 3 and {"first_turn_pass@1", "first_turn_pass@10"} <= set(heldout)
    assert heldout["first_turn_pass@1"] <= heldout["pass@1"]  # a later turn only adds tries
    assert json.loads((directory / "config.json").read_text())["max_position_embeddings"] == 1024


def test_tinycode_loops_bootstrap_learns_only_seen_combinations():
    """The reference's training data: problems of `seen` combinations, each with its known solutions and
    plausible wrong programs, none of them a held-out combination's program."""
    from softrl.bootstrap import sft_examples
    from softrl.tasks.loopcode import combination_name, combinations, programs, split_of
    from softrl.tasks.tinycode import rename_variables

    texts: dict[str, set[str]] = {"seen": set(), "heldout": set()}
    for f, m, r in combinations():  # every program of every combination, at every constant
        for kf in f.constants or (0,):
            for km in m.constants or (0,):
                written = programs(f.code.format(k=kf), m.code.format(k=km), r)
                texts[split_of(combination_name(f, m, r))].update(written + [rename_variables(p) for p in written])
    assert not texts["heldout"] & texts["seen"]  # no held-out program is also a seen one, word for word
    examples = sft_examples(BootstrapConfig(task="tinycode-loops", train_problems=200))
    assert len(examples) == 200 and all(len(right) == 4 and wrong for _, right, wrong in examples)
    assert not texts["heldout"] & {program for _, right, wrong in examples for program in right + wrong}


# a first use of a cache entry in a process of its own; its build is counted in `log` and lasts until
# `release` exists, so the test decides when it ends
FIRST_USE = """
import sys, time
from pathlib import Path
from softrl.models.loading import built_once

entry, log, release = map(Path, sys.argv[1:])

def build(work):
    with open(log, "a") as f:
        f.write("built\\n")
    deadline = time.time() + 15
    while not release.exists() and time.time() < deadline:
        time.sleep(0.02)
    work.mkdir()
    (work / "softrl.json").write_text("{}")

print(built_once(entry, build))
"""


def test_concurrent_first_uses_build_the_entry_once(tmp_path):
    import subprocess
    import sys
    import time

    entry, log, release = tmp_path / "cache" / "entry", tmp_path / "builds", tmp_path / "release"

    def start():
        return subprocess.Popen([sys.executable, "-c", FIRST_USE, entry, log, release],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    first = start()
    deadline = time.time() + 60
    while not log.exists() and time.time() < deadline:  # the first is building
        time.sleep(0.02)
    second = start()
    told = ""
    while "waiting" not in told and (line := second.stderr.readline()):
        told += line
    release.touch()
    outs = [p.communicate(timeout=60) for p in (first, second)]
    assert [p.returncode for p in (first, second)] == [0, 0], [err[-2000:] for _, err in outs]
    assert "waiting for another process to finish building" in told and str(entry) in told
    assert [out.strip() for out, _ in outs] == [str(entry)] * 2
    assert log.read_text() == "built\n" and (entry / "softrl.json").exists()
    assert sorted(p.name for p in entry.parent.iterdir()) == ["entry", "entry.lock"]


def test_a_build_killed_midway_is_cleaned_up_by_the_next(tmp_path):
    from softrl.models.loading import built_once

    entry = tmp_path / "entry"
    stale = tmp_path / "entry.tmp999999"  # as a process killed while building leaves it
    (stale / "half").mkdir(parents=True)
    builds = []

    def build(work):
        builds.append(work)
        work.mkdir()
        (work / "softrl.json").write_text("{}")

    assert built_once(entry, build) == entry and built_once(entry, build) == entry
    assert len(builds) == 1 and not stale.exists() and (entry / "softrl.json").exists()

    def failing(work):
        work.mkdir()
        raise RuntimeError("out of memory")

    with pytest.raises(RuntimeError):
        built_once(tmp_path / "other", failing)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["entry", "entry.lock", "other.lock"]
