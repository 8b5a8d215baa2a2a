"""`softrl bench store`: the experience store's reads, maintenance and writers at growing sizes."""

from __future__ import annotations

import json
import shlex
import shutil
import sys
from pathlib import Path

import typer

from softrl.cli_bench import _csv, bench_app
from softrl.cli_common import err, fail, one_line_errors, progress_bar

FULL = {"sizes": "1e4,1e5,1e6,1e7", "s3_sizes": "1e4,1e5", "writer_rows": 5_000}
QUICK = {"sizes": "2e3,2e4", "s3_sizes": "2e3", "writer_rows": 500}


def _sizes(option: str, text: str) -> list[int]:
    try:
        sizes = [int(float(v)) for v in _csv(text)]
    except ValueError:
        fail(f"{option}: {text!r} is not a comma-separated list of row counts (e.g. 1e4,1e5)")
    if not sizes or any(n < 1 for n in sizes) or sizes != sorted(sizes):
        fail(f"{option}: {text!r} must list row counts >= 1, smallest first")
    return sizes


@bench_app.command("store")
def store(
    sizes: str = typer.Option(FULL["sizes"], help="rows of the local table, smallest first"),
    s3_sizes: str = typer.Option(FULL["s3_sizes"], help="rows of the table on a loopback S3 server (none: '')"),
    writers: int = typer.Option(4, min=1, help="writer processes appending at once"),
    writer_rows: int = typer.Option(FULL["writer_rows"], min=1, help="rows each writer appends"),
    runs: Path = typer.Option(Path("runs/store-bench"), help="where the local tables go (kept: a size reached is reused)"),
    report: Path = typer.Option(Path("docs/bench"), help="where store.md, store.json and store.png go"),
    quick: bool = typer.Option(False, "--quick", help="small sizes, in place of the options above (a test's run)"),
    clean: bool = typer.Option(False, "--clean", help="remove the tables when done (they are large)"),
) -> None:
    """The store at growing sizes, locally and on S3: pool build, a sample of 64, Q0 lookup, stats and
    dedupe, their peak memory, and N writers at once, against issue 34's targets."""
    from softrl.bench import store as bench

    if quick:
        sizes, s3_sizes, writer_rows = QUICK["sizes"], QUICK["s3_sizes"], QUICK["writer_rows"]
    local, remote = _sizes("--sizes", sizes), _sizes("--s3-sizes", s3_sizes) if s3_sizes.strip() else []
    if remote:
        try:
            import moto  # noqa: F401
        except ImportError:
            fail("--s3-sizes: the loopback S3 server needs moto (pip install 'moto[server]'), or pass --s3-sizes ''")
    runs.mkdir(parents=True, exist_ok=True)
    with progress_bar("store", total=local[-1]) as update, one_line_errors():
        results = bench.run(runs, local, remote, writers, writer_rows,
                            lambda backend, n, size: update(n, size, f"{backend}: writing to {size:,} rows"))
    command = "softrl bench store " + shlex.join(sys.argv[3:]) if sys.argv[1:3] == ["bench", "store"] else "softrl bench store"
    report.mkdir(parents=True, exist_ok=True)
    text = bench.markdown(results, command.strip())
    (report / "store.md").write_text(text)
    (report / "store.json").write_text(json.dumps(results, indent=1))
    bench.plot(results, report / "store.png")
    if clean:
        shutil.rmtree(runs, ignore_errors=True)
    typer.echo(text)
    err.print(f"report: {report}/store.md")
