"""`softrl bench store`: the experience store at growing sizes, on a local directory and on a loopback
S3 server (moto), against issue 34's targets (docs/bench/store-*.md).

Rows are realistic in size (a prompt of 200 tokens, a response of 300, a third with the sampler's
log-probs), 16 per prompt, over 4 tasks. A table grows by bulk appends of 50,000 rows to each size
(resumable: a size already reached is not written again), then each operation is measured in a
fresh process (its peak RSS is the process's): a run's pool of one task and draws of 64 rows from
it, the Q0 lookup of 64 prompts, stats, dedupe. Separately, N writer processes append through
`ExperienceStore.append` in commits of 1,000 rows, as runs do. Nothing is asserted.
"""

from __future__ import annotations

import logging
import math
import multiprocessing
import os
import random
import resource
import statistics
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pyarrow as pa

from softrl.data import ExperienceStore, Trajectory
from softrl.data.batched import BatchedAppender
from softrl.data.schema import PROMPT_SCHEMA, TRAJECTORY_SCHEMA
from softrl.plots import save_figure

PROMPT_TOKENS, RESPONSE_TOKENS, ROWS_PER_PROMPT, TASKS, CHUNK = 200, 300, 16, 4, 50_000
SAMPLE, LOOKUP, REPEATS = 64, 64, 20
TARGETS = {"sample_ms": 50, "sample_rss_mib": 1024, "q0_ms": 100, "stats_s": 10, "writers_rows_s": 5000}


def payload(n: int, seed: int = 0) -> dict[str, pa.Array]:
    """Token and log-prob columns of n rows, made once and reused by every chunk (only ids and keys vary)."""
    rng = np.random.default_rng(seed)

    def lists(width: int, values: np.ndarray) -> pa.Array:
        return pa.ListArray.from_arrays(pa.array(np.arange(0, n * width + 1, width, dtype=np.int32)), pa.array(values))

    logprobs = lists(RESPONSE_TOKENS, -rng.random(n * RESPONSE_TOKENS, dtype=np.float32))
    online = pa.array(np.arange(n) % 3 == 0)
    return {"prompt_tokens": lists(PROMPT_TOKENS, rng.integers(0, 50_000, n * PROMPT_TOKENS, dtype=np.int32)),
            "response_tokens": lists(RESPONSE_TOKENS, rng.integers(0, 50_000, n * RESPONSE_TOKENS, dtype=np.int32)),
            "behavior_logprobs": pa.compute.if_else(online, logprobs, pa.nulls(n, logprobs.type))}


def prompt_of(i: np.ndarray) -> np.ndarray:
    return i // ROWS_PER_PROMPT


