"""Generation throughput on this machine.

    .venv/bin/python benchmarks/generation_throughput.py --model DIR [--samples 200] [--new-tokens 24]
    .venv/bin/python benchmarks/generation_throughput.py --model DIR --dtypes float32,bfloat16 --tokens-only

1. Many samples of one prompt: one batched call (the prompt's forward pass shared) against the same
   number of single-sample calls. 2. Tokens per second for each dtype (batch of 8 prompts).
Prints Markdown tables; nothing is asserted.
"""

from __future__ import annotations

import argparse
import time

import torch

from softrl.models.generation import HFGenerator, SamplingParams
from softrl.models.loading import apply_chat_template, load_causal_lm

PROMPT = "7 3 9 2 -> 25\n"


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--new-tokens", type=int, default=24)
    parser.add_argument("--dtypes", default="float32")
    parser.add_argument("--prompt", default=PROMPT)
    parser.add_argument("--chat", action="store_true", help="apply the tokenizer's chat template")
    parser.add_argument("--tokens-only", action="store_true")
    args = parser.parse_args()
    for dtype in args.dtypes.split(","):
        model, tok = load_causal_lm(args.model, dtype=dtype)
        gen = HFGenerator(model, tok)
        text = apply_chat_template(tok, args.prompt) if args.chat else args.prompt
        prompt = tok(text, add_special_tokens=False)["input_ids"]
        fixed = dict(max_new_tokens=args.new_tokens, temperature=1.0)
        gen.generate([prompt], SamplingParams(n=2, **fixed, seed=0))  # warm-up
        if not args.tokens_only:
            batched = timed(lambda: gen.generate([prompt], SamplingParams(n=args.samples, **fixed, seed=1)))
            single = timed(lambda: [gen.generate([prompt], SamplingParams(n=1, **fixed, seed=i))
                                    for i in range(args.samples)])
            print(f"| {dtype} | {args.samples} samples, one prompt | batched {batched:.2f} s | "
                  f"{args.samples} single calls {single:.2f} s | speed-up {single / batched:.1f}x |")
        prompts = [prompt] * 8
        tokens = []
        seconds = timed(lambda: tokens.extend(len(s.tokens) for s in gen.generate(
            prompts, SamplingParams(n=1, max_new_tokens=args.new_tokens, temperature=1.0, seed=2))))
        print(f"| {dtype} | 8 prompts x {args.new_tokens} new tokens | {sum(tokens)} tokens in {seconds:.2f} s | "
              f"{sum(tokens) / seconds:.1f} tokens/s | threads {torch.get_num_threads()} |")


if __name__ == "__main__":
    main()
