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

import softrl.models.logprobs as logprobs
from softrl.assemble import Run, model_directory
from softrl.bench.systems import batch_rows
from softrl.config import config_from
from softrl.runtime.feed import DataFeed

NEVER = 2.0  # a SHARING_SAVES no layout reaches: prompts never shared


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
    config = config_from({"data.objective.algorithm": "grpo", "data.mix": {"online": 1.0}, "model.path": model,
                          "data.store": tempfile.mkdtemp(), "sampling.samples_per_prompt": args.n,
                          "optim.warmup_steps": 0})
    run = Run(config)
    feed = DataFeed(config, run.store, run.train_task, {r["prompt_id"]: 0.5 for r in rows}, run.tokenizer)
    batch = feed.batch(rows)
    shared = batch.padded.shared
    print(f"{len(rows)} rows, padded {tuple(batch.padded.input_ids.shape)}; shared: "
          + ("no" if shared is None else f"{shared.prompt_ids.numel() + shared.response_ids.numel()} tokens a pass"))
    default = logprobs.SHARING_SAVES
    times: dict[str, list[float]] = {"plain": [], "shared": []}
    for pair in range(args.pairs + 1):  # the first pair warms up (AdamW's state)
        for name in times:
            # the learner lays out each micro-batch again, reading SHARING_SAVES then
            logprobs.SHARING_SAVES = NEVER if name == "plain" else default
            start = time.perf_counter()
            run.learner.step(batch)
            if pair:
                times[name].append(time.perf_counter() - start)
    logprobs.SHARING_SAVES = default
    ratios = [s / p for p, s in zip(times["plain"], times["shared"])]
    print(f"median step: plain {statistics.median(times['plain']):.3f} s, shared {statistics.median(times['shared']):.3f} s")
    print("shared / plain, pair by pair: " + " ".join(f"{r:.2f}" for r in ratios)
          + f" (median {statistics.median(ratios):.2f})")


if __name__ == "__main__":
    main()
