"""Whether a bootstrap build is bit-identical: short builds of one recipe, with a thread count each, and the
digest of their weights (docs/MODELS.md, "tinycode-loops").

    .venv/bin/python benchmarks/bootstrap_determinism.py [--task tinycode-loops] [--steps 40] [--threads 2,2,1]

Each build runs in a fresh process (`--force`: the cache's folder of this short recipe is rebuilt).
Prints one line per build: threads and digest. Nothing is asserted.
"""

import argparse
import subprocess
import sys

BUILD = """
import sys, torch
from softrl_bench.learning import weights_digest
from softrl.bootstrap import bootstrap
torch.set_num_threads(int(sys.argv[1]))
print(weights_digest(bootstrap(sys.argv[2], steps=int(sys.argv[3]), eval_problems=4, eval_samples=2, force=True)))
"""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--task", default="tinycode-loops")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--threads", default="2,2,1")
    args = parser.parse_args()
    for threads in args.threads.split(","):
        out = subprocess.run([sys.executable, "-c", BUILD, threads, args.task, str(args.steps)], capture_output=True,
                             text=True, check=True)
        print(f"threads {threads}: weights {out.stdout.split()[-1]}")


if __name__ == "__main__":
    main()
