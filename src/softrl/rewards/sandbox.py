"""Run untrusted Python programs: bubblewrap + seccomp + rlimits, or Landlock + seccomp + rlimits.

One sandbox runs all tests of a problem: a small runner inside (`_runner.py`) forks one child per
test. Runners stay up between calls (`Runners`, a few per process), each call's job in a fresh fork of
its runner with an emptied scratch, so the sandbox start-up is paid once per runner, not per call. The
host never trusts what comes back beyond facts (exit code, output, times): statuses are decided here,
outputs compared here.

Statuses: passed | wrong_answer | runtime_error | time_limit | memory_limit | output_limit |
sandbox_error. A sandbox failure is `sandbox_error`, never a silent wrong answer.
"""

from __future__ import annotations

import base64
import ctypes
import dataclasses
import functools
import json
import marshal
import os
import queue
import secrets
import selectors
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

from softrl.rewards.grading import HELPER_NAMES, HELPERS, outputs_match, strict_checks
from softrl.rewards.seccomp import seccomp_bpf

STATUSES = ("passed", "wrong_answer", "runtime_error", "time_limit", "memory_limit", "output_limit", "sandbox_error")
BACKENDS = ("bwrap", "landlock", "unsafe")
RUNNER = Path(__file__).with_name("_runner.py")
SETUP_FAILED, MEMORY_ERROR = 121, 120  # exit codes the runner uses
LANDLOCK_LOST = (
    "no namespaces (the program shares the host's PID, IPC and network namespaces and its uid; "
    "UDP and raw sockets are refused by seccomp alone), no private /tmp and no writable scratch "
    "(a size-limited tmpfs cannot be mounted without namespaces, so programs may not write files)"
)


@dataclass(frozen=True)
class Limits:
    """Per-test limits. `cpu_s` defaults to `wall_s`."""

    wall_s: float = 5.0
    cpu_s: float | None = None
    memory_mb: int = 512
    output_bytes: int = 1 << 20
    file_size_mb: int = 16
    open_files: int = 64
    scratch_mb: int = 64

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if value is not None and not (isinstance(value, (int, float)) and value > 0):
                raise ValueError(f"limit {field.name} must be a positive number, got {field.name}={value!r}")
        if self.memory_mb < 64:
            raise ValueError(f"limit memory_mb must be >= 64 (the interpreter needs it), got {self.memory_mb}")

    def for_runner(self) -> dict:
        return {"wall_s": self.wall_s, "cpu_s": self.cpu_s or self.wall_s, "memory_mb": self.memory_mb,
                "output_bytes": self.output_bytes, "file_size_mb": self.file_size_mb,
                "open_files": self.open_files, "processes": 64}


@dataclass
class ExecResult:
    status: str
    stdout: str
    stderr: str
    exit_code: int | None
    wall_s: float
    cpu_s: float

    @property
    def passed(self) -> bool:
        return self.status == "passed"

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


class SandboxError(RuntimeError):
    """The sandbox itself could not be set up (not the program's fault)."""


@functools.lru_cache(maxsize=1)
def landlock_abi() -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    return max(libc.syscall(444, None, 0, 1), 0)


def _python() -> str:
    return os.path.realpath(sys.executable)


def _read_paths() -> list[str]:
    """What the interpreter needs to start, read-only: the system libraries and its own prefix."""
    paths = ["/usr", "/lib", "/lib64", "/bin", sys.base_prefix, os.path.dirname(_python()), str(RUNNER)]
    return list(dict.fromkeys(p for p in paths if os.path.exists(p)))


