"""Pools: the rows a source of the training mix draws from. `Pool` holds, per row, only the index of its
prompt; the rows themselves come from `fetch`. `TrajectoryPool` keeps rows in memory (a run's online
buffer, tests); `StoredPool` keeps the row handles of one store version and its rows' narrow columns
(`HeldColumns`), and takes a draw's wide columns with the storage's `take`, so its memory is about 50
bytes a row whatever the rows hold (a store of 1e7 rows of 500 tokens is a pool of a few hundred MB,
not tens of gigabytes of Python objects)."""

from __future__ import annotations

import hashlib
import random
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

if TYPE_CHECKING:
    from softrl.data.packed import PackedRows

Rows = list[dict[str, Any]]
HEX = np.full(256, 255, dtype=np.uint8)
HEX[np.frombuffer(b"0123456789abcdef", np.uint8)] = np.arange(16, dtype=np.uint8)


def id_keys(ids: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Each trajectory id as two 64-bit words (`[N, 2]` uint64), for finding repeated ids without a
    Python string per row. An id of 32 hex digits (every id softrl makes) is its 128 bits, exactly;
    any other id its BLAKE2 digest. Decided row by row, so an id has one key whatever its neighbours."""
    ids = ids.combine_chunks() if isinstance(ids, pa.ChunkedArray) else ids
    raw = np.zeros((len(ids), 16), dtype=np.uint8)
    hexed = np.zeros(len(ids), dtype=bool)
    sized = pc.fill_null(pc.equal(pc.binary_length(ids), 32), False).to_numpy(zero_copy_only=False)
    if sized.any():
        fixed = ids.filter(pa.array(sized)).cast(pa.binary()).cast(pa.binary(32))
        digits = HEX[np.frombuffer(fixed.buffers()[1], np.uint8, 32 * len(fixed), 32 * fixed.offset).reshape(-1, 32)]
        valid = (digits != 255).all(axis=1)
        hexed[np.flatnonzero(sized)[valid]] = True
        raw[hexed] = (digits[valid, 0::2] << 4) | digits[valid, 1::2]
    for position in np.flatnonzero(~hexed).tolist():
        raw[position] = np.frombuffer(hashlib.blake2b(str(ids[position]).encode(), digest_size=16).digest(), np.uint8)
    return raw.view(np.uint64)  # [N, 2]


def owned(column: pa.Array) -> np.ndarray:
    """A column of a scanned batch as a numpy array of its own. A view (`to_numpy`) would keep the whole
    batch in memory, every column of it: Lance hands a batch over with one release for all its buffers
    (at 1e7 rows, a pool's handles alone held 260 MiB of scanned batches)."""
    return np.array(column.to_numpy(zero_copy_only=False), copy=True)


def mixed(x: np.ndarray) -> np.ndarray:
    """MurmurHash3's 64-bit finaliser: a bijection of 64-bit words in which every input bit moves every
    output bit."""
    with np.errstate(over="ignore"):
        x = x ^ (x >> np.uint64(33))
        x *= np.uint64(0xFF51AFD7ED558CCD)
        x ^= x >> np.uint64(33)
        x *= np.uint64(0xC4CEB9FE1A85EC53)
        x ^= x >> np.uint64(33)
    return x


def key_words(first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """`[N]` uint64: one well-mixed word of each 128-bit key (its two halves, `[N]` each). Ids that differ
    in a few bits of one half (sequential ids: their first halves all 0, the row number in a byte of the
    second) still get distinct words, and any bits of the word spread them evenly."""
    return mixed(first ^ mixed(second))


def first_copies(keys: np.ndarray) -> np.ndarray:
    """Positions of the first row of every distinct key (`keys`: [N, 2]), in row order. Sorted by one word
    of each key (`key_words`: a stable sort of 1e7 words takes about a second; of 128-bit keys, several);
    rows that share a word, the repeats and the rare collisions, are then sorted by the whole key."""
    word = key_words(keys[:, 0], keys[:, 1])
    order = np.argsort(word, kind="stable")
    word = word[order]
    same = word[1:] == word[:-1]  # [N - 1]: a row's word is the one before it's (a byte a row, no counts)
    del word
    starts = np.ones(len(order), dtype=bool)
    starts[1:] = ~same
    shared = np.zeros(len(order), dtype=bool)
    shared[1:] |= same
    shared[:-1] |= same
    grouped = order[shared]
    grouped = grouped[np.lexsort((grouped, keys[grouped, 1], keys[grouped, 0]))]  # by key, then row
    new = np.ones(len(grouped), dtype=bool)
    new[1:] = (keys[grouped[1:]] != keys[grouped[:-1]]).any(axis=1)
    return np.sort(np.concatenate([order[starts & ~shared], grouped[new]]))


def sorted_distinct(values: np.ndarray) -> np.ndarray:
    """The distinct values, sorted. numpy 2's `np.unique` hashes, which took 0.49 s for 600,000 distinct
    64-bit words where this sort takes 0.02 s."""
    values = np.sort(values)
    keep = np.ones(len(values), dtype=bool)
    keep[1:] = values[1:] != values[:-1]
    return values[keep]


def first_by_handle(handle: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """Positions of each id's first committed copy (the lowest row handle), in commit order."""
    if bool((handle[1:] > handle[:-1]).all()):  # scanned in commit order already: no reordered copy of the keys
        return first_copies(keys)
    order = np.argsort(handle, kind="stable")
    return order[first_copies(keys[order])] if len(order) else order


SPILL_ROWS = 1 << 21  # (key, handle) pairs `LaterCopies` holds before it writes them to disk: 48 MiB
SPILL_BUCKETS = 256  # (a byte) its files: at 1e8 rows about 400,000 pairs (9 MiB) each, sorted one at a time
COPY_RECORD = np.dtype([("k0", "<u8"), ("k1", "<u8"), ("handle", "<u8")])


class LaterCopies:
    """The row handles of every later copy of a trajectory id (all but each id's lowest handle), from
    batches of (handles, id keys) in any order, with at most `spill_rows` pairs in memory: past that
    they go to temporary files by key (24 bytes a row on disk, in the system's temporary folder),
    and each file is sorted alone. A store's `stats` and `dedupe` hold no more than that however
    many rows it has."""

    def __init__(self, spill_rows: int = SPILL_ROWS):
        self.held: list[np.ndarray] = []
        self.count, self.spill_rows, self.rows = 0, spill_rows, 0
        self.folder: tempfile.TemporaryDirectory | None = None

    def add(self, handles: np.ndarray, keys: np.ndarray) -> None:
        pairs = np.empty(len(handles), COPY_RECORD)
        pairs["k0"], pairs["k1"], pairs["handle"] = keys[:, 0], keys[:, 1], handles
        self.held.append(pairs)
        self.count += len(pairs)
        self.rows += len(pairs)
        if self.count > self.spill_rows:
            self._spill()

    def _spill(self) -> None:
        if self.folder is None:
            self.folder = tempfile.TemporaryDirectory(prefix="softrl-copies-")
        pairs = np.concatenate(self.held) if self.held else np.empty(0, COPY_RECORD)
        self.held, self.count = [], 0
        bucket = (key_words(pairs["k0"], pairs["k1"]) % np.uint64(SPILL_BUCKETS)).astype(np.uint8)
        order = np.argsort(bucket, kind="stable")  # of bytes: a radix sort
        ordered = np.empty(len(pairs), COPY_RECORD)
        for name in COPY_RECORD.names:  # field by field: a gather of whole records took twice as long
            ordered[name] = np.ascontiguousarray(pairs[name])[order]
        pairs, bounds = ordered, np.searchsorted(bucket[order], np.arange(SPILL_BUCKETS + 1))
        for b in np.flatnonzero(bounds[1:] > bounds[:-1]).tolist():
            with open(Path(self.folder.name) / str(b), "ab") as f:
                pairs[bounds[b]:bounds[b + 1]].tofile(f)

    def handles(self) -> np.ndarray:
        """The later copies' handles, sorted (the files are removed)."""
        try:
            if self.folder is None:
                parts = [later_in(np.concatenate(self.held))] if self.held else []
            else:
                self._spill()
                parts = [later_in(np.fromfile(f, COPY_RECORD)) for f in Path(self.folder.name).iterdir()]
            return np.sort(np.concatenate(parts)) if parts else np.empty(0, np.uint64)
        finally:
            self.held = []
            if self.folder is not None:
                self.folder.cleanup()
                self.folder = None


def later_in(pairs: np.ndarray) -> np.ndarray:
    """Handles of the pairs (COPY_RECORD) whose key a pair of a lower handle has."""
    later = np.ones(len(pairs), dtype=bool)
    later[first_by_handle(pairs["handle"], np.stack([pairs["k0"], pairs["k1"]], axis=1))] = False
    return pairs["handle"][later]


def in_sorted(values: np.ndarray, sorted_set: np.ndarray) -> np.ndarray:
    """`[N]` bool: which of `values` are in `sorted_set` (sorted, as `LaterCopies.handles` gives it)."""
    if not len(sorted_set):
        return np.zeros(len(values), dtype=bool)
    at = np.minimum(np.searchsorted(sorted_set, values), len(sorted_set) - 1)
    return sorted_set[at] == values


def encode(values: pa.Array, names: dict[str | None, int], nulls: bool = False) -> np.ndarray:
    """`[N]` int64: each value's index in `names`, new values added (so codes hold across batches);
    `nulls`: a null is a value of its own (None), else there must be none."""
    encoded = pc.dictionary_encode(values, null_encoding="encode" if nulls else "mask")
    code = np.array([names.setdefault(v, len(names)) for v in encoded.dictionary.to_pylist()], dtype=np.int64)
    return code[encoded.indices.to_numpy()] if len(code) else np.empty(0, dtype=np.int64)


class HeldColumns:
    """Some narrow columns (`fields`) of the rows a pool scans, held compactly in memory: a string column
    as codes into its distinct values (the smallest integer type that holds them), any other as one Arrow
    array. `add` each scanned batch, `keep` the pool's rows (positions into everything added), then
    `take(positions)` gives those rows' columns with their own types."""

    def __init__(self, fields: Sequence[pa.Field]):
        self.fields = list(fields)
        self.values: dict[str, dict[str | None, int]] = {f.name: {} for f in self.fields if pa.types.is_string(f.type)}
        self.parts: dict[str, list] = {f.name: [] for f in self.fields}
        self.columns: dict[str, np.ndarray | pa.Array] = {}
        self.dictionaries: dict[str, pa.Array] = {}

    def add(self, batch: pa.RecordBatch) -> None:
        for f in self.fields:
            column = batch[f.name]
            if f.name in self.values:  # codes of the smallest type so far (a byte a row for most columns)
                names = self.values[f.name]
                column = encode(column, names, nulls=True).astype(np.min_scalar_type(max(len(names) - 1, 0)))
            else:  # a copy: a view would hold the whole scanned batch (`owned`)
                column = pa.concat_arrays([column])
            self.parts[f.name].append(column)

    def keep(self, rows: np.ndarray) -> None:
        everything = sum(len(p) for p in self.parts[self.fields[0].name]) if self.fields else 0
        identity = len(rows) == everything and bool((rows == np.arange(everything)).all())  # no copy needed
        for f in self.fields:
            parts = self.parts.pop(f.name)
            if f.name in self.values:
                names = self.values.pop(f.name)
                width = np.min_scalar_type(max(len(names) - 1, 0))
                codes = np.concatenate(parts).astype(width) if parts else np.empty(0, width)
                self.columns[f.name] = codes if identity else codes[rows]
                self.dictionaries[f.name] = pa.array(list(names), f.type)
            else:
                column = pa.concat_arrays(parts) if parts else pa.array([], f.type)
                self.columns[f.name] = column if identity else column.take(pa.array(rows))

    def names(self, name: str) -> list[str | None]:
        """The distinct values of string column `name`, by code."""
        return self.dictionaries[name].to_pylist()

    def take(self, positions: np.ndarray) -> dict[str, pa.Array]:
        out = {}
        for f in self.fields:
            column = self.columns[f.name]
            out[f.name] = pa.DictionaryArray.from_arrays(pa.array(column[positions].astype(np.int32)),
                                                         self.dictionaries[f.name]).cast(f.type) \
                if f.name in self.dictionaries else column.take(pa.array(positions))
        return out


class KeySet:
    """A set of id keys (`[M, 2]`, M small: annotations), asked about many rows at a time."""

    def __init__(self, keys: np.ndarray):
        self.high = np.unique(keys[:, 0])
        self.whole = np.ascontiguousarray(keys).view("V16").ravel()

    def members(self, keys: np.ndarray) -> np.ndarray:
        """`[N]` bool: whether each key (`[N, 2]`) is in the set."""
        out = np.isin(keys[:, 0], self.high)
        if out.any():
            candidates = np.flatnonzero(out)
            out[candidates] = np.isin(np.ascontiguousarray(keys[candidates]).view("V16").ravel(), self.whole)
        return out


class Pool:
    """Rows 0..N-1, each of a prompt (`prompt_index[i]` into `prompt_names`), sampled uniformly with
    replacement, or by prompt; `fetch(positions)` gives the rows at positions, in that order."""

    def __init__(self, prompt_index: np.ndarray, prompt_names: Sequence[str], fetch: Callable[[list[int]], Rows]):
        self.prompt_index, self.prompt_names, self.fetch = prompt_index, list(prompt_names), fetch
        order = np.argsort(prompt_index, kind="stable")  # positions grouped by prompt, row order within
        bounds = np.searchsorted(prompt_index[order], np.arange(len(self.prompt_names) + 1))
        self._of = {name: order[bounds[k]:bounds[k + 1]] for k, name in enumerate(self.prompt_names)
                    if bounds[k + 1] > bounds[k]}

    def __len__(self) -> int:
        return len(self.prompt_index)

    def draw(self, n: int, rng: random.Random) -> Rows:
        return self.fetch([rng.randrange(len(self)) for _ in range(n)]) if len(self) else []

    def prompts_with(self, n: int) -> list[str]:
        """The prompt ids with at least n rows, sorted."""
        return sorted(name for name, positions in self._of.items() if len(positions) >= n)

    def of_prompt(self, prompt_id: str, n: int, rng: random.Random, replace: bool = False) -> Rows:
        """n rows of one prompt; without replacement unless asked (then fewer when it has fewer)."""
        index = self._of.get(prompt_id, np.empty(0, dtype=np.int64)).tolist()
        chosen = [rng.choice(index) for _ in range(n)] if replace and index else rng.sample(index, min(n, len(index)))
        return self.fetch(chosen)

    def checked_rows(self, limit: int) -> Rows:
        """Every row when there are at most `limit`, else `limit` rows drawn once by a fixed seed: what a
        run checks before it starts (a store of 1e7 rows is not read whole to find one bad row)."""
        positions = range(len(self)) if len(self) <= limit else sorted(random.Random(0).sample(range(len(self)), limit))
        return self.fetch(list(positions))


class TrajectoryPool(Pool):
    """Rows held in memory."""

    def __init__(self, rows: pa.Table | Sequence[dict[str, Any]]):
        self.rows = rows.to_pylist() if isinstance(rows, pa.Table) else list(rows)
        names = list(dict.fromkeys(row["prompt_id"] for row in self.rows))
        code = {name: k for k, name in enumerate(names)}
        super().__init__(np.array([code[r["prompt_id"]] for r in self.rows], dtype=np.int64), names,
                         lambda positions: [self.rows[i] for i in positions])


@dataclass(frozen=True)
class Reads:
    """What a draw takes of its rows' wide columns: `always`, then `later` for the rows that `wants`
    (given each row as drawn so far). A run's draw needs a row's token ids where its own tokenizer made
    them and its texts only where it did not: every column a draw need not read is a read per row saved
    (one of the page cache's misses, or one request to an object store). Columns not taken are null."""

    always: tuple[str, ...]
    later: tuple[str, ...] = ()
    wants: Callable[[dict[str, Any]], bool] | None = None


class StoredPool(Pool):
    """Rows of one version of a store's trajectory table, held as row handles (`[N]` uint64, ascending:
    commit order) and fetched by `take(positions, columns) -> pa.Table` (positions ascending; the wide
    columns `columns`, None: all; with the run's joins, e.g. MC-target annotations), as `reads` says
    (None: every column); `local`: the local copy of its wide columns, where one was made."""

    def __init__(self, handles: np.ndarray, prompt_index: np.ndarray, prompt_names: Sequence[str],
                 take: Callable[[np.ndarray, Sequence[str] | None], pa.Table], local: PackedRows | None = None,
                 reads: Reads | None = None):
        self.handles, self.take, self.local = handles, take, local

        def fetch(positions: list[int]) -> Rows:
            if not positions:
                return []
            unique, back = np.unique(np.asarray(positions, dtype=np.int64), return_inverse=True)
            rows = take(unique, reads and reads.always).to_pylist()  # in handle order
            wanting = [k for k, row in enumerate(rows) if reads and reads.later and reads.wants(row)]
            if wanting:
                more = take(unique[wanting], reads.later)
                for k, row in zip(wanting, more.select(list(reads.later)).to_pylist()):
                    rows[k].update(row)
            return [rows[k] for k in back]

        super().__init__(prompt_index, prompt_names, fetch)

    def tables(self, rows: int = 10_000) -> Iterator[pa.Table]:
        """Every row in commit order, with every column the pool reads (all, without `reads`), `rows` at a
        time (what an export streams)."""
        for start in range(0, len(self), rows):
            yield self.take(np.arange(start, min(start + rows, len(self))), None)
