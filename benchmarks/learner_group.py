"""A learner group of 2 processes (FSDP2 shards, gloo) against one process: the SPO step's time and
what each process holds, each side in fresh processes, alternating A B.

    .venv/bin/python benchmarks/learner_group.py --model smollm2-135m --pairs 2

The batch is the reference's samples of 4 countdown prompts, 4 per prompt, 32 new tokens (EOS never
drawn); `--steps` steps a side, the first two (optimizer state, warm-up) left out of the median; the
group's step is its slowest rank's. Per rank: the trained state it holds after a step (its weights and
AdamW's two moments, local shards in a group; gradients are freed at each step's end), the resident memory after the steps and its peak, both above
the process before any model was loaded. On this machine's cores the two ranks share the same cores
(each gets half the threads): a group cannot be faster here; the point is what each rank holds.
Nothing is asserted.
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
import json, os, sys, time
import torch, torch.distributed as dist, torch.multiprocessing as mp

def held_mib(learner):
    local = lambda t: t.to_local() if hasattr(t, "to_local") else t
    tensors = [local(p) for p in learner.params] + [local(p.grad) for p in learner.params if p.grad is not None]
    tensors += [local(v) for s in learner.optimizer.state.values() for v in s.values() if torch.is_tensor(v) and v.dim()]
    return sum(t.numel() * t.element_size() for t in tensors) / 2**20

def rank_main(rank, world, init, rows_file, model, steps, out):
    from softrl.assemble import RunParts
    from softrl_bench.systems import peak_rss_mib, reset_peak_rss, rss_mib
    from softrl.config import config_from
    from softrl.models.loading import encode_prompt, encode_response, tokenizer_fingerprint
    from softrl.training.batch import make_batch

    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    if world > 1:
        dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    base = rss_mib()
    reset_peak_rss()
    rows = json.loads(open(rows_file).read())
    config = config_from({"data.objective.algorithm": "spo", "data.mix": {"online": 1.0}, "model.path": model,
                          "data.store": rows_file + ".store", "sampling.samples_per_prompt": 4, "optim.warmup_steps": 0,
                          "model.device": "cpu", "runtime.learners": world})
    run = RunParts(config, rank=rank)
    tok = run.tokenizer
    batch = make_batch(rows, tokenizer_fingerprint(tok), tok.pad_token_id, lambda t: encode_prompt(tok, t),
                       lambda t: encode_response(tok, t), {r["prompt_id"]: 0.5 for r in rows})
    times = []
    for _ in range(steps):
        if world > 1:
            dist.barrier()
        start = time.perf_counter()
        run.learner.step(batch)
        times.append(time.perf_counter() - start)
    result = {"rank": rank, "times": times, "held_mib": held_mib(run.learner), "rss_mib": rss_mib() - base,
              "peak_mib": peak_rss_mib() - base}
    with open(f"{out}.{rank}", "w") as f:
        json.dump(result, f)
    if world > 1:
        dist.destroy_process_group()

if __name__ == "__main__":
    from softrl.runtime.group import rendezvous
    rows_file, model, world, steps = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    out = rows_file + f".side{world}"
    mp.start_processes(rank_main, args=(world, rendezvous(), rows_file, model, steps, out), nprocs=world,
                       start_method="spawn")
    print(json.dumps([json.load(open(f"{out}.{r}")) for r in range(world)]))
"""


def main() -> None:
    from softrl.assemble import model_directory
    from softrl_bench.systems import batch_rows

    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2-135m", help="bootstrap, smollm2-135m or a model directory")
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    model = model_directory(args.model, "countdown")
    folder = Path(tempfile.mkdtemp())
    rows_file = folder / "rows.json"
    rows_file.write_text(json.dumps(batch_rows(model, "countdown", 4, 4, 32), default=str))
    script = folder / "side.py"
    script.write_text(SIDE)
    ratios = []
    for pair in range(args.pairs):
        step = {}
        for world in (1, 2):
            out = subprocess.run([sys.executable, str(script), str(rows_file), model, str(world), str(args.steps)],
                                 capture_output=True, text=True, check=True)
            ranks = json.loads(out.stdout.strip().splitlines()[-1])
            step[world] = statistics.median(max(r["times"][i] for r in ranks) for i in range(2, args.steps))
            each = "; ".join(f"rank {r['rank']}: holds {r['held_mib']:.0f} MiB, resident {r['rss_mib']:.0f} MiB "
                             f"(peak {r['peak_mib']:.0f})" for r in ranks)
            print(f"pair {pair + 1} learners {world}: median step {step[world]:.2f} s; {each}", flush=True)
        ratios.append(step[2] / step[1])
    print("2 learners / 1 learner step time, pair by pair: " + ", ".join(f"{r:.2f}x" for r in ratios))


if __name__ == "__main__":
    main()
