"""Sandbox throughput: problems executed per second on this machine, per backend, against a bare
subprocess per test (`python -I -S`, no isolation at all).

    .venv/bin/python benchmarks/sandbox_throughput.py [--problems 60] [--workers 2]

A problem is one program run on its tests (1 or 10 stdin/stdout tests of `a + b`). The sandbox
runs all tests of a problem in one sandbox; the bare baseline starts one interpreter per test.
`workers` problems run at once (threads; the work is in child processes). Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
import warnings
from concurrent.futures import ThreadPoolExecutor

from softrl.rewards.sandbox import Sandbox, probe

SOURCE = "a, b = map(int, input().split())\nprint(a + b)\n"


def tests(n: int) -> list[tuple[str, str]]:
    return [(f"{i} {i + 1}", str(2 * i + 1)) for i in range(n)]


def bare(cases: list[tuple[str, str]]) -> bool:
    python = os.path.realpath(sys.executable)
    ok = True
    for stdin, expected in cases:
        out = subprocess.run([python, "-I", "-S", "-c", SOURCE], input=stdin, capture_output=True, text=True, timeout=10)
        ok &= out.stdout.strip() == expected
    return ok


def rate(run_one, problems: int, workers: int) -> float:
    start = time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        results = list(pool.map(lambda _: run_one(), range(problems)))
    assert all(results), "a correct program failed: the benchmark measures nothing"
    return problems / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problems", type=int, default=60)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    backends = {"bare subprocess": None}
    backends.update({b: Sandbox(b) for b, (ok, _) in probe().items() if ok})
    backends["unsafe (runner only)"] = Sandbox("unsafe", unsafe=True)
    rows = []
    for n in (1, 10):
        cases = tests(n)
        for name, sandbox in backends.items():
            def one(sandbox=sandbox, cases=cases) -> bool:
                if sandbox is None:
                    return bare(cases)
                return all(r.passed for r in sandbox.run_tests(SOURCE, cases))

            rate(one, args.workers * 2, args.workers)  # warm-up
            rates = [rate(one, args.problems, args.workers) for _ in range(args.repeats)]
            rows.append((n, name, statistics.median(rates)))
    base = {n: r for n, name, r in rows if name == "bare subprocess"}
    print(f"| tests per problem | backend | problems/s (median of {args.repeats}) | cost vs bare subprocess |")
    print("|---|---|---|---|")
    for n, name, r in rows:
        print(f"| {n} | {name} | {r:.1f} | {base[n] / r:.2f}x |")


if __name__ == "__main__":
    main()
