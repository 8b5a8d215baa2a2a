"""ExperienceStore: every trajectory of every run, in three tables under one root, a local
directory or an s3://bucket/prefix URI, each behind the storage interface (data/storage.py).

    trajectories   Trajectory rows (schema.TRAJECTORY_SCHEMA), appended
    prompts        prompt rows, upserted on prompt_id
    annotations    MC targets, upserted on trajectory_id; joined onto their trajectory when read

(on Lance: ROOT/trajectories.lance and so on).

A `Snapshot` is the version of each table at one moment; every read at a snapshot sees exactly
those versions, whatever is appended or deduplicated meanwhile. Where rows share a key, "first"
and "newest" are by commit order (row handles grow with each commit), never by a writer's clock.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from softrl.data import legacy
from softrl.data.pool import (
    HeldColumns, KeySet, LaterCopies, Reads, StoredPool, encode, first_by_handle, first_copies, id_keys, in_sorted, owned,
    sorted_distinct,
)
from softrl.data.schema import ANNOTATION_SCHEMA, PROMPT_SCHEMA, TRAJECTORY_SCHEMA, Trajectory, now
from softrl.data.lance_table import COPY_BATCH_ROWS, LanceTable, table_file
from softrl.data.packed import PackedRows
from softrl.data.storage import HANDLE, MissingTable, Staged, StoreError, Table, damaged
from softrl.tasks.base import check_reward

__all__ = ["ExperienceStore", "Snapshot", "StoreError"]

# The narrow columns a pool holds in memory from its build scan (strings as codes), so that a draw takes
# only the others by handle: Lance reads each column of each data file a draw touches on its own. At 1e7
# rows (200 files) a draw of 64 took 32-38 ms this way against 65-70 ms taking all twenty columns
# (benchmarks/store_draw.py); holding seven of these eleven kept the build's peak memory 130 MiB lower
# but drew in 45-51 ms against 54 (docs/BENCHMARKS.md, "The experience store: `softrl bench store`").
HELD = ("prompt_id", "task", "tokenizer", "reward", "passed", "source", "run_id", "policy_version", "decoding",
        "created_at", "finish")
TABLES = {"trajectories": TRAJECTORY_SCHEMA, "prompts": PROMPT_SCHEMA, "annotations": ANNOTATION_SCHEMA}
KEYS = {"prompts": "prompt_id", "annotations": "trajectory_id"}
FILTERABLE = ("task", "source", "run_id", "passed", "policy_version", "tokenizer", "prompt_id")
# `rewards_by_prompt`: one row per prompt, its first copies' rewards and pass flags in commit order
PROMPT_REWARDS = pa.schema([("prompt_id", pa.string()), ("task", pa.string()), ("text", pa.string()),
                            ("rewards", pa.list_(pa.float64())), ("passed", pa.list_(pa.bool_()))])


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


def both(a: pc.Expression | None, b: pc.Expression | None) -> pc.Expression | None:
    return a if b is None else b if a is None else a & b


def in_commit_order(table: pa.Table) -> pa.Table:
    """Rows sorted by row handle (commit order), the handle column dropped."""
    return table.take(pc.sort_indices(table[HANDLE])).drop_columns([HANDLE])


def newest(table: pa.Table, key: str) -> dict[str, dict[str, Any]]:
    """key -> the last committed row of that key (concurrent upserts of a new key can leave two)."""
    return {row[key]: row for row in in_commit_order(table).to_pylist()}


def prompt_hashes(values: pa.Array) -> np.ndarray:
    """`[N]` uint64: each prompt id's hash, for counting distinct prompts without a string per prompt
    held (Python's hash of the text, one call per distinct id in the batch; fixed within a process)."""
    encoded = pc.dictionary_encode(pc.fill_null(values, ""))
    words = np.array([hash(v) for v in encoded.dictionary.to_pylist()], dtype=np.int64).view(np.uint64)
    return words[encoded.indices.to_numpy()] if len(words) else np.empty(0, np.uint64)


def distinct(parts: list[np.ndarray]) -> np.ndarray:
    return sorted_distinct(np.concatenate(parts)) if parts else np.empty(0, np.uint64)


class SourceSums:
    """One source's running figures over the first copies `stats` scans: counts, sums and its distinct
    prompts' hashes (made distinct whenever the batches since outnumber them)."""

    def __init__(self):
        self.rows = self.annotated = 0
        self.known = {"passed": [0, 0.0], "reward": [0, 0.0]}  # values that are not NaN: count, sum
        self.seen, self.recent, self.recent_size = np.empty(0, np.uint64), [], 0

    def add(self, prompts: np.ndarray, passed: np.ndarray, reward: np.ndarray, annotated: np.ndarray) -> None:
        self.rows += len(prompts)
        self.annotated += int(annotated.sum())
        for name, values in (("passed", passed), ("reward", reward)):
            values = values[~np.isnan(values)]
            self.known[name][0] += len(values)
            self.known[name][1] += float(values.sum())
        self.recent.append(sorted_distinct(prompts))
        self.recent_size += len(self.recent[-1])
        if self.recent_size > max(len(self.seen), 1 << 16):
            self.prompts()

    def prompts(self) -> np.ndarray:
        if self.recent:
            self.seen, self.recent, self.recent_size = distinct([self.seen, *self.recent]), [], 0
        return self.seen

    def figures(self) -> dict[str, Any]:
        mean = {name: total / count if count else None for name, (count, total) in self.known.items()}
        return {"trajectories": self.rows, "prompts": len(self.prompts()), "pass_rate": mean["passed"],
                "mean_reward": mean["reward"], "with_mc_targets": self.annotated}


class TargetIndex:
    """Which rows have MC targets: their newest annotation's (an annotation with none empties a row's
    own), else their own; built once from the annotations (`store.annotations`), asked per batch."""

    def __init__(self, notes: dict[str, list]):
        self.annotated = KeySet(id_keys(pa.array([k for k, v in notes.items() if v], pa.string())))
        self.emptied = KeySet(id_keys(pa.array([k for k, v in notes.items() if not v], pa.string())))

    def of(self, keys: np.ndarray, own: pa.Array) -> np.ndarray:
        """`[N]` bool for rows with id keys `keys` and their own `mc_targets` (null: none)."""
        has_own = pc.fill_null(pc.greater(pc.list_value_length(own), 0), False).to_numpy(zero_copy_only=False)
        return self.annotated.members(keys) | (has_own & ~self.emptied.members(keys))


def location(root: str | Path) -> str:
    """A root as the storage takes it: an s3:// URI as given (less a trailing slash), a path as a path."""
    text = str(root)
    return text.rstrip("/") if text.startswith("s3://") else str(Path(text))


def checked_rows(trajectories: Iterable[Trajectory | dict[str, Any]]) -> pa.Table:
    """Trajectory rows as a table, the later copies of an id dropped; a reward that is not a finite
    number in [0, 1] is a RewardError naming the row."""
    rows: dict[str, dict[str, Any]] = {}
    for t in trajectories:
        row = (t if isinstance(t, Trajectory) else Trajectory.from_row(t)).to_row()
        row["reward"] = check_reward(row["reward"], f"task {row['task'] or '?'}, prompt {row['prompt_id']}, "
                                                    f"trajectory {row['id']}")
        rows.setdefault(row["id"], row)
    return pa.Table.from_pylist(list(rows.values()), schema=TRAJECTORY_SCHEMA)


class ExperienceStore:
    def __init__(self, root: str | Path, create: bool = True):
        if str(root).startswith("s3://") and not str(root).removeprefix("s3://").split("/")[0]:
            raise StoreError(f"{root} names no bucket: give s3://BUCKET or s3://BUCKET/PREFIX")
        self.root = location(root)
        if legacy.is_legacy(self.root):
            raise StoreError(f"{self.root} is an experience store of the old format (Parquet parts): copy it into "
                             f"a new store with `softrl data migrate {self.root} NEW` and use that")
        local = None if self.root.startswith("s3://") else Path(self.root)
        if local is not None and local.exists() and not local.is_dir():
            raise StoreError(f"{self.root} is a file, not a store directory")
        if create and local is not None and local.exists() and not (local / table_file("trajectories")).exists() \
                and any(p.name not in {table_file(t) for t in TABLES} for p in local.iterdir()):
            raise StoreError(f"{self.root} holds other files; give an empty or new directory for a store")
        try:
            # the one place that picks the storage implementation (data/storage.py)
            self.tables: dict[str, Table] = {name: LanceTable(self.root, name, schema, create)
                                             for name, schema in TABLES.items()}
        except MissingTable:
            raise StoreError(f"{self.root} is not an experience store (no {table_file('trajectories')}); create one "
                             "with any write") from None

    def check_intact(self) -> None:
        """A StoreError naming the first damaged table and its damage (docs/DATA.md, "A damaged table"):
        a run checks before it starts, rather than have its first commit refused halfway."""
        for table in self.tables.values():
            problem = table.retried(table.damage)
            if problem is not None:
                raise damaged(table.uri, problem)

    # --- writing ------------------------------------------------------------------------------
    def append(self, trajectories: Iterable[Trajectory | dict[str, Any]]) -> int:
        """Write trajectories in one commit (duplicates within the call dropped); returns rows written.
        Every reward must be a finite number in [0, 1]: one bad row is a RewardError and nothing is written."""
        rows = checked_rows(trajectories)
        if rows.num_rows:
            self.tables["trajectories"].append(rows)
        return rows.num_rows

    def stage(self, trajectories: Iterable[Trajectory | dict[str, Any]]) -> list[Staged]:
        """Write trajectories (checked as `append` checks them) without committing them: a rollout
        worker on any node writes, one committer commits many workers' staged rows at once
        (`commit_staged`); until then no reader sees them, and a worker killed meanwhile leaves
        only files that no version names."""
        rows = checked_rows(trajectories)
        return [self.tables["trajectories"].stage(rows)] if rows.num_rows else []

    def commit_staged(self, staged: Sequence[Staged]) -> None:
        """One commit of every write `stage` staged (in the order given)."""
        if staged:
            self.tables["trajectories"].commit_staged(list(staged))

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
                     unique: bool = True, where: pc.Expression | None = None, **filters: Any) -> pa.Table:
        """Rows matching `filters` (see FILTERABLE; a value or a list of values) and `where` (an Arrow
        expression), in commit order, the first committed copy of each id, with the newest MC-target
        annotation joined in."""
        snapshot = snapshot or self.snapshot()
        where = both(filter_expression(filters), where)
        if columns is not None:
            columns = list(dict.fromkeys(["id", *columns]))
        table = in_commit_order(self.tables["trajectories"].read(snapshot.versions["trajectories"], columns, where,
                                                                  handles=True))
        if unique and table.num_rows:
            table = table.take(first_copies(id_keys(table["id"])))
        if (columns is None or "mc_targets" in columns) and table.num_rows:
            table = self._join_annotations(table, snapshot)
        return table

    def annotations(self, snapshot: Snapshot, ids: Sequence[str] | None = None) -> dict[str, list]:
        """trajectory id -> its newest MC targets (of `ids` only, read by filter, when given)."""
        where = None if ids is None else pc.field("trajectory_id").isin(list(ids))
        notes = self.tables["annotations"].read(snapshot.versions["annotations"], ["trajectory_id", "mc_targets"],
                                                where, handles=True)
        return {k: row["mc_targets"] for k, row in newest(notes, "trajectory_id").items()}

    def _join_annotations(self, table: pa.Table, snapshot: Snapshot, by_filter: bool = False) -> pa.Table:
        """`table` with each row's newest annotation as its `mc_targets`; `by_filter`: read only the
        annotations of its ids (a few rows drawn from a large table)."""
        notes = self.annotations(snapshot, table["id"].to_pylist() if by_filter else None)
        if not notes:
            return table
        targets = [notes[i] if i in notes else old
                   for i, old in zip(table["id"].to_pylist(), table["mc_targets"].to_pylist())]
        index = table.schema.get_field_index("mc_targets")
        return table.set_column(index, table.schema.field(index), pa.array(targets, type=table.schema.field(index).type))

    def pool(self, snapshot: Snapshot | None = None, prompt_ids: Sequence[str] | None = None, annotated: bool = False,
             copy: bool | None = None, reads: Reads | None = None, **filters: Any) -> StoredPool:
        """The rows `trajectories(snapshot, **filters)` gives (of `prompt_ids` only, and only those with MC
        targets when `annotated`) as a StoredPool: one scan of their ids and HELD columns, the filters
        pushed down to the storage; each draw takes the other columns of its rows by handle (those
        `reads` names, where given). With `copy` (by default where the store is on an object store) the
        scan also copies those columns to local disk, packed row by row (`PackedRows`), and draws read
        them there: one scan of the pool's rows, then one local read a drawn row."""
        snapshot = snapshot or self.snapshot()
        version, table = snapshot.versions["trajectories"], self.tables["trajectories"]
        where = both(filter_expression(filters), None if prompt_ids is None else pc.field("prompt_id").isin(list(prompt_ids)))
        targets = TargetIndex(self.annotations(snapshot)) if annotated else None
        held = HeldColumns([TRAJECTORY_SCHEMA.field(name) for name in HELD])
        wide = [f.name for f in TRAJECTORY_SCHEMA if f.name not in HELD]
        read = wide if reads is None else [n for n in wide if n in reads.always or n in reads.later]
        local = PackedRows([TRAJECTORY_SCHEMA.field(name) for name in read]) \
            if (self.root.startswith("s3://") if copy is None else copy) else None
        scanned = ["id", *HELD] + (["mc_targets"] if annotated else [])
        handles, keys, keeps = [], [], []

        def scan() -> Iterator[pa.RecordBatch]:
            for batch in table.batches(version, scanned + [n for n in read if local and n not in scanned], where, True,
                                       COPY_BATCH_ROWS if local else None):
                batch_keys = id_keys(batch["id"])
                keeps.append(targets.of(batch_keys, batch["mc_targets"]) if targets else np.ones(batch.num_rows, dtype=bool))
                handles.append(owned(batch[HANDLE]))
                keys.append(batch_keys)
                held.add(batch)
                yield batch

        batches = scan()
        if local:
            local.write(batches)
        for _ in batches:  # all of it, or what the copy left when it gave up
            pass
        # each list replaced by its concatenation, so that the batches' parts are not held beside it
        handles = np.concatenate(handles) if handles else np.empty(0, dtype=np.uint64)
        keys = np.concatenate(keys) if keys else np.empty((0, 2), dtype=np.uint64)
        first = first_by_handle(handles, keys)
        del keys
        if len(first):
            first = first[np.concatenate(keeps)[first]]  # the first copy decides, as `trajectories` does
        del keeps
        handle = handles[first]
        del handles
        held.keep(first)
        copied = local if local and not local.given_up else None
        noted = self.tables["annotations"].count(snapshot.versions["annotations"]) > 0  # else no join to read

        def take(positions: np.ndarray, columns: Sequence[str] | None) -> pa.Table:
            """The rows at `positions` (ascending): the held columns from memory, the wide `columns` (None:
            all) from the local copy or by handle, the others null."""
            names = [n for n in read if columns is None or n in columns]
            taken = {} if not names else copied.take(first[positions], names) if copied else \
                table.take(version, handle[positions], names)
            part, n = held.take(positions), len(positions)
            rows = pa.table([part[f.name] if f.name in HELD else taken[f.name] if f.name in names else pa.nulls(n, f.type)
                             for f in TRAJECTORY_SCHEMA], schema=TRAJECTORY_SCHEMA)
            joins = noted and n and "id" in names and "mc_targets" in names
            return self._join_annotations(rows, snapshot, by_filter=True) if joins else rows

        return StoredPool(handle, held.columns["prompt_id"], held.names("prompt_id"), take, local, reads)

    def prompts(self, snapshot: Snapshot | None = None, ids: Sequence[str] | None = None) -> dict[str, dict[str, Any]]:
        """prompt_id -> its last committed row (meta decoded); of `ids` only (read by filter) when given."""
        snapshot = snapshot or self.snapshot()
        where = None if ids is None else pc.field("prompt_id").isin(list(ids))
        out = newest(self.tables["prompts"].read(snapshot.versions["prompts"], where=where, handles=True), "prompt_id")
        for row in out.values():
            row["meta"] = json.loads(row["meta"]) if row["meta"] else {}
        return out

    def __len__(self) -> int:
        return self.trajectories(columns=["id"]).num_rows

    # --- maintenance --------------------------------------------------------------------------
    def stats(self, snapshot: Snapshot | None = None) -> dict[str, Any]:
        """Per source: trajectories, distinct prompts, pass rate, mean reward, annotated rows, of each id's
        first copy. Two scans, a batch at a time: the ids, for the later copies (`LaterCopies`), then
        five small columns summed per source. Held: a batch, the later copies' handles and 8 bytes a
        distinct prompt of each source, never anything per row."""
        snapshot = snapshot or self.snapshot()
        version, table = snapshot.versions["trajectories"], self.tables["trajectories"]
        later = self.later_copies(version)
        notes = self.annotations(snapshot)
        targets = TargetIndex(notes) if notes else None
        sums: dict[str, SourceSums] = {}
        sources: dict[str, int] = {}
        for batch in table.batches(version, ["source", "prompt_id", "passed", "reward", "mc_targets"]
                                   + (["id"] if targets else []), handles=True):
            first = ~in_sorted(batch[HANDLE].to_numpy(), later)
            source = encode(batch["source"], sources)[first]
            prompt = prompt_hashes(batch["prompt_id"])[first]
            # as floats, a null as NaN: left out of the means, as pyarrow's mean leaves it out
            passed = pc.cast(batch["passed"], pa.float64()).to_numpy(zero_copy_only=False)[first]
            reward = batch["reward"].to_numpy(zero_copy_only=False)[first]
            annotated = (targets.of(id_keys(batch["id"]), batch["mc_targets"]) if targets else
                         pc.fill_null(pc.greater(pc.list_value_length(batch["mc_targets"]), 0), False)
                         .to_numpy(zero_copy_only=False))[first]
            for name, code in sources.items():
                part = source == code
                if part.any():
                    sums.setdefault(name, SourceSums()).add(prompt[part], passed[part], reward[part], annotated[part])
        per_source = {name: sums[name].figures() for name in sorted(sums)}
        prompts = len(distinct([s.prompts() for s in sums.values()]))
        return self.summary(snapshot, per_source, table.count(version), prompts)

    def later_copies(self, version: int) -> np.ndarray:
        """Sorted handles of every later copy of an id in `version` of the trajectories (one scan of the ids)."""
        copies = LaterCopies()
        for batch in self.tables["trajectories"].batches(version, ["id"], handles=True):
            copies.add(batch[HANDLE].to_numpy(), id_keys(batch["id"]))
        return copies.handles()

    def rewards_by_prompt(self, source: str, snapshot: Snapshot | None = None) -> pa.Table:
        """One row per prompt with rows of `source` (`PROMPT_REWARDS`): its task, text, and the rewards and
        pass flags of its first copies, in commit order: what Q0 is made of. One scan of that source's rows
        with the filter pushed down, of the small columns only; a prompt's text is read from one row."""
        snapshot = snapshot or self.snapshot()
        version, table = snapshot.versions["trajectories"], self.tables["trajectories"]
        names: dict[str, int] = {}
        columns: dict[str, list[np.ndarray]] = {k: [] for k in ("handle", "key", "prompt", "reward", "passed")}
        for batch in table.batches(version, ["id", "prompt_id", "reward", "passed"], pc.field("source") == source,
                                   handles=True):
            columns["handle"].append(owned(batch[HANDLE]))
            columns["key"].append(id_keys(batch["id"]))
            columns["prompt"].append(encode(batch["prompt_id"], names))
            columns["reward"].append(owned(batch["reward"]))
            columns["passed"].append(owned(batch["passed"]))
        if not names:
            return PROMPT_REWARDS.empty_table()
        rows = {k: np.concatenate(v) for k, v in columns.items()}
        first = first_by_handle(rows["handle"], rows["key"])  # in commit order
        order = first[np.argsort(rows["prompt"][first], kind="stable")]
        prompt, starts = np.unique(rows["prompt"][order], return_index=True)
        ids = list(names)
        return self.prompt_rewards(snapshot, [ids[c] for c in prompt], rows["handle"][order[starts]],
                                   [r.tolist() for r in np.split(rows["reward"][order], starts[1:])],
                                   [p.tolist() for p in np.split(rows["passed"][order], starts[1:])])

    def prompt_rewards(self, snapshot: Snapshot, prompt_ids: list[str], first: np.ndarray, rewards: list[list],
                       passed: list[list]) -> pa.Table:
        """`rewards_by_prompt`'s table from its per-prompt lists, with each prompt's task and text taken by
        the handle of its `first` row (not a scan of every row's text)."""
        texts = self.tables["trajectories"].take(snapshot.versions["trajectories"], first, ["task", "prompt_text"])
        return pa.table({"prompt_id": prompt_ids, "task": texts["task"], "text": texts["prompt_text"],
                         "rewards": rewards, "passed": passed}, schema=PROMPT_REWARDS).sort_by("prompt_id")

    def summary(self, snapshot: Snapshot, per_source: dict[str, dict], rows: int, prompts: int) -> dict[str, Any]:
        """`stats`' answer from the per-source figures (of first copies), the rows counted with their
        repeats and the distinct prompts; prompts with a Q0 read from the prompts table."""
        table = self.tables["prompts"].read(snapshot.versions["prompts"], ["prompt_id", "q0_hat"], handles=True)
        trajectories = sum(s["trajectories"] for s in per_source.values())
        return {"trajectories": trajectories, "duplicates": rows - trajectories, "prompts": prompts,
                "prompts_with_q0": sum(1 for p in newest(table, "prompt_id").values() if p["q0_hat"] is not None),
                "versions": dict(snapshot.versions), "sources": per_source}

    def dedupe(self) -> tuple[int, int]:
        """Delete, in one commit, every later copy of a trajectory id in the latest version (the first
        committed copy stays and no row moves); returns (rows before, rows after). Reads the ids and
        row handles only. Rows appended meanwhile stay, a reader of an older version reads it to the
        end, and a concurrent dedupe or compaction makes this one start over."""
        table = self.tables["trajectories"]

        def attempt() -> tuple[int, int]:
            version = table.latest()
            later, rows = self.later_copies(version), table.count(version)
            if len(later):
                table.delete(version, later)
            return rows, rows - len(later)

        return table.retried(attempt)
