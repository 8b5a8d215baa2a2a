"""The store before Lance (a folder of Parquet parts), beside today's, on the same rows: issue 34 asks for
each figure beside the old store's at the sizes it can reach (docs/BENCHMARKS.md, "The experience store").

    .venv/bin/python benchmarks/old_store.py [--sizes 10000,100000,1000000] [--part-rows 64] [--out FILE.json]

The old store's code comes from git (`git archive COMMIT src`, by default the last commit before the
move) into a temporary folder, and runs in its own processes with that folder first on the path. The
rows are `softrl bench store`'s (a 200-token prompt, a 300-token response, 16 a prompt, 4 tasks),
made once per size and handed to both sides as Parquet files. Each store is written as runs leave it:
the old one a part per step (--part-rows: 64 rows is 16 prompts x 4), today's a commit per 10 steps
(a fragment of 10 x --part-rows rows); today's is measured again after `softrl data compact`. At each
size, old then new, each figure in a fresh process: a run's pool of one task (the old one: its rows
read into memory, as its feed did) and 64 rows drawn from it, Q0 of 64 prompts (the old one read every
prompt), stats, dedupe (the old one rewrote the store in memory: only up to 1e5 rows). Prints a
markdown table. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

BEFORE_LANCE = "3e3c32d^"  # the commit that moved the store onto Lance, less one
OLD_DEDUPE_ROWS = 100_000  # above this the old dedupe held the store in memory (about 2 GB a 1e5 rows)
SAMPLE, LOOKUP, REPEATS = 64, 64, 20


def peak_rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


# --- in a process with the old store's code first on the path ---------------------------------------
def old_grow(root: str, staged: str, part_rows: int) -> dict:
    from softrl.data import ExperienceStore

    store, started, rows = ExperienceStore(root), time.perf_counter(), 0
    for path in sorted(Path(staged, "trajectories").iterdir()):
        table = pq.read_table(path)
        for start in range(0, len(table), part_rows):
            store._write_part("trajectories", table.slice(start, part_rows))
        rows += len(table)
    for path in sorted(Path(staged, "prompts").iterdir()):
        store._write_part("prompts", pq.read_table(path))
    return {"write_rows_s": rows / (time.perf_counter() - started),
            "part_files": len(list(Path(root, "trajectories").iterdir()))}


def old_reads(root: str) -> dict:
    from softrl.data import ExperienceStore, TrajectoryPool

    store, rng, baseline = ExperienceStore(root, create=False), random.Random(0), peak_rss_mib()
    started = time.perf_counter()
    q0 = store.prompts()
    rows = [r for r in store.trajectories(task="task0").to_pylist() if r["prompt_id"] in q0]
    pool = TrajectoryPool(rows)
    build = time.perf_counter() - started
    draws = []
    for _ in range(REPEATS):
        started = time.perf_counter()
        pool.draw(SAMPLE, rng)
        draws.append(time.perf_counter() - started)
    lookups = []
    for _ in range(REPEATS):  # the old Q0 lookup: every prompt read, then 64 of them picked
        started = time.perf_counter()
        prompts = store.prompts()
        [prompts.get(f"bench-{rng.randrange(len(prompts))}") for _ in range(LOOKUP)]
        lookups.append(time.perf_counter() - started)
    return {"pool_rows": len(pool), "pool_build_s": build, "sample_ms": 1000 * statistics.median(draws),
            "sample_rss_mib": peak_rss_mib(), "pool_rss_mib": peak_rss_mib() - baseline,
            "q0_ms": 1000 * statistics.median(lookups)}


def old_maintenance(root: str, rows: int) -> dict:
    from softrl.data import ExperienceStore

    store = ExperienceStore(root, create=False)
    started = time.perf_counter()
    store.stats()
    out = {"stats_s": time.perf_counter() - started}
    if rows <= OLD_DEDUPE_ROWS:
        started = time.perf_counter()
        store.dedupe()
        out["dedupe_s"] = time.perf_counter() - started
    return {**out, "maintenance_rss_mib": peak_rss_mib()}


# --- the driver: today's code ---------------------------------------------------------------------
def old_side(source: Path, function: str, *args) -> dict:
    """`function(*args)` of this file in a fresh process that imports softrl from `source` (the old code)."""
    call = f"import json, sys; sys.path.insert(0, {str(source)!r}); sys.path.insert(1, {str(Path(__file__).parent)!r}); " \
           f"import old_store; print(json.dumps(old_store.{function}(*{args!r})))"
    done = subprocess.run([sys.executable, "-c", call], capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"the old store's {function} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.splitlines()[-1])


def stage(folder: Path, rows: int) -> None:
    """The size's rows as Parquet files, 50,000 rows each, and their prompts (each with a Q0)."""
    from softrl_bench import store as bench

    for name in ("trajectories", "prompts"):
        (folder / name).mkdir(parents=True)
    columns = bench.payload(min(bench.CHUNK, rows))
    for start in range(0, rows, bench.CHUNK):
        n = min(bench.CHUNK, rows - start)
        pq.write_table(bench.chunk(start, n, columns), folder / "trajectories" / f"{start:012d}.parquet")
        prompts = np.unique(bench.prompt_of(np.arange(start, start + n)))
        pq.write_table(bench.prompt_rows(prompts[prompts * bench.ROWS_PER_PROMPT >= start]),
                       folder / "prompts" / f"{start:012d}.parquet")


