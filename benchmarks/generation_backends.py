"""Generation throughput of the "hf" and "static" backends, measured in alternation on this machine.

    .venv/bin/python benchmarks/generation_backends.py                     # the standard set below
    .venv/bin/python benchmarks/generation_backends.py --model DIR --prompts 16 --n 4 --new-tokens 32 [--chat]
        [--pairs 3] [--calls 1] [--dtype bfloat16] [--compile auto|on|off] [--device cuda]

Standard set: the countdown bootstrap model (`softrl bootstrap countdown`), 16 countdown prompts x 4
samples x 24 new tokens; SmolLM2-135M-Instruct (`softrl model prepare smollm2-135m`, chat template),
4 prompts x 4 samples and 16 prompts x 4 samples, 32 new tokens. Each pair runs hf then static with
the same seed (so both draw the same samples and the same number of tokens); pairs alternate A B A B
after one untimed warm-up call each (countdown: 10 calls a measurement, a call is ~0.1 s). Tokens are
the generated ones (through EOS or the length limit), so an early EOS counts as fewer tokens. Prints a Markdown table: medians and the per-pair ratios
static/hf of tokens/s. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from softrl.models.device import resolve_device
from softrl.models.generation import SamplingParams, make_generator
from softrl.models.loading import encode_prompt, load_causal_lm
from softrl.tasks.registry import load_task

QUESTIONS = ["What is {a} + {b}?", "Compute {a} * {b}. Answer with the number only.",
             "Is {a} a prime number? Explain briefly.", "Write {a} - {b} as a sentence."]


def smollm2_prompts(count: int) -> list[str]:
    return [QUESTIONS[i % len(QUESTIONS)].format(a=17 + 7 * i, b=5 + 3 * i) for i in range(count)]


def run_pairs(label: str, directory, texts: list[str], n: int, new_tokens: int, pairs: int, dtype: str,
              compile: str, calls: int = 1, device: str = "auto") -> None:
    """`pairs` x (hf, static); each measurement is `calls` generate calls (seeds shared by the pair)."""
    model, tok = load_causal_lm(directory, dtype=dtype)
    model = model.to(resolve_device(device))
    prompts = [encode_prompt(tok, t) for t in texts]
    gens = {"hf": make_generator(model, tok, "hf"), "static": make_generator(model, tok, "static")}
    if compile != "auto":
        from softrl.models.generation import StaticCacheGenerator

        gens["static"] = StaticCacheGenerator(model, tok, compile=compile == "on")
    results = {name: [] for name in gens}  # name -> [(tokens, seconds)]
    for name, gen in gens.items():  # warm-up: allocations, compilation
        gen.generate(prompts, SamplingParams(n=n, max_new_tokens=new_tokens, seed=10_000))
    for pair in range(pairs):
        for name, gen in gens.items():
            start, tokens = time.perf_counter(), 0
            for call in range(calls):
                params = SamplingParams(n=n, max_new_tokens=new_tokens, seed=pair * calls + call)
                tokens += sum(len(s.tokens) for s in gen.generate(prompts, params))
            results[name].append((tokens, time.perf_counter() - start))
    rate = {name: [t / s for t, s in rows] for name, rows in results.items()}
    ratios = [s / h for h, s in zip(rate["hf"], rate["static"])]
    shape = f"{len(prompts)} prompts x {n} x {new_tokens} ({dtype}){f', {calls} calls' if calls > 1 else ''}"
    for name in gens:
        tokens = statistics.median(t for t, _ in results[name])
        print(f"| {label} | {shape} | {name} | {tokens:.0f} | {statistics.median(s for _, s in results[name]):.3f} "
              f"| {statistics.median(rate[name]):.0f} | {' '.join(f'{r:.0f}' for r in rate[name])} | "
              f"{'' if name == 'hf' else ' '.join(f'{r:.2f}' for r in ratios)} |")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", help="a model directory; default: the standard set")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--chat", action="store_true", help="arithmetic questions (else countdown prompts)")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--calls", type=int, default=1, help="generate calls per measurement (--model only)")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    parser.add_argument("--compile", choices=["auto", "on", "off"], default="auto",
                        help="the static backend's compile setting (auto: on CUDA only)")
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.pairs} pairs hf/static alternating\n")
    print("| model | shape | backend | tokens | median s | median tokens/s | tokens/s per pair | static/hf per pair |")
    print("|---|---|---|---|---|---|---|---|")
    countdown = lambda k: [p.text for p in load_task("countdown", size=k, seed=12345).prompts()]  # noqa: E731
    if args.model:
        texts = smollm2_prompts(args.prompts) if args.chat else countdown(args.prompts)
        run_pairs(args.model, args.model, texts, args.n, args.new_tokens, args.pairs, args.dtype, args.compile,
                  args.calls, args.device)
        return
    from softrl.bootstrap import bootstrap
    from softrl.models.prepare import prepare_model

    run_pairs("countdown bootstrap", bootstrap("countdown"), countdown(16), 4, 24, args.pairs, args.dtype,
              args.compile, calls=10, device=args.device)  # about 0.1 s a call: ten calls a measurement
    smollm2 = prepare_model("smollm2-135m")
    for prompts in (4, 16):
        run_pairs("SmolLM2-135M", smollm2, smollm2_prompts(prompts), 4, 32, args.pairs, args.dtype, args.compile,
                  device=args.device)


if __name__ == "__main__":
    main()
