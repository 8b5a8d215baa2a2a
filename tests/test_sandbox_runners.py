"""Warm sandbox runners: kept between calls, yet each call's programs start from nothing of an earlier one's."""

import os
import tempfile
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

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


def test_a_runner_whose_scratch_changed_retires():
    """What a job leaves in scratch that the runner cannot undo (here its mode, changed from outside, as a
    program cannot) retires the runner after that job: the next call gets a new one."""
    if "landlock" not in BACKENDS:
        pytest.skip("a Landlock runner's scratch is a folder of the host's")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sandbox = Sandbox("landlock")
    sandbox.run("print(1)")
    (runner,) = sandbox_module._runners().idle[("landlock", sandbox.limits.scratch_mb)]
    os.chmod(runner.scratch, 0o750)
    assert sandbox.run("print(2)").stdout == "2\n"  # this call is answered; its runner then stops
    assert runner.proc.poll() is not None
    assert runner.proc.pid not in runner_pids() and sandbox.run("print(3)").stdout == "3\n"


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


NEEDS_BWRAP = pytest.mark.skipif("bwrap" not in BACKENDS, reason="bubblewrap gives programs the writable places")


@NEEDS_BWRAP
@pytest.mark.parametrize("leave, look", [
    ("open('/dev/shm/x', 'w').write('a')", "import os\nprint(os.path.exists('/dev/shm/x'))"),
    ("open('/dev/x', 'w').write('a')", "import os\nprint(os.path.exists('/dev/x'))"),
    ("import os\nos.setxattr('.', 'user.note', b'a')", "import os\nprint(os.listxattr('.'))"),
    ("import os\nos.chmod('.', 0o555)", "open('f', 'w').write('a')\nprint(False)"),
    ("import os\nos.chmod('.', 0o1777)", "import os, stat\nprint(stat.S_IMODE(os.stat('.').st_mode) == 0o1777)"),
    ("open('/leak', 'w').write('a')", "import os\nprint(os.path.exists('/leak'))"),
])
def test_nothing_a_program_leaves_reaches_the_next_call(leave, look):
    """Places beside scratch (/, /dev, /dev/shm) are read-only; a program cannot change scratch itself
    (its mode, its extended attributes), and a runner whose scratch changed all the same would retire.
    The next call sees none of it."""
    sandbox = Sandbox("bwrap")
    sandbox.run(leave)
    after = sandbox.run(look)
    assert after.status == "passed" and after.stdout.strip() in ("False", "[]"), (after.status, after.stderr[-300:])


def test_system_v_and_posix_message_ipc_are_refused(sandbox):
    """Such objects outlive the program (in its runner's IPC namespace, or the host's under Landlock)."""
    result = sandbox.run("import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
                         "print(libc.shmget(0, 1 << 20, 0o1600), libc.msgget(0, 0o1600), libc.semget(0, 1, 0o1600), "
                         "ctypes.get_errno())")
    assert result.stdout.split() == ["-1", "-1", "-1", "1"], result  # EPERM


