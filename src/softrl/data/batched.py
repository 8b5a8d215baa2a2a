"""Batched commits: a run's online rows reach the store every few learner steps in one commit, not one
commit per step (each commit is a table version; thousands of them slow every reader and writer).
Rollout workers elsewhere (Ray) write their rows as uncommitted fragments (`FragmentWriter`) and the
run's one committer commits them with its own (`BatchedAppender.add_fragments`)."""

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
        self._fragments: list[dict] = []
        self._own = 0  # rows of the kept fragments that this appender wrote (not the workers')
        self._calls, self.commits = 0, 0
        self._lock = threading.Lock()

    def append(self, rows: Iterable[Trajectory | dict[str, Any]]) -> int:
        with self._lock:
            self._rows.extend(rows)
        return self._counted()

    def add_fragments(self, fragments: Iterable[dict]) -> int:
        """Keep fragments written by workers (`FragmentWriter`) for the next commit; one call per step."""
        with self._lock:
            self._fragments.extend(fragments)
        return self._counted()

    def _counted(self) -> int:
        with self._lock:
            self._calls += 1
            due = self._calls % self.every == 0
        return self.flush() if due else 0

    def flush(self) -> int:
        """Commit the rows and fragments kept so far, in one commit (none: no commit); returns the rows
        written here (workers' fragments not counted). What a failure leaves is kept for the next flush."""
        with self._lock:
            if not self._rows and not self._fragments:
                return 0
            if self._rows:  # kept as written fragments, so a commit that fails is tried again at the next flush
                written = self.store.write_fragments(self._rows)
                self._rows, self._own = [], self._own + sum(f["physical_rows"] for f in written)
                self._fragments += written
            self.store.commit_fragments(self._fragments)
            self._fragments, own, self._own = [], self._own, 0
            self.commits += 1
            return own


class FragmentWriter:
    """A rollout worker's store: `append` writes rows as uncommitted fragments, `take` hands their
    metadata over (to travel with the rows to the run's committer)."""

    def __init__(self, store):
        self.store, self._fragments = store, []

    def append(self, rows: Iterable[Trajectory | dict[str, Any]]) -> int:
        written = self.store.write_fragments(rows)
        self._fragments += written
        return sum(f["physical_rows"] for f in written)

    def take(self) -> list[dict]:
        fragments, self._fragments = self._fragments, []
        return fragments
