"""Q0 throughput on this machine, and Q0's agreement with an independent evaluation.

    .venv/bin/python benchmarks/q0_agreement.py [--prompts 20] [--k 200]

Q0 on the countdown bootstrap model (`softrl bootstrap countdown`, built if absent): samples per
second of `estimate_q0` (generation + grading + store writes), and the per-prompt success rates
against an independent evaluation (fresh samples, another seed): mean |difference|, the share of
prompts within 2 binomial standard errors, and the correlation. Prints Markdown; nothing is
asserted. The store itself is measured by `softrl bench store`.
"""

from __future__ import annotations

import argparse
import math
import tempfile
import time
from pathlib import Path

import torch

from softrl.annotate.q0 import binomial_stderr, estimate_q0
from softrl.rollout import RolloutSpec
from softrl.data import ExperienceStore
from softrl.bootstrap import bootstrap
from softrl.models.generation import HFGenerator, SamplingParams
from softrl.models.loading import encode_prompt, load_causal_lm, tokenizer_fingerprint
from softrl.algorithms.common import SPO_BETA
from softrl.tasks.registry import load_task


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
    parser.add_argument("--prompts", type=int, default=20)
    parser.add_argument("--k", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        q0_benchmark(args.prompts, args.k, Path(tmp) / "q0")


if __name__ == "__main__":
    main()
