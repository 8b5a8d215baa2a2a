"""The README is a newcomer's page that tells the truth: short, its Python runs as written, its config
file is the demo's and trains, and every number of its results table is the number in the file the row
links to."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
EXAMPLE = ROOT / "examples" / "countdown-spo.yaml"
SOFTRL = shutil.which("softrl", path=os.path.dirname(sys.executable)) or shutil.which("softrl")
OFFLINE = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
DECIMAL = re.compile(r"[-+]?\d+\.\d+")


def results_rows() -> list[tuple[str, str]]:
    """(result cell, linked source path) of each row of the README's results table."""
    text = README.read_text()
    table = text[text.index("## Results"):].split("\n\n")
    rows = next(block for block in table if block.startswith("| what"))
    out = []
    for line in rows.splitlines()[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        out.append((cells[1], re.search(r"\]\(([^)]+)\)", cells[2]).group(1)))
    return out


def numbers_of(path: Path) -> list[float]:
    if path.suffix == ".json":
        found = []

        def walk(value):
            if isinstance(value, bool):
                return
            if isinstance(value, (int, float)):
                found.append(float(value))
            elif isinstance(value, dict):
                for v in value.values():
                    walk(v)
            elif isinstance(value, list):
                for v in value:
                    walk(v)

        walk(json.loads(path.read_text()))
        return found
    return [float(x) for x in DECIMAL.findall(path.read_text())]


def quoted(cell: str) -> list[str]:
    """The measured numbers of a result cell: its decimals, less the targets in parentheses."""
    return DECIMAL.findall(re.sub(r"\([^)]*\)", "", cell))


def test_the_readme_is_a_short_page():
    assert len(README.read_text().splitlines()) <= 150


def test_every_result_in_the_readme_is_the_number_of_its_source():
    rows = results_rows()
    assert 5 <= len(rows) <= 10
    wrong = []
    for cell, link in rows:
        source = ROOT / link
        assert source.is_file(), f"{link} does not exist"
        values = numbers_of(source)
        for number in quoted(cell):
            places = len(number.split(".")[1])
            if not any(f"{v:+.{places}f}".lstrip("+") == number.lstrip("+") for v in values):
                wrong.append(f"{number} ({cell}) is no number of {link} to {places} places")
    assert quoted(rows[0][0]), "the first row quotes no number: the check would check nothing"
    assert wrong == []


def test_a_number_not_in_its_source_is_caught():
    """The check above fails where it should: the source's number moved by one in the last place."""
    cell, link = results_rows()[0]
    number = quoted(cell)[0]
    off = f"{float(number) + 10 ** -len(number.split('.')[1]):.{len(number.split('.')[1])}f}"
    assert not any(f"{v:.{len(off.split('.')[1])}f}" == off for v in numbers_of(ROOT / link))


def test_the_readme_python_runs_as_written(tmp_path):
    text = README.read_text()
    start = text.index("```python\n") + len("```python\n")
    code = text[start:text.index("```\n", start)]
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=OFFLINE, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert re.search(r"^\d\.\d+ -> \d\.\d+ ; weights: runs/run/final$", done.stdout.strip().splitlines()[-1])


def test_the_example_config_is_the_demo_and_trains(tmp_path):
    from softrl.cli.train import DEMO
    from softrl.config import load_config

    demo = load_config(None, [], base=DEMO).model_dump()
    example = load_config(EXAMPLE, []).model_dump()
    assert {k: v for k, v in example.items() if k != "name"} == {k: v for k, v in demo.items() if k != "name"}
    small = [f"out_dir={tmp_path / 'runs'}", f"data.store={tmp_path / 'store'}", "optim.steps=2", "task.size=4",
             "task.eval_size=2", "q0.k=2", "eval.samples=2", "sampling.prompts_per_step=2", "eval.every=0"]
    done = subprocess.run([SOFTRL, "train", str(EXAMPLE), *small, "--json"], env=OFFLINE, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1])["steps"] == 2
    # no terminal here: no bar, but a timed line at each phase (and about every 10 s within one)
    phases = re.findall(r"^\d\d:\d\d:\d\d (.+?) \d+/\d+", done.stderr, re.M)
    assert {"q0", "train"} <= set(phases), done.stderr[-3000:]


def test_progress_lines_come_at_each_phase_and_then_every_ten_seconds(monkeypatch):
    import io

    from rich.console import Console

    from softrl.api import ProgressLines

    console = Console(file=io.StringIO(), width=200)
    lines = ProgressLines(console, enabled=True, every=10.0)
    clock = iter([0.0, 1.0, 2.0, 12.5, 13.0])
    monkeypatch.setattr("softrl.api.time.monotonic", lambda: next(clock))
    for phase, done in (("q0", 1), ("q0", 2), ("train", 1), ("train", 2), ("train", 3)):
        lines.say(phase, done, 3)
    monkeypatch.undo()
    said = [line.split(" ", 1)[1] for line in console.file.getvalue().splitlines()]
    assert said == ["q0 1/3", "train 1/3", "train 2/3"]  # a new phase at once; within one, after 10 s
    quiet = ProgressLines(Console(file=io.StringIO()), enabled=False)
    quiet.say("q0", 1, 3)
    assert quiet.console.file.getvalue() == ""


def test_a_bench_progress_bar_off_a_terminal_says_each_run_in_a_line(monkeypatch):
    """`softrl bench frontier ... > log`: the bar cannot be drawn, so each new description (a finished
    run) is a timed line, and a long phase a line about every 10 s."""
    import io

    from rich.console import Console

    from softrl.cli import common

    log = Console(file=io.StringIO(), width=30)  # not a terminal, and narrower than a line: never wrapped
    monkeypatch.setattr(common, "err", log)
    clock = iter([0.0, 1.0, 2.0, 3.0, 15.0])
    monkeypatch.setattr("softrl.api.time.monotonic", lambda: next(clock))
    with common.progress_bar("tuning (2 at once)", total=3) as update:
        update(0)
        update(1, description="tuning: a done")
        update(2, description="tuning: b done")
        update(2, total=5)
        update(3)
    said = [line.split(" ", 1)[1] for line in log.file.getvalue().splitlines()]
    assert said == ["tuning (2 at once) 0/3", "tuning: a done 1/3", "tuning: b done 2/3", "tuning: b done 3/5"]
