"""Multi-turn rollouts against single-turn at equal generated tokens (issue 50, part 7's throughput).

    .venv/bin/python benchmarks/episode_throughput.py [--model bootstrap] [--prompts 16] [--k 4] \
        [--turn-tokens 64] [--turns 3] [--pairs 3] [--device auto] [--dtype float32] [--json out.json]

Side A, single turn: `rollouts` of tinycode-loops' prompts, k samples each, `turns x turn-tokens` new
tokens, EOS never drawn (every sample that long). Side B, episodes: `episodes` of tinycode-feedback's
prompts (the same problems), k episodes each, up to `turns` policy turns of `turn-tokens` tokens, EOS
never drawn, so every episode takes every turn (a program cut at its length fails its examples) and the
sandbox runs each turn's program: the environment's cost is in B's clock, as in a run. Both sample with
the same model and generator; the sides alternate A B A B, and each pair's ratio of policy tokens/s
(B over A) is reported, with samples/s. Nothing is asserted; the target (>= 0.7x for 3-turn episodes)
is read off the printed ratios.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from statistics import median

import torch

from softrl.assemble import model_directory
from softrl.models.device import resolve_device
from softrl.models.generation import make_generator
from softrl.models.loading import encode_prompt, load_causal_lm
from softrl.rollout import EpisodeLimits, RolloutSpec, contexts_of, episodes, rollouts
from softrl.tasks.registry import load_task


def side(name: str, run) -> dict:
    start = time.perf_counter()
    rows = run()
    seconds = time.perf_counter() - start
    policy = sum(sum(r.action_mask) if r.action_mask else len(r.response_tokens) for r in rows)
    return {"side": name, "seconds": seconds, "samples": len(rows), "policy_tokens": policy,
            "tokens_per_s": policy / seconds, "samples_per_s": len(rows) / seconds,
            "turns": sum(sum(t["role"] == "assistant" for t in r.turns) if r.turns else 1 for r in rows) / len(rows)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="bootstrap", help="a model directory, or 'bootstrap' (tinycode-feedback's)")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--turn-tokens", type=int, default=64)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    directory = model_directory(args.model, "tinycode-feedback")
    model, tokenizer = load_causal_lm(directory, dtype=args.dtype)
    model = model.to(resolve_device(args.device))  # the GPU lease of 2026-11-28 sampled 0.53B on its CPU
    generator = make_generator(model, tokenizer, args.backend)
    encode = lambda text: encode_prompt(tokenizer, text)  # noqa: E731
    single_task = load_task("tinycode-loops", size=args.prompts, seed=1)
    episode_task = load_task("tinycode-feedback", size=args.prompts, seed=1)
    single = RolloutSpec.for_model(single_task, model, tokenizer, args.turns * args.turn_tokens, source="bench",
                                   generator=generator, ignore_eos=True)
    multi = replace(RolloutSpec.for_model(episode_task, model, tokenizer, args.turn_tokens, source="bench",
                                          generator=generator), ignore_eos=True)
    env, limits = episode_task.make_environment(), EpisodeLimits(max_turns=args.turns)
    a = lambda seed: rollouts(single, contexts_of(single, single_task.prompts(), encode), args.k, seed)  # noqa: E731
    b = lambda seed: episodes(multi, env, contexts_of(multi, episode_task.prompts(), encode), args.k, seed,  # noqa: E731
                              limits, tokenizer)
    a(99), b(99)  # warm-up: compilation, the sandbox's first start
    pairs = []
    for pair in range(args.pairs):
        one, many = side("single-turn", lambda: a(pair)), side("episodes", lambda: b(pair))
        pairs.append({"single": one, "episodes": many, "tokens_ratio": many["tokens_per_s"] / one["tokens_per_s"]})
        print(f"pair {pair + 1}: single {one['tokens_per_s']:.1f} tok/s ({one['samples_per_s']:.2f} samples/s), "
              f"episodes {many['tokens_per_s']:.1f} tok/s ({many['samples_per_s']:.2f} episodes/s, "
              f"{many['turns']:.2f} turns), ratio {pairs[-1]['tokens_ratio']:.3f}", flush=True)
    result = {"model": directory, "device": str(model.device), "dtype": args.dtype, "prompts": args.prompts, "k": args.k, "turn_tokens": args.turn_tokens,
              "turns": args.turns, "threads": torch.get_num_threads(), "pairs": pairs,
              "tokens_ratio_by_pair": [p["tokens_ratio"] for p in pairs],
              "tokens_ratio_median": median(p["tokens_ratio"] for p in pairs)}
    print(f"episodes / single turn, policy tokens/s, pair by pair: "
          f"{', '.join(f'{r:.3f}' for r in result['tokens_ratio_by_pair'])} (median {result['tokens_ratio_median']:.3f})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
