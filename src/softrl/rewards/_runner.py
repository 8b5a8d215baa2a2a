"""The program that runs *inside* the sandbox: standard library only, started as `python -I -S`.

It stays up between jobs (each a frame on stdin: a 4-byte length, then marshal written by the host), takes each
in a fresh fork of itself, and runs each test of it in a forked child. The child takes
rlimits, a Landlock layer (scoped signals, no TCP, and in the landlock backend the filesystem)
and the seccomp filter (raw BPF built outside by pyseccomp), then executes the untrusted source
in-process. The runner reports facts only, one JSON line per test on its stdout; the host
decides the status and compares outputs (expected outputs never enter the sandbox).
Nothing here imports softrl: this file is bind-mounted into the sandbox on its own.
"""

import binascii
import builtins
import ctypes
import marshal
import os
import resource
import select
import struct
import sys
import time

# json, base64, signal and traceback are not imported: they cost more start-up time than a test
# (re, enum)
SIGKILL = 9

libc = ctypes.CDLL(None, use_errno=True)
ORIGINAL_BUILTINS = dict(builtins.__dict__)  # taken before any untrusted code runs
PR_SET_NO_NEW_PRIVS, PR_SET_DUMPABLE, PR_SET_PDEATHSIG, PR_SET_SECCOMP = 38, 4, 1, 22
SECCOMP_MODE_FILTER = 2
SYS_LANDLOCK_CREATE, SYS_LANDLOCK_ADD_RULE, SYS_LANDLOCK_RESTRICT = 444, 445, 446
FS_READ = (1 << 0) | (1 << 2) | (1 << 3)  # execute, read file, read dir
FS_ALL_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 5: (1 << 16) - 1}
NET_TCP = (1 << 0) | (1 << 1)  # bind, connect
SCOPE_ALL = (1 << 0) | (1 << 1)  # abstract unix sockets, signals


def _check(ret, what):
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return ret


def landlock_abi():
    return libc.syscall(SYS_LANDLOCK_CREATE, None, 0, 1)  # LANDLOCK_CREATE_RULESET_VERSION


def landlock(read_paths=(), write_paths=(), filesystem=False):
    """Restrict this process (and its future children): TCP always, signals and abstract sockets
    to its own domain (ABI >= 6), and, with `filesystem`, files to the given trees."""
    abi = landlock_abi()
    if abi < 1:
        raise OSError("Landlock is not available")
    fs = FS_ALL_BY_ABI[max(k for k in FS_ALL_BY_ABI if k <= abi)] if filesystem else 0
    attr = struct.pack("QQQ", fs, NET_TCP if abi >= 4 else 0, SCOPE_ALL if abi >= 6 else 0)
    size = 24 if abi >= 6 else 16
    buf = ctypes.create_string_buffer(attr[:size], size)
    ruleset = _check(libc.syscall(SYS_LANDLOCK_CREATE, buf, ctypes.c_size_t(size), 0), "landlock_create_ruleset")
    for paths, access in ((read_paths, FS_READ), (write_paths, fs)):
        for path in paths if filesystem else ():
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except FileNotFoundError:
                continue
            allowed = access if os.path.isdir(path) else access & ((1 << 0) | (1 << 1) | (1 << 2) | (1 << 14))
            rule = ctypes.create_string_buffer(struct.pack("=Qi", allowed, fd), 12)
            _check(libc.syscall(SYS_LANDLOCK_ADD_RULE, ruleset, 1, rule, 0), f"landlock_add_rule {path}")
            os.close(fd)
    _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    _check(libc.syscall(SYS_LANDLOCK_RESTRICT, ruleset, 0), "landlock_restrict_self")
    os.close(ruleset)
    return abi


def load_seccomp(bpf):
    """Install a raw BPF program (struct sock_filter[]) as this thread's seccomp filter."""
    prog_buf = ctypes.create_string_buffer(bpf, len(bpf))

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    prog = SockFprog(len(bpf) // 8, ctypes.addressof(prog_buf))
    _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    _check(libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0), "seccomp")


