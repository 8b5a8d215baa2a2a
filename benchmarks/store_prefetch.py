"""What a run's prefetch hides of a cold draw (issue 53): the feed starts the next step's draw in the
background as soon as a batch is made (`DataFeed.prefetch`) and the step waits on it only if it is not
done (`time/store_wait` in a run's step records). Here the learner step is stood in for by a pause of
T ms (no CPU: what overlaps is the draw's disk reads, not its decoding against a busy learner), on the
pool of one task of `softrl bench store`'s table, 64 rows a draw of the columns a run's draw reads
(`draw_reads`), the page cache dropped before each step (root).

    .venv/bin/python benchmarks/store_prefetch.py [--rows 10000000] [--store runs/store1e7] \
        [--steps-ms 0,25,50,100,200] [--draws 10]

Prints for each T the median draw and the median wait (drawn in the step when T is 0). Nothing is
asserted.
"""

import argparse
import random
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from softrl_bench.store import SAMPLE, drop_page_cache, grow  # noqa: E402

from softrl.data import ExperienceStore  # noqa: E402
from softrl.runtime.feed import draw_reads  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--store", default="runs/store1e7", help="grown to --rows where it holds fewer")
    parser.add_argument("--steps-ms", default="0,25,50,100,200")
    parser.add_argument("--draws", type=int, default=10)
    args = parser.parse_args()
    grow(args.store, args.rows, lambda done: None)
    store, rng = ExperienceStore(args.store, create=False), random.Random(0)
    pool = store.pool(store.snapshot(), task="task0", reads=draw_reads("offline", "bench"))
    background = ThreadPoolExecutor(1)

    def timed_draw() -> float:
        started = time.perf_counter()
        assert len(pool.draw(SAMPLE, rng)) == SAMPLE
        return time.perf_counter() - started

    print(f"pool of {len(pool):,} rows; {SAMPLE} rows a draw, the page cache dropped before each step\n")
    print("| learner step (a pause), ms | draw, ms | the step's wait for it, ms |\n|---|---|---|")
    for step_ms in (float(v) for v in args.steps_ms.split(",")):
        draws, waits = [], []
        for _ in range(args.draws):
            drop_page_cache()
            if step_ms == 0:  # drawn in the step: it waits the whole draw
                took = timed_draw()
                draws.append(took), waits.append(took)
                continue
            future = background.submit(timed_draw)
            time.sleep(step_ms / 1000)
            started = time.perf_counter()
            draws.append(future.result())
            waits.append(time.perf_counter() - started)
        print(f"| {step_ms:g} | {1000 * statistics.median(draws):.1f} | {1000 * statistics.median(waits):.1f} |",
              flush=True)
    background.shutdown()


if __name__ == "__main__":
    main()