def _bwrap_command(scratch_mb: int) -> list[str]:
    cmd = ["bwrap", "--unshare-all", "--unshare-user", "--uid", "65534", "--gid", "65534", "--die-with-parent",
           "--new-session", "--clearenv", "--cap-drop", "ALL"]
    for path in _read_paths():
        if path == str(RUNNER):
            continue
        if os.path.islink(path):  # merged /usr: /lib -> usr/lib
            cmd += ["--symlink", os.readlink(path), path]
        else:
            cmd += ["--ro-bind", path, path]
    # / and /dev read-only (device nodes still work): no file outside scratch outlives a job in a warm runner
    cmd += ["--ro-bind", str(RUNNER), "/sandbox/runner.py", "--dev", "/dev", "--remount-ro", "/dev",
            "--size", str(scratch_mb * 1024 * 1024), "--tmpfs", "/tmp", "--chdir", "/tmp",
            "--remount-ro", "/", "--", _python(), "-I", "-S", "/sandbox/runner.py", "/tmp"]
    return cmd


class Sandbox:
    """Runs untrusted programs with limits. `backend`: auto | bwrap | landlock | unsafe."""

    def __init__(self, backend: str = "auto", limits: Limits | None = None, *, unsafe: bool = False):
        if backend not in ("auto", *BACKENDS):
            raise ValueError(f"backend must be one of auto, {', '.join(BACKENDS)}; got backend={backend!r}")
        if backend == "unsafe" and not unsafe:
            raise ValueError("backend='unsafe' runs programs unsandboxed and needs unsafe=True")
        self.limits = limits or Limits()
        self.backend = backend if backend != "auto" else choose_backend(unsafe)
        if self.backend == "landlock":
            warnings.warn(f"sandbox: bubblewrap unavailable, using Landlock + seccomp + rlimits; lost: {LANDLOCK_LOST}",
                          stacklevel=2)

    # --- public -----------------------------------------------------------------------------
    def run(self, source: str, stdin: str = "", limits: Limits | None = None) -> ExecResult:
        """Run once; `passed` means it exited with status 0 within its limits."""
        return self._execute(source, [{"input": stdin}], limits)[0]

    def run_tests(self, source: str, tests: list[tuple[str, str]], limits: Limits | None = None,
                  stop_at_first_error: bool = False) -> list[ExecResult]:
        """stdin/stdout tests `(input, expected_output)`, all in one sandbox; outputs compared token-wise.
        With `stop_at_first_error`, the tests after the first that crashed or ran out of a limit are not
        run (status "skipped"): a grader that only needs pass/fail does not wait out every timeout."""
        results = self._execute(source, [{"input": i} for i, _ in tests], limits, stop_at_first_error=stop_at_first_error)
        for result, (_, expected) in zip(results, tests):
            if result.status == "passed" and not outputs_match(result.stdout, expected):
                result.status = "wrong_answer"
        return results

    def run_checks(self, source: str, checks: str, limits: Limits | None = None) -> ExecResult:
        """Function-style problem: the solution, then `checks` (asserts, already made strict), then a
        fresh nonce printed by the runner. No nonce at the end of stdout means the checks did not all run."""
        nonce = secrets.token_hex(16)
        result = self._execute(source, [{"input": "", "check": strict_checks(checks)}], limits, nonce)[0]
        if result.status == "passed":
            body, _, last = result.stdout.rstrip("\n").rpartition("\n")
            if last != nonce:
                result.status = "wrong_answer"
            result.stdout = body if last == nonce else result.stdout
        elif result.status == "runtime_error" and result.stderr.rstrip().rpartition("\n")[2].startswith("AssertionError"):
            result.status = "wrong_answer"  # a check failed (the program can only choose among failures)
        return result

    # --- execution --------------------------------------------------------------------------
    def _execute(self, source: str, tests: list[dict], limits: Limits | None, nonce: str = "",
                 stop_at_first_error: bool = False) -> list[ExecResult]:
        limits = limits or self.limits
        warm = self.backend != "unsafe" and landlock_abi() >= 6
        job = {
            "source": source, "tests": tests, "limits": limits.for_runner(), "nonce": nonce,
            "bpf": b"" if self.backend == "unsafe" else seccomp_bpf(), "child_landlock": warm,
            "landlock_runner": self.backend == "landlock", "read_paths": _read_paths(),
            "helpers": HELPERS, "helper_names": HELPER_NAMES, "stop_at_first_error": stop_at_first_error,
        }
        frame = marshal.dumps(job)  # what cannot be sent fails here, before a runner is taken
        deadline = time.monotonic() + len(tests) * (limits.wall_s + 0.5) + 10
        pool = _runners()
        for _ in range(2):  # once more on a fresh runner where the first died before the job started
            try:
                runner = pool.take(self.backend, limits.scratch_mb)
            except (OSError, RuntimeError) as e:
                return [_sandbox_error(f"could not start the sandbox: {e}") for _ in tests]
            end = "lost"
            try:
                lines, end = runner.ask(frame, deadline - time.monotonic())
            finally:  # reused only where the job ended cleanly, and where the program could not signal it
                pool.give_back(runner, reusable=end == "END" and warm)
            if end != "unstarted":
                break
        results = []
        for i in range(len(tests)):
            if stop_at_first_error and results and results[-1].status != "passed" and i >= len(lines):
                results.append(ExecResult("skipped", "", "", None, 0.0, 0.0))
                continue
            try:
                results.append(_classify(json.loads(lines[i]), limits))
            except (IndexError, ValueError, KeyError):
                # the runner is gone: the program killed it, or the sandbox failed to start
                reason = runner.stderr.strip()[-2000:] or f"runner exit {runner.returncode}"
                results.append(_runner_lost(reason, runner.returncode))
        return results


