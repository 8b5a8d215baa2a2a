"""Rewards have one unit, a finite number in [0, 1] (a bool counts as 0 or 1), checked at every door:
a task's grades (`Task.grade_many`), a user's reward function, the store's writes and `data import`.
A bad value is a one-line error naming where it came from and the value, and nothing is written."""

import json
import math
import re
from datetime import datetime, timezone

import pytest
from typer.testing import CliRunner

from softrl.cli.data import data_app
from softrl.data import ExperienceStore, Trajectory
from softrl.data.io import export, read_trajectories
from softrl.models.generation import Sample
from softrl.rollout import RolloutSpec, RolloutWorker
from softrl.tasks import Grade, Prompt, RecordError, Task, load_task
from softrl.tasks.base import RewardError, check_reward

BAD = [(5.0, "5.0"), (-3.0, "-3.0"), (math.nan, "nan"), (math.inf, "inf"), (-math.inf, "-inf"), ("abc", "'abc'"),
       (None, "None"), ([0.5], "[0.5]")]


class FixedReward(Task):
    """Rewards every response to prompt cd-17 with `reward`, every other one with 1."""

    name = "countdown"

    def __init__(self, reward, parallel=False):
        self.reward, self.parallel_grading = reward, parallel

    def prompts(self):
        return [Prompt("cd-16", "1 2 -> 3"), Prompt("cd-17", "2 2 -> 4")]

    def grade(self, prompt, response):
        reward = self.reward if prompt.id == "cd-17" else 1.0
        return Grade(reward, reward is True or reward == 1.0)


class EchoGenerator:
    """Samples the prompt's own tokens back (one char per token)."""

    def generate(self, prompts, params):
        return [Sample(i, list(p), "", [-1.0] * len(p), params.temperature, "eos")
                for i, p in enumerate(prompts) for _ in range(params.n)]


def worker(task, store):
    spec = RolloutSpec(task, EchoGenerator(), lambda ids: "".join(map(chr, ids)), "chars", max_new_tokens=8,
                       source="online")
    return RolloutWorker(spec, lambda text: [ord(c) for c in text], store)


def is_empty(store):
    return len(store) == 0 and store.tables["trajectories"].latest() == 1  # no commit since the table's creation


@pytest.mark.parametrize("parallel", [False, True])
@pytest.mark.parametrize("value,shown", BAD)
def test_bad_grade_is_one_line_naming_task_prompt_and_value(tmp_path, value, shown, parallel):
    task = FixedReward(value, parallel)
    pairs = [(p, "x") for p in task.prompts()]
    with pytest.raises(RewardError) as caught:
        task.grade_many(pairs)
    message = str(caught.value)
    assert message == f"task countdown, prompt cd-17: reward must be a finite number in [0, 1], got {shown}"
    assert "\n" not in message and isinstance(caught.value, ValueError)
    store = ExperienceStore(tmp_path / "store")
    with pytest.raises(RewardError, match="task countdown, prompt cd-17: reward"):
        worker(task, store).collect(task.prompts(), n=2, version=0, seed=0)
    assert is_empty(store)


def test_good_grades_pass_and_bools_are_zero_or_one(tmp_path):
    for value, expected in [(True, 1.0), (False, 0.0), (1, 1.0), (0.25, 0.25)]:
        grades = FixedReward(value).grade_many([(p, "x") for p in FixedReward(value).prompts()])
        assert grades[1].reward == expected and type(grades[1].reward) is float
    store = ExperienceStore(tmp_path / "store")
    rows = worker(FixedReward(True), store).collect(FixedReward(True).prompts(), n=2, version=3, seed=0)
    assert [r.reward for r in rows] == [1.0] * 4 and len(store) == 2  # two prompts, one distinct response each
    assert check_reward(True, "x") == 1.0 and check_reward(False, "x") == 0.0 and check_reward(1, "x") == 1.0


def test_a_grader_that_returns_no_grade(tmp_path):
    class Bare(FixedReward):
        def grade(self, prompt, response):
            return 1.0

    with pytest.raises(RewardError, match=r"^task countdown, prompt cd-16: grade\(\) must return a Grade, got float$"):
        Bare(1.0).grade_many([(p, "x") for p in Bare(1.0).prompts()])


