"""A pool's local copy of its rows' wide columns, packed row by row: one file in the system's temporary
folder where each row's columns lie together, and in memory only where each row starts. A draw of a row
is one read (`os.pread`), where a take by address from a columnar file reads each column of the row on
its own, about two reads a list column: 496 read calls for a draw of 64 rows of four columns at 1e7
rows, against 64 here (docs/BENCHMARKS.md, "The experience store: `softrl bench store`"). It serves a
pool on an object store too, where each of those reads would be a request.

A row is a header of one little-endian int32 a column (its length in bytes, -1 for null, with the JSON
bit where the value is written as JSON), then each column's bytes: a string's
UTF-8, a list of numbers or booleans its values as they lie in memory (a boolean a byte), a list of
structs (an episode's turns, MC targets) its JSON. Packing joins views of a scanned batch's buffers;
only the struct-list columns go through Python objects."""

from __future__ import annotations

import errno
import json
import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa

# free disk the copy leaves: past it the copy is given up and the pool reads from the store
COPY_RESERVE_BYTES = 2 << 30
COPY_CHECK_BYTES = 256 << 20  # bytes written between checks of the free disk


JSON = 1 << 30  # in a header's length: this value is JSON (a list of structs, or of numbers holding a null)


def _as_bytes(column: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(each row's header entry: its length in bytes, -1 where null, JSON-flagged where so written;
    where each row's bytes start in the data; the data): `[N]` int64, `[N]` int64, uint8."""
    kind, n = column.type, len(column)
    null = column.is_null().to_numpy(zero_copy_only=False)
    flag = 0
    if pa.types.is_string(kind) or pa.types.is_binary(kind):
        ends = np.frombuffer(column.buffers()[1], np.int32, n + 1, 4 * column.offset).astype(np.int64)
        buffer = column.buffers()[2]
        data = np.frombuffer(buffer, np.uint8) if buffer is not None else np.empty(0, np.uint8)
        starts, lengths = ends[:-1], np.diff(ends)
    elif pa.types.is_list(kind) and not pa.types.is_struct(kind.value_type) and column.values.null_count == 0:
        ends = column.offsets.to_numpy().astype(np.int64)
        if pa.types.is_boolean(kind.value_type):  # bits in Arrow: a byte each here
            width, data = 1, column.values.to_numpy(zero_copy_only=False).astype(np.uint8)
        else:
            width, data = kind.value_type.bit_width // 8, column.values.to_numpy().view(np.uint8)
        starts, lengths = ends[:-1] * width, np.diff(ends) * width
    else:  # structs, or lists holding nulls: JSON, row by row
        texts = [b"" if row is None else json.dumps(row).encode() for row in column.to_pylist()]
        lengths = np.array([len(t) for t in texts], dtype=np.int64)
        starts, data = np.concatenate([[0], np.cumsum(lengths)[:-1]]), np.frombuffer(b"".join(texts), np.uint8)
        flag = JSON
    if lengths.size and lengths.max() >= JSON:
        raise ValueError(f"a value of {lengths.max():,} bytes in column {column.type} is too long to pack")
    return np.where(null, -1, lengths | flag), starts, data


def pack(batch: pa.RecordBatch, names: Sequence[str]) -> tuple[bytes, np.ndarray]:
    """The rows of `batch` packed (the columns `names`, in order): (their bytes back to back; each row's
    length, `[N]` int64). The values are joined as views of the batch's buffers, one piece a value (a
    scatter by index arrays of the same bytes took 2.4 times as long); a value of JSON bytes or more is a
    ValueError."""
    width = 4 * len(names)
    parts = [_as_bytes(batch[name]) for name in names]
    header = np.stack([p[0] for p in parts], axis=1)  # [N, C]
    sizes = np.where(header < 0, 0, header & (JSON - 1))  # [N, C] bytes of each value
    headers = memoryview(header.astype("<i4").tobytes())
    data = [memoryview(p[2]) for p in parts]
    pieces = []
    for row, (row_sizes, row_starts) in enumerate(zip(sizes.tolist(), np.stack([p[1] for p in parts], 1).tolist())):
        pieces.append(headers[row * width:(row + 1) * width])
        pieces += [view[start:start + size] for view, start, size in zip(data, row_starts, row_sizes) if size]
    return b"".join(pieces), width + sizes.sum(axis=1)


def _value(raw: bytes, kind: pa.DataType, as_json: bool):
    if as_json:
        return json.loads(raw)
    if pa.types.is_string(kind):
        return raw.decode()
    if pa.types.is_binary(kind):
        return raw
    boolean = pa.types.is_boolean(kind.value_type)
    return np.frombuffer(raw, np.bool_ if boolean else kind.value_type.to_pandas_dtype()).tolist()


class PackedRows:
    """The columns `fields` of the rows a pool scans, packed row by row into a local file as the scan
    passes (`write`), read back a row a read (`take`). Where the disk would keep less than
    COPY_RESERVE_BYTES free the copy is given up (`given_up`: why) and the caller reads from the store
    instead."""

    def __init__(self, fields: Sequence[pa.Field]):
        self.schema = pa.schema(fields)
        self.folder = tempfile.TemporaryDirectory(prefix="softrl-pool-")
        self.path = Path(self.folder.name) / "rows.packed"
        self.given_up: str | None = None
        self.starts = np.zeros(1, np.int64)  # [rows + 1]: where each row starts, and the end
        self.file: int | None = None

    def write(self, batches: Iterator[pa.RecordBatch]) -> None:
        """Copy `batches` (of these columns and others) until they end or the disk runs short (checked
        before the first write and every COPY_CHECK_BYTES; a full disk, or a value too long for a
        header, gives the copy up too); then the rest of `batches` is the caller's to read on."""
        starts, end, checked = [np.zeros(1, np.int64)], 0, -COPY_CHECK_BYTES
        try:
            with open(self.path, "wb") as f:
                for batch in batches:
                    if end - checked >= COPY_CHECK_BYTES:
                        checked, free = end, shutil.disk_usage(self.folder.name).free
                        if free < COPY_RESERVE_BYTES:
                            self.given_up = f"{free / 2**30:.1f} GiB left free on {self.folder.name}"
                            break
                    packed, sizes = pack(batch, self.schema.names)
                    f.write(packed)
                    starts.append(end + np.cumsum(sizes))
                    end += int(sizes.sum())
        except ValueError as e:  # a value of a GiB or more
            self.given_up = str(e)
        except OSError as e:
            if e.errno != errno.ENOSPC:
                raise
            self.given_up = f"{self.folder.name} is full"
        if self.given_up:
            self.folder.cleanup()
            return
        self.starts = np.concatenate(starts)
        self.file = os.open(self.path, os.O_RDONLY)

    @property
    def bytes(self) -> int:
        return 0 if self.given_up else int(self.starts[-1])

    def take(self, rows: np.ndarray, columns: Sequence[str]) -> dict[str, pa.Array]:
        """`columns` of rows `rows` (indices into everything written, any order, repeats allowed)."""
        unique, back = np.unique(rows, return_inverse=True)
        wanted = [(self.schema.names.index(name), self.schema.field(name).type) for name in columns]
        width = 4 * len(self.schema)
        values: list[list] = [[] for _ in columns]
        for row in unique.tolist():
            start, size = int(self.starts[row]), int(self.starts[row + 1] - self.starts[row])
            raw = os.pread(self.file, size, start)
            if len(raw) != size:  # a local file read whole, unless the folder is not what it seems
                raise OSError(f"{self.path}: read {len(raw)} of row {row}'s {size} bytes")
            header = np.frombuffer(raw, "<i4", len(self.schema))
            sizes = np.where(header < 0, 0, header & (JSON - 1))
            offsets = width + np.concatenate([[0], np.cumsum(sizes)])
            for out, (c, kind) in zip(values, wanted):
                out.append(None if header[c] < 0 else
                           _value(raw[offsets[c]:offsets[c + 1]], kind, bool(header[c] & JSON)))
        return {name: pa.array(v, type=self.schema.field(name).type).take(pa.array(back))
                for name, v in zip(columns, values)}

    def __del__(self):
        if getattr(self, "file", None) is not None:
            os.close(self.file)
