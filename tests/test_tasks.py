"""Tasks: built-in procedural tasks, dataset loaders in every file format, reasoning-gym, import paths.
Correct solutions pass and wrong ones fail; bad records are named."""

import json
import re
import sys
from pathlib import Path

import pytest

from softrl.tasks import RecordError, load_task, read_records
from softrl.tasks.countdown import CountdownTask, check, parse_expression, solve
from softrl.tasks.math import answers_match

FIXTURES = Path(__file__).parent / "fixtures"


# --- countdown --------------------------------------------------------------------------------
def test_countdown_deterministic_and_solvable():
    a, b = CountdownTask(size=60, seed=3), CountdownTask(size=60, seed=3)
    assert [p.text for p in a.prompts()] == [p.text for p in b.prompts()]
    assert [p.text for p in a.prompts()] != [p.text for p in CountdownTask(size=60, seed=4).prompts()]
    for prompt in a.prompts():
        solution = a.reference_solutions(prompt)
        assert solution, prompt.text  # generated from an expression, so the solver must find one
        assert a.grade(prompt, f"thinking...\n{solution[0]}").passed
        assert a.grade(prompt, f"<answer>{solution[0]}</answer>\nbye").passed


def test_countdown_exact_arithmetic_and_rules():
    assert parse_expression("2+3*4")[0] == 14 and parse_expression("(2+3)*4")[0] == 20
    assert parse_expression("1/3*3")[0] == 1  # exact with fractions, no float rounding
    assert parse_expression("8-3-2")[0] == 3 and parse_expression("16/4/2")[0] == 2  # left-associative
    assert check([3, 7, 25], 178, "25*7+3") == (True, "ok")
    assert not check([3, 7, 25], 181, "25*7+3+3")[0]  # a number used twice
    assert not check([3, 7, 25], 33, "25+7")[0]  # wrong value
    for bad in ("__import__('os').system('true')", "25**2", "2 3", "(25", "", "7/(3-3)"):
        assert not check([3, 7, 25, 2], 625, bad)[0], bad
    assert solve([1, 2], 100) is None
    with pytest.raises(ValueError, match="min_numbers"):
        CountdownTask(min_numbers=1)


# --- tinycode ---------------------------------------------------------------------------------
def test_tinycode_reference_passes_wrong_fails():
    task = load_task("tinycode", size=10, seed=2)
    for prompt in task.prompts():
        assert task.grade(prompt, f"```python\n{task.reference_solutions(prompt)[0]}\n```").passed
        wrong = task.grade(prompt, "print(input())")
        assert not wrong.passed and wrong.reward == 0.0
    with pytest.raises(ValueError, match="unknown tinycode family 'nope'"):
        load_task("tinycode", families=["nope"])


def test_tinycode_loops_problems_have_hidden_tests_and_known_solutions():
    from softrl.tasks.loopcode import LoopCodeTask, combinations, split_of, combination_name, plausible_wrong

    task = load_task("tinycode-loops", size=40, seed=3)
    heldout = {combination_name(*c) for c in combinations() if split_of(combination_name(*c)) == "heldout"}
    for prompt in task.prompts():
        assert prompt.meta["combination"] in heldout and len(prompt.meta["tests"]) >= 5
        shown = prompt.text.count("Input: ")
        assert shown == 2 and len(prompt.meta["tests"]) > shown  # the rest are hidden
        solutions = task.reference_solutions(prompt)
        loop = solutions[0]
        assert len(set(solutions)) == 4 and loop.count("for x in") == 1
        assert ("    if x" in loop) == (not prompt.meta["combination"].startswith("all-"))  # a loop with a condition
        assert all(g.passed for g in task.grade_many([(prompt, s) for s in solutions]))
        assert not any(g.passed for g in task.grade_many([(prompt, w) for w in plausible_wrong(prompt)[:4]]))
    seen = load_task("tinycode-loops", size=20, seed=3, split="seen")
    assert all(p.meta["combination"] not in heldout for p in seen.prompts())
    with pytest.raises(ValueError, match="unknown tinycode-loops split 'test'"):
        load_task("tinycode-loops", split="test")


# --- code datasets ----------------------------------------------------------------------------
WRONG = {
    "codecontests": "print(3)",
    "taco": "def add(a, b):\n    return a - b\nprint(0)",
    "mbpp": "def second_smallest(xs):\n    return min(xs)\ndef vowel_words(s):\n    return 0",
    "humaneval": "    return 0\n",
}


@pytest.mark.parametrize("kind", ["codecontests", "taco", "mbpp", "humaneval"])
def test_code_fixtures_right_passes_wrong_fails(kind):
    task = load_task(f"{kind}:{FIXTURES / (kind + '.jsonl')}")
    assert len(task.prompts()) == 2
    for prompt in task.prompts():
        solutions = task.reference_solutions(prompt)
        assert solutions
        for solution in solutions:
            assert task.grade(prompt, solution).passed, (prompt.id, task.grade(prompt, solution).details)
        assert not task.grade(prompt, WRONG[kind]).passed


