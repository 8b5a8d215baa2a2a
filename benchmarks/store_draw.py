"""A draw of 64 rows from a pool, two ways, timed in turn (docs/BENCHMARKS.md, "The experience store"),
on the same table, the same handles each pair. The table is grown as `softrl bench store` grows its own.
- `--against every-column`: the pool's own (`ExperienceStore.pool`: the narrow columns held in memory from
  its build scan, the wide ones taken by handle) against every column taken by handle (what a draw did
  before the pool held columns);
- `--against no-copy`: a run's draw (`feed.draw_reads`) from the pool's local copy, packed row by row
  (`copy=True`, `data/packed.py`), against the same draw taken by handle from the table (`copy=False`).

    .venv/bin/python benchmarks/store_draw.py [--rows 10000000] [--pairs 4] [--cold] [--store DIR] \
        [--against every-column|no-copy]

Prints the pool's build time (its memory: `softrl bench store`), then pair by pair (A B A B) the median
milliseconds of 20 draws each way (5 with --cold, the page cache dropped before each: root only) and
their ratio. Nothing is asserted.
"""

import argparse
import contextlib
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from softrl_bench.store import drop_page_cache, grow  # noqa: E402

from softrl.data import ExperienceStore  # noqa: E402
from softrl.runtime.feed import draw_reads  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--pairs", type=int, default=4)
    parser.add_argument("--cold", action="store_true")
    parser.add_argument("--store", default=None, help="a store to grow to --rows and keep (default: a temporary one)")
    parser.add_argument("--against", choices=("every-column", "no-copy"), default="every-column")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() if args.store is None else contextlib.nullcontext(args.store) as where:
        started = time.perf_counter()
        grow(where, args.rows, lambda done: None)
        print(f"{args.rows:,} rows grown in {time.perf_counter() - started:.0f} s", flush=True)
        store = ExperienceStore(where, create=False)
        snapshot, started = store.snapshot(), time.perf_counter()
        copy = args.against == "no-copy"
        reads = draw_reads("offline", "bench") if copy else None
        pool = store.pool(snapshot, task="task0", reads=reads, copy=copy)
        print(f"pool of {len(pool):,} rows built in {time.perf_counter() - started:.1f} s"
              + (f", its copy {pool.local.bytes / 2**30:.2f} GiB" if copy else ""), flush=True)
        table, version, rng = store.tables["trajectories"], snapshot.versions["trajectories"], random.Random(0)
        if copy:
            by_handle = store.pool(snapshot, task="task0", reads=reads, copy=False)
            ways = {"the local copy": lambda positions: pool.fetch(positions),
                    "by handle": lambda positions: by_handle.fetch(positions)}
        else:
            ways = {"pool (held + wide by handle)": lambda positions: pool.fetch(positions),
                    "every column by handle": lambda positions: table.take(
                        version, pool.handles[sorted(set(positions))]).to_pylist()}
        print("\n| pair | " + " | ".join(f"{w}, ms" for w in ways) + " | ratio |\n|---|---|---|---|")
        for pair in range(args.pairs):
            draws = [[rng.randrange(len(pool)) for _ in range(64)] for _ in range(5 if args.cold else 20)]
            ms = []
            for way in ways.values():
                times = []
                for positions in draws:
                    if args.cold:
                        drop_page_cache()
                    started = time.perf_counter()
                    assert len(way(positions)) >= 60
                    times.append(time.perf_counter() - started)
                ms.append(1000 * statistics.median(times))
            print(f"| {pair + 1} | {ms[0]:.1f} | {ms[1]:.1f} | {ms[0] / ms[1]:.2f} |", flush=True)


if __name__ == "__main__":
    main()
