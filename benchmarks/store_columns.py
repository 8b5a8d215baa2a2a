"""What a draw of 64 rows costs column by column (docs/BENCHMARKS.md, "The experience store"): Lance's
take by row address on the store's trajectories table as `softrl bench store` grows it (rows of
`softrl_bench.store.chunk`, appended in commits of CHUNK rows, one data file each), all columns, the
three token columns, each column alone; warm, then with the page cache dropped before each take (root).

    .venv/bin/python benchmarks/store_columns.py [--rows 10000000] [--table runs/columns.lance]

Prints the median milliseconds (and bytes and read calls of this process, /proc/self/io) of each.
The table is kept where --table says (14 GB at 1e7) and reused when it is there. Nothing is asserted.
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

import lance
import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).parent))
from softrl_bench.store import CHUNK, chunk, drop_page_cache, payload  # noqa: E402

from softrl.data.schema import TRAJECTORY_SCHEMA  # noqa: E402

TOKENS = ["prompt_tokens", "response_tokens", "behavior_logprobs"]


def reads() -> tuple[int, int]:
    fields = dict(line.split(": ") for line in Path("/proc/self/io").read_text().splitlines())
    return int(fields["rchar"]), int(fields["syscr"])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--table", default="runs/columns.lance")
    args = parser.parse_args()
    if not Path(args.table).exists():
        columns, started = payload(CHUNK), time.perf_counter()
        lance.write_dataset(TRAJECTORY_SCHEMA.empty_table(), args.table, schema=TRAJECTORY_SCHEMA, mode="create")
        for start in range(0, args.rows, CHUNK):
            lance.write_dataset(chunk(start, min(CHUNK, args.rows - start), columns), args.table, mode="append")
        print(f"{args.rows:,} rows written in {time.perf_counter() - started:.0f} s", flush=True)
    dataset, rng = lance.dataset(args.table), np.random.default_rng(0)
    addresses = dataset.to_table(columns=[], with_row_address=True)["_rowaddr"].to_numpy()

    def timed(columns: list[str] | None, n: int = 20, cold: bool = False) -> str:
        times, before = [], reads()
        for _ in range(n):
            chosen = np.sort(rng.choice(len(addresses), 64, replace=False))
            if cold:
                drop_page_cache()
            started = time.perf_counter()
            dataset._take_rows(pa.array(addresses[chosen], pa.uint64()), columns)
            times.append(time.perf_counter() - started)
        after = reads()
        return (f"{1000 * statistics.median(times):.1f} ms ({(after[0] - before[0]) / n / 1024:.0f} KiB, "
                f"{(after[1] - before[1]) / n:.0f} read calls a take)")

    print(f"{len(dataset.get_fragments())} data files, {len(addresses):,} rows", flush=True)
    for _ in range(2):
        print("all columns", timed(None), "| token columns", timed(TOKENS), flush=True)
    print("cold: all columns", timed(None, 5, True), "| token columns", timed(TOKENS, 5, True), flush=True)
    print(" ".join(f"{f.name}={timed([f.name], 10).split(' ms')[0]}" for f in TRAJECTORY_SCHEMA))


if __name__ == "__main__":
    main()
