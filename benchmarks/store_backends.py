"""Lance against Delta Lake on the experience store's own workload, side by side (issue 34: "use Delta
Lake instead only if a side-by-side measurement says it serves better"; docs/bench/store-backends.md).

    .venv/bin/pip install deltalake==1.6.6     # not a softrl dependency: this comparison only
    .venv/bin/python benchmarks/store_backends.py [--rows 1000000] [--commit 10000] [--repeats 3]

The rows of `softrl bench store` (a 200-token prompt, a 300-token response, a third with log-probs,
16 a prompt, 4 tasks), appended in commits of `--commit` rows (a run commits every 10 steps), to a
Lance dataset and to a Delta table on local disk. Then, alternately (Lance, Delta, Lance, Delta ...):
- the pool scan of a run: ids and prompt ids of one task, the filter pushed down;
- 64 rows at random positions of that pool: Lance takes them by row address; Delta has no random
  row access, so the 64 ids are a filter over the table (`id IN (...)`);
- stats: five columns of every row, grouped by source (pyarrow over each table's dataset);
- compaction into large files (Lance `compact_files`, Delta `optimize.compact`), once.
Prints Markdown; nothing is asserted.
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from softrl_bench.store import chunk, payload

COLUMNS = ["id", "source", "prompt_id", "passed", "reward"]


class LanceSide:
    name = "Lance"

    def __init__(self, where: Path):
        self.uri = str(where / "t.lance")

    def append(self, rows: pa.Table) -> None:
        lance.write_dataset(rows, self.uri, mode="append")

    def pool(self) -> np.ndarray:
        table = lance.dataset(self.uri).to_table(columns=["id", "prompt_id"], filter=pc.field("task") == "task0",
                                                with_row_address=True)
        return table["_rowaddr"].to_numpy()

    def sample(self, pool: np.ndarray, rng: random.Random) -> int:
        chosen = np.sort(pool[[rng.randrange(len(pool)) for _ in range(64)]])
        return lance.dataset(self.uri)._take_rows(pa.array(chosen, pa.uint64())).num_rows

    def stats(self) -> int:
        table = lance.dataset(self.uri).to_table(columns=COLUMNS)
        return table.group_by("source").aggregate([("id", "count"), ("reward", "mean"), ("passed", "count")]).num_rows

    def compact(self) -> None:
        lance.dataset(self.uri).optimize.compact_files(target_rows_per_fragment=1 << 20)

    def size(self) -> int:
        return sum(p.stat().st_size for p in Path(self.uri).rglob("*") if p.is_file())


class DeltaSide:
    name = "Delta Lake"

    def __init__(self, where: Path):
        self.uri = str(where / "t.delta")

    def append(self, rows: pa.Table) -> None:
        from deltalake import write_deltalake

        write_deltalake(self.uri, rows, mode="append")

    def dataset(self):
        from deltalake import DeltaTable

        return DeltaTable(self.uri).to_pyarrow_dataset()

    def pool(self) -> np.ndarray:
        table = self.dataset().to_table(columns=["id", "prompt_id"], filter=pc.field("task") == "task0")
        return np.asarray(table["id"].to_pylist(), dtype=object)  # no row addresses: the ids stand for the rows

    def sample(self, pool: np.ndarray, rng: random.Random) -> int:
        chosen = [pool[rng.randrange(len(pool))] for _ in range(64)]
        return self.dataset().to_table(filter=pc.field("id").isin(chosen)).num_rows

    def stats(self) -> int:
        table = self.dataset().to_table(columns=COLUMNS)
        return table.group_by("source").aggregate([("id", "count"), ("reward", "mean"), ("passed", "count")]).num_rows

    def compact(self) -> None:
        from deltalake import DeltaTable

        DeltaTable(self.uri).optimize.compact()

    def size(self) -> int:
        return sum(p.stat().st_size for p in Path(self.uri).rglob("*") if p.is_file())


def timed(action) -> tuple[float, object]:
    started = time.perf_counter()
    out = action()
    return time.perf_counter() - started, out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--commit", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    where = Path(tempfile.mkdtemp(prefix="store-backends-"))
    sides = [LanceSide(where), DeltaSide(where)]
    columns = payload(args.commit)
    commit_s: dict[str, list[float]] = {s.name: [] for s in sides}
    for start in range(0, args.rows, args.commit):  # the two sides alternately, commit by commit
        rows = chunk(start, min(args.commit, args.rows - start), columns)
        for side in sides:
            commit_s[side.name].append(timed(lambda: side.append(rows))[0])
    ratios, results = [], {s.name: {"pool": [], "sample": [], "stats": []} for s in sides}
    for _ in range(args.repeats):
        for side in sides:  # A B A B
            seconds, pool = timed(side.pool)
            results[side.name]["pool"].append(seconds)
            rng = random.Random(0)
            draws = [timed(lambda: side.sample(pool, rng))[0] for _ in range(10)]
            results[side.name]["sample"].append(statistics.median(draws))
            results[side.name]["stats"].append(timed(side.stats)[0])
        ratios.append({k: results["Delta Lake"][k][-1] / results["Lance"][k][-1] for k in ("pool", "sample", "stats")})
    compact = {s.name: timed(s.compact)[0] for s in sides}
    print(f"## Lance {lance.__version__} vs Delta Lake, {args.rows:,} rows in commits of {args.commit:,} (local disk)\n")
    print("| operation | Lance | Delta Lake | Delta / Lance, pair by pair |\n|---|---|---|---|")
    n = len(commit_s["Lance"])
    for label, key in (("append: first commit (s)", 0), ("append: last commit (s)", n - 1)):
        print(f"| {label} | {commit_s['Lance'][key]:.3f} | {commit_s['Delta Lake'][key]:.3f} | "
              f"{commit_s['Delta Lake'][key] / commit_s['Lance'][key]:.2f} |")
    total = {k: args.rows / sum(v) for k, v in commit_s.items()}
    print(f"| append: rows/s over all {n} commits | {total['Lance']:,.0f} | {total['Delta Lake']:,.0f} | "
          f"{total['Lance'] / total['Delta Lake']:.2f} (time) |")
    for key, label in (("pool", "pool scan of one task (s)"), ("sample", "64 random rows of the pool (s, median of 10)"),
                       ("stats", "stats scan, grouped by source (s)")):
        print(f"| {label} | {statistics.median(results['Lance'][key]):.3f} | "
              f"{statistics.median(results['Delta Lake'][key]):.3f} | "
              f"{', '.join(f'{r[key]:.2f}' for r in ratios)} |")
    print(f"| compaction (s) | {compact['Lance']:.2f} | {compact['Delta Lake']:.2f} | "
          f"{compact['Delta Lake'] / compact['Lance']:.2f} |")
    print(f"| size on disk (MiB) | {sides[0].size() / 2**20:,.0f} | {sides[1].size() / 2**20:,.0f} | |")
    shutil.rmtree(where, ignore_errors=True)


if __name__ == "__main__":
    main()
