"""The storage interface (data/storage.py) on Lance: one table of the experience store as a Lance
dataset, at a local path or an s3:// URI (docs/DATA.md, "The store"). The only module that imports
Lance: a row handle is Lance's row address, a staged write is fragments' metadata.

Every write is one Lance commit, so a reader at a version never sees a torn write, and a writer
killed before its commit leaves only unreferenced data files behind. Lance itself rebases an append
over commits made meanwhile; what it cannot rebase (two rewrites of the same rows) comes back as a
commit conflict, retried here with backoff. Old versions stay readable until `softrl data compact`
cleans them up (tagged versions excepted), which softrl never does by itself: a reader holding a
version reads it to the end.
"""

from __future__ import annotations

import json
import os
import random
import re
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import timedelta
from typing import Any, TypeVar
from urllib.parse import urlsplit

import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from lance import LanceOperation
from lance.commit import CommitConflictError
from lance.fragment import FragmentMetadata
from lance.optimize import Compaction, CompactionOptions

from softrl.data.storage import HANDLE, MissingTable, Staged, StoreError, damaged
from softrl.network import NetworkError, configured_endpoint, s3_region, s3_timeouts, wait_for_s3

FORMAT = 3  # 1: Parquet part files (data/legacy.py); 2: Lance tables; 3: episodes (turns, action_mask, finish)
FORMAT_KEY = "softrl.store_format"
RETRIES = 8
BATCH_ROWS = 65_536  # rows a scan holds at once
INDEX_ROWS = 4_096  # rows of a keyed table past which it keeps an index on its key (`_keep_index`)
INDEX_STALE = 0.1  # the share of its rows not in the index past which the index is brought up to date
ADDRESS = "_rowaddr"  # Lance's row address: fragment id << 32 | row in fragment, so it grows with commit order
T = TypeVar("T")


def storage_options(uri: str) -> dict[str, str] | None:
    """Lance's S3 options from the standard AWS variables, as boto3 and the AWS CLI read them (None
    for a local path). Given explicitly so that an http:// endpoint (a local S3 server) just works."""
    if not uri.startswith("s3://"):
        return None
    env, options = os.environ, {}
    endpoint, _ = configured_endpoint()
    if endpoint:
        options["aws_endpoint"] = endpoint
        if endpoint.startswith("http://"):
            options["allow_http"] = "true"
    region = s3_region()
    if region:
        options["aws_region"] = region
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        if env.get(key):
            options[key.lower()] = env[key]
    return {**options, **s3_timeouts()}


RUST_SOURCE = re.compile(r",?\s*(?:/|[A-Za-z]:\\)[^\s,]*\.rs:\d+:\d+")  # Lance's own source paths
NOISE = re.compile(r"^(?:External error: |LanceError\(\w+\): |Generic \w+ error: )+")


def explain(error: BaseException, uri: str) -> str:
    """A Lance or object-store error as one line naming the table's URI and what the user can change,
    without Lance's source paths."""
    text = RUST_SOURCE.sub("", str(error))
    endpoint = configured_endpoint()[0] or "the S3 endpoint"
    if "NoSuchBucket" in text:
        return f"{uri}: bucket {uri.split('/')[2]!r} does not exist"
    if "InvalidAccessKeyId" in text or "SignatureDoesNotMatch" in text:
        return f"{uri}: the server refused the credentials (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY)"
    if "lacked the necessary privileges" in text or "AccessDenied" in text or "Permission denied" in text \
            or isinstance(error, PermissionError):
        return f"{uri}: permission denied (a read-only location?)"
    if "error sending request" in text or "Connection refused" in text:
        return f"{uri}: no S3 server answers at {endpoint} (AWS_ENDPOINT_URL)"
    status = re.search(r"non-2xx status code: (\d{3}[^:\n]*)", text)
    if status:  # an answer without S3's error document: a web server, a proxy, not S3
        return (f"{uri}: {endpoint} answered {status.group(1).strip()} without an S3 error: is it an S3 server "
                f"(AWS_ENDPOINT_URL), and does bucket {uri.split('/')[2]!r} exist?")
    missing = re.search(r"Not found: \S*?/data/([^/\s,]+\.lance)", text)
    if missing:
        return str(damaged(uri, f"data file data/{missing.group(1)} is missing"))
    if "failed to fill whole buffer" in text or "unexpected end of file" in text.lower():
        return str(damaged(uri, "a data file is cut short"))
    if "does not have sufficient data" in text or "manifest" in text.lower() and "decode" in text.lower():
        return (f"{uri}: damaged, its newest manifest cannot be read: move that file (the lowest-numbered in "
                "_versions) out of the folder and the table reads as of the version before (docs/DATA.md, \"A damaged "
                "table\")")
    first = NOISE.sub("", next((line for line in text.splitlines() if line.strip()), type(error).__name__))
    return f"{uri}: {first[:300]}"