def test_codecontests_keeps_limits_tests_and_python_solutions():
    task = load_task(f"codecontests:{FIXTURES / 'codecontests.jsonl'}")
    problem = task.problems["1000_A. Sum of two"]
    assert len(problem.tests) == 4 and problem.limits.wall_s == 1.5 and problem.limits.memory_mb == 256
    assert len(problem.solutions) == 1  # the C++ solution is not a Python one
    incorrect = json.loads((FIXTURES / "codecontests.jsonl").read_text().splitlines()[1])["incorrect_solutions"]
    assert not task.grade(task.prompts()[1], incorrect["solution"][0]).passed


def test_taco_float_tolerance():
    task = load_task(f"taco:{FIXTURES / 'taco.jsonl'}")
    prompt = task.prompts()[0]
    assert task.grade(prompt, "xs = list(map(float, input().split()))\nprint(sum(xs) / len(xs))").passed
    assert not task.grade(prompt, "xs = list(map(float, input().split()))\nprint(round(sum(xs) / len(xs), 2))").passed


def test_bundled_humaneval():
    task = load_task("humaneval", limit=12)
    for prompt in task.prompts():
        assert task.grade(prompt, task.reference_solutions(prompt)[0]).passed, prompt.id
        assert not task.grade(prompt, "    return None\n").passed, prompt.id


def test_parquet_and_datasets_directory(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [json.loads(line) for line in (FIXTURES / "mbpp.jsonl").read_text().splitlines()]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "mbpp.parquet")
    from_parquet = load_task(f"mbpp:{tmp_path / 'mbpp.parquet'}")
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "mbpp_hf"))
    from_hf = load_task(f"mbpp:{tmp_path / 'mbpp_hf'}")
    for task in (from_parquet, from_hf):
        prompt = task.prompts()[0]
        assert task.grade(prompt, task.reference_solutions(prompt)[0]).passed
    assert [p.id for p in from_parquet.prompts()] == [p.id for p in from_hf.prompts()] == ["901", "902"]


def test_bad_records_name_file_record_and_field(tmp_path):
    bad = tmp_path / "cc.jsonl"
    good = (FIXTURES / "codecontests.jsonl").read_text().splitlines()[0]
    broken = json.loads(good)
    del broken["description"]
    bad.write_text(good + "\n" + json.dumps(broken) + "\n")
    with pytest.raises(RecordError, match=r"cc\.jsonl:2: record '1000_A\. Sum of two': field 'description' is missing"):
        load_task(f"codecontests:{bad}")
    bad.write_text(good + "\n{not json\n")
    with pytest.raises(RecordError, match=r"cc\.jsonl:2: not valid JSON"):
        load_task(f"codecontests:{bad}")
    mbpp = tmp_path / "mbpp.jsonl"
    mbpp.write_text(json.dumps({"task_id": 7, "text": "x", "test_list": "assert f() == 1"}) + "\n")
    with pytest.raises(RecordError, match=r"mbpp\.jsonl:1: record 7: field 'test_list' must be list, got str"):
        load_task(f"mbpp:{mbpp}")
    with pytest.raises(RecordError, match="no such file"):
        list(read_records(tmp_path / "missing.jsonl"))
    with pytest.raises(ValueError, match="unknown task 'nonsense'"):
        load_task("nonsense")


# --- math -------------------------------------------------------------------------------------
def test_math_fixture_equivalent_forms():
    task = load_task(f"math:{FIXTURES / 'math.jsonl'}")
    answers = {"m1": ["\\boxed{0.5}", "the answer is \\boxed{1/2}"], "m2": ["x = \\boxed{4}"],
               "m3": ["\\boxed{(x+1)^2}", "$x^2+2x+1$"], "m4": ["\\boxed{\\sqrt{8}}"]}
    wrong = {"m1": "\\boxed{1/3}", "m2": "\\boxed{5}", "m3": "\\boxed{x^2+1}", "m4": "\\boxed{3}"}
    for prompt in task.prompts():
        assert task.grade(prompt, task.reference_solutions(prompt)[0]).passed, prompt.id
        for answer in answers[prompt.id]:
            assert task.grade(prompt, answer).passed, (prompt.id, answer)
        assert not task.grade(prompt, wrong[prompt.id]).passed
    assert not answers_match("2", "no answer here")


# --- reasoning-gym and import paths -----------------------------------------------------------
def test_gym_task():
    pytest.importorskip("reasoning_gym")
    task = load_task("gym:basic_arithmetic", size=8, seed=1)
    for prompt in task.prompts():
        assert task.grade(prompt, f"<answer>{task.reference_solutions(prompt)[0]}</answer>").passed
        assert not task.grade(prompt, "<answer>not a number</answer>").passed
    with pytest.raises(ValueError, match="no_such_dataset"):
        load_task("gym:no_such_dataset")