def test_a_call_that_raises_gives_its_runner_back(sandbox, monkeypatch):
    """Whatever a call raises, its runner is closed and its place freed: the next call does not wait."""
    monkeypatch.setattr(sandbox_module, "MAX_RUNNERS", 1)
    monkeypatch.setattr(sandbox_module, "_RUNNERS", None)

    class Unsendable(str):
        pass

    for _ in range(2):
        with pytest.raises(ValueError):
            sandbox.run("print(1)", Unsendable("x"))
    ask = sandbox_module.Runner.ask
    monkeypatch.setattr(sandbox_module.Runner, "ask", lambda *a: (_ for _ in ()).throw(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        sandbox.run("print(1)")
    monkeypatch.setattr(sandbox_module.Runner, "ask", ask)
    with ThreadPoolExecutor(max_workers=1) as pool:
        assert pool.submit(sandbox.run, "print(4)").result(timeout=20).stdout == "4\n"


def test_a_runner_freed_for_one_size_reaches_its_waiter_past_another_sizes(monkeypatch):
    """Waiters for different scratch sizes share one condition: a runner given back wakes them all."""
    from softrl.rewards.sandbox import Limits

    monkeypatch.setattr(sandbox_module, "MAX_RUNNERS", 1)
    monkeypatch.setattr(sandbox_module, "_RUNNERS", None)
    backend = BACKENDS[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        big, small = Sandbox(backend, Limits(scratch_mb=64)), Sandbox(backend, Limits(scratch_mb=32))
    slow = "import time\ntime.sleep(0.6)\nprint(1)"
    with ThreadPoolExecutor(max_workers=4) as pool:
        calls = [pool.submit(big.run, slow), pool.submit(small.run, slow)]
        time.sleep(0.2)  # both sizes at their cap; a waiter for each, the big one first
        calls += [pool.submit(big.run, "print(2)"), pool.submit(small.run, "print(3)")]
        assert [c.result(timeout=20).stdout for c in calls] == ["1\n", "1\n", "2\n", "3\n"]


def test_a_runner_that_died_idle_is_not_blamed_on_the_next_program(sandbox):
    import signal

    sandbox.run("print(1)")
    for pid in runner_pids():
        os.killpg(pid, signal.SIGKILL)
    time.sleep(0.3)  # dead by now (bubblewrap's inner processes follow it a moment later)
    result = sandbox.run("print(2)")
    assert result.status == "passed" and result.stdout == "2\n", result


def test_calls_work_where_the_host_holds_fds_past_1024(sandbox, monkeypatch):
    """Select() cannot wait on fd numbers of 1024 and more; a busy host's runners get such numbers."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"this process may open {hard} files")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    monkeypatch.setattr(sandbox_module, "_RUNNERS", None)  # new runners, started while the low fds are taken
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        assert sandbox.run("print(5)").stdout == "5\n"
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_without_scoped_signals_a_runner_serves_one_call(sandbox, monkeypatch):
    """Under Landlock ABI < 6 a program could stop or kill its runner: no runner is kept for the next."""
    monkeypatch.setattr(sandbox_module, "landlock_abi", lambda: 5)
    monkeypatch.setattr(sandbox_module, "_RUNNERS", None)
    assert sandbox.run("print(1)").stdout == "1\n" and not runner_pids()


def test_runners_answer_after_the_main_thread_ended_and_leave_no_scratch_behind(tmp_path):
    """Runners are started from a daemon thread of their own: a thread still calling after the main thread
    returned is answered. A Landlock runner's scratch folder is gone once its host process ended."""
    import subprocess
    import sys

    script = tmp_path / "late.py"
    script.write_text(
        "import threading, time, warnings\nwarnings.simplefilter('ignore')\n"
        "from softrl.rewards.sandbox import Sandbox, probe\n"
        "backends = [b for b, (ok, _) in probe().items() if ok]\n"
        "sb = Sandbox(backends[0])\nprint(sb.run('print(1)').status, flush=True)\n"
        "def later():\n    time.sleep(0.5)\n"
        "    print(*[Sandbox(b).run('print(2)').status for b in backends], flush=True)\n"
        "threading.Thread(target=later).start()\n")
    folders = lambda: {p.name for p in Path(tempfile.gettempdir()).glob("softrl-sandbox-*")}  # noqa: E731
    before = folders()
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["passed"] * (1 + len(BACKENDS)), out.stderr[-500:]
    deadline = time.monotonic() + 10
    while folders() - before and time.monotonic() < deadline:  # the runners see their host's end, then go
        time.sleep(0.1)
    assert not folders() - before


METADATA = """
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
target = sys.stdin.readline().strip()
changed = []
for name, call in (("chmod", lambda: os.chmod(target, 0o777)), ("chown", lambda: os.chown(target, 1234, 1234)),
                   ("utime", lambda: os.utime(target, (1, 1))), ("setxattr", lambda: os.setxattr(target, "user.x", b"1")),
                   ("renice runner", lambda: os.setpriority(os.PRIO_PROCESS, os.getppid(), 19)),
                   ("sched runner", lambda: os.sched_setaffinity(os.getppid(), {0}))):
    try:
        call()
        changed.append(name)
    except OSError:
        pass
fd = os.open(".", os.O_RDONLY)
for request in (0x40086602, 0xFFFFFFFF40086602):  # FS_IOC_SETFLAGS, and with high bits the kernel ignores
    flags = ctypes.c_long(0xC0)
    if libc.ioctl(fd, ctypes.c_ulong(request), ctypes.byref(flags)) == 0:
        changed.append(hex(request))
print("changed:", changed)
"""


def test_a_program_changes_no_files_metadata_and_no_process_scheduling(sandbox, tmp_path):
    """Landlock does not govern a file's mode, owner, times or attributes, nor another process's priority:
    seccomp refuses them (under Landlock the host's own files were reachable; in bubblewrap, scratch)."""
    victim = tmp_path / "victim"
    victim.write_text("x")
    victim.chmod(0o600)
    before = victim.stat()
    for target in (str(victim), "."):
        result = sandbox.run(METADATA, target + "\n")
        assert result.stdout.strip() == "changed: []", (result.stdout, result.stderr[-300:])
    after = victim.stat()
    assert (after.st_mode, after.st_uid, after.st_mtime) == (before.st_mode, before.st_uid, before.st_mtime)


@NEEDS_BWRAP
def test_a_file_in_the_way_of_the_next_tests_input_changes_nothing():
    """Tests' inputs reach the program from memory, not from a file in scratch an earlier test could block."""
    program = "import os\nx = input()\nif x == '1':\n    os.mkdir('.stdin')\n    os.mkfifo('in')\nprint(x)"
    results = Sandbox("bwrap").run_tests(program, [("1", "1"), ("2", "2"), ("3", "3")])
    assert [r.status for r in results] == ["passed"] * 3, [(r.status, r.stderr[-200:]) for r in results]
