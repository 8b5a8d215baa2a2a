#!/usr/bin/env bash
# The GPU measurements of docs/BENCHMARKS.md "On a GPU", as named steps (benchmarks/gpu/README.md says
# which call runs which):
#   source benchmarks/gpu/setup.sh && bash benchmarks/gpu/measure.sh tests models learner
# Each step runs under its own time limit, so a call ends inside the device's 10 minutes whatever hangs,
# and writes into $RESULTS (kept on the machine while it is warm). After every step the whole of
# $RESULTS is packed again into $OUT/results.tgz (the device returns at most 8 files), so a call
# that is cut off still brings back every step that finished.
#
# The sizes below are the GPU's; the CPU rehearsal (README.md) runs every step through with small ones:
#   DEVICE=cpu BIG=bootstrap MID=bootstrap SMALL=bootstrap NEW_TOKENS=8 PROMPTS=2 STEPS=2 BATCHES=4,8 \
#   TIMED=1 PAIRS=1 DEMO_STEPS=2 LEARNING_STEPS=2 EVAL_SIZE=2 bash benchmarks/gpu/measure.sh env tests ...
set -uo pipefail
RESULTS=${RESULTS:-/tmp/softrl-gpu}
OUT=${OUT:-$RESULTS/out}
DEVICE=${DEVICE:-cuda}
BIG=${BIG:-llama-1b-random}            # the learner and the largest end to end
MID=${MID:-llama-0.5b-random}
SMALL=${SMALL:-smollm2-135m}           # real weights; TRL's generation settings compared on it
NEW_TOKENS=${NEW_TOKENS:-128}          # every sample this long: EOS never drawn (fixed work)
PROMPTS=${PROMPTS:-16}                 # prompts per step, 4 samples each
STEPS=${STEPS:-8}                      # learner steps of each end-to-end run
TIMED=${TIMED:-5}                      # timed learner steps per method (after one warm-up)
# the learner's micro-batches (the timed steps, and softrl's side of e2e-big): the whole 64 x 170-token
# batch in one pass needed over 68 GiB at 1B on an H100 and ran out of memory (2026-11-27); weights and
# AdamW state, not activations, are what SPO and PPO's peaks compare
MICRO_TOKENS=${MICRO_TOKENS:-2048}
BATCHES=${BATCHES:-16,64,256}          # generation batch sizes (samples)
PAIRS=${PAIRS:-3}                      # end-to-end rounds, softrl and TRL alternately
# TRL's generation settings compared on $SMALL (static: no faster than dynamic on the CPU, and TRL turns
# compilation off, so it is left to a later session), and the fastest of them ("dynamic" or "trl-dynamic")
# for $MID and $BIG
TRL_SETTINGS=${TRL_SETTINGS:-dynamic,paged}
TRL_FASTEST=${TRL_FASTEST:-dynamic}
TRL_FASTEST=${TRL_FASTEST#trl-}
SOFTRL_MODES=${SOFTRL_MODES:-sync,async}
LEARNING_STEPS=${LEARNING_STEPS:-32}   # the SmolLM2 arithmetic benchmark's (docs/BENCHMARKS.md) steps
EVAL_SIZE=${EVAL_SIZE:-30}             # ... and held-out prompts
DEMO_STEPS=${DEMO_STEPS:-300}          # the demo's own
# the whole call's: each step's limit is cut to what is left of it, a step with under 30 s left is not
# started, so a call that lists more steps than fit still ends inside the device's 600 s
BUDGET=${BUDGET:-540}
CALL_STARTED=$(date +%s)
mkdir -p "$RESULTS" "$OUT"
SOFTRL=(python3 -m softrl)
GEN=(python3 benchmarks/generation_backends.py --device "$DEVICE" --dtype bfloat16 --fixed --bound --pairs 2
     --batches "$BATCHES" --new-tokens "$NEW_TOKENS")
SYSTEMS=(python3 -m softrl bench systems --device "$DEVICE" --prompts "$PROMPTS" --samples-per-prompt 4
         --max-new-tokens "$NEW_TOKENS")
LEARNER=(--parts learner --timed-steps "$TIMED" --micro-batch-tokens "$MICRO_TOKENS")
E2E=(--parts e2e,trl --pairs "$PAIRS" --e2e-steps "$STEPS")

run_step() {  # name, seconds, command...; its status is the command's (124: stopped at its limit)
  local name=$1 limit=$2 start rc left
  shift 2
  start=$(date +%s)
  left=$(( BUDGET - (start - CALL_STARTED) ))
  if (( left < 30 )); then
    echo "== $name: not started, ${left}s of this call's budget left: run it in the next call" | tee -a "$RESULTS/steps.log"
    return 3
  fi
  (( limit > left )) && limit=$left
  echo "== $name: start $(date -u +%T), limit ${limit}s" | tee -a "$RESULTS/steps.log"
  timeout --signal=INT --kill-after=15 "$limit" "$@" > "$RESULTS/$name.log" 2>&1
  rc=$?
  echo "== $name: rc $rc, $(( $(date +%s) - start )) s" | tee -a "$RESULTS/steps.log"
  tail -n 4 "$RESULTS/$name.log"
  # the runs' logs, plots and summaries come back; their weights, optimizer state and stores stay. Packed
  # beside and then moved, so a call killed while packing still leaves the last whole archive
  tar czf "$OUT/.results.tgz" -C "$RESULTS" --exclude=./out --exclude='*.safetensors' --exclude='*.pt' \
    --exclude='*.parquet' --exclude='*.arrow' . && mv "$OUT/.results.tgz" "$OUT/results.tgz"
  return $rc
}

needs_random() {  # the random models, built first where this machine has none yet (a fresh machine)
  local m
  for m in "$BIG" "$MID"; do
    if [[ $m == *-random && ! -f ${SOFTRL_CACHE:-$HOME/.cache/softrl}/models/$m/softrl.json ]]; then
      step models
      return
    fi
  done
}

step() {
  case $1 in
    learner|learner-ckpt|profile|gen-big|e2e-mid|e2e-big|episodes) needs_random ;;
  esac
  case $1 in
    env) run_step env 45 python3 benchmarks/gpu/env.py ;;
    tests) run_step tests 300 make test-gpu PYTHON=python3 ;;
    models) run_step models 180 bash -c "for m in llama-0.5b-random llama-1b-random; do
        ${SOFTRL[*]} model prepare \$m --base .whl/base || exit 1; done" ;;
    smollm2) run_step smollm2 90 "${SOFTRL[@]}" model prepare smollm2-135m ;;
    learner) run_step learner 270 "${SYSTEMS[@]}" --model "$BIG" "${LEARNER[@]}" --runs "$RESULTS/runs/learner" \
        --report "$RESULTS/learner" ;;
    learner-ckpt) run_step learner-ckpt 270 "${SYSTEMS[@]}" --model "$BIG" "${LEARNER[@]}" --gradient-checkpointing \
        --runs "$RESULTS/runs/learner-ckpt" --report "$RESULTS/learner-checkpointing" ;;
    profile) SOFTRL_PROFILE="$RESULTS/profile" run_step profile 270 "${SYSTEMS[@]}" --model "$BIG" --parts learner \
        --timed-steps 2 --pairs 1 --micro-batch-tokens "$MICRO_TOKENS" --runs "$RESULTS/runs/profile" \
        --report "$RESULTS/learner-profile" ;;
    gen-big) run_step gen-big 270 "${GEN[@]}" --model "$BIG" --json "$RESULTS/generation-big.json" ;;
    gen-small) run_step gen-small 180 "${GEN[@]}" --model "$SMALL" --chat --json "$RESULTS/generation-small.json" ;;
    e2e-small|e2e-mid|e2e-big)
      local model=$SMALL settings=$TRL_SETTINGS modes=sync,async
      [ "$1" = e2e-mid ] && model=$MID
      [ "$1" = e2e-big ] && model=$BIG
      [ "$1" != e2e-small ] && settings=$TRL_FASTEST modes=$SOFTRL_MODES
      local micro=0
      [ "$1" = e2e-big ] && micro=$MICRO_TOKENS
      run_step "$1" 530 "${SYSTEMS[@]}" --model "$model" "${E2E[@]}" --trl-generation "$settings" --modes "$modes" \
        --micro-batch-tokens "$micro" \
        --runs "$RESULTS/runs/$1" --report "$RESULTS/$1" ;;
    episodes) run_step episodes 240 python3 benchmarks/episode_throughput.py \
        --model "${SOFTRL_CACHE:-$HOME/.cache/softrl}/models/$MID" --prompts "$PROMPTS" --k 4 \
        --turn-tokens "$NEW_TOKENS" --turns 3 --pairs 3 --device "$DEVICE" --dtype bfloat16 --json "$RESULTS/episodes.json" ;;
    demo) run_step demo 240 "${SOFTRL[@]}" demo --json --steps "$DEMO_STEPS" --device "$DEVICE" --out "$RESULTS/runs/demo" ;;
    learning) run_step learning 530 "${SOFTRL[@]}" bench learning --base benchmarks/smollm2-arithmetic.yaml \
        --task gym:basic_arithmetic --methods spo-half,grpo,ppo --seeds 1 --steps "$LEARNING_STEPS" --prompts 4 \
        --lr 2e-6 --eval-size "$EVAL_SIZE" --eval-every 8 --runs "$RESULTS/runs/bench-smollm2" --report "$RESULTS/learning" ;;
    *) echo "measure.sh: unknown step '$1' (env tests models smollm2 learner learner-ckpt gen-big gen-small" \
            "e2e-small e2e-mid e2e-big episodes demo learning profile)"; return 2 ;;
  esac
}

status=0
for name in "$@"; do step "$name" || status=$?; done
exit $status
