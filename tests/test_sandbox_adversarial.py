"""Adversarial programs against every sandbox backend that works on this machine.

Each case must end with the right status within its wall limit + 1 s, and leave the host as it
was: no file written outside scratch, nothing learnt of the parent's secrets, no connection to
the loopback listener the test opens, no process left behind. Network checks only ever use
loopback addresses.
"""

import os
import socket
import time
import warnings

import pytest

from softrl.rewards.sandbox import Limits, Sandbox, probe, runner_pids

BACKENDS = [b for b, (ok, _) in probe().items() if ok]
LIMITS = Limits(wall_s=2.0, cpu_s=1.5, memory_mb=256, output_bytes=1 << 20, open_files=32)
pytestmark = pytest.mark.skipif(not BACKENDS, reason="no sandbox backend works on this machine")


@pytest.fixture(params=BACKENDS)
def sandbox(request):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return Sandbox(request.param, LIMITS)


def _children() -> set[str]:
    pid = os.getpid()
    out = set()
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/children") as f:
            out |= set(f.read().split())
    return out


def run(sandbox, source, stdin=""):
    before = _children()
    start = time.monotonic()
    result = sandbox.run(source, stdin)
    elapsed = time.monotonic() - start
    assert elapsed <= LIMITS.wall_s + 1.0, f"took {elapsed:.2f} s"
    assert _children() - {str(pid) for pid in runner_pids()} <= before, "a process outlived the sandbox"
    return result