@pytest.fixture
def reward_module(tmp_path, monkeypatch):
    (tmp_path / "my_rewards.py").write_text(
        "from softrl.tasks import Grade\n"
        "def too_much(prompt, response):\n"
        "    return 1.5\n"
        "def wordy(prompt, response):\n"
        "    return 'abc'\n"
        "def nan_grade(prompt, response):\n"
        "    return Grade(float('nan'), False)\n"
        "def solved(prompt, response):\n"
        "    return response == 'yes'\n"
    )
    (tmp_path / "prompts.jsonl").write_text('{"id": "p1", "prompt": "say yes"}\n{"id": "p2", "prompt": "again"}\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    return str(tmp_path / "prompts.jsonl")


@pytest.mark.parametrize("fn,expected", [
    ("too_much", "reward must be a finite number in [0, 1], got 1.5"),
    ("wordy", "reward function wordy must return a finite number, got 'abc'"),
    ("nan_grade", "reward function nan_grade must return a finite number, got nan")])
def test_reward_function_out_of_range(tmp_path, reward_module, fn, expected):
    task = load_task(f"my_rewards:{fn}", prompts=reward_module)
    prompt = task.prompts()[0]
    expected = f"task {fn}, prompt {prompt.id}: {expected}"
    assert prompt.id.startswith(f"{fn}.") and prompt.id.endswith(":p1")
    with pytest.raises(RewardError) as caught:
        task.grade_many([(p, "yes") for p in task.prompts()])
    assert str(caught.value).startswith(expected)
    with pytest.raises(RewardError) as caught:
        task.grade(prompt, "yes")  # a direct grade() is checked too
    assert str(caught.value).startswith(expected)
    store = ExperienceStore(tmp_path / "store")
    with pytest.raises(RewardError, match=f"task {fn}, prompt {re.escape(prompt.id)}"):
        worker(task, store).collect(task.prompts(), n=2, version=0, seed=0)
    assert is_empty(store)


def test_reward_function_bools(reward_module):
    task = load_task("my_rewards:solved", prompts=reward_module)
    prompt = task.prompts()[0]
    yes, no = task.grade_many([(prompt, "yes"), (prompt, "no")])
    assert (yes.reward, yes.passed, no.reward, no.passed) == (1.0, True, 0.0, False)
    assert type(yes.reward) is float and type(task.grade(prompt, "no").reward) is float


@pytest.mark.parametrize("value,shown", BAD)
def test_store_rejects_bad_rewards_all_or_nothing(tmp_path, value, shown):
    store = ExperienceStore(tmp_path / "store")
    good = Trajectory("cd-16", "fine", 1.0, True, task="countdown")
    bad = Trajectory("cd-17", "bad", value, False, task="countdown")
    with pytest.raises(RewardError) as caught:
        store.append([good, bad])
    message = str(caught.value)
    assert message.startswith("task countdown, prompt cd-17, trajectory ")
    assert message.endswith(f": reward must be a finite number in [0, 1], got {shown}") and "\n" not in message
    with pytest.raises(RewardError):
        store.append([good.to_row(), bad.to_row()])  # rows as dicts go through the same check
    assert is_empty(store)
    assert store.append([good, Trajectory("cd-17", "bool", True, True)]) == 2
    assert store.trajectories()["reward"].to_pylist() == [1.0, 1.0]


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))  # json writes NaN as the literal NaN
    return path


def import_cli(file, store):
    return CliRunner().invoke(data_app, ["import", str(file), "--store", str(store)])


@pytest.mark.parametrize("reward,shown", [(2, "2"), (math.nan, "nan"), (-0.5, "-0.5"), (math.inf, "inf"), ("1", "'1'")])
def test_data_import_rejects_bad_reward_and_writes_nothing(tmp_path, reward, shown):
    records = write_jsonl(tmp_path / "records.jsonl", [
        {"prompt": "1 2 -> 3", "response": "1+2", "reward": 1},
        {"prompt": "1 2 -> 3", "response": "1*2", "reward": reward},
    ])
    with pytest.raises(RecordError) as caught:
        read_trajectories(records, "human")
    assert str(caught.value) == f"{records}:2: field 'reward' must be a finite number in [0, 1], got {shown}"
    exported_row = {**Trajectory("p", "r", 0.5, False, task="t").to_row(), "reward": reward, "created_at": None}
    rows = write_jsonl(tmp_path / "rows.jsonl", [exported_row])
    with pytest.raises(RecordError, match="rows.jsonl:1: field 'reward' must be a finite number"):
        read_trajectories(rows, None)
    for file in (records, rows):
        result = import_cli(file, tmp_path / "store")
        assert result.exit_code == 2, result.output
        assert "field 'reward' must be a finite number in [0, 1]" in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "store").exists() or is_empty(ExperienceStore(tmp_path / "store"))