def measure(work: Path, source: Path, sizes: list[int], part_rows: int) -> list[dict]:
    out = []
    for rows in sizes:
        staged = work / f"rows-{rows}"
        stage(staged, rows)
        old_root = str(work / f"old-{rows}")
        old = {"side": "old", "rows": rows, **old_side(source, "old_grow", old_root, str(staged), part_rows),
               **old_side(source, "old_reads", old_root), **old_side(source, "old_maintenance", old_root, rows)}
        print(json.dumps(old), file=sys.stderr)
        new_root = str(work / f"new-{rows}")
        new = {"side": "new", "rows": rows, **new_grow(new_root, staged, 10 * part_rows), **new_figures(new_root)}
        print(json.dumps(new), file=sys.stderr)
        from softrl.data import ExperienceStore
        from softrl.data.versions import compact

        compact(ExperienceStore(new_root), keep=1)
        compacted = {"side": "new, compacted", "rows": rows, **new_figures(new_root)}
        print(json.dumps(compacted), file=sys.stderr)
        out += [old, new, compacted]
    return out


def new_grow(root: str, staged: Path, commit_rows: int) -> dict:
    """Today's store written as a run writes it: a commit of `commit_rows` rows at a time."""
    from softrl.data import ExperienceStore
    from softrl.data.schema import PROMPT_SCHEMA, TRAJECTORY_SCHEMA

    store, started, rows = ExperienceStore(root), time.perf_counter(), 0
    for path in sorted((staged / "trajectories").iterdir()):
        table = pq.read_table(path)
        for field in TRAJECTORY_SCHEMA:  # the old store had no episodes: their columns null
            if field.name not in table.column_names:
                table = table.append_column(field, pa.nulls(len(table), field.type))
        table = table.select(TRAJECTORY_SCHEMA.names).cast(TRAJECTORY_SCHEMA)  # Parquet names a list's values "element"
        for start in range(0, len(table), commit_rows):
            store.tables["trajectories"].append(table.slice(start, commit_rows))
        rows += len(table)
    for path in sorted((staged / "prompts").iterdir()):
        store.tables["prompts"].append(pq.read_table(path).cast(PROMPT_SCHEMA))
    fragments = store.tables["trajectories"].parts(store.tables["trajectories"].latest())
    return {"write_rows_s": rows / (time.perf_counter() - started), "part_files": fragments}


def new_figures(root: str) -> dict:
    from softrl_bench import store as bench

    return {**bench.in_fresh_process(bench.measure_reads, root), **bench.in_fresh_process(bench.measure_maintenance, root)}


COLUMNS = [("pool_build_s", "pool build s", "{:.2f}"), ("sample_ms", "sample 64 ms", "{:.2f}"),
           ("sample_rss_mib", "peak RSS MiB", "{:,.0f}"), ("q0_ms", "Q0 64 prompts ms", "{:.1f}"),
           ("stats_s", "stats s", "{:.2f}"), ("dedupe_s", "dedupe s", "{:.2f}")]


def markdown(results: list[dict], part_rows: int, commit: str) -> str:
    lines = [f"Old store (code of `{commit}`, a Parquet part per {part_rows} rows) and today's (Lance, a commit per "
             f"{10 * part_rows} rows; then compacted), the same rows, old then new at each size:", "",
             "| rows | store | files | write rows/s | " + " | ".join(c[1] for c in COLUMNS) + " |",
             "|---" * (len(COLUMNS) + 4) + "|"]
    for r in results:
        cells = [fmt.format(r[key]) if r.get(key) is not None else "-" for key, _, fmt in COLUMNS]
        write = f"{r['write_rows_s']:,.0f}" if "write_rows_s" in r else "-"
        files = f"{r['part_files']:,}" if "part_files" in r else "1"
        lines.append(f"| {r['rows']:,} | {r['side']} | {files} | {write} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="10000,100000,1000000")
    parser.add_argument("--part-rows", type=int, default=64)
    parser.add_argument("--commit", default=BEFORE_LANCE)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    repo = Path(__file__).resolve().parent.parent
    with tempfile.TemporaryDirectory(prefix="old-store-") as tmp:
        work = Path(tmp)
        archive = subprocess.run(["git", "-C", str(repo), "archive", args.commit, "src"], capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", tmp], input=archive.stdout, check=True)
        results = measure(work, work / "src", [int(s) for s in args.sizes.split(",")], args.part_rows)
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))
    print(markdown(results, args.part_rows, args.commit))


if __name__ == "__main__":
    main()
