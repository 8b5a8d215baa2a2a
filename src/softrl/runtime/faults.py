"""What a run meets besides its own work: a second process in its run directory (a lock file held
for the whole run, which the OS releases when its process ends, kill -9 included) and a full disk
(one line naming what was being written; the writes before it are intact, the store's and the
checkpoints' being atomic)."""

from __future__ import annotations

import errno
import fcntl
import os
import time
from contextlib import contextmanager
from pathlib import Path

import torch

from softrl.config import ConfigError, RunConfig
from softrl.models.loading import first_line


class RunInUseError(ConfigError):
    """Another process is training in the run directory (it holds its lock)."""


class DiskFullError(OSError):
    """The disk (or the quota) filled up while the run wrote a file; what was written before is
    intact. An OSError with errno ENOSPC whose message is one line for the user."""

    def __init__(self, message: str):
        super().__init__(message)
        self.errno = errno.ENOSPC


def is_disk_full(error: BaseException) -> bool:
    """ENOSPC or EDQUOT; also a writer's own error that keeps only the OS's message (safetensors)."""
    if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    return isinstance(error, Exception) and any(s in str(error) for s in ("No space left on device",
                                                                           "Disk quota exceeded"))


def disk_full(what: str, run_dir: Path) -> DiskFullError:
    """The line: what was being written, that the checkpoints and store rows before it are intact, what to do."""
    root = Path(run_dir) / "checkpoints"
    where = "" if str(root) in what else f" (in {root})"
    return DiskFullError(f"disk full while writing {what}: earlier checkpoints{where} and store rows are intact; "
                         "free space, then --resume")


@contextmanager
def disk_full_reported(config: RunConfig, what: str | None = None):
    """A full disk met in the block becomes one DiskFullError line naming what was being written:
    store rows, a file of the run directory or another (its path), else `what`. The writes before it
    are intact (the store's and the checkpoints' are atomic)."""
    try:
        yield
    except DiskFullError:
        raise
    except Exception as e:
        if not is_disk_full(e):
            raise
        filename = getattr(e, "filename", None)
        where = Path(filename) if isinstance(filename, (str, os.PathLike)) else None
        if where is not None and where.resolve().is_relative_to(Path(config.data.store).resolve()):
            what = f"store rows in {config.data.store}"
        elif where is not None:
            what = str(where)
        raise disk_full(what or f"the run's files ({first_line(e)})", config.run_dir) from e


class _Recorded:
    """A file torch.save writes through that keeps the OS's error: torch reports a failed write
    (a full disk) as a RuntimeError that no longer says why."""

    def __init__(self, file):
        self.file, self.error = file, None

    def write(self, data) -> int:
        try:
            return self.file.write(data)
        except OSError as e:
            self.error = e
            raise

    def flush(self) -> None:
        self.file.flush()


def save_state(state: dict, path: Path) -> None:
    """torch.save(state, path), an OSError (ENOSPC) raised as itself."""
    with open(path, "wb") as f:
        recorded = _Recorded(f)
        try:
            torch.save(state, recorded)
        except RuntimeError as e:
            if recorded.error is not None:
                raise recorded.error from e
            raise


# --- one process per run directory ---------------------------------------------------------------
LOCK_NAME = ".lock"  # in the run directory, holding the PID of the process training there
_held: dict[Path, "RunLock"] = {}  # the run directories this process holds


def in_use(run_dir: Path, holder: str) -> RunInUseError:
    return RunInUseError(f"run directory {run_dir} is in use by process {holder}, which is still training in it: "
                         "wait for it to end or stop it (then --resume), or give this run another name=...")


class RunLock:
    """An exclusive flock on RUN_DIR/.lock, held while a process trains there: a second process is
    refused in one line naming the holder's PID. The OS releases it when the holder exits, however
    (kill -9 included), so a lock file left behind locks nothing."""

    def __init__(self, run_dir: Path):
        self.run_dir = Path(run_dir)
        self.key = self.run_dir.resolve()
        self.fd: int | None = None
        self.created: list[Path] = []  # the directories made for the lock, innermost first

    def acquire(self) -> "RunLock":
        if self.key in _held:
            raise in_use(self.run_dir, f"{os.getpid()} (this one)")
        missing = self.run_dir
        while not missing.exists():
            self.created.append(missing)
            missing = missing.parent
        self.run_dir.mkdir(parents=True, exist_ok=True)
        path = self.run_dir / LOCK_NAME
        for attempt in range(100):
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
                os.close(fd)
                if attempt < 5 and not holder:  # a holder just starting, or another process's brief probe
                    time.sleep(0.02)
                    continue
                self._remove_created()
                raise in_use(self.run_dir, holder or "(PID unknown)") from None
            try:  # the file locked must still be the one at `path` (a run that ends removes it)
                same = os.path.samestat(os.fstat(fd), os.stat(path))
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        else:
            self._remove_created()
            raise in_use(self.run_dir, "(PID unknown)")
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self.fd = fd
        _held[self.key] = self
        return self

    def release(self) -> None:
        """Unlock (and remove the lock file, and the directories made for it that are still empty)."""
        if self.fd is None:
            return
        path = self.run_dir / LOCK_NAME
        try:
            if os.path.samestat(os.fstat(self.fd), os.stat(path)):
                path.unlink()
        except OSError:
            pass
        os.close(self.fd)
        self.fd = None
        _held.pop(self.key, None)
        self._remove_created()

    def _remove_created(self) -> None:
        for directory in self.created:  # a run refused before it wrote anything leaves nothing behind
            try:
                directory.rmdir()
            except OSError:
                break
        self.created = []


def check_not_in_use(run_dir: Path) -> None:
    """Refuse a run directory another process trains in (one that holds its lock)."""
    path = Path(run_dir) / LOCK_NAME
    if Path(run_dir).resolve() in _held or not path.is_file():
        return
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
        raise in_use(Path(run_dir), holder or "(PID unknown)") from None
    finally:
        os.close(fd)


