"""Generation throughput of the "hf" and "static" backends, measured in alternation on this machine.

    .venv/bin/python benchmarks/generation_backends.py                     # the standard set below
    .venv/bin/python benchmarks/generation_backends.py --model DIR --prompts 16 --n 4 --new-tokens 32 [--chat]
        [--pairs 3] [--calls 1] [--dtype bfloat16] [--compile auto|on|off] [--device cuda]
        [--batches 16,64,256] [--fixed] [--bound] [--json FILE] [--task NAME]

Standard set: the countdown bootstrap model (`softrl bootstrap countdown`), 16 countdown prompts x 4
samples x 24 new tokens; SmolLM2-135M-Instruct (`softrl model prepare smollm2-135m`, chat template),
4 prompts x 4 samples and 16 prompts x 4 samples, 32 new tokens. Each pair runs hf then static with
the same seed (so both draw the same samples and the same number of tokens); pairs alternate A B A B
after one untimed warm-up call each (countdown: 10 calls a measurement, a call is ~0.1 s). Tokens are
the generated ones (through EOS or the length limit), so an early EOS counts as fewer tokens; with
--fixed EOS is never drawn and every sample is --new-tokens long. --batches runs each batch size
(samples: batch / n prompts x n) on the one loaded model. --bound adds the memory-bandwidth bound of a
decode step that reads every weight once: batch x (measured device-to-device copy bandwidth) / (weight
bytes), tokens/s no backend can pass at that batch while decoding is bound by weight reads (the KV
cache's reads, growing with batch and length, left out: the true bound is lower). Prints a Markdown
table: medians and the per-pair ratios static/hf of tokens/s. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from softrl_bench.systems import memory_bandwidth
from softrl.models.device import resolve_device
from softrl.models.generation import SamplingParams, make_generator
from softrl.models.loading import encode_prompt, load_causal_lm
from softrl.tasks.registry import load_task

QUESTIONS = ["What is {a} + {b}?", "Compute {a} * {b}. Answer with the number only.",
             "Is {a} a prime number? Explain briefly.", "Write {a} - {b} as a sentence."]


def smollm2_prompts(count: int) -> list[str]:
    return [QUESTIONS[i % len(QUESTIONS)].format(a=17 + 7 * i, b=5 + 3 * i) for i in range(count)]


def weight_bytes(model) -> int:
    """Bytes of the distinct weights a decode step reads (a tied embedding once)."""
    return sum(p.numel() * p.element_size() for p in model.parameters())


def run_pairs(label: str, model, tok, texts: list[str], n: int, new_tokens: int, pairs: int, dtype: str,
              compile: str, calls: int = 1, fixed: bool = False) -> dict:
    """`pairs` x (hf, static); each measurement is `calls` generate calls (seeds shared by the pair)."""
    prompts = [encode_prompt(tok, t) for t in texts]
    gens = {"hf": make_generator(model, tok, "hf"), "static": make_generator(model, tok, "static")}
    if compile != "auto":
        from softrl.models.generation import StaticCacheGenerator

        gens["static"] = StaticCacheGenerator(model, tok, compile=compile == "on")
    sampling = lambda seed: SamplingParams(n=n, max_new_tokens=new_tokens, seed=seed, ignore_eos=fixed)  # noqa: E731
    results = {name: [] for name in gens}  # name -> [(tokens, seconds)]
    for name, gen in gens.items():  # warm-up: allocations, compilation
        gen.generate(prompts, sampling(10_000))
    for pair in range(pairs):
        for name, gen in gens.items():
            start, tokens = time.perf_counter(), 0
            for call in range(calls):
                tokens += sum(len(s.tokens) for s in gen.generate(prompts, sampling(pair * calls + call)))
            results[name].append((tokens, time.perf_counter() - start))
    rate = {name: [t / s for t, s in rows] for name, rows in results.items()}
    shape = f"{len(prompts)} prompts x {n} x {new_tokens} ({dtype}){f', {calls} calls' if calls > 1 else ''}"
    return {"model": label, "shape": shape, "batch": len(prompts) * n, "rate": rate,
            "tokens": {name: statistics.median(t for t, _ in rows) for name, rows in results.items()},
            "seconds": {name: statistics.median(s for _, s in rows) for name, rows in results.items()},
            "static_over_hf": [s / h for h, s in zip(rate["hf"], rate["static"])]}


def print_rows(r: dict, bound: float | None = None) -> None:
    for name in r["rate"]:
        rate = statistics.median(r["rate"][name])
        cells = [r["model"], r["shape"], name, f"{r['tokens'][name]:.0f}", f"{r['seconds'][name]:.3f}", f"{rate:.0f}",
                 " ".join(f"{x:.0f}" for x in r["rate"][name]),
                 "" if name == "hf" else " ".join(f"{x:.2f}" for x in r["static_over_hf"])]
        if bound is not None:
            cells += [f"{bound:.0f}", f"{rate / bound:.1%}"]
        print("| " + " | ".join(cells) + " |", flush=True)


def batch_sizes(text: str) -> list[int]:
    try:
        sizes = [int(b) for b in text.split(",")]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"batch sizes must be positive integers, got {text!r}")
    return sizes


def load(directory, dtype: str, device: str):
    model, tok = load_causal_lm(directory, dtype=dtype)
    return model.to(resolve_device(device)), tok


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", help="a model directory or a name `softrl model prepare` knows; default: the standard set")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--batches", type=batch_sizes, help="comma-separated batch sizes (samples), each batch/n "
                        "prompts x n; instead of --prompts (--model only)")
    parser.add_argument("--chat", action="store_true", help="arithmetic questions (else --task's prompts)")
    parser.add_argument("--task", default="countdown", help="the task whose prompts are sampled (--model only), "
                        "e.g. tinycode-loops: long prompts and programs, where the two backends differ most")
    parser.add_argument("--fixed", action="store_true", help="EOS never drawn: every sample --new-tokens long")
    parser.add_argument("--bound", action="store_true", help="add the weight-read memory-bandwidth bound")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--calls", type=int, default=1, help="generate calls per measurement (--model only)")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    parser.add_argument("--compile", choices=["auto", "on", "off"], default="auto",
                        help="the static backend's compile setting (auto: on CUDA only)")
    parser.add_argument("--json", help="also write every measurement (and the bound's inputs) to this file")
    args = parser.parse_args()
    device = resolve_device(args.device)
    bandwidth = memory_bandwidth(device) if args.bound else None
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"{torch.get_num_threads()} threads"
    print(f"torch {torch.__version__}, {where}, {args.pairs} pairs hf/static alternating"
          + (f", copy bandwidth {bandwidth / 1e9:.0f} GB/s" if bandwidth else "") + "\n")
    extra = " bound tokens/s | of bound |" if bandwidth else ""
    print(f"| model | shape | backend | tokens | median s | median tokens/s | tokens/s per pair | static/hf per pair |{extra}")
    print("|---|---|---|---|---|---|---|---|" + ("---|---|" if bandwidth else ""))
    task_prompts = lambda k, task="countdown": [p.text for p in load_task(task, size=k, seed=12345).prompts()]  # noqa: E731
    results = []

    def keep(r: dict, bound: float | None = None) -> None:  # printed and written as it comes: a run cut off
        print_rows(r, bound)                                  # keeps the finished ones
        results.append(r)
        if args.json:
            Path(args.json).write_text(json.dumps({"torch": torch.__version__, "device": where,
                                                   "copy_bytes_per_s": bandwidth, "results": results}, indent=1))

    if args.model:
        from softrl.assemble import model_directory

        model, tok = load(model_directory(args.model, args.task), args.dtype, args.device)
        weights = weight_bytes(model)
        for prompts in [max(1, b // args.n) for b in args.batches] if args.batches else [args.prompts]:
            texts = smollm2_prompts(prompts) if args.chat else task_prompts(prompts, args.task)
            r = run_pairs(args.model, model, tok, texts, args.n, args.new_tokens, args.pairs, args.dtype,
                          args.compile, args.calls, args.fixed)
            r["bound_tokens_per_s"] = r["batch"] * bandwidth / weights if bandwidth else None
            keep(r, r["bound_tokens_per_s"])
    else:
        from softrl.bootstrap import bootstrap
        from softrl.models.prepare import prepare_model

        model, tok = load(bootstrap("countdown"), args.dtype, args.device)
        # about 0.1 s a call: ten calls a measurement
        keep(run_pairs("countdown bootstrap", model, tok, task_prompts(16), 4, 24, args.pairs, args.dtype,
                       args.compile, calls=10, fixed=args.fixed))
        model, tok = load(prepare_model("smollm2-135m"), args.dtype, args.device)
        for prompts in (4, 16):
            keep(run_pairs("SmolLM2-135M", model, tok, smollm2_prompts(prompts), 4, 32, args.pairs,
                           args.dtype, args.compile, fixed=args.fixed))


if __name__ == "__main__":
    main()
