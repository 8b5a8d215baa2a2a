"""What a take of 64 rows costs on object storage, column by column (docs/BENCHMARKS.md, "The
experience store"): a table of `softrl bench store`'s rows on moto's S3 server on loopback.

    .venv/bin/python benchmarks/s3_take.py [--rows 100000]

Prints seconds per take of the same 64 row addresses of one task's pool, for all columns and for a
few alone. Nothing is asserted.
"""

import argparse
import random
import time

import numpy as np
import pyarrow as pa

from softrl.bench import store as bench
from softrl.data import ExperienceStore


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=100_000)
    args = parser.parse_args()
    with bench.LoopbackS3() as bucket:
        root = f"{bucket}/take"
        bench.grow(root, args.rows, lambda n: None)
        store = ExperienceStore(root)
        table = store.tables["trajectories"]
        dataset = table.at(table.latest())
        pool, rng = store.pool(task="task0"), random.Random(0)
        chosen = pa.array(np.sort(pool.addresses[[rng.randrange(len(pool)) for _ in range(64)]]), pa.uint64())
        print(f"| columns taken ({args.rows:,} rows, {len(dataset.get_fragments())} fragments) | seconds |\n|---|---|")
        for columns in (None, ["id"], ["reward", "passed"], ["prompt_tokens"], ["response_tokens"]):
            started = time.perf_counter()
            dataset._take_rows(chosen, columns=columns)
            print(f"| {', '.join(columns) if columns else 'all'} | {time.perf_counter() - started:.3f} |")


if __name__ == "__main__":
    main()
