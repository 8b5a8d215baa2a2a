"""`softrl data migrate OLD NEW`: a store of the old format (Parquet parts, data/legacy.py) copied
into a new store, each table checked after the copy (row count and content hash). Nothing is
deleted: OLD stays as it was.

Trajectories are copied row for row, duplicates included and in write order, so reads keep the
same first copy of each id; prompts and annotations as the old store read them (the last written
row of each key).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pyarrow as pa

from softrl.data import legacy
from softrl.data.store import KEYS, TABLES, ExperienceStore, location
from softrl.data.storage import StoreError


def content_hash(table: pa.Table) -> str:
    """SHA-256 of a table's rows as a multiset: the same rows in any order hash alike."""
    digests = sorted(hashlib.sha256(json.dumps(row, sort_keys=True, default=str).encode()).digest()
                     for row in table.to_pylist())
    return hashlib.sha256(b"".join(digests)).hexdigest()


def migrate(old: str | Path, new: str | Path) -> dict[str, dict[str, Any]]:
    """table -> {rows, sha256, skipped (old files that could not be read)}; a StoreError when OLD is
    not an old-format store, NEW already holds rows, or a copy does not check out."""
    old, new = location(old), location(new)
    if not legacy.is_legacy(old):
        raise StoreError(f"{old} is not an old-format store (no {legacy.MARKER} there)")
    target = ExperienceStore(new)
    if any(table.count(table.latest()) for table in target.tables.values()):
        raise StoreError(f"{new} already holds rows (an earlier migrate stopped halfway?): give a new location")
    report = {}
    for name, schema in TABLES.items():
        rows, skipped = legacy.read(old, name, schema)
        if name in KEYS:
            latest = {row[KEYS[name]]: row for row in rows.to_pylist()}
            rows = pa.Table.from_pylist(list(latest.values()), schema=schema)
        if rows.num_rows:
            target.tables[name].append(rows)
        table = target.tables[name]
        copied = table.read(table.latest())
        digest = content_hash(rows)
        if copied.num_rows != rows.num_rows or content_hash(copied) != digest:
            raise StoreError(f"{new}: the copy of {name} does not match {old} ({copied.num_rows} rows copied of "
                             f"{rows.num_rows}); {old} is untouched")
        report[name] = {"rows": rows.num_rows, "sha256": digest, "skipped": skipped}
    return report
