"""`softrl bench store`: the experience store at growing sizes, on a local directory (with a warm and a
cold page cache) and on loopback S3 servers (SeaweedFS, a real implementation, and moto, a mock),
against issue 53's targets (docs/bench/store-*.md).

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
from softrl.runtime.feed import draw_reads

PROMPT_TOKENS, RESPONSE_TOKENS, ROWS_PER_PROMPT, TASKS, CHUNK = 200, 300, 16, 4, 50_000
SAMPLE, LOOKUP, REPEATS, COLD_REPEATS = 64, 64, 20, 5
TARGETS = {"sample_ms": 50, "sample_rss_mib": 1024, "q0_ms": 100, "stats_s": 10, "writers_rows_s": 5000}
S3_SAMPLE_MS = 100  # on SeaweedFS at 1e6 rows
# moto reads a whole object to answer a ranged read: past this a draw by request takes seconds, 20 of them minutes
MOTO_MAX_ROWS = 100_000


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
        # each prompt once, written as Q0 writes them (an upsert, which keeps the key's index)
        store.tables["prompts"].upsert("prompt_id", prompt_rows(prompts[prompts * ROWS_PER_PROMPT >= have]))
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


def drop_page_cache() -> bool:
    """Empty the kernel's page cache (root only: False where it cannot), so that the next read comes
    from the disk, as a table larger than the memory is read."""
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def disk_reads() -> tuple[int, int]:
    """(bytes this process has read from storage, read system calls): /proc/self/io."""
    fields = dict(line.split(": ") for line in Path("/proc/self/io").read_text().splitlines())
    return int(fields["read_bytes"]), int(fields["syscr"])


class Timings:
    """Each call of a figure timed warm (page cache as left by the calls before) and, where `cold`, also
    after the page cache is dropped, with the bytes read from the disk and the read calls it made."""

    def __init__(self, cold: bool):
        self.cold, self.out = cold, {}

    def figure(self, name: str, unit: str, call: Callable[[], object], repeats: int):
        """`call()` `repeats` times (the first COLD_REPEATS of them also cold): NAME_UNIT, NAME_cold_UNIT
        (medians, in ms or s), NAME_cold_read_kib and NAME_cold_read_calls; returns the last result."""
        scale = 1000 if unit == "ms" else 1
        warm, cold, reads = [], [], []
        result = None
        for i in range(repeats):
            if self.cold and i < COLD_REPEATS:
                drop_page_cache()
                before = disk_reads()
                started = time.perf_counter()
                result = call()
                cold.append(time.perf_counter() - started)
                after = disk_reads()
                reads.append((after[0] - before[0], after[1] - before[1]))
            started = time.perf_counter()
            result = call()
            warm.append(time.perf_counter() - started)
        self.out[f"{name}_{unit}"] = scale * statistics.median(warm)
        if cold:
            self.out[f"{name}_cold_{unit}"] = scale * statistics.median(cold)
            self.out[f"{name}_cold_read_kib"] = statistics.median(r[0] for r in reads) / 1024
            self.out[f"{name}_cold_read_calls"] = statistics.median(r[1] for r in reads)
        return result


def measure_reads(root: str, cold: bool) -> dict[str, float]:
    """In a fresh process: the pool of one task as a run builds it (build, then draws of 64 of the columns
    a run's step reads, `draw_reads`), the process's peak memory so far; then draws of whole rows (every
    column), on an object store draws by request (no local copy), and the Q0 lookup of 64 prompts; each
    warm, and cold where `cold` (`Timings`)."""
    store, rng = ExperienceStore(root, create=False), random.Random(0)
    snapshot, baseline = store.snapshot(), peak_rss_mib()
    timings = Timings(cold)
    reads = draw_reads("offline", "bench")  # the bench's rows are tokenized by "bench": their ids, not texts
    if cold:
        drop_page_cache()
    started = time.perf_counter()
    pool = store.pool(snapshot, task="task0", reads=reads)
    build = time.perf_counter() - started
    rows = timings.figure("sample", "ms", lambda: pool.draw(SAMPLE, rng), REPEATS)
    assert len(rows) == SAMPLE and rows[0]["response_tokens"] and rows[0]["mc_targets"] is None  # not read
    out = {"pool_rows": len(pool), ("pool_build_cold_s" if cold else "pool_build_s"): build,
           "sample_rss_mib": peak_rss_mib(), "pool_rss_mib": peak_rss_mib() - baseline}
    if pool.local is not None:
        out["pool_copy_mib"] = pool.local.bytes / 2**20
        by_request = store.pool(snapshot, task="task0", reads=reads, copy=False)
        timings.figure("sample_by_request", "ms", lambda: by_request.draw(SAMPLE, rng), REPEATS)
        del by_request
    if pool.local is None:  # locally, beside whole rows (an object store's by request is the figure above) and
        del pool            # from a local copy, which a local store's run makes only when asked (`data.pool_copy`)
        whole = store.pool(snapshot, task="task0")
        rows = timings.figure("sample_whole", "ms", lambda: whole.draw(SAMPLE, rng), REPEATS)
        assert rows[0]["mc_targets"] == []  # read
        del whole
        started = time.perf_counter()
        copied = store.pool(snapshot, task="task0", reads=reads, copy=True)
        assert not copied.local.given_up, f"the pool's copy was given up: {copied.local.given_up}"
        out.update(pool_copy_build_s=time.perf_counter() - started, pool_copy_mib=copied.local.bytes / 2**20)
        timings.figure("sample_copy", "ms", lambda: copied.draw(SAMPLE, rng), REPEATS)
        del copied
    prompts = store.tables["prompts"].count(snapshot.versions["prompts"])
    asked = []

    def lookup():
        asked.append([f"bench-{rng.randrange(prompts)}" for _ in range(LOOKUP)])
        return store.prompts(snapshot, ids=asked[-1])
    found = timings.figure("q0", "ms", lookup, REPEATS)
    assert len(found) == len(set(asked[-1]))
    return {**out, **timings.out}


def measure_maintenance(root: str, cold: bool) -> dict[str, float]:
    """In a fresh process: stats, then dedupe (the table has no repeated id: a full check, no commit);
    each once cold (where `cold`) and once warm."""
    store, timings = ExperienceStore(root, create=False), Timings(cold)
    stats = timings.figure("stats", "s", store.stats, 1)
    before, after = timings.figure("dedupe", "s", store.dedupe, 1)
    return {"stats_rows": stats["trajectories"], "dedupe_removed": before - after, **timings.out,
            "maintenance_rss_mib": peak_rss_mib()}


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


def measure_size(root: str, rows: int, progress: Callable[[int], None], cold: bool = False) -> dict[str, float]:
    write = grow(root, rows, progress)
    return {"rows": rows, "bulk_write_rows_s": write, **in_fresh_process(measure_reads, root, cold),
            **in_fresh_process(measure_maintenance, root, cold)}


def extrapolate(points: list[dict], key: str, rows: float = 1e8) -> float | None:
    """`key` at `rows` by the power law through the two largest measured sizes (None with fewer)."""
    usable = sorted((p["rows"], p[key]) for p in points if p.get(key) and p[key] > 0)
    if len(usable) < 2:
        return None
    (n0, y0), (n1, y1) = usable[-2], usable[-1]
    slope = math.log(y1 / y0) / math.log(n1 / n0)
    return y1 * (rows / n1) ** slope


class LoopbackS3:
    """An S3 server on 127.0.0.1 with one bucket, SeaweedFS (`kind` "seaweedfs": a real S3 implementation,
    softrl_bench/s3_server.py) or moto (a mock); the standard AWS variables point softrl (and the processes
    it starts) at it while it runs."""

    def __init__(self, kind: str):
        self.kind = kind

    def __enter__(self) -> str:
        if self.kind == "seaweedfs":
            from softrl_bench.s3_server import SeaweedS3

            self.server = SeaweedS3("softrl-bench")
            variables = self.server.env()
        else:
            import boto3
            from moto.server import ThreadedMotoServer

            from softrl_bench.s3_server import free_port

            port = free_port()
            logging.getLogger("werkzeug").setLevel(logging.ERROR)  # a line per request otherwise
            self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
            self.server.start()
            variables = {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_REGION": "us-east-1",
                         "AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench"}
            boto3.client("s3", endpoint_url=variables["AWS_ENDPOINT_URL"], region_name="us-east-1",
                         aws_access_key_id="bench", aws_secret_access_key="bench").create_bucket(Bucket="softrl-bench")
        self.saved = {k: os.environ.get(k) for k in variables}
        os.environ.update(variables)
        return "s3://softrl-bench"

    def __exit__(self, *exc) -> None:
        for key, value in self.saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        self.server.stop()


S3_SERVERS = ("seaweedfs", "moto")


def run(where: Path, sizes: list[int], s3_sizes: list[int], writers: int, writer_rows: int,
        progress: Callable[[str, int, int], None], servers: tuple[str, ...] = S3_SERVERS, cold: bool = True) -> dict:
    """Every size on the local directory `where/local` (warm and, where the page cache can be dropped,
    cold) and on each loopback S3 server of `servers`, then the writers."""
    cold = cold and drop_page_cache()
    results: dict = {"local": [], "targets": TARGETS, "cold": cold, **{server: [] for server in servers}}
    for rows in sizes:
        results["local"].append(measure_size(str(where / "local"), rows, lambda n: progress("local", n, rows), cold))
    results["writers_local"] = measure_writers(str(where / f"writers-{time.time_ns()}"), writers, writer_rows)
    for server in servers if s3_sizes else ():
        with LoopbackS3(server) as bucket:
            for rows in [n for n in s3_sizes if server != "moto" or n <= MOTO_MAX_ROWS]:
                results[server].append(measure_size(f"{bucket}/store", rows, lambda n: progress(server, n, rows)))
            results[f"writers_{server}"] = measure_writers(f"{bucket}/writers", writers, writer_rows)
    # from the cold figures where there are some: a table of 1e8 rows is not in the page cache
    results["at_1e8"] = {key: extrapolate(results["local"], key) for key in
                         ("pool_build_s", "pool_build_cold_s", "sample_ms", "sample_cold_ms", "sample_rss_mib",
                          "q0_ms", "q0_cold_ms", "stats_s", "stats_cold_s", "dedupe_s", "dedupe_cold_s")}
    return results


COLUMNS = [("rows", "rows", "{:,.0f}"), ("bulk_write_rows_s", "bulk write rows/s", "{:,.0f}"),
           ("pool_build_s", "pool build s", "{:.2f}"), ("pool_build_cold_s", "pool build s (cold)", "{:.2f}"),
           ("pool_rows", "pool rows", "{:,.0f}"),
           ("pool_copy_mib", "pool's local copy MiB", "{:,.0f}"),
           ("pool_copy_build_s", "pool build with its copy s", "{:.1f}"),
           ("sample_copy_ms", "sample 64 from the copy ms", "{:.1f}"),
           ("sample_copy_cold_ms", "from the copy ms (cold)", "{:.1f}"),
           ("sample_ms", "sample 64 ms", "{:.1f}"), ("sample_cold_ms", "sample 64 ms (cold)", "{:.1f}"),
           ("sample_whole_ms", "sample 64 whole rows ms", "{:.1f}"),
           ("sample_whole_cold_ms", "whole rows ms (cold)", "{:.1f}"),
           ("sample_by_request_ms", "sample 64 by request ms", "{:.1f}"),
           ("sample_cold_read_kib", "sample: KiB read (cold)", "{:,.0f}"),
           ("sample_cold_read_calls", "sample: read calls (cold)", "{:,.0f}"),
           ("sample_rss_mib", "peak RSS MiB", "{:,.0f}"), ("pool_rss_mib", "of it the pool's", "{:,.0f}"),
           ("q0_ms", "Q0 64 prompts ms", "{:.1f}"), ("q0_cold_ms", "Q0 ms (cold)", "{:.1f}"),
           ("q0_cold_read_kib", "Q0: KiB read (cold)", "{:,.0f}"),
           ("stats_s", "stats s", "{:.2f}"), ("stats_cold_s", "stats s (cold)", "{:.2f}"),
           ("dedupe_s", "dedupe s", "{:.2f}"), ("dedupe_cold_s", "dedupe s (cold)", "{:.2f}")]
TITLES = {"local": "Local directory", "seaweedfs": "S3: SeaweedFS on loopback (a real S3 implementation)",
          "moto": "S3: moto on loopback (a mock)"}


MOTO_NOTE = ("moto reads a whole object to answer a ranged read (`benchmarks/s3_take.py`: 4.9 ms for 4 KiB of a 1 MiB "
             "object, 46.5 ms of a 64 MiB one), and a take is a ranged read per row and column: the sample times "
             "below grow with the data files, which S3's would not. They are moto's, not a measurement of S3 (and "
             f"moto is measured up to {MOTO_MAX_ROWS:,} rows only).\n")
COPY_NOTE = ("On an object store a pool copies the columns its draws read to local disk as it is built, packed row by "
             "row (\"pool's local copy\"; the build's time includes it) and a sample reads them there; \"sample 64 by "
             "request\" is the same draw from a pool without the copy, which asks the server for each row's columns "
             "(`ExperienceStore.pool`, `copy`). A local store's pool copies only when asked (`data.pool_copy`): "
             "\"from the copy\" is its draw from one, after a build with it.\n")
COLD_NOTE = ("Cold: the page cache dropped (`echo 3 > /proc/sys/vm/drop_caches`) before each of the first "
             f"{COLD_REPEATS} calls of a figure (median), as a table larger than the memory is read; KiB read and "
             "read calls are the process's own (/proc/self/io) in that call.\n")


def table_lines(points: list[dict]) -> list[str]:
    """A markdown table of `points`, with the COLUMNS any of them has."""
    columns = [c for c in COLUMNS if any(c[0] in p for p in points)]
    lines = ["| " + " | ".join(title for _, title, _ in columns) + " |", "|" + "---|" * len(columns)]
    for point in points:
        lines.append("| " + " | ".join(fmt.format(point[key]) if point.get(key) is not None else "-"
                                       for key, _, fmt in columns) + " |")
    return lines


def target_rows(results: dict) -> list[str]:
    """Issue 53's targets: local at the largest size, warm and cold; SeaweedFS's sample at its largest."""
    out = []
    largest = max(results["local"], key=lambda p: p["rows"]) if results["local"] else {}
    measured = {**largest, "writers_rows_s": results.get("writers_local", {}).get("writers_rows_s")}
    for key, target in TARGETS.items():
        at_least = key == "writers_rows_s"
        name, _, unit = key.rpartition("_")
        figures = [("", key), (" (cold)", f"{name}_cold_{unit}")]
        if key == "sample_ms":  # and from a local copy of the pool (`data.pool_copy`)
            figures += [(" from the pool's local copy", "sample_copy_ms"),
                        (" from the pool's local copy (cold)", "sample_copy_cold_ms")]
        for label, figure in figures:
            value = measured.get(figure)
            if value is not None:
                met = value >= target if at_least else value <= target
                out.append(f"| {key}{label}, local, {largest['rows']:,} rows | {value:,.1f} | "
                           f"{'>=' if at_least else '<='} {target:,} | {'yes' if met else '**no**'} |")
    sea = results.get("seaweedfs") or []
    if sea:
        top = max(sea, key=lambda p: p["rows"])
        out.append(f"| sample_ms, SeaweedFS, {top['rows']:,} rows | {top['sample_ms']:,.1f} | <= {S3_SAMPLE_MS} | "
                   f"{'yes' if top['sample_ms'] <= S3_SAMPLE_MS else '**no**'} |")
    return out


def markdown(results: dict, command: str) -> str:
    """The report: a table per backend, the writers, the targets, 1e8 by extrapolation."""
    out = [f"# The experience store at growing sizes\n\n`{command}`\n",
           f"Rows of a {PROMPT_TOKENS}-token prompt and a {RESPONSE_TOKENS}-token response (a third with log-probs), "
           f"{ROWS_PER_PROMPT} a prompt, {TASKS} tasks. The pool is one task's (a quarter of the rows); a sample is "
           f"{SAMPLE} rows drawn from it as a run's step draws them, the columns it feeds the learner (`draw_reads`: "
           "token ids, log-probs, turns; not the texts of rows whose ids the run's tokenizer made, nor MC targets), "
           f"median of {REPEATS}; \"whole rows\" draws every column. Q0 is the lookup of {LOOKUP} prompts (median of "
           f"{REPEATS}); peak RSS is the measuring process's, imports included, at its last sample (\"of it the "
           "pool's\": its rise from opening the store). Stats and dedupe read the whole table.\n",
           COLD_NOTE if results.get("cold") else "Cold figures: none (the page cache could not be dropped: not root).\n"]
    for backend in ("local", *S3_SERVERS):
        if not results.get(backend):
            continue
        out.append(f"\n## {TITLES[backend]}\n")
        if backend == "moto":
            out.append(MOTO_NOTE)
        out.append(COPY_NOTE)
        out += table_lines(results[backend])
        w = results.get(f"writers_{backend}")
        if w:
            out.append(f"\n{w['writers']} writer processes, {w['writer_rows']:,} rows in {w['writers_commits']} commits "
                       f"of 1,000: **{w['writers_rows_s']:,.0f} rows/s**; {w['writers_arrived']:,} rows arrived.\n")
    rows = target_rows(results)
    if rows:
        out.append("\n## Targets (issue 53)\n\n| figure | measured | target | met |\n|---|---|---|---|")
        out += rows
    guess = {k: v for k, v in results.get("at_1e8", {}).items() if v is not None}
    if guess:
        out.append("\n## At 1e8 rows, extrapolated\n\nBy the power law through the two largest local sizes "
                   "(a guess, not a measurement; the cold figures are the ones that apply, since such a table is not in "
                   "the page cache): " + ", ".join(f"{k} {v:,.1f}" for k, v in guess.items())
                   + ". 1,000 runs of 1e5 rows are such a table; committing every 10 steps, a run of 300 steps "
                   "adds 30 versions (`softrl data compact` folds them).\n")
    return "\n".join(out) + "\n"


def plot(results: dict, out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (times, memory) = plt.subplots(1, 2, figsize=(11, 4.2))
    for backend, style in (("local", "-o"), ("seaweedfs", "--s"), ("moto", ":^")):
        points = sorted(results.get(backend) or [], key=lambda p: p["rows"])
        if not points:
            continue
        rows = [p["rows"] for p in points]
        for key, label in (("pool_build_s", "pool build"), ("sample_ms", "sample 64 (ms/1000)"),
                           ("q0_ms", "Q0 64 (ms/1000)"), ("stats_s", "stats"), ("dedupe_s", "dedupe"),
                           ("pool_build_cold_s", "pool build, cold"), ("sample_cold_ms", "sample 64, cold (ms/1000)"),
                           ("q0_cold_ms", "Q0 64, cold (ms/1000)"), ("stats_cold_s", "stats, cold"),
                           ("dedupe_cold_s", "dedupe, cold")):
            if not any(p.get(key) for p in points):
                continue
            scale = 1000 if key.endswith("_ms") else 1
            times.plot(rows, [p[key] / scale if p.get(key) else float("nan") for p in points], style,
                       alpha=0.5 if "cold" in key else 1.0, label=f"{label}, {backend}")
        memory.plot(rows, [p["sample_rss_mib"] for p in points], style, label=f"pool + sample, {backend}")
        memory.plot(rows, [p["maintenance_rss_mib"] for p in points], style, alpha=0.5, label=f"stats + dedupe, {backend}")
    times.set(xscale="log", yscale="log", xlabel="rows in the store", ylabel="seconds", title="time")
    memory.set(xscale="log", xlabel="rows in the store", ylabel="peak RSS (MiB)", title="memory")
    return save_figure(fig, out, times, memory)
