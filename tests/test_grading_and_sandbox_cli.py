"""The documented grading rules, and `softrl sandbox run | test | probe` as a user runs them."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from softrl.rewards.grading import outputs_match, strict_checks
from softrl.rewards.sandbox import Limits, Sandbox, probe

SOFTRL = shutil.which("softrl", path=os.path.dirname(sys.executable)) or shutil.which("softrl")
HAS_BACKEND = any(ok for ok, _ in probe().values())


def test_outputs_match_rule():
    assert outputs_match("1 2\n3\n", "1 2 3")  # whitespace and line breaks do not matter
    assert not outputs_match("1 2", "1 2 3") and not outputs_match("YES", "yes")
    assert outputs_match("0.3333333", "0.333333333") and outputs_match("1e6", "1000000.0")
    assert not outputs_match("0.34", "0.333333") and not outputs_match("3", "3.5")
    assert not outputs_match("3.0", "3")  # an integer answer must be printed as one
    assert not outputs_match("nan", "1.0") and not outputs_match("inf", "1e308")


def test_strict_checks_rewrites_comparisons():
    out = strict_checks("assert f(1) == 2\nassert g() != 3\nassert 1 < h() <= 3\nassert ok()\nx = a == b")
    assert "__softrl_eq__(f(1), 2)" in out and "not __softrl_eq__(g(), 3)" in out
    assert "__softrl_plain__(h())" in out and "__softrl_plain__(ok())" in out
    assert "x = a == b" in out  # only asserts are rewritten
    with pytest.raises(ValueError, match="does not parse"):
        strict_checks("assert (")


@pytest.mark.skipif(not HAS_BACKEND, reason="no sandbox backend works here")
def test_strict_equality_semantics():
    box = Sandbox(limits=Limits(wall_s=3))
    good = ("assert f(0) == 2.0\nassert [f(0)] == [2]\nassert {'a': (1, [f(0)])} == {'a': (1, [2])}\n"
            "assert f(0) != 3\nassert {1, 2} == {2, 1}")
    assert box.run_checks("def f(x):\n    return 2", good).passed
    for source, checks in [("def f(x):\n    return True", "assert f(0) == 1"),
                           ("def f(x):\n    return (1, 2)", "assert f(0) == [1, 2]"),
                           ("import collections\ndef f(x):\n    return collections.OrderedDict(a=1)", "assert f(0) == {'a': 1}")]:
        assert box.run_checks(source, checks).status == "wrong_answer", (source, checks)


@pytest.mark.skipif(not HAS_BACKEND, reason="no sandbox backend works here")
def test_stop_at_first_error_skips_the_rest():
    box = Sandbox(limits=Limits(wall_s=0.5))
    source = "n = int(input())\nwhile n == 2:\n    pass\nprint(n)"
    tests = [("1", "1"), ("3", "4"), ("2", "2"), ("1", "1"), ("5", "5")]
    stopped = [r.status for r in box.run_tests(source, tests, stop_at_first_error=True)]
    # a wrong answer is not an error: the timeout on the third test is what stops the run
    assert stopped == ["passed", "wrong_answer", "time_limit", "skipped", "skipped"]
    assert [r.status for r in box.run_tests(source, tests)] == ["passed", "wrong_answer", "time_limit", "passed", "passed"]


@pytest.mark.skipif(SOFTRL is None or not HAS_BACKEND, reason="needs the console script and a backend")
def test_sandbox_cli(tmp_path):
    (tmp_path / "add.py").write_text("a, b = map(int, input().split())\nprint(a + b)\n")
    (tmp_path / "in.txt").write_text("3 4\n")
    (tmp_path / "tests.jsonl").write_text('{"input": "1 2", "output": "3"}\n{"input": "2 2", "output": "5"}\n')

    def softrl(*args):
        return subprocess.run([SOFTRL, "sandbox", *args], cwd=tmp_path, capture_output=True, text=True, timeout=120)

    run = softrl("run", "add.py", "--stdin", "in.txt", "--timeout", "2", "--memory-mb", "256", "--json")
    result = json.loads(run.stdout)
    assert run.returncode == 0 and result["status"] == "passed" and result["stdout"] == "7\n"
    assert {"status", "stdout", "stderr", "exit_code", "wall_s"} <= set(result)
    loop = softrl("run", "add.py", "--json", "--timeout", "1")  # no stdin: EOFError
    assert loop.returncode == 1 and json.loads(loop.stdout)["status"] == "runtime_error"
    tested = softrl("test", "add.py", "--tests", "tests.jsonl", "--json")
    report = json.loads(tested.stdout)
    assert tested.returncode == 1 and report["passed"] is False
    assert [r["status"] for r in report["results"]] == ["passed", "wrong_answer"]
    probed = json.loads(softrl("probe", "--json").stdout)
    assert probed["chosen"] in ("bwrap", "landlock") and probed["backends"][probed["chosen"]]["works"]
    (tmp_path / "bad.jsonl").write_text('{"input": "1"}\n')
    bad = softrl("test", "add.py", "--tests", "bad.jsonl")
    assert bad.returncode == 2 and bad.stderr.strip() == (
        "error: bad.jsonl:1: a test needs string fields 'input' and 'output'")
    assert softrl("run", "add.py", "--timeout", "-1").returncode == 2


def test_limits_and_backend_arguments_are_named():
    with pytest.raises(ValueError, match="wall_s"):
        Limits(wall_s=0)
    with pytest.raises(ValueError, match="memory_mb"):
        Limits(memory_mb=16)
    with pytest.raises(ValueError, match="backend"):
        Sandbox("docker")
    with pytest.raises(ValueError, match="unsafe=True"):
        Sandbox("unsafe")
