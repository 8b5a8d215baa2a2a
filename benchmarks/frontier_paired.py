"""Points of `softrl bench frontier` paired by report seed against a baseline's point.

    .venv/bin/python benchmarks/frontier_paired.py REGIME BASELINE POINT... [--kept FILE] [--seeds N] [--first K]

A point is a frontier run's name without its seed (`lag64/topr_lr0.0001_default-s3` is point
`topr_lr0.0001_default` of regime `lag64`). For the baseline and each point: pass@1 (mean ± sd over the
report seeds K..N-1 it finished), pass@10 and KL(pi || pi0); then pass@1 minus the baseline's on each seed
both finished, with its mean ± sd: the paired differences docs/BENCHMARKS.md's frontier sections report.
Prints Markdown; nothing is asserted.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from softrl.config import ConfigError
from softrl_bench.frontier_runs import kept


def per_seed(outcomes: dict[str, dict], regime: str, point: str, seeds: range) -> dict[int, dict]:
    runs = {seed: outcomes.get(f"{regime}/{point}-s{seed}") for seed in seeds}
    return {seed: entry["outcome"] for seed, entry in runs.items() if entry is not None}


def spread(values: list[float]) -> str:
    if not values:
        return "-"
    sd = f" ± {statistics.stdev(values):.3f}" if len(values) > 1 else ""
    return f"{statistics.fmean(values):.3f}{sd}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("regime")
    parser.add_argument("baseline")
    parser.add_argument("points", nargs="+")
    parser.add_argument("--kept", type=Path, default=Path("docs/bench/frontier-runs.jsonl"))
    parser.add_argument("--seeds", type=int, default=4, help="report seeds up to N-1")
    parser.add_argument("--first", type=int, default=0, help="report seeds from K (seeds added later, alone)")
    args = parser.parse_args()
    if not args.kept.is_file():
        sys.exit(f"frontier_paired: --kept {args.kept}: no such file")
    try:
        outcomes = kept(args.kept)
    except ConfigError as e:
        sys.exit(f"frontier_paired: {e}")
    seeds = range(args.first, args.seeds)
    for point in [args.baseline, *args.points]:  # a mistyped point would print as an empty row
        if not per_seed(outcomes, args.regime, point, seeds):
            sys.exit(f"frontier_paired: no run of point {point!r} in {args.regime} at report seeds "
                     f"{args.first}-{args.seeds - 1} in {args.kept}")
    base = per_seed(outcomes, args.regime, args.baseline, seeds)
    print(f"Regime {args.regime}, report seeds {args.first}-{args.seeds - 1}, paired against {args.baseline}.\n")
    print("| point | seeds | pass@1 | pass@10 | KL | paired pass@1 | per seed |")
    print("|---|---|---|---|---|---|---|")
    for point in [args.baseline, *args.points]:
        runs = per_seed(outcomes, args.regime, point, seeds)
        diffs = [runs[s]["pass@1"] - base[s]["pass@1"] for s in sorted(runs) if s in base]
        paired = "-" if point == args.baseline else spread(diffs)
        each = ", ".join(f"{d:+.3f}" for d in diffs) if point != args.baseline else ""
        print(f"| {point} | {len(runs)} | {spread([o['pass@1'] for o in runs.values()])} | "
              f"{spread([o['pass@10'] for o in runs.values()])} | {spread([o['kl'] for o in runs.values()])} | "
              f"{paired} | {each} |")


if __name__ == "__main__":
    main()
