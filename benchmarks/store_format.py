"""A draw of 64 rows from the store's trajectories table written in two Lance file formats, timed in
turn (docs/BENCHMARKS.md, "The experience store"): the format pylance writes by default against an
older one given by `data_storage_version` (lance-format/lance#8430 reports format 2.1's full-zip
encoding slower for random takes of wide list columns, which are most of a row here: 500 tokens and 300
log-probs). Rows as `softrl bench store` makes them (`softrl_bench.store.chunk`), appended in commits of
50,000 (as it grows its tables), on local disk.

    .venv/bin/python benchmarks/store_format.py [--rows 1000000] [--pairs 4] [--formats 2.0,default] [--cold]

Prints, pair by pair (A B A B), the median milliseconds of 20 draws by row address (all columns, and
the token columns alone), the table's bytes on disk, and the ratios to the first format. `--cold`
drops the page cache before each draw (root only). Nothing is asserted.
"""

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import lance
import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).parent))
from softrl_bench.store import CHUNK, chunk, drop_page_cache, payload  # noqa: E402

from softrl.data.schema import TRAJECTORY_SCHEMA  # noqa: E402

TOKENS = ["prompt_tokens", "response_tokens", "behavior_logprobs"]


def build(uri: str, rows: int, version: str) -> lance.LanceDataset:
    columns = payload(CHUNK)
    options = {} if version == "default" else {"data_storage_version": version}
    lance.write_dataset(TRAJECTORY_SCHEMA.empty_table(), uri, schema=TRAJECTORY_SCHEMA, mode="create", **options)
    for start in range(0, rows, CHUNK):
        lance.write_dataset(chunk(start, min(CHUNK, rows - start), columns), uri, mode="append")
    return lance.dataset(uri)


def draws(dataset: lance.LanceDataset, addresses: np.ndarray, columns: list[str] | None, rng, cold: bool) -> float:
    times = []
    for _ in range(5 if cold else 20):
        chosen = np.sort(rng.choice(len(addresses), 64, replace=False))
        if cold:
            drop_page_cache()
        started = time.perf_counter()
        assert dataset._take_rows(pa.array(addresses[chosen], pa.uint64()), columns).num_rows == 64
        times.append(time.perf_counter() - started)
    return 1000 * statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--pairs", type=int, default=4)
    parser.add_argument("--formats", default="2.0,default")
    parser.add_argument("--cold", action="store_true")
    parser.add_argument("--where", default=None, help="a folder for the tables (default: a temporary one)")
    args = parser.parse_args()
    formats, rng = args.formats.split(","), np.random.default_rng(0)
    with tempfile.TemporaryDirectory(dir=args.where) as where:
        tables = {}
        for version in formats:
            started = time.perf_counter()
            dataset = build(f"{where}/{version}.lance", args.rows, version)
            size = sum(p.stat().st_size for p in Path(f"{where}/{version}.lance").rglob("*") if p.is_file())
            print(f"{version}: written as format {dataset.data_storage_version} in {time.perf_counter() - started:.0f} s, "
                  f"{size / 2**20:,.0f} MiB", flush=True)
            tables[version] = (dataset, dataset.to_table(columns=[], with_row_address=True)["_rowaddr"].to_numpy())
        heads = " | ".join(f"{v}: all, ms | {v}: tokens, ms" for v in formats)
        print(f"\n| pair | {heads} | ratios to {formats[0]} (all, tokens) |\n|---|" + "---|" * (2 * len(formats) + 1))
        for pair in range(args.pairs):
            ms = {v: (draws(d, a, None, rng, args.cold), draws(d, a, TOKENS, rng, args.cold)) for v, (d, a) in tables.items()}
            base = ms[formats[0]]
            ratios = "; ".join(f"{v} {m[0] / base[0]:.2f}, {m[1] / base[1]:.2f}" for v, m in ms.items() if v != formats[0])
            print(f"| {pair + 1} | " + " | ".join(f"{a:.1f} | {t:.1f}" for a, t in ms.values()) + f" | {ratios} |", flush=True)


if __name__ == "__main__":
    main()