MAX_RUNNERS = 16  # warm runners a process keeps per backend and scratch size; a call beyond them waits


class Runner:
    """One runner process (`_runner.py`), in bubblewrap or not, answering one job at a time; kept warm between
    calls where the programs cannot signal it (Landlock's scoped signals, ABI >= 6), so that its start-up (a
    namespace, an interpreter: some 30 ms, more than a program's tests) is paid once, not per call."""

    def __init__(self, backend: str, scratch_mb: int, start: Callable[..., subprocess.Popen]):
        self.backend, self.scratch_mb = backend, scratch_mb
        self.stderr, self.returncode = "", None
        if backend == "bwrap":  # its own tmpfs at /tmp
            self.scratch, cmd = "/tmp", _bwrap_command(scratch_mb)
        else:  # a folder of the host's, the runner's working directory, which the runner removes at its end
            self.scratch = tempfile.mkdtemp(prefix="softrl-sandbox-")
            cmd = [_python(), "-I", "-S", str(RUNNER), self.scratch, "remove"]
        try:
            self.proc = start(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              cwd=None if backend == "bwrap" else self.scratch,
                              env=None if backend == "bwrap" else {}, start_new_session=True)
        except BaseException:
            self._remove_scratch()
            raise
        os.set_blocking(self.proc.stdin.fileno(), False)  # a write waits under the call's deadline

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def ask(self, job: bytes, budget: float) -> tuple[list[str], str]:
        """A job's result lines (one per test run) and how it ended: END (this runner can take another),
        DIRTY (its scratch is not as it was), timeout (over `budget` seconds), unstarted (the runner was
        gone before it read the job) or lost (it died during the job: the program killed it, or the sandbox
        failed). Any ending but END closes it."""
        out, end = self._exchange(job, time.monotonic() + budget)
        lines = out.decode(errors="replace").splitlines()
        lines = lines[1:] if lines[:1] == ["START"] else lines
        if end != "END":
            self.close()
        return (lines[:-1] if end in ("END", "DIRTY") else lines), end

    def _exchange(self, job: bytes, deadline: float) -> tuple[bytearray, str]:
        """Write the framed job, read until the runner's last line: (what it wrote, how it ended)."""
        frame = memoryview(struct.pack("<I", len(job)) + job)
        out = bytearray()
        with selectors.DefaultSelector() as waiting:  # poll or epoll: no limit on fd numbers, unlike select()
            waiting.register(self.proc.stdin, selectors.EVENT_WRITE)
            while frame:
                if time.monotonic() > deadline or not waiting.select(deadline - time.monotonic()):
                    return out, "timeout"
                try:
                    frame = frame[os.write(self.proc.stdin.fileno(), frame):]
                except BlockingIOError:
                    continue
                except OSError:
                    return out, "unstarted"
            waiting.unregister(self.proc.stdin)
            waiting.register(self.proc.stdout, selectors.EVENT_READ)
            while not (out.endswith(b"END\n") or out.endswith(b"DIRTY\n")):
                left = deadline - time.monotonic()
                if left <= 0:
                    return out, "timeout"
                if waiting.select(left):
                    chunk = os.read(self.proc.stdout.fileno(), 1 << 16)
                    if not chunk:
                        return out, "lost" if out.startswith(b"START\n") else "unstarted"
                    out += chunk
        return out, "END" if out.endswith(b"END\n") else "DIRTY"

    def close(self) -> None:
        """Kill it (bubblewrap takes its namespace down with it) and keep what it said on stderr."""
        if self.proc.stderr.closed:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.returncode = self.proc.wait()
        self.stderr = self.proc.stderr.read().decode(errors="replace")
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            try:
                stream.close()
            except OSError:
                pass
        self._remove_scratch()

    def _remove_scratch(self) -> None:
        if self.backend != "bwrap":
            shutil.rmtree(self.scratch, ignore_errors=True)


