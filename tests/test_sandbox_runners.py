"""Warm sandbox runners: kept between calls, yet each call's programs start from nothing of an earlier one's."""

import os
import warnings
from concurrent.futures import ThreadPoolExecutor

import pytest

from softrl.rewards import sandbox as sandbox_module
from softrl.rewards.sandbox import Sandbox, probe, runner_pids

BACKENDS = [b for b, (ok, _) in probe().items() if ok]
pytestmark = pytest.mark.skipif(not BACKENDS, reason="no sandbox backend works on this machine")


@pytest.fixture(params=BACKENDS)
def sandbox(request):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return Sandbox(request.param)


def test_a_runner_is_kept_and_each_call_is_a_fresh_fork_of_it(sandbox):
    """The runner process stays; the process a call's tests are forked from is new every call (so no call's
    programs or inputs are in the memory of the next call's programs)."""
    sandbox.run("print(1)")
    before = runner_pids()
    parents = {sandbox.run("import os\nprint(os.getppid())").stdout for _ in range(3)}
    assert runner_pids() == before and len(parents) == 3


def test_a_file_left_in_scratch_is_gone_for_the_next_call():
    if "bwrap" not in BACKENDS:
        pytest.skip("only bubblewrap gives programs a writable scratch")
    sandbox = Sandbox("bwrap")
    assert sandbox.run("open('left', 'w').write('x')\nimport os\nprint(os.listdir('.'))").stdout.strip() == "['left']"
    assert sandbox.run("import os\nprint(os.listdir('.'))").stdout.strip() == "[]"


def test_a_scratch_that_cannot_be_emptied_retires_its_runner():
    if "bwrap" not in BACKENDS:
        pytest.skip("only bubblewrap gives programs a writable scratch")
    sandbox = Sandbox("bwrap")
    sandbox.run("print(1)")
    before = runner_pids()
    locked = "import os\nos.mkdir('d')\nopen('d/f', 'w').write('x')\nos.chmod('d', 0)\nprint('ok')"
    assert sandbox.run(locked).stdout.strip() == "ok"
    assert sandbox.run("import os\nprint(os.listdir('.'))").stdout.strip() == "[]"
    assert not before <= runner_pids()


def test_a_runner_started_on_a_thread_that_ended_still_answers(sandbox):
    """bubblewrap's --die-with-parent follows the thread that started it: runners are started from one
    long-lived thread, not from a call's."""
    with ThreadPoolExecutor(max_workers=24) as pool:  # more runners than are idle: some start on these threads
        assert all(r.stdout == "2\n" for r in pool.map(lambda _: sandbox.run("print(1 + 1)"), range(24)))
    kept = runner_pids()
    results = [sandbox.run("print(3)") for _ in range(20)]
    assert all(r.status == "passed" and r.stdout == "3\n" for r in results), [r.stderr[-300:] for r in results]
    assert runner_pids() == kept


def test_calls_beyond_the_runners_wait_for_one(sandbox, monkeypatch):
    monkeypatch.setattr(sandbox_module, "MAX_RUNNERS", 1)
    monkeypatch.setattr(sandbox_module, "_RUNNERS", None)  # a fresh set, under the lowered cap
    with ThreadPoolExecutor(max_workers=6) as pool:
        out = list(pool.map(lambda i: sandbox.run(f"print({i})").stdout, range(12)))
    assert out == [f"{i}\n" for i in range(12)] and len(runner_pids()) == 1


def test_a_forked_process_starts_runners_of_its_own(sandbox):
    sandbox.run("print(1)")
    parents = runner_pids()
    pid = os.fork()
    if pid == 0:  # the parent's runners are not the child's to write to
        ok = sandbox.run("print(5)").stdout == "5\n" and runner_pids() and not runner_pids() & parents
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0 and runner_pids() == parents
