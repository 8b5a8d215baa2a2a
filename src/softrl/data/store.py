"""ExperienceStore: an append-only directory of Parquet part files that keeps every trajectory of
every run.

    STORE/trajectories/part-*.parquet   Trajectory rows (schema.TRAJECTORY_SCHEMA)
    STORE/prompts/part-*.parquet        prompt rows; the newest row of a prompt id wins
    STORE/annotations/part-*.parquet    MC targets, joined onto their trajectory when read

Each write is one new part file, written to a hidden temporary name, fsynced and renamed, so a
reader never sees a torn file and a writer killed mid-write leaves only a hidden temporary file
behind. Writers never touch each other's files, so any number of processes can append at once.
A reader lists the part files once (its snapshot) and reads only those. Files it cannot read are
reported by name in `problems` and skipped; they are never deleted.
"""

from __future__ import annotations

import fcntl
import json
import os
import uuid
from collections.abc import Iterable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from softrl.data.schema import ANNOTATION_SCHEMA, PROMPT_SCHEMA, TRAJECTORY_SCHEMA, Trajectory, now
from softrl.tasks.base import check_reward

# columns later versions added: parts written before them read as null there
ADDED_COLUMNS = {"q0_rewards"}
TABLES = {"trajectories": TRAJECTORY_SCHEMA, "prompts": PROMPT_SCHEMA, "annotations": ANNOTATION_SCHEMA}
FILTERABLE = ("task", "source", "run_id", "passed", "policy_version", "tokenizer", "prompt_id")
MARKER = "softrl-store.json"


class StoreError(ValueError):
    """The store directory cannot be used (one line, naming the path)."""


@dataclass(frozen=True)
class Problem:
    path: Path
    reason: str

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}"


@dataclass(frozen=True)
class Snapshot:
    """The part files of every table at one moment."""

    parts: dict[str, tuple[Path, ...]]


def part_name() -> str:
    # time first so that a directory listing is in write order (newest prompt row wins)
    return f"part-{now().strftime('%Y%m%dT%H%M%S%f')}-{os.getpid()}-{uuid.uuid4().hex[:8]}.parquet"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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


