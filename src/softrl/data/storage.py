"""What the experience store asks of a table, whatever holds it: the storage interface (`Table`), the
opaque values that cross it (row handles, staged writes) and its errors. Lance is the one
implementation today (data/lance_table.py, which ExperienceStore's constructor picks); nothing
outside it sees a Lance type, a fragment or a row address.

A table is a sequence of versions, each a set of rows; every write commits one new version, and a
reader at a version sees exactly it, whatever is committed meanwhile. Rows have no key of their own:
where the store needs "first" or "newest", it asks for each row's handle (the `HANDLE` column of
`read` and `batches`), a uint64 that grows with commit order within a version and that `take` and
`delete` accept at that version. Handles are opaque otherwise: they mean nothing at another version
or in another table.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["HANDLE", "MissingTable", "Staged", "StoreError", "Table"]

HANDLE = "_handle"  # the row-handle column `read` and `batches` add when asked
T = TypeVar("T")


class StoreError(ValueError):
    """The store cannot be used (one line, naming the path or URI)."""


def damaged(uri: str, problem: str) -> StoreError:
    """The one line for a damaged table (`Table.damage`), and the way back."""
    return StoreError(f"{uri}: damaged, {problem} (writes are refused until `softrl data restore` brings back an "
                      "intact version: docs/DATA.md, \"A damaged table\")")


class MissingTable(StoreError):
    """No table at the URI, and none to be created."""


@dataclass(frozen=True)
class Staged:
    """Rows written by `Table.stage` but in no version yet: `rows` of them, and what the implementation
    needs to commit them (`detail`, plain JSON-able data, so a staged write travels between processes
    and nodes to the one committer)."""

    rows: int
    detail: tuple[Any, ...]


class Table(Protocol):
    """One table of rows of a fixed Arrow schema, versioned (see the module's docstring)."""

    uri: str
    schema: pa.Schema

    # --- reading at a version --------------------------------------------------------------------
    def latest(self) -> int: ...

    def count(self, version: int, where: pc.Expression | None = None) -> int:
        """Rows of `version` (matching `where`)."""

    def read(self, version: int, columns: list[str] | None = None, where: pc.Expression | None = None,
             handles: bool = False) -> pa.Table:
        """Rows of `version` matching `where`, of `columns` (all: None), with the `HANDLE` column when asked."""

    def batches(self, version: int, columns: list[str], where: pc.Expression | None = None,
                handles: bool = False, rows: int | None = None) -> Iterator[pa.RecordBatch]:
        """`read`'s rows a batch (of at most `rows`; None: the implementation's) at a time in handle order
        (memory bounded by a batch)."""

    def take(self, version: int, handles: np.ndarray, columns: list[str] | None = None) -> pa.Table:
        """The rows of `version` with `handles` (`[N]` uint64), in that order."""

    def parts(self, version: int) -> int:
        """How many pieces `version` is stored in: what a distributed reader can split it into."""

    def distributed(self, version: int, columns: list[str], equal: dict[str, Any] | None = None):
        """The rows of `version` (`columns` and the `HANDLE` column, those whose columns equal `equal`'s
        values) as a Ray Data dataset, read in parallel by the cluster `ray` is connected to."""

    # --- writing: each call one commit -----------------------------------------------------------
    def append(self, rows: pa.Table) -> None: ...

    def stage(self, rows: pa.Table) -> Staged:
        """Write `rows` where no version names them yet (any process, any node): no reader sees them
        until a `commit_staged`, and a writer killed meanwhile leaves nothing a reader sees."""

    def commit_staged(self, staged: Sequence[Staged]) -> None:
        """One commit appending every staged write, in the order given; a retry after a commit that
        landed but whose answer was lost does not append them twice."""

    def upsert(self, key: str, rows: pa.Table) -> None:
        """Rows replace those of the same `key` (the new ones after every other row in commit order)."""

    def delete(self, version: int, handles: np.ndarray) -> None:
        """Commit, over `version`, the deletion of the rows with `handles` (no other row moves; rows
        committed after `version` stay). A concurrent rewrite of the same rows is a commit conflict,
        which `retried` retries."""

    def retried(self, attempt: Callable[[], T]) -> T:
        """`attempt()` again while it loses a commit race to another writer; any other error as a
        one-line StoreError."""

    # --- versions --------------------------------------------------------------------------------
    def versions(self) -> dict[int, object]:
        """Every version still readable -> its commit time."""

    def tags(self) -> dict[str, int]: ...

    def tag(self, name: str, version: int, move: bool = False) -> None:
        """Tag `version` as `name` (kept through `cleanup`); `move`: an existing tag now names `version`."""

    def untag(self, name: str) -> None: ...

    def compact(self) -> bool:
        """The rows rewritten into as few pieces as can be, in commit order; False: nothing to do."""

    def cleanup(self, keep: int) -> int:
        """Old versions removed, the newest `keep` and every tagged one kept; returns how many went."""

    def damage(self, version: int | None = None) -> str | None:
        """What is wrong with the files the newest version (or `version`) is made of (None: nothing); every
        write refuses a damaged table."""

    def restore(self, version: int) -> None:
        """`version`'s rows committed as the newest version (the versions between stay as they were)."""
