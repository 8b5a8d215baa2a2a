"""Lance's two takes of 64 rows, timed in turn (docs/BENCHMARKS.md, "The experience store"): the public
`take` by row offset against the private `_take_rows` by row address, which the store uses
(src/softrl/data/lance_table.py says why). A table of 1e6 rows of about 800 bytes in ten commits,
with one deletion file (as a dedupe leaves), on local disk.

    .venv/bin/python benchmarks/store_take.py [--rows 1000000] [--pairs 4]

Prints the median milliseconds of 20 takes of each kind, pair by pair (A B A B), and their ratio.
Nothing is asserted.
"""

import argparse
import statistics
import tempfile
import time

import lance
import numpy as np
import pyarrow as pa


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--pairs", type=int, default=4)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as where:
        uri, commits = f"{where}/t.lance", 10
        for i in range(commits):
            ids = range(i * args.rows // commits, (i + 1) * args.rows // commits)
            lance.write_dataset(pa.table({"id": [f"id{j}" for j in ids], "text": ["x" * 800] * len(ids),
                                          "reward": rng.random(len(ids))}), uri, mode="append" if i else "create")
        dataset = lance.dataset(uri)
        dataset.delete("id = 'id5'")
        addresses = dataset.to_table(columns=[], with_row_address=True)["_rowaddr"].to_numpy()
        columns = ["id", "text", "reward"]
        takes = {"take (offset)": lambda pos: dataset.take(pa.array(pos, pa.uint64()), columns=columns),
                 "_take_rows (address)": lambda pos: dataset._take_rows(pa.array(addresses[pos], pa.uint64()), columns)}
        print("| pair | take by offset, ms | _take_rows by address, ms | ratio |\n|---|---|---|---|")
        for pair in range(args.pairs):
            ms = {}
            for name, take in takes.items():
                times = []
                for _ in range(20):
                    chosen = np.sort(rng.choice(len(addresses), 64, replace=False))
                    started = time.perf_counter()
                    assert take(chosen).num_rows == 64
                    times.append(time.perf_counter() - started)
                ms[name] = 1000 * statistics.median(times)
            offset, address = ms.values()
            print(f"| {pair + 1} | {offset:.2f} | {address:.2f} | {offset / address:.2f} |")


if __name__ == "__main__":
    main()