class ExperienceStore:
    def __init__(self, root: str | os.PathLike, create: bool = True):
        self.root = Path(root)
        marker = self.root / MARKER
        if self.root.exists() and not self.root.is_dir():
            raise StoreError(f"{self.root} is a file, not a store directory")
        if not marker.exists():
            if not create:
                raise StoreError(f"{self.root} is not an experience store (no {MARKER}); create one with any write")
            if self.root.exists() and any(p.name not in TABLES for p in self.root.iterdir()):
                raise StoreError(f"{self.root} holds other files; give an empty or new directory for a store")
            for table in TABLES:
                (self.root / table).mkdir(parents=True, exist_ok=True)
            self._write_atomic(marker, json.dumps({"kind": "softrl-experience-store", "version": 1}).encode())
        self.problems: list[Problem] = []

    # --- writing ------------------------------------------------------------------------------
    def _write_atomic(self, final: Path, data: bytes | pa.Table) -> None:
        tmp = final.with_name(f".{final.name}.{uuid.uuid4().hex[:8]}.tmp")
        try:
            if isinstance(data, pa.Table):
                pq.write_table(data, tmp, compression="zstd")
            else:
                tmp.write_bytes(data)
            fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            os.rename(tmp, final)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        _fsync_dir(final.parent)

    def _write_part(self, table_name: str, rows: list[dict[str, Any]] | pa.Table) -> Path | None:
        if not len(rows):
            return None
        table = rows if isinstance(rows, pa.Table) else pa.Table.from_pylist(rows, schema=TABLES[table_name])
        final = self.root / table_name / part_name()
        self._write_atomic(final, table)
        return final

    def append(self, trajectories: Iterable[Trajectory | dict[str, Any]]) -> int:
        """Write trajectories as one part file (duplicates within the call dropped); returns rows written.
        Every reward must be a finite number in [0, 1]: one bad row is a RewardError and nothing is written."""
        rows: dict[str, dict[str, Any]] = {}
        for t in trajectories:
            row = (t if isinstance(t, Trajectory) else Trajectory.from_row(t)).to_row()
            row["reward"] = check_reward(row["reward"], f"task {row['task'] or '?'}, prompt {row['prompt_id']}, "
                                                        f"trajectory {row['id']}")
            rows.setdefault(row["id"], row)
        self._write_part("trajectories", list(rows.values()))
        return len(rows)

    def put_prompts(self, rows: Iterable[dict[str, Any]]) -> int:
        """Add or update prompts (a later row for the same prompt_id wins); `meta` may be a dict."""
        out = []
        for row in rows:
            row = {**row, "updated_at": now()}
            if not isinstance(row.get("meta", ""), str):
                row["meta"] = json.dumps(row["meta"], sort_keys=True, default=str)
            out.append(row)
        self._write_part("prompts", out)
        return len(out)

    def annotate(self, mc_targets: dict[str, list[dict[str, Any]]], source: str = "pts") -> int:
        """Set the MC targets `[{"t", "success", "k"}]` of trajectories by id."""
        rows = [{"trajectory_id": tid, "mc_targets": targets, "source": source, "created_at": now()}
                for tid, targets in mc_targets.items()]
        self._write_part("annotations", rows)
        return len(rows)

    # --- reading ------------------------------------------------------------------------------
    def snapshot(self) -> Snapshot:
        parts = {}
        for name in TABLES:
            directory = self.root / name
            files = []
            for path in sorted(directory.iterdir()) if directory.is_dir() else []:
                if path.name.startswith("."):
                    continue  # a write in progress, or the leftover of a killed writer
                if path.suffix != ".parquet" or not path.is_file():
                    self._report(path, "not a Parquet part file; skipped")
                    continue
                files.append(path)
            parts[name] = tuple(files)
        return Snapshot(parts)

    def _report(self, path: Path, reason: str) -> None:
        problem = Problem(path, reason)
        if problem not in self.problems:
            self.problems.append(problem)

    def _read(self, table_name: str, snapshot: Snapshot | None, filters: pc.Expression | None = None,
              columns: Sequence[str] | None = None) -> pa.Table:
        schema = TABLES[table_name]
        wanted = pa.schema([schema.field(c) for c in columns]) if columns else schema
        tables = []
        for path in (snapshot or self.snapshot()).parts[table_name]:
            try:
                found = pq.read_schema(path)
                missing = [f.name for f in schema if f.name not in found.names and f.name not in ADDED_COLUMNS]
                if missing:
                    self._report(path, f"not a softrl {table_name} part (missing column {missing[0]!r}); skipped")
                    continue
                table = pq.read_table(path, columns=[n for n in wanted.names if n in found.names], filters=filters)
                for name in wanted.names:  # a part written before a column existed: null there
                    if name not in table.column_names:
                        table = table.append_column(wanted.field(name), pa.nulls(len(table), wanted.field(name).type))
                tables.append(table.select(wanted.names).cast(wanted))
            except (OSError, pa.ArrowException, ValueError) as e:
                self._report(path, f"unreadable ({type(e).__name__}: {str(e).splitlines()[0][:200]}); skipped")
        return pa.concat_tables(tables) if tables else wanted.empty_table()

    def trajectories(self, snapshot: Snapshot | None = None, columns: Sequence[str] | None = None,
                     unique: bool = True, **filters: Any) -> pa.Table:
        """Rows matching `filters` (see FILTERABLE; a value or a list of values), first copy of each id,
        with the newest MC-target annotation joined in."""
        snapshot = snapshot or self.snapshot()
        if columns is not None:
            columns = list(dict.fromkeys(["id", *columns]))
        table = self._read("trajectories", snapshot, filter_expression(filters), columns)
        if unique and table.num_rows:
            table = table.take(first_occurrences(table["id"]))
        if (columns is None or "mc_targets" in columns) and snapshot.parts["annotations"] and table.num_rows:
            table = self._join_annotations(table, snapshot)
        return table

    def _join_annotations(self, table: pa.Table, snapshot: Snapshot) -> pa.Table:
        notes = self._read("annotations", snapshot)
        newest = dict(zip(notes["trajectory_id"].to_pylist(), notes["mc_targets"].to_pylist()))
        if not newest:
            return table
        targets = [newest.get(i, old) for i, old in zip(table["id"].to_pylist(), table["mc_targets"].to_pylist())]
        index = table.schema.get_field_index("mc_targets")
        return table.set_column(index, table.schema.field(index), pa.array(targets, type=table.schema.field(index).type))

    def prompts(self, snapshot: Snapshot | None = None) -> dict[str, dict[str, Any]]:
        """prompt_id -> the newest row for it (meta decoded)."""
        out: dict[str, dict[str, Any]] = {}
        for row in self._read("prompts", snapshot).to_pylist():
            row["meta"] = json.loads(row["meta"]) if row["meta"] else {}
            out[row["prompt_id"]] = row
        return out

    def __len__(self) -> int:
        return self.trajectories(columns=["id"]).num_rows

    # --- maintenance --------------------------------------------------------------------------
    def stats(self, snapshot: Snapshot | None = None) -> dict[str, Any]:
        """Per source: trajectories, distinct prompts, pass rate, mean reward, annotated rows."""
        snapshot = snapshot or self.snapshot()
        table = self.trajectories(snapshot, columns=["source", "prompt_id", "passed", "reward", "mc_targets"])
        raw_rows = self._read("trajectories", snapshot, columns=["id"]).num_rows
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
            "part_files": {name: len(files) for name, files in snapshot.parts.items()},
            "sources": per_source, "problems": [str(p) for p in self.problems],
        }

    def dedupe(self) -> tuple[int, int]:
        """Rewrite the readable trajectory parts of a snapshot as one part without duplicates and with
        annotations folded in; returns (rows before, rows after). Unreadable files are left alone, and
        parts written meanwhile by other writers are not touched. One dedupe at a time: a second,
        meanwhile, is refused (both would rewrite the same parts)."""
        with self._alone("dedupe"):
            return self._dedupe()

    @contextmanager
    def _alone(self, what: str):
        """Hold the store's lock for `what`, or a StoreError if another process holds it."""
        with open(self.root / f".{what}.lock", "a") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise StoreError(f"{self.root}: another {what} of this store is running; wait for it to end") from None
            yield

    def _dedupe(self) -> tuple[int, int]:
        snapshot = self.snapshot()
        before = self._read("trajectories", snapshot, columns=["id"]).num_rows
        table = self.trajectories(snapshot)
        unreadable = {p.path for p in self.problems}
        self._write_part("trajectories", table)
        for name in ("trajectories", "annotations"):
            for path in snapshot.parts[name]:
                if path not in unreadable:
                    path.unlink()
        _fsync_dir(self.root / "trajectories")
        return before, table.num_rows
