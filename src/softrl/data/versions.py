"""Versions of the experience store: the Snapshot of an earlier version or of a tag (what a run's
`data.store_version` pins its reads to), tags that keep a version through cleanup (a user's, and the
hold a run that reads the store keeps on its snapshot until it finishes), and compaction that keeps
the rows' commit order (docs/DATA.md, "Versions, tags, compaction")."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from softrl.data.store import ExperienceStore, Snapshot, StoreError

__all__ = ["compact", "hold", "hold_name", "holds", "pinned", "release", "restore", "tag", "untag"]
HOLD = "run-hold-"  # the tags runs keep on the versions they read


def spans(versions: list[int]) -> str:
    """[1, 2, 3, 7, 9, 10] -> '1-3, 7, 9-10'."""
    out, start = [], None
    for i, v in enumerate(versions):
        start = v if start is None else start
        if i + 1 == len(versions) or versions[i + 1] != v + 1:
            out.append(str(v) if start == v else f"{start}-{v}")
            start = None
    return ", ".join(out)


def pinned(store: ExperienceStore, at: int | str | None) -> Snapshot:
    """The tables' versions now (`at` None), at a tag, or at a version of the trajectories table (the
    other tables then at their newest version committed while it was the newest: by commit time, so a
    tag, which names every table's version, is the exact way back). A version or tag that does not
    exist is a StoreError naming those that do."""
    if at is None:
        return store.snapshot()
    tables, tags = store.tables, store.tables["trajectories"].tags()
    history = tables["trajectories"].versions()
    if isinstance(at, str) and at in tags:
        return Snapshot({name: table.tags()[at] for name, table in tables.items()})
    if isinstance(at, int) and not isinstance(at, bool) and at in history:
        until = min((t for v, t in history.items() if v > at), default=None)
        versions = {name: at if name == "trajectories" else before(table, until) for name, table in tables.items()}
        gone = sorted(name for name, version in versions.items() if version is None)
        if gone:
            raise StoreError(f"{store.root}: the {', '.join(gone)} table has no version as old as version {at} of "
                             f"trajectories (compacted away); a tag keeps every table's version")
        return Snapshot(versions)
    named = f"tag {at!r}" if isinstance(at, str) else f"version {at}"
    raise StoreError(f"{store.root} has no {named} (versions: {spans(sorted(history))}; "
                     f"tags: {', '.join(sorted(tags)) or 'none'})")


def before(table, moment) -> int | None:
    """The newest version of `table` committed before `moment` (None: the newest of all). Where every
    version is newer: its first (version 1, created empty: the table did not exist then), or None
    where the older ones were compacted away."""
    history = table.versions()
    return max((v for v, t in history.items() if moment is None or t < moment), default=1 if 1 in history else None)


def tag(store: ExperienceStore, name: str, at: int | None = None) -> Snapshot:
    """Tag every table's version of `pinned(store, at)` as `name`; returns that snapshot."""
    existing = store.tables["trajectories"].tags()
    if name in existing:
        raise StoreError(f"{store.root}: tag {name!r} exists already (trajectories version {existing[name]})")
    snapshot = pinned(store, at)
    for table_name, table in store.tables.items():
        table.tag(name, snapshot.versions[table_name])
    return snapshot


def hold_name(run_dir: str | Path) -> str:
    """The tag that holds a run's snapshot: its directory's name (in the characters a tag may have; no
    dots, as Lance refuses two in a row) and a digest of its full path, so two runs of one name in two
    places hold apart and a resumed run finds its own."""
    path = str(Path(run_dir).resolve())
    return f"{HOLD}{re.sub(r'[^A-Za-z0-9_-]', '_', Path(path).name)[:60]}-{hashlib.sha1(path.encode()).hexdigest()[:8]}"


def hold(store: ExperienceStore, snapshot: Snapshot, name: str) -> None:
    """Tag every table's version of `snapshot` as `name` (moved where an earlier start of the run left it
    on other versions), so that `compact` keeps the versions a running run reads, whatever it is asked
    to remove."""
    for table_name, table in store.tables.items():
        held = table.tags().get(name)
        if held != snapshot.versions[table_name]:
            table.tag(name, snapshot.versions[table_name], move=held is not None)


def release(store: ExperienceStore, name: str) -> None:
    """Remove a run's hold (a finished run reads no more); its versions go at the next `compact`."""
    for table in store.tables.values():
        if name in table.tags():
            table.untag(name)


def untag(store: ExperienceStore, name: str) -> dict[str, int]:
    """Remove a tag (a user's or a run's hold) from every table; returns the versions it kept. A tag that
    does not exist is a StoreError naming those that do."""
    tags = {table_name: table.tags() for table_name, table in store.tables.items()}
    if name not in tags["trajectories"]:
        raise StoreError(f"{store.root} has no tag {name!r} (tags: {', '.join(sorted(tags['trajectories'])) or 'none'})")
    release(store, name)
    return {table_name: found[name] for table_name, found in tags.items() if name in found}


def holds(store: ExperienceStore) -> dict[str, int]:
    """Runs' holds on the store: tag -> the trajectories version it keeps. One left by a run that will not
    be resumed keeps its versions until `softrl data tag --delete` removes it."""
    return {name: v for name, v in store.tables["trajectories"].tags().items() if name.startswith(HOLD)}


def restore(store: ExperienceStore, at: int | str) -> Snapshot:
    """Every table's version of `pinned(store, at)` (a version of trajectories, or a tag) made the
    newest again, as a new version of its rows: the way back from a damaged table (docs/DATA.md, "A
    damaged table"). Refused when the files of that version are not all there either."""
    snapshot = pinned(store, at)
    for name, table in store.tables.items():
        problem = table.retried(lambda: table.damage(snapshot.versions[name]))  # noqa: B023 - called at once
        if problem is not None:
            raise StoreError(f"{store.root}: {name} version {snapshot.versions[name]} is damaged too ({problem}): "
                             "restore an earlier version or tag")
    for name, table in store.tables.items():
        if snapshot.versions[name] != table.latest():
            table.restore(snapshot.versions[name])
    return store.snapshot()


def compact(store: ExperienceStore, keep: int) -> dict[str, dict[str, int]]:
    """Every table's rows rewritten into one piece in commit order, then all versions but the newest
    `keep` and the tagged ones removed: per table, whether it was rewritten and versions removed."""
    if keep < 1:
        raise StoreError(f"keep-versions must be at least 1, got {keep}")
    return {name: {"rewritten": int(table.compact()), "versions_removed": table.cleanup(keep)}
            for name, table in store.tables.items()}
