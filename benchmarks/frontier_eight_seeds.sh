#!/bin/bash
# Report seeds 4-7 at the picks that decide issue 51's targets in the three stale regimes (docs/BENCHMARKS.md,
# "Eight report seeds at the deciding picks"): softrl's best there (spo-ema-is), spo-ema-failed at lag 64, and
# every baseline whose pick reported within 0.02 of the best baseline's on seeds 0-3.
# One method an invocation: alone in a regime a method's matched point is its pick, so only the pick runs.
# The kept outcomes (and the reference beside them) are a copy of the frontier's, so no tuning run trains again.
# Usage: bash benchmarks/frontier_eight_seeds.sh DIR   (then DIR/frontier-runs.jsonl holds seeds 4-7 too)
set -eu
dir=${1:?usage: frontier_eight_seeds.sh DIR}
mkdir -p "$dir"
kept=$dir/frontier-runs.jsonl
[ -f "$kept" ] || cat docs/bench/frontier-runs.jsonl docs/bench/diagnosis/eight-seeds-runs.jsonl > "$kept"
[ -d "$dir/frontier-reference" ] || cp -r docs/bench/frontier-reference "$dir/"
for pair in lag64:topr lag64:gspo lag64:cispo lag64:grpo-tis lag64:spo-ema-is lag64:spo-ema-failed \
            lag256:grpo-tis lag256:spo-ema-is half:cispo half:decoupled-ppo half:m2po half:grpo-tis half:spo-ema-is; do
  regime=${pair%%:*} method=${pair##*:}
  .venv/bin/softrl bench frontier --regimes "$regime" --methods "$method" --seeds 8 --tune-seeds 3 --jobs 2 \
    --runs runs/frontier --kept "$kept" --report "$dir/report-$regime-$method"
done