def test_data_import_accepts_bool_and_passed_only_records(tmp_path):
    records = write_jsonl(tmp_path / "records.jsonl", [
        {"prompt": "a", "response": "b", "reward": True},
        {"prompt": "a", "response": "c", "passed": False},
        {"prompt": "a", "response": "d", "reward": 0.5},
    ])
    rows = read_trajectories(records, "human")
    assert [(r.reward, r.passed) for r in rows] == [(1.0, True), (0.0, False), (0.5, False)]


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz", ".parquet"])
def test_export_then_import_round_trips(tmp_path, suffix):
    store = ExperienceStore(tmp_path / "store")
    written = [Trajectory(f"cd-{i}", f"response {i}", reward, reward == 1.0, task="countdown", prompt_text=f"prompt {i}",
                          prompt_tokens=[1, 2], response_tokens=[3, i], tokenizer="chars", source="online",
                          run_id="run", policy_version=i, behavior_logprobs=[-0.5, -0.25],
                          decoding={"temperature": 1.0, "top_p": 1.0},
                          created_at=datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc))
               for i, reward in enumerate([0.0, 0.25, 1.0, True])]
    assert store.append(written) == 4
    out = tmp_path / f"export{suffix}"
    assert export(store.trajectories(), out) == 4
    again = ExperienceStore(tmp_path / "again")
    assert again.append(read_trajectories(out, None)) == 4
    assert again.trajectories().to_pylist() == store.trajectories().to_pylist()
    result = import_cli(out, tmp_path / "third")
    assert result.exit_code == 0, result.output
    assert ExperienceStore(tmp_path / "third").trajectories().to_pylist() == store.trajectories().to_pylist()


# --- `softrl data`: results on stdout (a table, or with --json one JSON document), messages on stderr ---

def small_store(tmp_path):
    records = write_jsonl(tmp_path / "records.jsonl", [
        {"prompt": "1 2 -> 3", "response": "1+2", "reward": 1},
        {"prompt": "1 2 -> 3", "response": "1*2", "reward": 0.0},
        {"prompt": "4 4 -> 8", "response": "4+4", "passed": True},
    ])
    result = CliRunner().invoke(data_app, ["import", str(records), "--source", "human", "--store",
                                           str(tmp_path / "store")])
    assert result.exit_code == 0, result.output
    assert result.stdout == "" and "imported 3 trajectories" in result.stderr  # a message: stderr only
    return tmp_path / "store"


def test_data_stats_table_goes_to_stdout(tmp_path):
    store = small_store(tmp_path)
    result = CliRunner().invoke(data_app, ["stats", "--store", str(store)])
    assert result.exit_code == 0, result.output
    rows = [line for line in result.stdout.splitlines() if "human" in line]
    cells = re.findall(r"[\w.]+", rows[0]) if len(rows) == 1 else []  # the table's borders left out
    assert cells == ["human", "3", "2", "0.667", "0.667", "0"], result.stdout  # trajectories, prompts, pass rate, ...
    assert "human" not in result.stderr and "pass rate" not in result.stderr


def test_data_stats_json_is_one_document_on_stdout(tmp_path):
    store = small_store(tmp_path)
    (store / "trajectories.lance" / "notes.txt").write_text("hello")  # no version names it: never read
    result = CliRunner().invoke(data_app, ["stats", "--store", str(store), "--json"])
    assert result.exit_code == 0, result.output
    stats = json.loads(result.stdout)  # nothing else on stdout
    assert stats["trajectories"] == 3 and stats["sources"]["human"]["trajectories"] == 3
    assert stats["sources"]["human"]["pass_rate"] == pytest.approx(2 / 3)
    assert result.stderr == ""


def test_data_import_export_dedupe_json_and_messages(tmp_path):
    store = small_store(tmp_path)
    runner = CliRunner()
    out = tmp_path / "all.jsonl"
    exported = runner.invoke(data_app, ["export", str(out), "--store", str(store)])
    assert exported.exit_code == 0 and exported.stdout == "" and "exported 3 trajectories" in exported.stderr
    again = runner.invoke(data_app, ["import", str(out), "--store", str(store), "--json"])
    assert again.exit_code == 0, again.output
    assert json.loads(again.stdout) == {"imported": 3, "repeated": 0, "store": str(store)}
    assert again.stderr == ""
    dedupe = runner.invoke(data_app, ["dedupe", "--store", str(store)])
    assert dedupe.exit_code == 0 and dedupe.stdout == "" and "3 duplicates removed" in dedupe.stderr
    assert json.loads(runner.invoke(data_app, ["dedupe", "--store", str(store), "--json"]).stdout) == {
        "before": 3, "after": 3, "removed": 0}
    assert json.loads(runner.invoke(data_app, ["export", str(out), "--store", str(store), "--json"]).stdout) == {
        "exported": 3, "file": str(out)}
