#!/bin/bash
# Issue 51 with each strength knob grown one rung past the edge its best point lies on (`--extend-strength 1`,
# docs/BENCHMARKS.md "Strength grids grown past their edge"), for the methods that decide the target in
# each of its four regimes, where it could change the verdict: in the two regimes the target is not met,
# softrl's own whose pick lies on a knob's edge and reported within 0.03 of softrl's best pick there on
# seeds 0-3 (lag 64: spo-ema-failed, tau 0.8; half online: spo-moving-is and spo-moving, K 10; the best
# picks themselves lie inside their grids); in all four, every baseline whose pick reported within 0.02 of
# the best baseline's on seeds 0-3 and whose knob is a ladder (TOPR has no knob, GSPO's two clips are no
# ladder). Tuned on seeds 100-102 (lag 1: 100-101), reported on seeds 0-7 (lag 1: 0-3) as "Eight report
# seeds". One method an invocation: alone in a regime a method's matched point is its pick, so only
# the pick runs. The kept outcomes (and the reference beside them) start as a copy of the frontier's, the
# eight seeds' and this study's, so no run trains again. Usage: bash benchmarks/frontier_grown_strengths.sh DIR
set -eu
dir=${1:?usage: frontier_grown_strengths.sh DIR}
mkdir -p "$dir"
kept=$dir/frontier-runs.jsonl
[ -f "$kept" ] || cat docs/bench/frontier-runs.jsonl docs/bench/diagnosis/eight-seeds-runs.jsonl \
  docs/bench/diagnosis/grown-strengths-runs.jsonl > "$kept"
[ -d "$dir/frontier-reference" ] || cp -r docs/bench/frontier-reference "$dir/"
for pair in lag64:spo-ema-failed lag64:grpo-tis lag64:cispo lag256:grpo-tis half:spo-moving-is half:spo-moving \
            half:cispo half:decoupled-ppo half:m2po half:grpo-tis lag1:decoupled-ppo lag1:cispo; do
  regime=${pair%%:*} method=${pair##*:}
  if [ "$regime" = lag1 ]; then tune=2 seeds=4; else tune=3 seeds=8; fi
  .venv/bin/softrl bench frontier --regimes "$regime" --methods "$method" --extend-strength 1 --seeds $seeds \
    --tune-seeds $tune --jobs 2 --runs runs/frontier --kept "$kept" --report "$dir/report-$regime-$method"
done
