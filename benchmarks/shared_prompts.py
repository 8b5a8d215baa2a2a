"""Learner step time with the group's prompt shared (`logprobs.SharedPrompts`) against the plain
padded batch, on one batch, alternating A B for N pairs in one process.

    .venv/bin/python benchmarks/shared_prompts.py --model bootstrap --prompts 16 --new-tokens 24 --pairs 8
    .venv/bin/python benchmarks/shared_prompts.py --model smollm2-135m --prompts 4 --new-tokens 32 --pairs 3

The batch is the reference's samples of countdown prompts, 4 per prompt, every one `--new-tokens`
long (EOS never drawn), GRPO's loss. Prints the median step times and the ratio pair by pair.
Nothing is asserted.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from dataclasses import replace

from softrl.assemble import model_directory
from softrl_bench.systems import batch_rows, learner_setup


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="bootstrap", help="bootstrap, smollm2-135m or a model directory")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--n", type=int, default=4, help="samples per prompt")
    parser.add_argument("--new-tokens", type=int, default=24)
    parser.add_argument("--pairs", type=int, default=8)
    args = parser.parse_args()
    model = model_directory(args.model, "countdown")
    rows = batch_rows(model, "countdown", args.prompts, args.n, args.new_tokens)
    run, batch = learner_setup("grpo", model, rows, args.n, tempfile.mkdtemp())
    shared = batch.padded.shared
    print(f"{len(rows)} rows, padded {tuple(batch.padded.input_ids.shape)}; shared: "
          + ("no" if shared is None else f"{shared.prompt_ids.numel() + shared.response_ids.numel()} tokens a pass"))
    # the same rows without the shared layout (one micro-batch: the learner steps on the batch as it is)
    batches = {"plain": replace(batch, padded=replace(batch.padded, shared=None)), "shared": batch}
    times: dict[str, list[float]] = {"plain": [], "shared": []}
    for pair in range(args.pairs + 1):  # the first pair warms up (AdamW's state)
        for name in times:
            start = time.perf_counter()
            run.learner.step(batches[name])
            if pair:
                times[name].append(time.perf_counter() - start)
    ratios = [s / p for p, s in zip(times["plain"], times["shared"])]
    print(f"median step: plain {statistics.median(times['plain']):.3f} s, shared {statistics.median(times['shared']):.3f} s")
    print("shared / plain, pair by pair: " + " ".join(f"{r:.2f}" for r in ratios)
          + f" (median {statistics.median(ratios):.2f})")


if __name__ == "__main__":
    main()
