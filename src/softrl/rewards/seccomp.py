"""The seccomp filter of every sandboxed program, compiled once to raw BPF with pyseccomp.

Default allow; refused with an errno (so the program sees an ordinary error): sockets other than
AF_UNIX, fork / vfork / clone without CLONE_THREAD (a root-launched bwrap ignores RLIMIT_NPROC,
so this is what stops fork bombs), clone3 (ENOSYS, so glibc falls back to clone for threads),
execve, System V and POSIX message IPC, changes to files' metadata (mode, owner, times, extended
attributes, inode flags), other processes' scheduling, and the kernel surfaces an untrusted program
never needs.
"""

from __future__ import annotations

import errno
import functools
import socket
import tempfile

CLONE_THREAD = 0x00010000

DENIED = (
    "fork", "vfork", "execve", "execveat", "ptrace", "process_vm_readv", "process_vm_writev",
    "mount", "umount2", "pivot_root", "chroot", "unshare", "setns", "move_mount", "open_tree", "fsopen",
    "fsmount", "fsconfig", "fspick", "mount_setattr", "bpf", "io_uring_setup", "io_uring_enter",
    "io_uring_register", "keyctl", "add_key", "request_key", "perf_event_open", "userfaultfd",
    "setrlimit", "setuid", "setgid", "setreuid", "setregid", "setresuid", "setresgid", "setfsuid",
    "setfsgid", "setgroups", "capset", "kexec_load", "kexec_file_load", "init_module", "finit_module",
    "delete_module", "reboot", "swapon", "swapoff", "acct", "quotactl", "open_by_handle_at",
    "name_to_handle_at", "lookup_dcookie", "syslog", "personality", "uselib", "vhangup",
    # System V and POSIX message IPC: objects that outlive the program (in its runner's IPC namespace, or
    # the host's under Landlock) and could carry data to the next one
    "shmget", "shmat", "shmctl", "shmdt", "msgget", "msgsnd", "msgrcv", "msgctl", "semget", "semop",
    "semtimedop", "semctl", "mq_open", "mq_unlink", "mq_timedsend", "mq_timedreceive", "mq_notify",
    "mq_getsetattr",
    # a file's metadata (mode, owner, times, attributes): Landlock does not govern it, so under Landlock a
    # program could change the host's files, and in a warm runner leave marks on its scratch
    "chmod", "fchmod", "fchmodat", "fchmodat2", "chown", "fchown", "lchown", "fchownat", "utime", "utimes",
    "utimensat", "futimesat", "setxattr", "lsetxattr", "fsetxattr", "removexattr", "lremovexattr",
    "fremovexattr",
    # scheduling of other processes of the same uid (its runner; under Landlock, the host)
    "setpriority", "sched_setscheduler", "sched_setparam", "sched_setattr", "sched_setaffinity", "ioprio_set",
)
# newer than this libseccomp's names; numbers from 424 up are the same on every architecture
DENIED_NUMBERS = {"setxattrat": 463, "removexattrat": 466}
# inode flags (immutable, append-only, nodump...) and project attributes: FS_IOC_SETFLAGS, its 32-bit
# form, FS_IOC_FSSETXATTR; the kernel reads ioctl's request as 32 bits, so only those are compared
DENIED_IOCTLS = (0x40086602, 0x40046602, 0x401C5820)


@functools.lru_cache(maxsize=1)
def seccomp_bpf() -> bytes:
    """The filter as raw BPF (struct sock_filter[]), ready for prctl(PR_SET_SECCOMP)."""
    import pyseccomp as sc

    f = sc.SyscallFilter(defaction=sc.ALLOW)
    deny = sc.ERRNO(errno.EPERM)
    for name in DENIED:
        f.add_rule(deny, name)
    for number in DENIED_NUMBERS.values():
        f.add_rule(deny, number)
    for request in DENIED_IOCTLS:
        f.add_rule(deny, "ioctl", sc.Arg(1, sc.MASKED_EQ, 0xFFFFFFFF, request))
    for name in ("socket", "socketpair"):
        f.add_rule(sc.ERRNO(errno.EAFNOSUPPORT), name, sc.Arg(0, sc.NE, socket.AF_UNIX))
    f.add_rule(deny, "clone", sc.Arg(0, sc.MASKED_EQ, CLONE_THREAD, 0))
    f.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
    f.add_rule(deny, "prlimit64", sc.Arg(2, sc.NE, 0))  # reading limits is fine, setting is not
    with tempfile.TemporaryFile() as out:
        f.export_bpf(out)
        out.seek(0)
        return out.read()
