"""Experience-store and Q0 throughput on this machine, and Q0's agreement with an independent evaluation.

    .venv/bin/python benchmarks/store_and_q0.py [--rows 100000] [--part 1000] [--prompts 20] [--k 200]

1. Store: `--rows` trajectories (countdown-sized) appended in parts of `--part` rows, then read back
   whole, filtered (one source, passed only) and as a training pool.
2. Q0 on the countdown bootstrap model (`softrl bootstrap countdown`, built if absent): samples per
   second of `estimate_q0` (generation + grading + store writes), and the per-prompt success rates
   against an independent evaluation (fresh samples, another seed): mean |difference|, the share of
   prompts within 2 binomial standard errors, and the correlation.
Prints Markdown; nothing is asserted.
"""

from __future__ import annotations

import argparse
import math
import random
import tempfile
import time
from pathlib import Path

import torch

from softrl.annotate.q0 import binomial_stderr, estimate_q0
from softrl.rollout import RolloutSpec
from softrl.data import ExperienceStore, Trajectory, TrajectoryPool
from softrl.bootstrap import bootstrap
from softrl.models.generation import HFGenerator, SamplingParams
from softrl.models.loading import encode_prompt, load_causal_lm, tokenizer_fingerprint
from softrl.algorithms.common import SPO_BETA
from softrl.tasks.registry import load_task


def fake_rows(n: int, start: int, rng: random.Random) -> list[Trajectory]:
    return [Trajectory(f"countdown-0-{i % 500}", "(3+4)*5", float(i % 4 == 0), i % 4 == 0, task="countdown",
                       prompt_text="3 4 5 2 -> 35\n", prompt_tokens=[rng.randrange(100) for _ in range(16)],
                       response_tokens=[rng.randrange(100) for _ in range(12)] + [i], tokenizer="bench",
                       source=("online", "reference", "human")[i % 3], policy_version=i // 1000,
                       behavior_logprobs=[-1.0] * 13, decoding={"temperature": 1.0, "top_p": 1.0})
            for i in range(start, start + n)]


def store_benchmark(rows: int, part: int, root: Path) -> None:
    rng, store = random.Random(0), ExperienceStore(root)
    batches = [fake_rows(part, s, rng) for s in range(0, rows, part)]
    start = time.perf_counter()
    for batch in batches:
        store.append(batch)
    write_s = time.perf_counter() - start
    timings = {}
    for name, read in [("read all", lambda: store.trajectories()),
                       ("read source=online, passed", lambda: store.trajectories(source="online", passed=True)),
                       ("read 3 columns", lambda: store.trajectories(columns=["prompt_id", "reward", "passed"])),
                       ("build a TrajectoryPool", lambda: TrajectoryPool(store.trajectories()))]:
        start = time.perf_counter()
        result = read()
        timings[name] = (time.perf_counter() - start, len(result) if isinstance(result, TrajectoryPool) else result.num_rows)
    size = sum(f.stat().st_size for f in (root / "trajectories").iterdir()) / 2**20
    print(f"## Store: {rows} trajectories in parts of {part} ({size:.1f} MiB on disk)\n")
    print("| operation | rows | seconds | rows/s |\n|---|---|---|---|")
    print(f"| append | {rows} | {write_s:.2f} | {rows / write_s:,.0f} |")
    for name, (seconds, n) in timings.items():
        print(f"| {name} | {n} | {seconds:.2f} | {n / seconds:,.0f} |")


def q0_benchmark(prompts: int, k: int, root: Path) -> None:
    directory = bootstrap("countdown")
    model, tokenizer = load_causal_lm(directory)
    task = load_task("countdown", size=prompts, seed=12345)
    generator = HFGenerator(model, tokenizer)
    spec = RolloutSpec(task, generator, lambda ids: tokenizer.decode(ids, skip_special_tokens=True),
                       tokenizer_fingerprint(tokenizer), task.max_new_tokens)
    encode = lambda text: encode_prompt(tokenizer, text)  # noqa: E731
    start = time.perf_counter()
    rows = estimate_q0(spec, task.prompts(), encode, ExperienceStore(root), k, SPO_BETA, str(directory), seed=1)
    seconds = time.perf_counter() - start
    fresh = generator.generate([encode(p.text) for p in task.prompts()],
                               SamplingParams(n=k, max_new_tokens=task.max_new_tokens, seed=777))
    grades = task.grade_many([(task.prompts()[s.prompt_index], s.text) for s in fresh])
    independent = [0.0] * prompts
    for s, g in zip(fresh, grades):
        independent[s.prompt_index] += g.passed / k
    q0 = [rows[p.id]["q0_success"] for p in task.prompts()]
    diffs = [abs(a - b) for a, b in zip(q0, independent)]
    within = sum(d <= 2 * math.sqrt(2) * binomial_stderr((a + b) / 2, k) for d, a, b in zip(diffs, q0, independent))
    corr = torch.corrcoef(torch.tensor([q0, independent]))[0, 1].item()
    print(f"\n## Q0 on the countdown bootstrap model ({prompts} held-out prompts x K={k}, {torch.get_num_threads()} threads)\n")
    print(f"- estimate_q0: {prompts * k} samples in {seconds:.1f} s = **{prompts * k / seconds:.0f} samples/s** "
          "(generation, grading, store writes)")
    print(f"- mean success {sum(q0) / prompts:.3f} (q0) vs {sum(independent) / prompts:.3f} (independent, another seed)")
    print(f"- per prompt: mean |difference| {sum(diffs) / prompts:.3f}; {within}/{prompts} within 2 standard errors "
          f"of the difference; correlation {corr:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--part", type=int, default=1000)
    parser.add_argument("--prompts", type=int, default=20)
    parser.add_argument("--k", type=int, default=200)
    parser.add_argument("--skip-q0", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        store_benchmark(args.rows, args.part, Path(tmp) / "store")
        if not args.skip_q0:
            q0_benchmark(args.prompts, args.k, Path(tmp) / "q0")


if __name__ == "__main__":
    main()