def set_limits(lim):
    mem = lim["memory_mb"] * 1024 * 1024
    cpu = max(1, int(lim["cpu_s"] + 0.999))
    for res, value in (
        (resource.RLIMIT_CPU, (cpu, cpu + 1)),
        (resource.RLIMIT_AS, (mem, mem)),
        (resource.RLIMIT_FSIZE, (lim["file_size_mb"] * 1024 * 1024,) * 2),
        (resource.RLIMIT_NOFILE, (lim["open_files"],) * 2),
        (resource.RLIMIT_CORE, (0, 0)),
        (resource.RLIMIT_NPROC, (lim["processes"],) * 2),
    ):
        resource.setrlimit(res, value)


def child(job, test, in_fd, out_w, err_w, bpf):
    """In the forked child: confine, then run the untrusted source. Never returns."""
    try:
        os.setpgid(0, 0)
        libc.prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0)
        os.dup2(in_fd, 0)
        os.dup2(out_w, 1)
        os.dup2(err_w, 2)
        os.closerange(3, 1 << 16)
        sys.stdin = open(0, "r", closefd=False)
        sys.stdout = open(1, "w", closefd=False)
        sys.stderr = open(2, "w", closefd=False)
        os.chdir(job["scratch"])
        if job["child_landlock"]:  # own domain: cannot signal the runner; in the landlock backend, no writes
            fs = job["landlock_runner"]
            landlock(job["read_paths"] + [job["scratch"]] if fs else (), filesystem=fs)
        set_limits(job["limits"])
        if bpf:
            load_seccomp(bpf)
    except BaseException:  # a confinement step failed: never run the program unconfined
        import traceback

        os.write(2, ("sandbox setup failed: " + traceback.format_exc()).encode())
        os._exit(121)
    code = 0
    try:
        namespace = {"__name__": "__main__", "__builtins__": builtins}
        exec(compile(job["source"], "solution.py", "exec"), namespace)
        if test.get("check"):
            builtins.__dict__.clear()
            builtins.__dict__.update(ORIGINAL_BUILTINS)
            helpers = {"__builtins__": builtins}
            exec(compile(job["helpers"], "helpers.py", "exec"), helpers)
            namespace.update({name: helpers[attr] for name, attr in job["helper_names"].items()})
            exec(compile(test["check"], "checks.py", "exec"), namespace)
            sys.stdout.flush()
            os.write(1, ("\n" + job["nonce"] + "\n").encode())
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except MemoryError:
        os.write(2, b"MemoryError\n")
        code = 120
    except BaseException:
        # the interpreter's own hook, not one the program set; it imports nothing (the program may hold every fd)
        sys.__excepthook__(*sys.exc_info())
        code = 1
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:
        code = code or 1
    os._exit(code)


def run_test(job, test, bpf):
    lim = job["limits"]
    # in memory, not a file in scratch, where an earlier test's program could have put something in its way
    in_fd = os.memfd_create("stdin")
    data = test.get("input", "").encode()
    while data:
        data = data[os.write(in_fd, data):]
    os.lseek(in_fd, 0, os.SEEK_SET)
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:
        os.close(out_r)
        os.close(err_r)
        child(job, test, in_fd, out_w, err_w, bpf)
    for fd in (in_fd, out_w, err_w):
        os.close(fd)
    buffers = {out_r: bytearray(), err_r: bytearray()}
    open_fds, killed, over = [out_r, err_r], None, False
    deadline = start + lim["wall_s"]
    status = None
    while open_fds:
        left = deadline - time.monotonic()
        if left <= 0:
            killed = "wall"
            break
        ready, _, _ = select.select(open_fds, [], [], min(left, 0.05))
        for fd in ready:
            chunk = os.read(fd, 65536)
            if not chunk:
                open_fds.remove(fd)
                continue
            buffers[fd] += chunk
            if len(buffers[fd]) > lim["output_bytes"]:
                over = True
        if over:
            break
        if status is None:  # the child exited: drain what is already there, then stop waiting
            done, status, usage = os.wait4(pid, os.WNOHANG)
            if not done:
                status = None
            else:
                while True:
                    ready, _, _ = select.select(open_fds, [], [], 0)
                    chunks = [(fd, os.read(fd, 65536)) for fd in ready]
                    if not any(c for _, c in chunks):
                        break
                    for fd, c in chunks:
                        buffers[fd] += c
                break
    for sig_target in (lambda: os.killpg(pid, SIGKILL), lambda: os.kill(pid, SIGKILL)):
        try:
            sig_target()
        except ProcessLookupError:
            pass
    if status is None:
        _, status, usage = os.wait4(pid, 0)
    wall = time.monotonic() - start
    for fd in (out_r, err_r):
        os.close(fd)
    cap = lim["output_bytes"]
    code = os.waitstatus_to_exitcode(status)
    return code == 0 and not killed and not over, (
        '{"exit_code": %d, "killed": %s, "output_limit": %s, "wall_s": %.4f, "cpu_s": %.4f, '
        '"stdout": "%s", "stderr": "%s"}'
        % (code, '"wall"' if killed else "null", "true" if over else "false", wall,
           usage.ru_utime + usage.ru_stime, _b64(buffers[out_r][:cap]), _b64(buffers[err_r][:cap]))
    )


