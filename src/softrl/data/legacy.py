"""Reading a store of the old format (format 1: a directory of Parquet part files per table), for
`softrl data migrate` only: softrl refuses to work on such a store and names the command.

    OLD/softrl-store.json             the marker
    OLD/<table>/part-*.parquet        rows; hidden `.part-*.tmp` files are a killed writer's leftovers

Parts that cannot be read, or are not of the table's schema, are skipped and named, as the old
store did; nothing here writes or deletes anything.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

MARKER = "softrl-store.json"
ADDED_COLUMNS = {"q0_rewards", "turns", "action_mask", "finish"}  # parts written before them read as null there


def is_legacy(root: str) -> bool:
    return not root.startswith("s3://") and (Path(root) / MARKER).is_file()


def read(root: str, table_name: str, schema: pa.Schema) -> tuple[pa.Table, list[str]]:
    """Every readable part of one table in write order (part names start with their time), and a
    line for each file skipped."""
    tables, skipped = [], []
    directory = Path(root) / table_name
    for path in sorted(directory.iterdir()) if directory.is_dir() else []:
        if path.name.startswith("."):
            continue
        if path.suffix != ".parquet" or not path.is_file():
            skipped.append(f"{path}: not a Parquet part file; skipped")
            continue
        try:
            found = pq.read_schema(path)
            missing = [f.name for f in schema if f.name not in found.names and f.name not in ADDED_COLUMNS]
            if missing:
                skipped.append(f"{path}: not a softrl {table_name} part (missing column {missing[0]!r}); skipped")
                continue
            table = pq.read_table(path, columns=[n for n in schema.names if n in found.names])
            for field in schema:
                if field.name not in table.column_names:
                    table = table.append_column(field, pa.nulls(len(table), field.type))
            tables.append(table.select(schema.names).cast(schema))
        except (OSError, pa.ArrowException, ValueError) as e:
            skipped.append(f"{path}: unreadable ({type(e).__name__}: {str(e).splitlines()[0][:200]}); skipped")
    return (pa.concat_tables(tables) if tables else schema.empty_table()), skipped
