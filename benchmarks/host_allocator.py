"""The learner step under glibc's own allocator policy against softrl's CPU policy
(`Placement.host_allocator`: fast by default, lean under activation checkpointing): step time,
page faults per step and peak resident memory, each side in a fresh process, alternating A B.

    .venv/bin/python benchmarks/host_allocator.py --model smollm2-135m --pairs 2
    .venv/bin/python benchmarks/host_allocator.py --model smollm2-135m --pairs 2 --checkpointing

The batch is the reference's samples of 4 countdown prompts, 4 per prompt, 32 new tokens (EOS never
drawn), SPO's loss; `--steps` steps a process, the first two (optimizer state, warm-up) left out of
the median. Prints each side's numbers and the time ratio pair by pair. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

SIDE = """
import json, resource, sys, time
from softrl_bench.systems import learner_setup, peak_rss_mib, reset_peak_rss, rss_mib
from softrl.models.device import Placement
rows_file, model, policy, checkpointing, steps = sys.argv[1:6]
if policy == "glibc":
    Placement.host_allocator = lambda self, lean=False: False
base = rss_mib()
reset_peak_rss()
run, batch = learner_setup("spo", model, json.loads(open(rows_file).read()), 4, rows_file + ".store", "cpu",
                           checkpointing == "1")
times, faults = [], []
for _ in range(int(steps)):
    f, t = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.perf_counter()
    run.learner.step(batch)
    times.append(time.perf_counter() - t)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f)
print(json.dumps({"times": times, "faults": faults, "peak_mib": peak_rss_mib() - base}))
"""


def main() -> None:
    from softrl.assemble import model_directory
    from softrl_bench.systems import batch_rows

    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2-135m", help="bootstrap, smollm2-135m or a model directory")
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--checkpointing", action="store_true")
    args = parser.parse_args()
    model = model_directory(args.model, "countdown")
    rows_file = Path(tempfile.mkdtemp()) / "rows.json"
    rows_file.write_text(json.dumps(batch_rows(model, "countdown", 4, 4, 32), default=str))
    ratios = []
    for pair in range(args.pairs):
        medians = {}
        for policy in ("glibc", "softrl"):
            out = subprocess.run([sys.executable, "-c", SIDE, str(rows_file), model, policy,
                                  str(int(args.checkpointing)), str(args.steps)], capture_output=True, text=True, check=True)
            r = json.loads(out.stdout.strip().splitlines()[-1])
            medians[policy] = statistics.median(r["times"][2:])
            print(f"pair {pair + 1} {policy:6s}: median step {medians[policy]:.3f} s, page faults a step "
                  f"{int(statistics.median(r['faults'][2:]))}, peak {r['peak_mib']:.0f} MiB", flush=True)
        ratios.append(medians["softrl"] / medians["glibc"])
    print("softrl / glibc step time, pair by pair: " + ", ".join(f"{r:.2f}x" for r in ratios))


if __name__ == "__main__":
    main()
