"""The peak memory of building a run's pool, by what the pool holds (docs/BENCHMARKS.md, "The experience
store"): in a fresh process per choice, open the store, build the pool of one task (a quarter of the
rows) and report the process's peak RSS before and after (imports excluded from the rise).

    .venv/bin/python benchmarks/store_pool_memory.py STORE [--held all,seven,prompt]

STORE: a store grown by `softrl bench store` (or benchmarks/store_draw.py --store). `all`: the pool's
own held columns (store.HELD); `seven`: prompt id, task, reward, passed, source, policy version,
decoding; `prompt`: the prompt id alone (a draw then takes every other column). Nothing is asserted.
"""

import argparse
import resource
import subprocess
import sys
import time

CHOICES = {"all": None, "seven": ("prompt_id", "task", "reward", "passed", "source", "policy_version", "decoding"),
           "prompt": ("prompt_id",)}


def peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def build(store: str, held: str) -> None:
    from softrl.data import ExperienceStore
    from softrl.data import store as module

    if CHOICES[held] is not None:
        module.HELD = CHOICES[held]
    opened = ExperienceStore(store, create=False)
    snapshot, before, started = opened.snapshot(), peak_mib(), time.perf_counter()
    pool = opened.pool(snapshot, task="task0")
    print(f"| {held} | {len(pool):,} | {time.perf_counter() - started:.2f} | {before:.0f} | {peak_mib():.0f} | "
          f"{peak_mib() - before:.0f} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("store")
    parser.add_argument("--held", default="all,seven,prompt")
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)  # the fresh process's own call
    args = parser.parse_args()
    if args.one:
        return build(args.store, args.one)
    print("| held | pool rows | build s | peak RSS MiB, opened | after the build | rise |\n|---|---|---|---|---|---|")
    for held in args.held.split(","):
        subprocess.run([sys.executable, __file__, args.store, "--one", held], check=True)


if __name__ == "__main__":
    main()