class Runners:
    """This process's warm runners, by backend and scratch size: taken for a call, given back after it. They
    are started from one daemon thread of their own, since bubblewrap's --die-with-parent follows the thread
    that started it, and a call's thread (or, at exit, a thread pool's) may end before the runner should."""

    def __init__(self):
        self.idle: dict[tuple[str, int], list[Runner]] = {}
        self.live: dict[tuple[str, int], int] = {}
        self.started: list[Runner] = []  # every runner not yet closed, idle or in a call
        self.changed = threading.Condition()
        self._starts: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._starter, name="softrl-sandbox-starter", daemon=True).start()

    def _starter(self) -> None:
        while True:
            args, kwargs, started = self._starts.get()
            try:
                started.set_result(subprocess.Popen(*args, **kwargs))
            except BaseException as e:  # noqa: BLE001 - handed to the caller
                started.set_exception(e)

    def _start(self, *args, **kwargs) -> subprocess.Popen:
        started: Future = Future()
        self._starts.put((args, kwargs, started))
        return started.result()

    def take(self, backend: str, scratch_mb: int) -> Runner:
        """An idle runner that is still alive, or a new one; waits while MAX_RUNNERS are in use."""
        key = (backend, scratch_mb)
        with self.changed:
            while True:
                self.changed.wait_for(lambda: self.idle.get(key) or self.live.get(key, 0) < MAX_RUNNERS)
                while self.idle.get(key):
                    runner = self.idle[key].pop()
                    if runner.alive:
                        return runner
                    runner.close()  # it died idle (killed from outside): not the next program's fault
                    self.live[key] -= 1
                if self.live.get(key, 0) < MAX_RUNNERS:
                    break
            self.live[key] = self.live.get(key, 0) + 1
        try:
            runner = Runner(backend, scratch_mb, self._start)
        except BaseException:
            self._forget(key)
            raise
        with self.changed:
            self.started = [r for r in self.started if not r.proc.stderr.closed] + [runner]
        return runner

    def give_back(self, runner: Runner, reusable: bool) -> None:
        key = (runner.backend, runner.scratch_mb)
        if not reusable:
            runner.close()
            self._forget(key)
            return
        with self.changed:
            self.idle.setdefault(key, []).append(runner)
            self.changed.notify_all()  # waiters of other keys share the condition: wake them all

    def _forget(self, key: tuple[str, int]) -> None:
        with self.changed:
            self.live[key] -= 1
            self.changed.notify_all()

    def pids(self) -> set[int]:
        """The host-side process of every idle runner (a test tells them from a process a program left)."""
        with self.changed:
            return {r.proc.pid for runners in self.idle.values() for r in runners}

    def forked(self) -> None:
        """In a forked child: the parent's runners are not its own; close its copies of their pipes, so that
        a runner sees its end when its parent's ends."""
        for r in self.started:
            for stream in (r.proc.stdin, r.proc.stdout, r.proc.stderr):
                try:  # the raw file: the buffered one's lock may have been held by a thread that is gone
                    stream.raw.close()
                except OSError:
                    pass


