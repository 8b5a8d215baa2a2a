"""SPO's evaluation protocol: n samples per held-out prompt (n = 20, temperature 0.4, top-p 0.95 by
default), unbiased pass@k for every k up to n, per-sample success and distinct correct answers."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import replace

from softrl.algorithms.passk import mean_pass_at_k
from softrl.rollout import RolloutSpec, contexts_of, rollouts
from softrl.tasks.base import Prompt


def summarize(results: list[tuple[str, str, bool]], n: int, ks: tuple[int, ...] = (1, 10)) -> dict:
    """(prompt_id, response text, passed) for n samples of each prompt -> the protocol's numbers."""
    correct: dict[str, int] = defaultdict(int)
    distinct: dict[str, set[str]] = defaultdict(set)
    for prompt_id, text, passed in results:
        correct[prompt_id] += 0
        if passed:
            correct[prompt_id] += 1
            distinct[prompt_id].add(text.strip())
    counts = list(correct.values())
    solved = [len(d) for d in distinct.values() if d]
    out = {"problems": len(counts), "samples_per_problem": n,
           "success_per_sample": sum(counts) / (len(counts) * n) if counts else 0.0,
           "solved_problems": len(solved),
           "distinct_correct_per_solved": sum(solved) / len(solved) if solved else 0.0}
    for k in ks:
        out[f"pass@{k}"] = mean_pass_at_k(counts, n, k) if n >= k else None
    return out


def sample(spec: RolloutSpec, prompts: list[Prompt], encode_prompt: Callable[[str], list[int]], n: int = 20,
           temperature: float = 0.4, top_p: float = 0.95, seed: int = 0) -> list:
    """n graded responses per prompt at the protocol's decoding (Trajectory rows, grouped by prompt)."""
    spec = replace(spec, temperature=temperature, temperature_range=None, top_p=top_p)
    return rollouts(spec, contexts_of(spec, prompts, encode_prompt), n, seed)


def evaluate(spec: RolloutSpec, prompts: list[Prompt], encode_prompt: Callable[[str], list[int]], n: int = 20,
             temperature: float = 0.4, top_p: float = 0.95, seed: int = 0, stats: bool = False,
             reference=None) -> dict:
    """Sample n responses per prompt at the protocol's decoding, grade them, summarize; with `stats`,
    also the policy's mean token entropy along them and (given a reference model) KL(pi || pi0)."""
    rows = sample(spec, prompts, encode_prompt, n, temperature, top_p, seed)
    ks = tuple(sorted({1, 10, *range(1, n + 1)}))  # every k up to n (pass@k curves); pass@10 None below 10
    out = {**summarize([(r.prompt_id, r.response_text, r.passed) for r in rows], n, ks),
           "temperature": temperature, "top_p": top_p}
    if stats:
        from softrl.eval.diversity import token_stats

        out.update(token_stats(spec.generator.model, rows, spec.generator.tokenizer.pad_token_id, reference))
    return out