def chunk(start: int, n: int, columns: dict[str, pa.Array]) -> pa.Table:
    """Rows start..start+n-1 of the synthetic table (ids: the row number as 32 hex digits)."""
    i = np.arange(start, start + n)
    prompt = prompt_of(i)
    text = lambda fmt, values: pa.array([fmt.format(v) for v in values.tolist()])  # noqa: E731
    data = {
        "id": text("{:032x}", i), "prompt_id": text("bench-{}", prompt), "task": text("task{}", prompt % TASKS),
        "prompt_text": pa.nulls(n, pa.string()), "response_text": pa.nulls(n, pa.string()),
        "prompt_tokens": columns["prompt_tokens"].slice(0, n), "response_tokens": columns["response_tokens"].slice(0, n),
        "tokenizer": pa.array(["bench"] * n), "reward": pa.array((i % 4 == 0).astype(np.float64)),
        "passed": pa.array(i % 4 == 0), "source": pa.array(np.array(["online", "reference", "human"])[i % 3]),
        "run_id": pa.array(["bench"] * n), "policy_version": pa.array(i // 10_000),
        "behavior_logprobs": columns["behavior_logprobs"].slice(0, n),
        "decoding": pa.array([{"temperature": 1.0, "top_p": 1.0}] * n, TRAJECTORY_SCHEMA.field("decoding").type),
        "mc_targets": pa.array([[]] * n, TRAJECTORY_SCHEMA.field("mc_targets").type),
        "created_at": pa.array([datetime.now(timezone.utc)] * n, TRAJECTORY_SCHEMA.field("created_at").type)}
    # single-turn rows: an episode's columns (turns, action_mask, finish) null
    data |= {f.name: pa.nulls(n, f.type) for f in TRAJECTORY_SCHEMA if f.name not in data}
    return pa.table(data, schema=TRAJECTORY_SCHEMA)


def grow(root: str, rows: int, progress: Callable[[int], None]) -> float:
    """Append synthetic rows (and their prompts, with a Q0) until the store holds `rows`; rows/s written."""
    store = ExperienceStore(root)
    have = store.tables["trajectories"].count(store.tables["trajectories"].latest())
    columns, started, written = payload(min(CHUNK, rows)), time.perf_counter(), 0
    while have < rows:
        n = min(CHUNK, rows - have)
        store.tables["trajectories"].append(chunk(have, n, columns))
        prompts = np.unique(prompt_of(np.arange(have, have + n)))
        store.tables["prompts"].append(prompt_rows(prompts[prompts * ROWS_PER_PROMPT >= have]))  # each prompt once
        have, written = have + n, written + n
        progress(have)
    return written / (time.perf_counter() - started) if written else float("nan")


def prompt_rows(prompts: np.ndarray) -> pa.Table:
    n = len(prompts)
    values = {"prompt_id": pa.array([f"bench-{p}" for p in prompts.tolist()]),
              "task": pa.array([f"task{p % TASKS}" for p in prompts.tolist()]), "q0_hat": pa.array(np.full(n, -0.5)),
              "q0_k": pa.array(np.full(n, 8))}
    return pa.table({f.name: values.get(f.name, pa.nulls(n, f.type)) for f in PROMPT_SCHEMA}, schema=PROMPT_SCHEMA)


def peak_rss_mib() -> float:
    """This process's peak resident memory (VmHWM: getrusage's maxrss would carry the peak of the parent
    this process was forked from, which Linux keeps across exec)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def measure_reads(root: str) -> dict[str, float]:
    """In a fresh process: the pool of one task (build, then draws of 64), the Q0 lookup of 64 prompts."""
    store, rng = ExperienceStore(root, create=False), random.Random(0)
    snapshot, baseline = store.snapshot(), peak_rss_mib()
    started = time.perf_counter()
    pool = store.pool(snapshot, task="task0")
    build = time.perf_counter() - started
    draws = []
    for _ in range(REPEATS):
        started = time.perf_counter()
        rows = pool.draw(SAMPLE, rng)
        draws.append(time.perf_counter() - started)
    assert len(rows) == SAMPLE
    prompts = store.tables["prompts"].count(snapshot.versions["prompts"])
    lookups = []
    for _ in range(REPEATS):
        ids = [f"bench-{rng.randrange(prompts)}" for _ in range(LOOKUP)]
        started = time.perf_counter()
        found = store.prompts(snapshot, ids=ids)
        lookups.append(time.perf_counter() - started)
    assert len(found) == len(set(ids))
    return {"pool_rows": len(pool), "pool_build_s": build, "sample_ms": 1000 * statistics.median(draws),
            "sample_rss_mib": peak_rss_mib(), "pool_rss_mib": peak_rss_mib() - baseline, "q0_ms": 1000 * statistics.median(lookups)}


def measure_maintenance(root: str) -> dict[str, float]:
    """In a fresh process: stats, then dedupe (the table has no repeated id: a full check, no commit)."""
    store = ExperienceStore(root, create=False)
    started = time.perf_counter()
    stats = store.stats()
    seconds = time.perf_counter() - started
    started = time.perf_counter()
    before, after = store.dedupe()
    return {"stats_s": seconds, "stats_rows": stats["trajectories"], "dedupe_s": time.perf_counter() - started,
            "dedupe_removed": before - after, "maintenance_rss_mib": peak_rss_mib()}


def writer(root: str, worker: int, rows: int, commit: int, ready, go, done) -> None:
    """Make its rows, say it is ready, wait for the start, then append them in commits of `commit`."""
    store, rng = ExperienceStore(root), random.Random(worker)
    made = [Trajectory(f"w-{i // ROWS_PER_PROMPT}", "", reward=1.0, passed=True, task="writers", source="online",
                       prompt_tokens=[rng.randrange(50_000) for _ in range(PROMPT_TOKENS)],
                       response_tokens=[worker, i] + [rng.randrange(50_000) for _ in range(RESPONSE_TOKENS - 2)],
                       tokenizer="bench") for i in range(rows)]
    committer = BatchedAppender(store, every=1)  # a run's path: rows written as fragments, then committed
    ready.release()
    go.wait()
    for start in range(0, rows, commit):
        committer.append(made[start:start + commit])
    done.release()


def in_fresh_process(function: Callable, *args) -> dict:
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(function, *args).result()


def measure_writers(root: str, processes: int, rows_each: int, commit: int = 1_000) -> dict[str, float]:
    """`processes` writers appending `rows_each` rows each at once, timed from a common start (their
    imports and row making excluded) to the last commit; and how many rows arrived (each once?)."""
    context = multiprocessing.get_context("spawn")
    ready, go, done = context.Semaphore(0), context.Event(), context.Semaphore(0)
    ExperienceStore(root)  # created before the race
    workers = [context.Process(target=writer, args=(root, w, rows_each, commit, ready, go, done))
               for w in range(processes)]
    for w in workers:
        w.start()
    for _ in workers:
        ready.acquire()
    started = time.perf_counter()
    go.set()
    for _ in workers:
        done.acquire()
    seconds = time.perf_counter() - started
    for w in workers:
        w.join()
    arrived = ExperienceStore(root, create=False).trajectories(task="writers", columns=["id"], unique=False).num_rows
    return {"writers": processes, "writer_rows": processes * rows_each, "writers_rows_s": processes * rows_each / seconds,
            "writers_arrived": arrived, "writers_commits": processes * math.ceil(rows_each / commit)}


def measure_size(root: str, rows: int, progress: Callable[[int], None]) -> dict[str, float]:
    write = grow(root, rows, progress)
    return {"rows": rows, "bulk_write_rows_s": write, **in_fresh_process(measure_reads, root),
            **in_fresh_process(measure_maintenance, root)}


def extrapolate(points: list[dict], key: str, rows: float = 1e8) -> float | None:
    """`key` at `rows` by the power law through the two largest measured sizes (None with fewer)."""
    usable = sorted((p["rows"], p[key]) for p in points if p.get(key) and p[key] > 0)
    if len(usable) < 2:
        return None
    (n0, y0), (n1, y1) = usable[-2], usable[-1]
    slope = math.log(y1 / y0) / math.log(n1 / n0)
    return y1 * (rows / n1) ** slope


class LoopbackS3:
    """moto's S3 server on 127.0.0.1 with one bucket; the standard AWS variables point softrl (and the
    processes it starts) at it while it runs."""

    def __enter__(self) -> str:
        import socket

        import boto3
        from moto.server import ThreadedMotoServer

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # a line per request otherwise
        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
        self.server.start()
        self.saved = {k: os.environ.get(k) for k in ("AWS_ENDPOINT_URL", "AWS_REGION", "AWS_ACCESS_KEY_ID",
                                                     "AWS_SECRET_ACCESS_KEY")}
        os.environ.update(AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}", AWS_REGION="us-east-1",
                          AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench")
        boto3.client("s3").create_bucket(Bucket="softrl-bench")
        return "s3://softrl-bench"

    def __exit__(self, *exc) -> None:
        for key, value in self.saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        self.server.stop()


def run(where: Path, sizes: list[int], s3_sizes: list[int], writers: int, writer_rows: int,
        progress: Callable[[str, int, int], None]) -> dict:
    """Every size on the local directory `where/local` and on a loopback S3 server, then the writers."""
    results: dict = {"local": [], "s3": [], "targets": TARGETS}
    for rows in sizes:
        results["local"].append(measure_size(str(where / "local"), rows, lambda n: progress("local", n, rows)))
    results["writers_local"] = measure_writers(str(where / f"writers-{time.time_ns()}"), writers, writer_rows)
    if s3_sizes:
        with LoopbackS3() as bucket:
            for rows in s3_sizes:
                results["s3"].append(measure_size(f"{bucket}/store", rows, lambda n: progress("s3", n, rows)))
            results["writers_s3"] = measure_writers(f"{bucket}/writers", writers, writer_rows)
    results["at_1e8"] = {key: extrapolate(results["local"], key) for key in
                         ("pool_build_s", "sample_ms", "sample_rss_mib", "q0_ms", "stats_s", "dedupe_s")}
    return results


COLUMNS = [("rows", "rows", "{:,.0f}"), ("bulk_write_rows_s", "bulk write rows/s", "{:,.0f}"),
           ("pool_build_s", "pool build s", "{:.2f}"), ("pool_rows", "pool rows", "{:,.0f}"),
           ("sample_ms", "sample 64 ms", "{:.1f}"), ("sample_rss_mib", "peak RSS MiB", "{:,.0f}"),
           ("pool_rss_mib", "of it the pool's", "{:,.0f}"),
           ("q0_ms", "Q0 64 prompts ms", "{:.1f}"), ("stats_s", "stats s", "{:.2f}"), ("dedupe_s", "dedupe s", "{:.2f}")]


MOTO_NOTE = ("moto reads a whole object to answer a ranged read (`benchmarks/s3_take.py`: 4.9 ms for 4 KiB of a 1 MiB "
             "object, 46.5 ms of a 64 MiB one), and a take is a ranged read per row and column: the sample times "
             "below grow with the data files, which S3's would not. They are moto's, not a measurement of S3.\n")


def markdown(results: dict, command: str) -> str:
    """The report: a table per backend, the writers, the targets at the largest local size, 1e8 by extrapolation."""
    out = [f"# The experience store at growing sizes\n\n`{command}`\n",
           f"Rows of a {PROMPT_TOKENS}-token prompt and a {RESPONSE_TOKENS}-token response (a third with log-probs), "
           f"{ROWS_PER_PROMPT} a prompt, {TASKS} tasks. The pool is one task's (a quarter of the rows); a sample is "
           f"{SAMPLE} rows drawn from it (median of {REPEATS}); Q0 is the lookup of {LOOKUP} prompts (median of "
           f"{REPEATS}); peak RSS is the measuring process's, imports included (\"of it the pool's\": its rise "
           "from opening the store to the last sample). Stats and dedupe read the whole table.\n"]
    for backend in ("local", "s3"):
        if not results[backend]:
            continue
        out.append(f"\n## {'Local directory' if backend == 'local' else 'S3 (moto on loopback)'}\n")
        if backend == "s3":
            out.append(MOTO_NOTE)
        out.append("| " + " | ".join(title for _, title, _ in COLUMNS) + " |")
        out.append("|" + "---|" * len(COLUMNS))
        for point in results[backend]:
            out.append("| " + " | ".join(fmt.format(point[key]) for key, _, fmt in COLUMNS) + " |")
        w = results.get(f"writers_{backend}")
        if w:
            out.append(f"\n{w['writers']} writer processes, {w['writer_rows']:,} rows in {w['writers_commits']} commits "
                       f"of 1,000: **{w['writers_rows_s']:,.0f} rows/s**; {w['writers_arrived']:,} rows arrived.\n")
    if results["local"]:
        largest = max(results["local"], key=lambda p: p["rows"])
        measured = {**largest, "writers_rows_s": results.get("writers_local", {}).get("writers_rows_s")}
        out.append(f"\n## Targets (issue 34), at {largest['rows']:,} rows, local\n")
        out.append("| figure | measured | target | met |\n|---|---|---|---|")
        for key, target in TARGETS.items():
            value = measured.get(key)
            if value is None:
                continue
            met = value >= target if key == "writers_rows_s" else value <= target
            out.append(f"| {key} | {value:,.1f} | {'>=' if key == 'writers_rows_s' else '<='} {target:,} | "
                       f"{'yes' if met else '**no**'} |")
        guess = {k: v for k, v in results["at_1e8"].items() if v is not None}
        if guess:
            out.append("\n## At 1e8 rows, extrapolated\n\nBy the power law through the two largest local sizes "
                       "(a guess, not a measurement): " + ", ".join(f"{k} {v:,.1f}" for k, v in guess.items())
                       + ". 1,000 runs of 1e5 rows are such a table; committing every 10 steps, a run of 300 steps "
                       "adds 30 versions (`softrl data compact` folds them).\n")
    return "\n".join(out) + "\n"


def plot(results: dict, out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (times, memory) = plt.subplots(1, 2, figsize=(11, 4.2))
    for backend, style in (("local", "-o"), ("s3", "--s")):
        points = sorted(results[backend], key=lambda p: p["rows"])
        if not points:
            continue
        rows = [p["rows"] for p in points]
        for key, label in (("pool_build_s", "pool build"), ("sample_ms", "sample 64 (ms/1000)"),
                           ("q0_ms", "Q0 64 (ms/1000)"), ("stats_s", "stats"), ("dedupe_s", "dedupe")):
            scale = 1000 if key.endswith("_ms") else 1
            times.plot(rows, [p[key] / scale for p in points], style, label=f"{label}, {backend}")
        memory.plot(rows, [p["sample_rss_mib"] for p in points], style, label=f"pool + sample, {backend}")
        memory.plot(rows, [p["maintenance_rss_mib"] for p in points], style, alpha=0.5, label=f"stats + dedupe, {backend}")
    times.set(xscale="log", yscale="log", xlabel="rows in the store", ylabel="seconds", title="time")
    memory.set(xscale="log", xlabel="rows in the store", ylabel="peak RSS (MiB)", title="memory")
    return save_figure(fig, out, times, memory)