def data_files(folder: str, options: dict[str, str] | None) -> tuple[Any, str]:
    """(a pyarrow filesystem, the path in it) for `folder`, a local directory or an s3:// prefix (read
    with `options`, as Lance reads it)."""
    from pyarrow import fs

    if options is None:
        return fs.LocalFileSystem(), folder
    endpoint = urlsplit(options.get("aws_endpoint", ""))
    s3 = fs.S3FileSystem(access_key=options.get("aws_access_key_id"), secret_key=options.get("aws_secret_access_key"),
                         session_token=options.get("aws_session_token"), region=options.get("aws_region"),
                         endpoint_override=endpoint.netloc or None, scheme=endpoint.scheme or "https",
                         connect_timeout=float(options["connect_timeout"].rstrip("s")),
                         request_timeout=float(options["timeout"].rstrip("s")))
    return s3, folder.removeprefix("s3://")


def file_sizes(folder: str, options: dict[str, str] | None, names: list[str] | None = None) -> dict[str, int]:
    """Name -> bytes of the files in `folder` (data_files), from one listing; or of just `names`, each
    looked at on its own. A listing taken while other processes write into the folder meets files that
    vanish between being listed and being looked at (a writer's temporary file renamed): pyarrow's
    listing skips them (the os.scandir one before it gave up on the whole listing there, so a healthy
    table read as damaged in CI); a file the listing lacks is still looked at on its own before it is
    called missing."""
    from pyarrow import fs

    filesystem, path = data_files(folder, options)
    found = filesystem.get_file_info(fs.FileSelector(path, allow_not_found=True)) if names is None else \
        filesystem.get_file_info([f"{path}/{name}" for name in names])
    return {info.base_name: info.size for info in found if info.type == fs.FileType.File}


def retryable_conflict(error: BaseException) -> bool:
    """A lost commit race that a fresh attempt can win: Lance's CommitConflictError marked retryable, or
    the same conflict as Lance's compaction commit raises it, a plain OSError ("Retryable commit
    conflict for version N: This Rewrite transaction was preempted by concurrent transaction ...")."""
    if isinstance(error, CommitConflictError):
        return error.retryable
    return isinstance(error, OSError) and "Retryable commit conflict" in str(error)


def with_retries(attempt: Callable[[], T], uri: str) -> T:
    """`attempt()` again, after a growing random pause, while it loses a commit race; any other
    error (and the last conflict) as a one-line StoreError."""
    for i in range(RETRIES):
        try:
            return attempt()
        except StoreError:
            raise
        except (OSError, ValueError) as e:
            if not retryable_conflict(e):
                raise StoreError(explain(e, uri)) from None
            if i == RETRIES - 1:
                raise StoreError(f"{uri}: commit conflict after {i + 1} attempts ({str(e).splitlines()[0][:200]})") from None
            time.sleep(random.uniform(0, 0.05 * 2 ** i))  # jittered: racing writers do not retry in step
    raise AssertionError("unreachable")


def renamed(batch: pa.RecordBatch | pa.Table) -> pa.RecordBatch | pa.Table:
    """Lance's row-address column under the interface's name for a row handle (no copy)."""
    return batch.rename_columns([HANDLE if name == ADDRESS else name for name in batch.schema.names])


