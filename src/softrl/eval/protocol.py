"""SPO's evaluation protocol: n samples per held-out prompt (n = 20, temperature 0.4, top-p 0.95 by
default), unbiased pass@k for every k up to n, per-sample success and distinct correct answers."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import replace

from softrl.algorithms.passk import mean_pass_at_k
from softrl.rollout import EpisodeLimits, RolloutSpec, contexts_of, graded_samples
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
           temperature: float = 0.4, top_p: float = 0.95, seed: int = 0, env=None,
           limits: EpisodeLimits | None = None) -> list:
    """n graded responses per prompt at the protocol's decoding (Trajectory rows, grouped by prompt):
    episodes within `limits` where an environment `env` answers between turns."""
    spec = replace(spec, temperature=temperature, temperature_range=None, top_p=top_p)
    return graded_samples(spec, contexts_of(spec, prompts, encode_prompt), n, seed, env, limits)


def policy_tokens(rows: list) -> int:
    """The tokens the policy generated in `rows`, Trajectories or their dict rows (an episode's environment
    turns are not its)."""
    total = 0
    for r in rows:
        mask, tokens = (r.get("action_mask"), r["response_tokens"]) if isinstance(r, dict) else (r.action_mask,
                                                                                                  r.response_tokens)
        total += sum(mask) if mask is not None else len(tokens)
    return total


def first_turns(spec: RolloutSpec, prompts: list[Prompt], rows: list) -> list[tuple[str, str, bool]]:
    """(prompt id, first policy turn, whether it alone passes) of every episode: what the policy does
    before the environment's first answer. Only episodes of several turns are graded again."""
    by_id = {p.id: p for p in prompts}
    firsts = [next(t["content"] for t in r.turns if t["role"] == "assistant") for r in rows]
    again = [i for i, r in enumerate(rows) if sum(t["role"] == "assistant" for t in r.turns) > 1]
    grades = spec.task.grade_many([(by_id[rows[i].prompt_id], firsts[i]) for i in again])
    passed = [r.passed for r in rows]
    for i, grade in zip(again, grades):
        passed[i] = grade.passed
    return [(r.prompt_id, text, ok) for r, text, ok in zip(rows, firsts, passed)]


def evaluate(spec: RolloutSpec, prompts: list[Prompt], encode_prompt: Callable[[str], list[int]], n: int = 20,
             temperature: float = 0.4, top_p: float = 0.95, seed: int = 0, stats: bool = False,
             reference=None, env=None, limits: EpisodeLimits | None = None) -> dict:
    """Sample n responses per prompt at the protocol's decoding, grade them, summarize (with the policy's
    tokens per response, `tokens_per_sample`); with `stats`,
    also the policy's mean token entropy along them and (given a reference model) KL(pi || pi0). With an
    environment, n episodes per prompt graded at their last turn, and besides: policy turns per episode
    and `first_turn_pass@k` (and `_success_per_sample`), the same numbers for the first turns alone."""
    rows = sample(spec, prompts, encode_prompt, n, temperature, top_p, seed, env, limits)
    ks = tuple(sorted({1, 10, *range(1, n + 1)}))  # every k up to n (pass@k curves); pass@10 None below 10
    # an episode's answer is its last policy turn (distinct answers, not distinct conversations)
    answers = [r.response_text if env is None else next(t["content"] for t in reversed(r.turns) if t["role"] == "assistant")
               for r in rows]
    out = {**summarize([(r.prompt_id, text, r.passed) for r, text in zip(rows, answers)], n, ks),
           "temperature": temperature, "top_p": top_p, "tokens_per_sample": policy_tokens(rows) / max(1, len(rows))}
    if env is not None:
        out["turns_per_episode"] = sum(sum(t["role"] == "assistant" for t in r.turns) for r in rows) / max(1, len(rows))
        first = summarize(first_turns(spec, prompts, rows), n, (1, 10))
        out.update({f"first_turn_{k}": first[k] for k in ("pass@1", "pass@10", "success_per_sample")})
    if stats:
        from softrl.eval.diversity import token_stats

        out.update(token_stats(spec.generator.model, rows, spec.generator.tokenizer.pad_token_id, reference))
    return out
