"""Pivotal Token Search (docs/ALGORITHMS.md): estimate the success probability S(t) of continuing the
prefix y_<=t of a stored response with K reference rollouts, bisecting [0, T] wherever S jumps by at
least `threshold`. Every visited (t, S(t), K) becomes an MC target of the trajectory; an interval of
length 1 that still jumps marks token t as pivotal. The rollouts are trajectories too (source "pts").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from softrl.data.schema import Trajectory
from softrl.data.store import ExperienceStore
from softrl.rollout import Context, RolloutSpec, rollouts
from softrl.tasks.base import Prompt


def bisect_pivots(length: int, success_at: Callable[[int], float], threshold: float) -> tuple[dict[int, float], list[int]]:
    """Visited {t: S(t)} and the pivotal positions t (S jumps between t - 1 and t), for t in 0..length.
    Only intervals that jump are split, so one isolated jump costs about log2(length) evaluations."""
    if not 0 < threshold <= 1:
        raise ValueError(f"threshold must be in (0, 1], got threshold={threshold}")
    visited: dict[int, float] = {}

    def s(t: int) -> float:
        if t not in visited:
            visited[t] = success_at(t)
        return visited[t]

    pivots, stack = [], [(0, length)]
    while stack:
        lo, hi = stack.pop()
        if hi <= lo or abs(s(hi) - s(lo)) < threshold:
            continue
        if hi - lo == 1:
            pivots.append(hi)
            continue
        mid = (lo + hi) // 2
        stack += [(mid, hi), (lo, mid)]
    return dict(sorted(visited.items())), sorted(pivots)


@dataclass
class PivotalToken:
    t: int  # 1-based position in the response: the token that makes S jump
    token: str
    before: float  # S(t - 1)
    after: float  # S(t)


@dataclass
class SearchResult:
    trajectory_id: str
    prompt_id: str
    tokens: list[str]  # the response, one string per token
    mc_targets: list[dict]  # [{"t", "success", "k"}]
    pivots: list[PivotalToken]
    evaluated: int  # prefixes whose S was estimated by rollouts
    rollouts: list[Trajectory] = field(default_factory=list)
    prompt_text: str = ""


def search(spec: RolloutSpec, prompt: Prompt, prompt_tokens: list[int], response: list[int], passed: bool,
           trajectory_id: str, k: int, threshold: float, seed: int = 0,
           s0: tuple[float, int] | None = None) -> SearchResult:
    """PTS on one response. S(T) is the response's own verdict; S(0) is `s0` = (success, K) when the
    prompt's Q0 samples are known, else estimated like any other prefix."""
    made: list[Trajectory] = []
    ks: dict[int, int] = {}

    def success_at(t: int) -> float:
        if t == len(response):
            ks[t] = 1
            return float(passed)
        if t == 0 and s0 is not None:
            ks[t] = s0[1]
            return s0[0]
        batch = rollouts(spec, [Context(prompt, list(prompt_tokens), tuple(response[:t]))], k, seed + 104729 * t)
        made.extend(batch)
        ks[t] = k
        return sum(r.passed for r in batch) / k

    visited, pivots = bisect_pivots(len(response), success_at, threshold)
    tokens = [spec.decode([tok]) for tok in response]
    return SearchResult(
        trajectory_id, prompt.id, tokens,
        [{"t": t, "success": s, "k": ks[t]} for t, s in visited.items()],
        [PivotalToken(t, tokens[t - 1], visited[t - 1], visited[t]) for t in pivots],
        evaluated=len(made) // k if k else 0, rollouts=made, prompt_text=prompt.text,
    )


def render(result: SearchResult, mark: Callable[[str, PivotalToken], str] | None = None) -> str:
    """The response with pivotal tokens marked, then one line per pivot with S before and after."""
    mark = mark or (lambda tok, p: f"[[{tok}]]")
    at = {p.t: p for p in result.pivots}
    body = "".join(mark(tok, at[i + 1]) if i + 1 in at else tok for i, tok in enumerate(result.tokens))
    lines = [f"{result.prompt_id}  {result.trajectory_id[:12]}  T={len(result.tokens)}  "
             f"prefixes evaluated={result.evaluated}  rollouts={len(result.rollouts)}"]
    lines += [f"  prompt: {line}" for line in result.prompt_text.strip().splitlines()[:3]]
    lines.append(body)
    lines += [f"  pivotal token {p.t} {p.token!r}: S {p.before:.2f} -> {p.after:.2f}" for p in result.pivots]
    if not result.pivots:
        lines.append("  no pivotal token at this threshold")
    return "\n".join(lines)


def spread_over_prompts(rows: list[dict]) -> list[dict]:
    """Round-robin over prompts (each prompt's first row, then each one's second, ...), so that a
    `limit` covers as many prompts as it can instead of the first few prompts' every answer."""
    by_prompt: dict[str, list[dict]] = {}
    for row in rows:
        by_prompt.setdefault(row["prompt_id"], []).append(row)
    depth = max((len(v) for v in by_prompt.values()), default=0)
    return [group[i] for i in range(depth) for group in by_prompt.values() if i < len(group)]


def annotate_store(spec: RolloutSpec, store: ExperienceStore, encode_prompt: Callable[[str], list[int]],
                   encode_response: Callable[[str], list[int]], model: str, k: int, threshold: float, seed: int = 0,
                   limit: int | None = None, force: bool = False, sources: list[str] | None = None,
                   progress: Callable[[int, int], None] | None = None) -> list[SearchResult]:
    """PTS over the store's passed trajectories of `spec.task` (of `sources`, default all but PTS's own
    rollouts; a `limit` is spread over as many prompts as it allows), each written back as soon as it
    is done: rollouts appended, MC targets annotated. Trajectories that already have MC targets are
    skipped unless `force`, so a killed run resumes. A trajectory whose tokens are not under
    this tokenizer is re-tokenised from its text and stored as a tokenised copy, which gets the targets."""
    prompts = {p.id: p for p in spec.task.prompts()}
    # an episode's response holds the environment's turns: PTS continues single responses only
    candidates = [r for r in store.trajectories(task=spec.task.name, passed=True, source=sources).to_pylist()
                  if r["prompt_id"] in prompts and r["source"] != "pts" and not r.get("turns")]
    stored, annotated = {r["id"] for r in candidates}, {r["id"] for r in candidates if r["mc_targets"]}
    rows, copies = [], []
    for row in candidates:
        if row["tokenizer"] != spec.fingerprint or not row["response_tokens"]:
            copy = Trajectory.from_row({**row, "id": "", "tokenizer": spec.fingerprint, "mc_targets": [],
                                        "prompt_tokens": encode_prompt(prompts[row["prompt_id"]].text),
                                        "response_tokens": encode_response(row["response_text"])})
            if copy.id in annotated and not force:
                continue
            copies += [] if copy.id in stored else [copy]
            row = copy.to_row()
        if force or row["id"] not in annotated:
            rows.append(row)
    rows = spread_over_prompts(list({r["id"]: r for r in rows}.values()))[:limit]
    store.append(copies)
    q0 = store.prompts()
    results = []
    for i, row in enumerate(rows):
        prompt = prompts[row["prompt_id"]]
        known = q0.get(prompt.id)
        s0 = (known["q0_success"], known["q0_k"]) if known and known.get("q0_model") == model else None
        result = search(spec, prompt, row["prompt_tokens"], row["response_tokens"], row["passed"], row["id"], k,
                        threshold, seed + i, s0)
        store.append(result.rollouts)
        store.annotate({row["id"]: result.mc_targets})
        results.append(result)
        if progress is not None:
            progress(i + 1, len(rows))
    return results
