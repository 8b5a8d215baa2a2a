"""ExperienceStore: every trajectory of every run, in three Lance tables under one root, a local
directory or an s3://bucket/prefix URI (data/tables.py).

    ROOT/trajectories.lance   Trajectory rows (schema.TRAJECTORY_SCHEMA), appended
    ROOT/prompts.lance        prompt rows, upserted on prompt_id
    ROOT/annotations.lance    MC targets, upserted on trajectory_id; joined onto their trajectory when read

A `Snapshot` is the version of each table at one moment; every read at a snapshot sees exactly
those versions, whatever is appended or deduplicated meanwhile. Where rows share a key, "first"
and "newest" are by commit order (Lance's row addresses grow with each commit), never by a
writer's clock.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from softrl.data import legacy
from softrl.data.schema import ANNOTATION_SCHEMA, PROMPT_SCHEMA, TRAJECTORY_SCHEMA, Trajectory, now
from softrl.data.tables import MissingTable, StoreError, Table, with_retries
from softrl.tasks.base import check_reward

__all__ = ["ExperienceStore", "Snapshot", "StoreError"]

TABLES = {"trajectories": TRAJECTORY_SCHEMA, "prompts": PROMPT_SCHEMA, "annotations": ANNOTATION_SCHEMA}
KEYS = {"prompts": "prompt_id", "annotations": "trajectory_id"}
FILTERABLE = ("task", "source", "run_id", "passed", "policy_version", "tokenizer", "prompt_id")
ADDRESS = "_rowaddr"


@dataclass(frozen=True)
class Snapshot:
    """The version of every table at one moment."""

    versions: dict[str, int]


def filter_expression(filters: dict[str, Any]) -> pc.Expression | None:
    """`{"source": "online", "passed": True, "task": ["a", "b"]}` -> an Arrow filter (None for no filter)."""
    expr = None
    for key, value in filters.items():
        if key not in FILTERABLE:
            raise ValueError(f"unknown filter {key!r}; use {', '.join(FILTERABLE)}")
        if value is None:
            continue
        values = list(value) if isinstance(value, (list, tuple, set)) else [value]
        term = pc.field(key).isin(values)
        expr = term if expr is None else expr & term
    return expr


def first_occurrences(ids: pa.Array) -> np.ndarray:
    """Row indices of the first row of every distinct id, in row order."""
    _, first = np.unique(np.asarray(ids.to_pylist(), dtype=object), return_index=True)
    return np.sort(first)


def in_commit_order(table: pa.Table) -> pa.Table:
    """Rows sorted by row address (commit order), the address column dropped."""
    return table.take(pc.sort_indices(table[ADDRESS])).drop_columns([ADDRESS])


def newest(table: pa.Table, key: str) -> dict[str, dict[str, Any]]:
    """key -> the last committed row of that key (concurrent upserts of a new key can leave two)."""
    return {row[key]: row for row in in_commit_order(table).to_pylist()}


def location(root: str | Path) -> str:
    """A root as Lance takes it: an s3:// URI as given (less a trailing slash), a path as a path."""
    text = str(root)
    return text.rstrip("/") if text.startswith("s3://") else str(Path(text))


