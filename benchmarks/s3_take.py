"""What a take of 64 rows costs on object storage, column by column (docs/BENCHMARKS.md, "The
experience store"): a table of `softrl bench store`'s rows on moto's S3 server on loopback.

    .venv/bin/python benchmarks/s3_take.py [--rows 100000]

Prints seconds per take of the same 64 row addresses of one task's pool, for all columns and for a
few alone; then what one ranged read of 4 KiB costs on the same server from objects of growing size
(a take is many such reads: on real S3 their cost does not grow with the object). Nothing is asserted.
"""

import argparse
import random
import statistics
import time

import boto3
import lance
import numpy as np
import pyarrow as pa

from softrl_bench import store as bench
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
        dataset = lance.dataset(table.uri, storage_options=table.options)  # Lance's own reads, measured
        pool, rng = store.pool(task="task0"), random.Random(0)
        chosen = pa.array(np.sort(pool.handles[[rng.randrange(len(pool)) for _ in range(64)]]), pa.uint64())
        print(f"| columns taken ({args.rows:,} rows, {len(dataset.get_fragments())} fragments) | seconds |\n|---|---|")
        for columns in (None, ["id"], ["reward", "passed"], ["prompt_tokens"], ["response_tokens"]):
            started = time.perf_counter()
            dataset._take_rows(chosen, columns=columns)
            print(f"| {', '.join(columns) if columns else 'all'} | {time.perf_counter() - started:.3f} |")
        ranged_reads(bucket.removeprefix("s3://"))


def ranged_reads(bucket: str, sizes_mib=(1, 16, 64), repeats: int = 10) -> None:
    """Median seconds of a 4 KiB ranged GET from objects of each size, at random offsets."""
    s3, rng = boto3.client("s3"), random.Random(0)
    print("\n| object MiB | 4 KiB ranged GET ms (median of 10) |\n|---|---|")
    for mib in sizes_mib:
        s3.put_object(Bucket=bucket, Key=f"ranged/{mib}", Body=bytes(mib << 20))
        times = []
        for _ in range(repeats):
            start = rng.randrange((mib << 20) - 4096)
            began = time.perf_counter()
            s3.get_object(Bucket=bucket, Key=f"ranged/{mib}", Range=f"bytes={start}-{start + 4095}")["Body"].read()
            times.append(time.perf_counter() - began)
        print(f"| {mib} | {1000 * statistics.median(times):.1f} |")


if __name__ == "__main__":
    main()