def _b64(data):
    return binascii.b2a_base64(bytes(data), newline=False).decode()


def read_exact(n):
    """n bytes of stdin, or None at its end (the host is gone or done)."""
    data = b""
    while len(data) < n:
        chunk = os.read(0, n - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def looks(scratch):
    """What a program could change of the scratch folder itself and leave for the next job: its mode, owner
    and extended attributes (its contents are removed)."""
    st = os.stat(scratch)
    try:
        attributes = sorted(os.listxattr(scratch))
    except OSError:  # a file system without them
        attributes = None
    return st.st_mode, st.st_uid, st.st_gid, attributes


def wipe(scratch, initial):
    """Remove everything a job's programs left in scratch, so the next job starts from an empty one as the
    runner found it (`initial`, of `looks`). False where it cannot (a directory a program made unreadable,
    a changed mode or attribute): this runner then stops."""
    for top, dirs, files in os.walk(scratch, topdown=False):
        for name in files + dirs:
            path = os.path.join(top, name)
            try:
                os.rmdir(path) if name in dirs and not os.path.islink(path) else os.unlink(path)
            except OSError:
                pass
    try:
        return not os.listdir(scratch) and looks(scratch) == initial
    except OSError:
        return False


def one_job(scratch, initial):
    """Read one framed job, say START, run its tests, empty scratch: the exit code says whether this runner
    may take another (0), must stop (3: scratch not as it was) or the host closed its end (4)."""
    header = read_exact(4)
    if header is None:
        return 4
    job = marshal.loads(read_exact(struct.unpack("<I", header)[0]))
    job["scratch"] = scratch  # this runner's, known from its start: the host does not send it
    sys.stdout.write("START\n")  # from here, a runner that dies is the job's doing, not an earlier one's
    sys.stdout.flush()
    if job.get("landlock_runner"):
        landlock(job["read_paths"], [scratch], filesystem=True)
    for test in job["tests"]:
        clean, line = run_test(job, test, job["bpf"])
        sys.stdout.write(line + "\n")
        sys.stdout.flush()
        if not clean and job.get("stop_at_first_error"):
            break
    emptied = wipe(scratch, initial)
    sys.stdout.write("END\n" if emptied else "DIRTY\n")
    sys.stdout.flush()
    return 0 if emptied else 3


def main():
    """Warm: jobs one after another, each in a fresh fork of this process, which never reads a job itself,
    so that nothing of one job (its programs, its inputs) is in the memory of the next one's programs.
    argv: the scratch folder, and "remove" where it is the host's folder to remove once the host is done."""
    scratch, remove = sys.argv[1], sys.argv[2:] == ["remove"]
    initial = looks(scratch)
    libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)  # no /proc/<runner>/fd for the children (forks keep it)
    while True:
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                code = one_job(scratch, initial)
            except BaseException:  # the runner's own failure: the host reports a sandbox error
                import traceback

                traceback.print_exc()
                sys.stderr.flush()
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
        if code != 0:  # the host gone (4, or a job that could not write to it) or this runner stopping
            if remove:
                wipe(scratch, initial)
                try:
                    os.rmdir(scratch)
                except OSError:
                    pass
            sys.exit(0 if code == 4 else code)

if __name__ == "__main__":
    main()
