#!/bin/bash
# Issue 51 at lag 64 with each strength knob grown one rung past the edge its best point lies on
# (`--extend-strength 1`, docs/BENCHMARKS.md "Strength grids grown past their edge at lag 64"), for the
# methods that decide the target there: softrl's whose pick lies on a knob's edge (spo-ema-failed, tau 0.8;
# spo-ema-is's 0.93 is inside its grid) and every baseline whose pick reported within 0.02 of the best
# baseline's on seeds 0-3 and whose knob is a ladder (GRPO-TIS's k3, CISPO's cap; TOPR has no knob, GSPO's
# two clips are no ladder). Tuned on seeds 100-102, reported on seeds 0-7 as "Eight report seeds".
# One method an invocation: alone in a regime a method's matched point is its pick, so only the pick runs.
# The kept outcomes (and the reference beside them) start as a copy of the frontier's and the eight seeds',
# so no run trains again. Usage: bash benchmarks/frontier_grown_strengths.sh DIR
set -eu
dir=${1:?usage: frontier_grown_strengths.sh DIR}
mkdir -p "$dir"
kept=$dir/frontier-runs.jsonl
[ -f "$kept" ] || cat docs/bench/frontier-runs.jsonl docs/bench/diagnosis/eight-seeds-runs.jsonl \
  docs/bench/diagnosis/grown-strengths-runs.jsonl > "$kept"
[ -d "$dir/frontier-reference" ] || cp -r docs/bench/frontier-reference "$dir/"
for method in spo-ema-failed grpo-tis cispo; do
  .venv/bin/softrl bench frontier --regimes lag64 --methods "$method" --extend-strength 1 --seeds 8 --tune-seeds 3 \
    --jobs 2 --runs runs/frontier --kept "$kept" --report "$dir/report-lag64-$method"
done