class ExperienceStore:
    def __init__(self, root: str | Path, create: bool = True):
        self.root = location(root)
        if legacy.is_legacy(self.root):
            raise StoreError(f"{self.root} is an experience store of the old format (Parquet parts): copy it into "
                             f"a new store with `softrl data migrate {self.root} NEW` and use that")
        local = None if self.root.startswith("s3://") else Path(self.root)
        if local is not None and local.exists() and not local.is_dir():
            raise StoreError(f"{self.root} is a file, not a store directory")
        if create and local is not None and local.exists() and not (local / "trajectories.lance").exists() \
                and any(p.name not in {f"{t}.lance" for t in TABLES} for p in local.iterdir()):
            raise StoreError(f"{self.root} holds other files; give an empty or new directory for a store")
        try:
            self.tables = {name: Table(f"{self.root}/{name}.lance", schema, create) for name, schema in TABLES.items()}
        except MissingTable:
            raise StoreError(f"{self.root} is not an experience store (no trajectories.lance); create one with any "
                             "write") from None

    # --- writing ------------------------------------------------------------------------------
    def append(self, trajectories: Iterable[Trajectory | dict[str, Any]]) -> int:
        """Write trajectories in one commit (duplicates within the call dropped); returns rows written.
        Every reward must be a finite number in [0, 1]: one bad row is a RewardError and nothing is written."""
        rows: dict[str, dict[str, Any]] = {}
        for t in trajectories:
            row = (t if isinstance(t, Trajectory) else Trajectory.from_row(t)).to_row()
            row["reward"] = check_reward(row["reward"], f"task {row['task'] or '?'}, prompt {row['prompt_id']}, "
                                                        f"trajectory {row['id']}")
            rows.setdefault(row["id"], row)
        if rows:
            self.tables["trajectories"].append(pa.Table.from_pylist(list(rows.values()), schema=TRAJECTORY_SCHEMA))
        return len(rows)

    def _upsert(self, name: str, rows: list[dict[str, Any]]) -> int:
        unique = {row[KEYS[name]]: row for row in rows}  # within one call, the later row wins
        if unique:
            self.tables[name].upsert(KEYS[name], pa.Table.from_pylist(list(unique.values()), schema=TABLES[name]))
        return len(rows)

    def put_prompts(self, rows: Iterable[dict[str, Any]]) -> int:
        """Add or update prompts (the last committed row of a prompt_id wins); `meta` may be a dict."""
        out = []
        for row in rows:
            row = {**row, "updated_at": now()}
            if not isinstance(row.get("meta", ""), str):
                row["meta"] = json.dumps(row["meta"], sort_keys=True, default=str)
            out.append(row)
        return self._upsert("prompts", out)

    def annotate(self, mc_targets: dict[str, list[dict[str, Any]]], source: str = "pts") -> int:
        """Set the MC targets `[{"t", "success", "k"}]` of trajectories by id."""
        return self._upsert("annotations", [{"trajectory_id": tid, "mc_targets": targets, "source": source,
                                             "created_at": now()} for tid, targets in mc_targets.items()])

    # --- reading ------------------------------------------------------------------------------
    def snapshot(self) -> Snapshot:
        return Snapshot({name: table.latest() for name, table in self.tables.items()})

    def trajectories(self, snapshot: Snapshot | None = None, columns: Sequence[str] | None = None,
                     unique: bool = True, **filters: Any) -> pa.Table:
        """Rows matching `filters` (see FILTERABLE; a value or a list of values), in commit order, the
        first committed copy of each id, with the newest MC-target annotation joined in."""
        snapshot = snapshot or self.snapshot()
        where = filter_expression(filters)
        if columns is not None:
            columns = list(dict.fromkeys(["id", *columns]))
        table = in_commit_order(self.tables["trajectories"].read(snapshot.versions["trajectories"], columns, where,
                                                                  row_address=True))
        if unique and table.num_rows:
            table = table.take(first_occurrences(table["id"]))
        if (columns is None or "mc_targets" in columns) and table.num_rows:
            table = self._join_annotations(table, snapshot)
        return table

    def _join_annotations(self, table: pa.Table, snapshot: Snapshot) -> pa.Table:
        notes = newest(self.tables["annotations"].read(snapshot.versions["annotations"], row_address=True),
                       "trajectory_id")
        if not notes:
            return table
        targets = [notes[i]["mc_targets"] if i in notes else old
                   for i, old in zip(table["id"].to_pylist(), table["mc_targets"].to_pylist())]
        index = table.schema.get_field_index("mc_targets")
        return table.set_column(index, table.schema.field(index), pa.array(targets, type=table.schema.field(index).type))

    def prompts(self, snapshot: Snapshot | None = None) -> dict[str, dict[str, Any]]:
        """prompt_id -> its last committed row (meta decoded)."""
        snapshot = snapshot or self.snapshot()
        out = newest(self.tables["prompts"].read(snapshot.versions["prompts"], row_address=True), "prompt_id")
        for row in out.values():
            row["meta"] = json.loads(row["meta"]) if row["meta"] else {}
        return out

    def __len__(self) -> int:
        return self.trajectories(columns=["id"]).num_rows

    # --- maintenance --------------------------------------------------------------------------
    def stats(self, snapshot: Snapshot | None = None) -> dict[str, Any]:
        """Per source: trajectories, distinct prompts, pass rate, mean reward, annotated rows."""
        snapshot = snapshot or self.snapshot()
        table = self.trajectories(snapshot, columns=["source", "prompt_id", "passed", "reward", "mc_targets"])
        raw_rows = self.tables["trajectories"].at(snapshot.versions["trajectories"]).count_rows()
        per_source = {}
        sources = table["source"].to_pylist()
        for source in sorted(set(sources)):
            part = table.filter(pc.equal(table["source"], source))
            per_source[source] = {
                "trajectories": part.num_rows,
                "prompts": len(pc.unique(part["prompt_id"])),
                "pass_rate": pc.mean(part["passed"].cast(pa.float64())).as_py(),
                "mean_reward": pc.mean(part["reward"]).as_py(),
                "with_mc_targets": sum(1 for m in part["mc_targets"].to_pylist() if m),
            }
        prompts = self.prompts(snapshot)
        return {
            "trajectories": table.num_rows, "duplicates": raw_rows - table.num_rows,
            "prompts": len(pc.unique(table["prompt_id"])) if table.num_rows else 0,
            "prompts_with_q0": sum(1 for p in prompts.values() if p["q0_hat"] is not None),
            "versions": dict(snapshot.versions), "sources": per_source,
        }

    def dedupe(self) -> tuple[int, int]:
        """Commit the trajectories of the latest version without duplicate ids (the first committed copy
        kept); returns (rows before, rows after). Rows appended meanwhile are kept as they are, and a
        reader of an older version goes on reading it; a concurrent dedupe makes this one start over."""
        table = self.tables["trajectories"]

        def attempt() -> tuple[int, int]:
            version = table.latest()
            rows = in_commit_order(table.read(version, row_address=True))
            kept = rows.take(first_occurrences(rows["id"])) if rows.num_rows else rows
            if kept.num_rows < rows.num_rows:
                table.replace(version, kept)
            return rows.num_rows, kept.num_rows

        return with_retries(attempt, table.uri)
