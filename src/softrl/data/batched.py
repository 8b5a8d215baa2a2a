"""Batched commits: a run's online rows reach the store every few learner steps in one commit, not one
commit per step (each commit is a table version; thousands of them slow every reader and writer).
Rollout workers elsewhere (Ray) stage their rows, written but uncommitted (`StagedWriter`), and the
run's one committer commits them with its own (`BatchedAppender.add_staged`)."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

from softrl.data.schema import Trajectory
from softrl.data.storage import Staged

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
        self._staged: list[Staged] = []
        self._own = 0  # rows of the kept staged writes that this appender wrote (not the workers')
        self._calls, self.commits = 0, 0
        self._lock = threading.Lock()

    def append(self, rows: Iterable[Trajectory | dict[str, Any]]) -> int:
        with self._lock:
            self._rows.extend(rows)
        return self._counted()

    def add_staged(self, staged: Iterable[Staged]) -> int:
        """Keep rows staged by workers (`StagedWriter`) for the next commit; one call per step."""
        with self._lock:
            self._staged.extend(staged)
        return self._counted()

    def _counted(self) -> int:
        with self._lock:
            self._calls += 1
            due = self._calls % self.every == 0
        return self.flush() if due else 0

    def flush(self) -> int:
        """Commit the rows and staged writes kept so far, in one commit (none: no commit); returns the rows
        written here (workers' staged rows not counted). What a failure leaves is kept for the next flush."""
        with self._lock:
            if not self._rows and not self._staged:
                return 0
            if self._rows:  # kept staged, so a commit that fails is tried again at the next flush
                written = self.store.stage(self._rows)
                self._rows, self._own = [], self._own + sum(s.rows for s in written)
                self._staged += written
            self.store.commit_staged(self._staged)
            self._staged, own, self._own = [], self._own, 0
            self.commits += 1
            return own


class StagedWriter:
    """A rollout worker's store: `append` stages rows (written, uncommitted), `take` hands the staged
    writes over (to travel with the rows to the run's committer)."""

    def __init__(self, store):
        self.store, self._staged = store, []

    def append(self, rows: Iterable[Trajectory | dict[str, Any]]) -> int:
        written = self.store.stage(rows)
        self._staged += written
        return sum(s.rows for s in written)

    def take(self) -> list[Staged]:
        staged, self._staged = self._staged, []
        return staged
