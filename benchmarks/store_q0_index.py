"""The Q0 lookup of a step's prompts with and without the prompts table's index on prompt_id
(docs/BENCHMARKS.md, "The experience store"): two stores whose prompts are written as Q0 writes them
(an upsert a chunk, `softrl bench store`'s prompt rows), one with the index the store keeps
(`lance_table._keep_index`), one with it switched off; then `store.prompts(ids=...)` of 64 random ids,
timed on the two alternately (A B A B), each pair's ratio printed. Nothing is asserted.

    .venv/bin/python benchmarks/store_q0_index.py [--prompts 625000] [--pairs 10] [--where /tmp/q0-index]
"""

import argparse
import math
import random
import shutil
import statistics
import time
from pathlib import Path

import numpy as np

from softrl.data import ExperienceStore, lance_table
from softrl_bench.store import prompt_rows

CHUNK = 3_125  # prompts a chunk: `softrl bench store` writes 50,000 rows of 16 a prompt at a time


def grown(root: Path, prompts: int, indexed: bool) -> ExperienceStore:
    saved = lance_table.INDEX_ROWS
    lance_table.INDEX_ROWS = saved if indexed else math.inf
    try:
        store = ExperienceStore(root)
        for start in range(0, prompts, CHUNK):
            store.tables["prompts"].upsert("prompt_id", prompt_rows(np.arange(start, min(start + CHUNK, prompts))))
    finally:
        lance_table.INDEX_ROWS = saved
    return store


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompts", type=int, default=625_000)
    parser.add_argument("--pairs", type=int, default=10)
    parser.add_argument("--where", default="/tmp/q0-index")
    args = parser.parse_args()
    where = Path(args.where)
    shutil.rmtree(where, ignore_errors=True)
    stores = {"scan": grown(where / "scan", args.prompts, False), "index": grown(where / "index", args.prompts, True)}
    rng = random.Random(0)

    def lookup(store: ExperienceStore) -> float:
        ids = [f"bench-{rng.randrange(args.prompts)}" for _ in range(64)]
        started = time.perf_counter()
        found = store.prompts(ids=ids)
        took = time.perf_counter() - started
        assert len(found) == len(set(ids))
        return 1000 * took

    for store in stores.values():
        lookup(store)  # first reads: the tables' metadata
    pairs = [(lookup(stores["scan"]), lookup(stores["index"])) for _ in range(args.pairs)]
    print(f"{args.prompts:,} prompts in {math.ceil(args.prompts / CHUNK)} upserts; 64 ids a lookup, ms")
    print("| pair | scan | index | index / scan |\n|---|---|---|---|")
    for k, (a, b) in enumerate(pairs, 1):
        print(f"| {k} | {a:.1f} | {b:.1f} | {b / a:.2f} |")
    print(f"median: scan {statistics.median(a for a, _ in pairs):.1f}, index {statistics.median(b for _, b in pairs):.1f}, "
          f"ratio {statistics.median(b / a for a, b in pairs):.2f}")
    shutil.rmtree(where, ignore_errors=True)


if __name__ == "__main__":
    main()