# name: (program, status, what stderr must say: the failure happened for the right reason)
CASES = {
    "infinite loop": ("while True: pass", "time_limit", ""),
    "sleep past the limit": ("import time\ntime.sleep(100)", "time_limit", ""),
    "SIGTERM ignored": ("import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nwhile True: time.sleep(0.01)",
                        "time_limit", ""),
    "8 GiB allocation": ("x = bytearray(8 << 30)", "memory_limit", "MemoryError"),
    "1 GB on stdout": ("import sys\nfor _ in range(1 << 14): sys.stdout.write('x' * 65536)", "output_limit", ""),
    "1 GB on stderr": ("import sys\nfor _ in range(1 << 14): sys.stderr.write('x' * 65536)", "output_limit", ""),
    "fork bomb": ("import os\nwhile True: os.fork()", "runtime_error", "Operation not permitted"),
    "thread bomb": ("import threading, time\nwhile True: threading.Thread(target=time.sleep, args=(60,), daemon=True).start()",
                    "runtime_error", "can't start new thread"),
    "fd exhaustion": ("import os\nfds = []\nwhile True: fds.append(os.dup(1))", "runtime_error", "Too many open files"),
    "setsid daemon holding stdout": ("import os, sys, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(100)\n"
                                     "print('parent done')", "runtime_error", "Operation not permitted"),
    "subprocess": ("import subprocess\nprint(subprocess.run(['/bin/echo', 'hi'], capture_output=True).stdout)",
                   "runtime_error", "Error"),
    "kill the parent": ("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nimport time\ntime.sleep(100)",
                        "runtime_error", "Operation not permitted"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_adversarial_status(sandbox, name):
    source, expected, reason = CASES[name]
    result = run(sandbox, source)
    assert result.status == expected, (result.status, result.stderr[-500:])
    assert reason in result.stderr, result.stderr[-500:]


def test_disk_fill(sandbox):
    source = (
        "i = 0\n"
        "while True:\n"
        "    with open(f'fill{i}', 'wb') as f:\n"
        "        f.write(b'x' * (1 << 20) * 8)\n"
        "    i += 1\n"
    )
    result = run(sandbox, source)
    assert result.status == "runtime_error"
    assert "OSError" in result.stderr or "PermissionError" in result.stderr


SYSCALLS = r'''
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
ok = []
if libc.mount(b"none", b"/tmp", b"tmpfs", 0, None) == 0: ok.append("mount")
if libc.unshare(0x00020000) == 0: ok.append("unshare")
if libc.ptrace(16, 1, None, None) == 0: ok.append("ptrace")
for name, call in (("setuid", lambda: os.setuid(0)), ("setgid", lambda: os.setgid(0)),
                   ("setrlimit", lambda: __import__("resource").setrlimit(__import__("resource").RLIMIT_NOFILE, (4096, 4096)))):
    try:
        call()
        ok.append(name)
    except (OSError, ValueError):  # Python reports a refused limit raise as ValueError
        pass
print("allowed:", ok)
'''


def test_privileged_syscalls_refused(sandbox):
    result = run(sandbox, SYSCALLS)
    assert result.status == "passed" and result.stdout.strip() == "allowed: []", result.stdout + result.stderr


def test_loopback_tcp_refused_and_listener_sees_nothing(sandbox):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        listener.settimeout(0.3)
        port = listener.getsockname()[1]
        source = (
            "import socket\n"
            f"try:\n    socket.create_connection(('127.0.0.1', {port}), timeout=1)\n    print('connected')\n"
            "except OSError as e:\n    print('blocked', e.errno)\n"
        )
        result = run(sandbox, source)
        assert result.status == "passed" and result.stdout.startswith("blocked"), result.stdout + result.stderr
        with pytest.raises(socket.timeout):
            listener.accept()


def test_files_and_secrets_outside_scratch(sandbox, tmp_path, monkeypatch):
    secret_file = tmp_path / "secret.txt"
    secret_file.write_text("TOP-SECRET-FILE")
    monkeypatch.setenv("SOFTRL_TEST_SECRET", "TOP-SECRET-ENV")
    outside = tmp_path / "written.txt"
    source = f'''
import os
seen = [repr(dict(os.environ))]
for path in ["/etc/shadow", {str(secret_file)!r}, "/proc/%d/environ" % os.getppid(), "/proc/1/environ",
             "/proc/self/environ"]:
    try:
        seen.append(open(path, "rb").read().decode(errors="replace"))
    except OSError as e:
        seen.append(f"{{path}}: {{type(e).__name__}}")
for path in [{str(outside)!r}, "/etc/softrl-test", "/usr/softrl-test"]:
    try:
        open(path, "w").write("x")
        seen.append("WROTE " + path)
    except OSError as e:
        seen.append(f"{{path}}: {{type(e).__name__}}")
print("\\n".join(seen))
'''
    before = sorted(os.listdir(tmp_path))
    result = run(sandbox, source)
    assert result.status == "passed", result.stderr
    for secret in ("TOP-SECRET-FILE", "TOP-SECRET-ENV", "root:"):
        assert secret not in result.stdout
    assert "WROTE" not in result.stdout
    assert sorted(os.listdir(tmp_path)) == before and secret_file.read_text() == "TOP-SECRET-FILE"
    assert not os.path.exists("/etc/softrl-test") and not os.path.exists("/usr/softrl-test")


def test_early_exit_and_fake_equality_fail(sandbox):
    checks = "assert f(2) == 4\nassert f(3) == 6"
    honest = sandbox.run_checks("def f(x):\n    return 2 * x", checks)
    assert honest.status == "passed", honest.stderr
    cheats = {
        "sys.exit(0)": "import sys\ndef f(x):\n    return 0\nsys.exit(0)",
        "os._exit(0)": "import os\ndef f(x):\n    return 0\nos._exit(0)",
        "exit at import of checks": "import atexit, os\natexit.register(lambda: os._exit(0))\ndef f(x):\n    return 0",
        "always-equal object": "class A:\n    def __eq__(self, o):\n        return True\ndef f(x):\n    return A()",
        "always-equal in a list": "class A:\n    def __eq__(self, o):\n        return True\ndef f(x):\n    return [A()]",
        "int subclass": "class I(int):\n    def __eq__(self, o):\n        return True\ndef f(x):\n    return I(0)",
        "patched builtins": "import builtins\nbuiltins.type = lambda x: int\ndef f(x):\n    return 0",
        "shadowed names": "def type(x):\n    return int\ndef all(x):\n    return True\ndef f(x):\n    return 0",
        "prints a fake nonce": "print('0' * 32)\ndef f(x):\n    return 0",
    }
    for name, source in cheats.items():
        result = sandbox.run_checks(source, checks)
        assert result.status in ("wrong_answer", "runtime_error"), (name, result.status, result.stderr[-300:])


def test_no_network_socket_can_even_be_created(sandbox):
    """Only AF_UNIX sockets exist inside: UDP, IPv6, netlink and packet sockets fail at creation,
    so nothing is ever sent (this test sends nothing anywhere either)."""
    source = (
        "import socket\n"
        "made = []\n"
        "for fam, kind in [(socket.AF_INET, socket.SOCK_DGRAM), (socket.AF_INET6, socket.SOCK_STREAM),\n"
        "                  (socket.AF_NETLINK, socket.SOCK_RAW), (socket.AF_PACKET, socket.SOCK_RAW)]:\n"
        "    try:\n"
        "        socket.socket(fam, kind).close()\n"
        "        made.append(int(fam))\n"
        "    except OSError:\n"
        "        pass\n"
        "a, b = socket.socketpair()\n"
        "print('made:', made)\n"
    )
    result = run(sandbox, source)
    assert result.status == "passed" and result.stdout.strip() == "made: []", result.stdout + result.stderr