def with_nulls(batch: pa.RecordBatch | pa.Table, fields: list[pa.Field]) -> pa.RecordBatch | pa.Table:
    """`batch` with a column of nulls for each of `fields` (columns a version from before an upgrade lacks)."""
    for f in fields:
        batch = batch.append_column(f, pa.nulls(batch.num_rows, f.type))
    return batch


def sql_equal(equal: dict[str, Any]) -> str:
    """{"source": "online"} -> "source = 'online'": Lance's filter text (Ray Data's reader takes no expression)."""
    def literal(value: Any) -> str:
        return "'" + value.replace("'", "''") + "'" if isinstance(value, str) else repr(value)
    return " AND ".join(f"{column} = {literal(value)}" for column, value in equal.items())


def table_file(name: str) -> str:
    """The directory that holds table `name` under a store's root."""
    return f"{name}.lance"


RECHECKS = 5  # looks at the newest version while writers and a dedupe keep committing new ones


class LanceTable:
    """Table `name` under `root` (a local directory or an s3:// URI) as a Lance dataset of rows of `schema`
    (data/storage.py's `Table`), created empty when it is missing and `create` (else MissingTable); the
    schema's metadata records the store format."""

    def __init__(self, root: str, name: str, schema: pa.Schema, create: bool):
        uri = f"{root}/{table_file(name)}"
        self.uri, self.schema = uri, schema
        try:
            self.options = storage_options(uri)
            if self.options is not None:
                wait_for_s3(uri)
        except NetworkError as e:
            raise StoreError(str(e)) from None
        self.dataset = with_retries(lambda: self._open(create), uri)
        found = int((self.dataset.schema.metadata or {}).get(FORMAT_KEY.encode(), b"0"))
        if found > FORMAT:
            raise StoreError(f"{uri}: written by a newer softrl (store format {found}; this one reads up to "
                             f"{FORMAT}): upgrade softrl")
        # add_columns (`_upgrade`) drops the metadata and only a second commit restores it: a table with
        # every current column and no format key is an upgrade interrupted between the two
        declared = found
        if found < 1 and not self._missing(self.dataset):
            found = FORMAT
        if found < 1:
            raise StoreError(f"{uri}: a Lance table, but not one of a softrl store (no {FORMAT_KEY} in its metadata)")
        self.current = declared == FORMAT and not self._missing(self.dataset)  # else `_upgrade` at the first write

    def _missing(self, dataset: lance.LanceDataset) -> list[pa.Field]:
        return [f for f in self.schema if f.name not in dataset.schema.names]

    def damage(self, version: int | None = None) -> str | None:
        """What is wrong with the files the table's newest version (or `version`) is made of: a data file
        missing or shorter than its manifest says (None: nothing)."""
        if version is not None:
            return self._files_missing(self._at(version))
        for _ in range(RECHECKS):  # a file gone while a newer version came: a compaction's cleanup, not damage
            dataset = self._newest()
            problem = self._files_missing(dataset)
            if problem is None or self.latest() == dataset.version:
                break
        return problem

    def _files_missing(self, dataset: lance.LanceDataset) -> str | None:
        named = {file.path: file.file_size_bytes for fragment in dataset.get_fragments()
                 for file in fragment.data_files()}
        sizes = file_sizes(f"{self.uri}/data", self.options)
        suspects = [path for path, size in named.items() if sizes.get(path) is None or sizes[path] < (size or 0)]
        if suspects:  # the listing's word checked file by file (file_sizes)
            sizes = file_sizes(f"{self.uri}/data", self.options, suspects)
        for path in suspects:
            size = sizes.get(path)
            if size is None:
                return f"data file data/{path} is missing"
            if named[path] and size < named[path]:
                return f"data file data/{path} is cut short ({size} of {named[path]} bytes)"
        return None

    def _writable(self, checked: bool = True) -> None:
        """Before a write: a damaged table refused (`damage`; not for `checked` False: staged files, which
        join no version until their commit checks) and a table of an older format upgraded first
        (`_upgrade`); reads never need either."""
        problem = with_retries(self.damage, self.uri) if checked else None
        if problem is not None:
            raise damaged(self.uri, problem)
        if not self.current:
            self.dataset = with_retries(self._upgrade, self.uri)
            self.current = True

    def _upgrade(self) -> lance.LanceDataset:
        """A table of an older format given the columns it lacks, all null (no row is rewritten): the
        versions before stay as they were, and reads of them get the new columns as nulls (`_read_columns`).
        Another process upgrading it meanwhile is fine: what counts is that the columns are there after."""
        dataset = self._newest()
        if self._missing(dataset):
            try:
                dataset.add_columns(self._missing(dataset))
            except (OSError, ValueError):
                if self._missing(self._newest()):  # not another process's upgrade: a real failure
                    raise
            dataset = self._newest()
        if int((dataset.schema.metadata or {}).get(FORMAT_KEY.encode(), b"0")) < FORMAT:
            dataset.update_schema_metadata({FORMAT_KEY: str(FORMAT)})  # add_columns leaves no metadata behind
        return self._newest()

    def _read_columns(self, dataset: lance.LanceDataset, columns: list[str] | None) -> tuple[list[str], list[pa.Field]]:
        """(the columns to read at `dataset`'s version, the fields of the current schema it lacks): a
        version from before an upgrade reads what it has, and the rest comes back null."""
        present = set(dataset.schema.names)
        wanted = [f.name for f in self.schema] if columns is None else columns
        return [c for c in wanted if c in present], \
            [self.schema.field(c) for c in wanted if c not in present and c in self.schema.names]

    def _open(self, create: bool) -> lance.LanceDataset:
        try:
            return self._newest()
        except ValueError as e:
            if "was not found" not in str(e):
                raise
            if not create:
                raise MissingTable(f"{self.uri} does not exist") from None
        marked = self.schema.with_metadata({FORMAT_KEY: str(FORMAT)})
        try:
            return lance.write_dataset(marked.empty_table(), self.uri, schema=marked, mode="create",
                                       storage_options=self.options)
        except OSError as e:
            if "already exists" not in str(e):  # another process created it first: use theirs
                raise
        return self._newest()

    def _newest(self) -> lance.LanceDataset:
        return lance.dataset(self.uri, storage_options=self.options)

    def _at(self, version: int) -> lance.LanceDataset:
        return with_retries(lambda: self.dataset.checkout_version(version), self.uri)

    def retried(self, attempt: Callable[[], T]) -> T:
        return with_retries(attempt, self.uri)

    # --- reading at a version --------------------------------------------------------------------
    def latest(self) -> int:
        return with_retries(lambda: self.dataset.latest_version, self.uri)

    def count(self, version: int, where: pc.Expression | None = None) -> int:
        dataset = self._at(version)
        return with_retries(lambda: dataset.count_rows(filter=where), self.uri)

    def read(self, version: int, columns: list[str] | None = None, where: pc.Expression | None = None,
             handles: bool = False) -> pa.Table:
        dataset = self._at(version)
        present, lacking = self._read_columns(dataset, columns)
        return with_nulls(renamed(with_retries(lambda: dataset.to_table(columns=present, filter=where,
                                                                        with_row_address=handles), self.uri)), lacking)

    def batches(self, version: int, columns: list[str], where: pc.Expression | None = None,
                handles: bool = False, rows: int | None = None) -> Iterator[pa.RecordBatch]:
        dataset = self._at(version)
        present, lacking = self._read_columns(dataset, columns)
        try:
            for batch in dataset.to_batches(columns=present, filter=where, with_row_address=handles,
                                            batch_size=rows or BATCH_ROWS, scan_in_order=True):
                yield with_nulls(renamed(batch), lacking)
        except (OSError, ValueError) as e:
            raise StoreError(explain(e, self.uri)) from None

    def take(self, version: int, handles: np.ndarray, columns: list[str] | None = None) -> pa.Table:
        # Lance's public `take` takes row offsets, not addresses: 1.33-1.93x slower than the private
        # `_take_rows` for 64 rows of a 1e6-row table with a deletion file (four A/B pairs,
        # benchmarks/store_take.py, 2026-11-28), and an offset cannot name a row to `delete`. So the
        # address it is, and pylance stays pinned exactly (pyproject.toml) for this private method.
        dataset = self._at(version)
        present, lacking = self._read_columns(dataset, columns)
        return with_nulls(with_retries(lambda: dataset._take_rows(pa.array(handles, pa.uint64()), present), self.uri),
                          lacking)

    def parts(self, version: int) -> int:
        return len(self._at(version).get_fragments())

    def distributed(self, version: int, columns: list[str], equal: dict[str, Any] | None = None):
        import ray.data

        rows = ray.data.read_lance(self.uri, version=version, columns=columns, filter=sql_equal(equal) if equal else None,
                                   storage_options=self.options, scanner_options={"with_row_address": True})
        # a map, not Ray's rename_columns: that one projects onto the whole table's schema, not the
        # columns read, and fails (Ray 2.60); a map fuses with the caller's first map
        return rows.map_batches(renamed, batch_format="pyarrow")

    # --- writing ---------------------------------------------------------------------------------
    def append(self, rows: pa.Table) -> None:
        self._writable()
        with_retries(lambda: lance.write_dataset(rows, self.uri, mode="append", storage_options=self.options),
                     self.uri)

    def stage(self, rows: pa.Table) -> Staged:
        """Data files that no version names yet; the Staged carries their fragments' metadata."""
        self._writable(checked=False)
        fragments = with_retries(lambda: [f.to_json() for f in lance.fragment.write_fragments(
            rows, self.uri, schema=self.schema, storage_options=self.options)], self.uri)
        return Staged(sum(f["physical_rows"] for f in fragments), tuple(fragments))

    def commit_staged(self, staged: Sequence[Staged]) -> None:
        """Lance rebases an append over commits made meanwhile; a lost race is retried."""
        fragments = [f for s in staged for f in s.detail]
        if not fragments:
            return
        self._writable()
        metadata = [FragmentMetadata.from_json(json.dumps(f)) for f in fragments]
        tried = []

        def attempt() -> None:
            # a retry after a commit that did land but whose answer was lost (an object store's "already
            # exists" on a repeated put) must not append the same files twice
            if tried and fragments[0]["files"][0]["path"] in self._committed_files():
                return
            tried.append(True)
            lance.LanceDataset.commit(self.uri, LanceOperation.Append(metadata), read_version=self.latest(),
                                      storage_options=self.options)

        with_retries(attempt, self.uri)

    def _committed_files(self) -> set[str]:
        return {file.path for fragment in self._newest().get_fragments() for file in fragment.metadata.files}

    def upsert(self, key: str, rows: pa.Table) -> None:
        """Lance retries a lost race itself. Past INDEX_ROWS rows the table keeps a BTREE index on `key`
        (`_keep_index`)."""
        self._writable()
        with_retries(lambda: self._newest().merge_insert(key).when_matched_update_all()
                     .when_not_matched_insert_all().execute(rows), self.uri)
        self._keep_index(key)

    def _keep_index(self, key: str) -> None:
        """A BTREE index on `key` once the table has INDEX_ROWS rows, brought up to date when more than
        INDEX_STALE of them are not in it: a lookup of a few keys (Q0 of a step's prompts) then reads the
        index, not the key column of every data file (at 625,000 prompts in 200 files, 64 ids in 63 ms
        against 166, docs/BENCHMARKS.md). Rows written since are still found, by a scan of their files.
        An index is an optimisation: one that loses a race with another writer is left to the next write."""
        dataset = self._newest()
        try:
            named = [i.name for i in dataset.describe_indices() if list(i.field_names) == [key]]
            if not named:
                if dataset.count_rows() >= INDEX_ROWS:
                    dataset.create_scalar_index(key, "BTREE")
                return
            stats = dataset.stats.index_stats(named[0])
            if stats["num_unindexed_rows"] > INDEX_STALE * stats["num_indexed_rows"]:
                dataset.optimize.optimize_indices(index_names=named)
        except (OSError, ValueError):
            pass

    def delete(self, version: int, handles: np.ndarray) -> None:
        """Deletion files: no row is rewritten or moved, and readers of `version` keep reading it."""
        if not len(handles):
            return
        self._writable()
        dataset, updated, emptied = self._at(version), [], []
        addresses = np.sort(handles)
        fragment_of = addresses >> np.uint64(32)
        ids, starts = np.unique(fragment_of, return_index=True)
        for fragment_id, part in zip(ids.tolist(), np.split(addresses, starts[1:])):
            meta = dataset.get_fragment(fragment_id).delete(f"{ADDRESS} IN ({', '.join(map(str, part.tolist()))})")
            if meta is None:  # every row of it deleted
                emptied.append(fragment_id)
            else:
                updated.append(meta)
        operation = LanceOperation.Delete(updated_fragments=updated, deleted_fragment_ids=emptied, predicate="dedupe")
        lance.LanceDataset.commit(self.uri, operation, read_version=version, storage_options=self.options)

    # --- versions --------------------------------------------------------------------------------
    def versions(self) -> dict[int, object]:
        dataset = self._newest()
        return with_retries(lambda: {v["version"]: v["timestamp"] for v in dataset.versions()}, self.uri)

    def tags(self) -> dict[str, int]:
        dataset = self._newest()
        return with_retries(lambda: {name: tag["version"] for name, tag in dataset.tags.list().items()}, self.uri)

    def tag(self, name: str, version: int, move: bool = False) -> None:
        dataset = self._newest()
        with_retries(lambda: (dataset.tags.update if move else dataset.tags.create)(name, version), self.uri)

    def untag(self, name: str) -> None:
        dataset = self._newest()
        with_retries(lambda: dataset.tags.delete(name), self.uri)

    def compact(self) -> bool:
        """Every fragment rewritten into one, rows in commit order. Lance's own compaction puts a
        rewritten group after the fragments it leaves alone and after any append committed meanwhile,
        either of which would reorder rows; so the whole table is one group, and the rewrite is done
        again if a commit lands while it runs (a commit in the instant between that check and the
        compaction's own commit is the one case left: docs/DATA.md)."""
        self._writable()

        def attempt() -> bool:
            dataset = self._newest()
            fragments = dataset.get_fragments()
            if len(fragments) < 2 and not any(f.metadata.deletion_file for f in fragments):
                return False
            options = CompactionOptions(target_rows_per_fragment=dataset.count_rows() + 1, materialize_deletions=True,
                                        materialize_deletions_threshold=0.0)
            rewrites = [task.execute(dataset) for task in Compaction.plan(dataset, options).tasks]
            if self._newest().latest_version != dataset.version:
                raise CommitConflictError("a commit landed during compaction")
            Compaction.commit(dataset, rewrites)
            return True
        return with_retries(attempt, self.uri)

    def restore(self, version: int) -> None:
        with_retries(lambda: self._at(version).restore(), self.uri)
        self.current = False  # the restored version may be of an older format: the next write upgrades it

    def cleanup(self, keep: int) -> int:
        dataset = self._newest()
        before = len(self.versions())
        with_retries(lambda: dataset.cleanup_old_versions(older_than=timedelta(0), retain_versions=keep,
                                                          error_if_tagged_old_versions=False), self.uri)
        return before - len(self.versions())


# rows a copying scan reads at once: its batches hold every column (some 2.4 KB a row of 500 tokens), and
# at the storage's 65,536 rows a batch the build of a pool of 250,000 such rows peaked at 1.4 GiB, at
# 2,048 at 0.55 GiB (0.30 without the copy)
COPY_BATCH_ROWS = 2048
