"""Files that appear whole or not at all, and where softrl keeps what it builds."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def whole_file(path: Path) -> Iterator[Path]:
    """Yield a path beside `path` to write; once the block ends it is synced and renamed onto `path`,
    and on any failure (a full disk, a signal) removed, so `path` holds the new content or what it held
    before, never a torn file. The name starts with a dot: a reader listing the folder skips it."""
    work = path.with_name(f".{path.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp")
    try:
        yield work
        fd = os.open(work, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(work, path)
    finally:
        work.unlink(missing_ok=True)


def cache_root() -> Path:
    """Where built models, prepared models and checked problem files are kept: `$SOFTRL_CACHE`, else
    ~/.cache/softrl."""
    return Path(os.environ.get("SOFTRL_CACHE", Path.home() / ".cache" / "softrl"))
