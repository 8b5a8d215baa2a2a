"""Batched commits: a run's online rows reach the store every few learner steps in one commit, not one
commit per step (each commit is a table version; thousands of them slow every reader and writer)."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

from softrl.data.schema import Trajectory

COMMIT_EVERY = 10  # learner steps' worth of rows per commit: a run makes about steps / 10 commits


class BatchedAppender:
    """`append` keeps rows and commits them to `store` on every `every`-th call, and on `flush` (which the
    run calls at each checkpoint, at the end and when it stops, so a checkpoint never has rows behind
    it that the store lacks). Thread-safe: the asynchronous runtime's sampler appends from its thread."""

    def __init__(self, store, every: int = COMMIT_EVERY):
        if every < 1:
            raise ValueError(f"every must be >= 1, got {every}")
        self.store, self.every = store, every
        self._rows: list[Trajectory | dict[str, Any]] = []
        self._calls, self.commits = 0, 0
        self._lock = threading.Lock()

    def append(self, rows: Iterable[Trajectory | dict[str, Any]]) -> int:
        with self._lock:
            self._rows.extend(rows)
            self._calls += 1
            due = self._calls % self.every == 0
        return self.flush() if due else 0

    def flush(self) -> int:
        """Commit the rows kept so far (none: no commit); returns rows written."""
        with self._lock:
            rows, self._rows = self._rows, []
            if not rows:
                return 0
            written = self.store.append(rows)
            self.commits += 1
            return written