_RUNNERS: Runners | None = None
_RUNNERS_LOCK = threading.Lock()


def _runners() -> Runners:
    """This process's runners."""
    global _RUNNERS
    with _RUNNERS_LOCK:
        if _RUNNERS is None:
            _RUNNERS = Runners()
        return _RUNNERS


def _after_fork() -> None:
    global _RUNNERS, _RUNNERS_LOCK
    if _RUNNERS is not None:
        _RUNNERS.forked()
    _RUNNERS, _RUNNERS_LOCK = None, threading.Lock()  # the lock may have been held by another thread


os.register_at_fork(after_in_child=_after_fork)


def runner_pids() -> set[int]:
    """The pids of this process's idle warm runners."""
    return _runners().pids()


def _decode(b64: str) -> str:
    return base64.b64decode(b64).decode(errors="replace")


def _classify(raw: dict, limits: Limits) -> ExecResult:
    stdout, stderr, code = _decode(raw["stdout"]), _decode(raw["stderr"]), raw["exit_code"]
    cpu_limit = limits.cpu_s or limits.wall_s
    if raw["killed"] == "wall":
        status = "time_limit"
    elif raw["output_limit"]:
        status = "output_limit"
    elif code == SETUP_FAILED:
        status = "sandbox_error"
    elif code in (-signal.SIGXCPU, -signal.SIGKILL) and raw["cpu_s"] >= cpu_limit - 0.1:
        status = "time_limit"
    elif code == MEMORY_ERROR or stderr.rstrip().endswith("MemoryError"):
        status = "memory_limit"
    elif code != 0:
        status = "runtime_error"
    else:
        status = "passed"
    return ExecResult(status, stdout, stderr, code, raw["wall_s"], raw["cpu_s"])


def _sandbox_error(message: str) -> ExecResult:
    return ExecResult("sandbox_error", "", message, None, 0.0, 0.0)


def _runner_lost(stderr: str, returncode: int | None) -> ExecResult:
    # bwrap's own setup errors begin with "bwrap:"; anything else means the runner was killed from
    # inside, which only the program under test can do
    status = "sandbox_error" if stderr.startswith("bwrap:") or "Traceback" in stderr else "runtime_error"
    return ExecResult(status, "", stderr, returncode, 0.0, 0.0)


@functools.lru_cache(maxsize=1)
def probe() -> dict[str, tuple[bool, str]]:
    """Which backends work here, and why not: {backend: (works, reason)}."""
    report: dict[str, tuple[bool, str]] = {}
    for backend in ("bwrap", "landlock"):
        if backend == "bwrap" and shutil.which("bwrap") is None:
            report[backend] = (False, "bwrap not installed (apt-get install bubblewrap)")
            continue
        if backend == "landlock" and landlock_abi() < 1:
            report[backend] = (False, "the kernel has no Landlock (needs Linux >= 5.13 with landlock in lsm=)")
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                result = Sandbox(backend).run("print(6 * 7)")
        except Exception as e:  # noqa: BLE001 - report whatever broke
            report[backend] = (False, f"{type(e).__name__}: {e}")
            continue
        ok = result.status == "passed" and result.stdout.strip() == "42"
        detail = f"Landlock ABI {landlock_abi()}" if backend == "landlock" else "user namespaces work"
        report[backend] = (ok, detail if ok else f"{result.status}: {result.stderr.strip()[-300:]}")
    return report


def choose_backend(unsafe: bool = False) -> str:
    report = probe()
    for backend in ("bwrap", "landlock"):
        if report[backend][0]:
            return backend
    if unsafe:
        return "unsafe"
    reasons = "; ".join(f"{b}: {r}" for b, (_, r) in report.items())
    raise SandboxError(f"no sandbox backend works here ({reasons}); pass unsafe=True to run unsandboxed")