def test_gym_answer_regex_reads_the_last_match():
    pytest.importorskip("reasoning_gym")
    task = load_task("gym:basic_arithmetic", size=4, seed=1, min_terms=2, max_terms=2, answer_regex=r"-?\d+",
                     prompt_suffix=" Reply with only the number.")
    plain = load_task("gym:basic_arithmetic", size=4, seed=1, min_terms=2, max_terms=2)
    for prompt, other in zip(task.prompts(), plain.prompts()):
        answer = task.reference_solutions(prompt)[0]
        assert prompt.text == other.text + " Reply with only the number."
        assert task.grade(prompt, f"1 + 1 = 2, so it is {answer}").passed
        assert not plain.grade(other, f"1 + 1 = 2, so it is {answer}").passed  # the last line is not the answer
        assert not task.grade(prompt, f"{answer} is wrong; it is {answer}1").passed
        assert task.grade(prompt, f"<answer>{answer}</answer> not 7").passed  # tags win
    with pytest.raises(ValueError, match="answer_regex"):
        load_task("gym:basic_arithmetic", size=2, answer_regex="(")


def test_user_task_and_reward_function_by_import_path(tmp_path, monkeypatch):
    (tmp_path / "my_tasks.py").write_text(
        "from softrl.tasks import Grade, Prompt, Task\n"
        "class Echo(Task):\n"
        "    def __init__(self, word='hi'):\n"
        "        self.word = word\n"
        "    def prompts(self):\n"
        "        return [Prompt('e0', 'say ' + self.word)]\n"
        "    def grade(self, prompt, response):\n"
        "        ok = response.strip() == self.word\n"
        "        return Grade(float(ok), ok)\n"
        "def longer_is_better(prompt, response):\n"
        "    return min(len(response) / 10, 1.0)\n"
    )
    (tmp_path / "prompts.jsonl").write_text('{"id": "p1", "prompt": "write"}\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    task = load_task("my_tasks:Echo", word="yo")
    assert task.grade(task.prompts()[0], "yo").passed and not task.grade(task.prompts()[0], "no").passed
    fn_task = load_task("my_tasks:longer_is_better", prompts=str(tmp_path / "prompts.jsonl"))
    prompt = fn_task.prompts()[0]
    assert re.fullmatch(r"longer_is_better\.[0-9a-f]{8}:p1", prompt.id) and fn_task.grade(prompt, "x" * 20).passed and fn_task.grade(prompt, "xy").reward == 0.2
    with pytest.raises(ValueError, match="needs prompts=PATH"):
        load_task("my_tasks:longer_is_better")
    with pytest.raises(ValueError, match="cannot import task my_tasks:Missing"):
        load_task("my_tasks:Missing")
    sys.modules.pop("my_tasks", None)


# --- a bad problem file: one line naming the record and the problem, never a problem dropped ----------
def _codecontests_file(tmp_path, edit) -> Path:
    records = [json.loads(line) for line in (FIXTURES / "codecontests.jsonl").read_text().splitlines()]
    edit(records)
    path = tmp_path / "problems.jsonl"
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in records) + "\n")
    return path


def _break_solution(records):
    records[1]["solutions"]["solution"][0] = "print(0)\n"


def _drop_tests(records):
    for key in ("public_tests", "private_tests", "generated_tests"):
        records[1].pop(key)


def _number_as_solution(records):
    records[1]["solutions"]["solution"][0] = 5


def _malform(records):
    records[1] = '{"name": "1000_B. Column sums", "description": '


@pytest.mark.parametrize("edit, message", [
    (_break_solution, r"problems.jsonl:2: problem '1000_B. Column sums': known solution 1 of 1 fails its own tests "
                      r"\(wrong_answer on test 1\)"),
    (_drop_tests, r"problems.jsonl:2: record '1000_B. Column sums': field 'public_tests' is missing"),
    (_malform, r"problems.jsonl:2: .*JSON"),
    (_number_as_solution, r"problems.jsonl:2: problem '1000_B. Column sums': known solution 1 is a int, not a program"),
])
def test_bad_problem_file_is_one_line_naming_the_problem(tmp_path, edit, message):
    from softrl.tasks.records import RecordError

    with pytest.raises(RecordError, match=message) as caught:
        load_task(f"codecontests:{_codecontests_file(tmp_path, edit)}")
    assert "\n" not in str(caught.value)


def test_known_solutions_checked_once_and_skippable(tmp_path, monkeypatch):
    from softrl.tasks import code

    path = _codecontests_file(tmp_path, _break_solution)
    assert len(load_task(f"codecontests:{path}", check_solutions="none").prompts()) == 2  # trusted: nothing run
    good = _codecontests_file(tmp_path, lambda records: None)
    load_task(f"codecontests:{good}")
    monkeypatch.setattr(code, "run_problem", lambda *a: pytest.fail("a checked file was run again"))
    assert len(load_task(f"codecontests:{good}").prompts()) == 2
