"""Samplers: which trajectories make up a training batch.

A *source* is anything with `draw(n, rng) -> list[dict]` (trajectory rows). A pool (data/pool.py) is
the source over rows of the store (e.g. "passed only", SPO's offline set); a runtime's online queue is
another. `MixtureSampler` mixes sources by weight, `GroupSampler` draws n responses of one prompt
(AGRO, RLOO, GRPO: groups contiguous), `replay` swaps fresh samples for stored ones with
probability p (AGRO's synthetic off-policy setting), and `ReplayBuffer` keeps a run's recent online
groups for the mix's `replay` source.
"""

from __future__ import annotations

import random
from typing import Any, Protocol

from softrl.data.pool import Pool


class Source(Protocol):
    def draw(self, n: int, rng: random.Random) -> list[dict[str, Any]]:
        """Up to `n` trajectory rows (fewer only when the source has run dry)."""


def split_counts(total: int, weights: dict[str, float], rng: random.Random) -> dict[str, int]:
    """`total` divided in proportion to `weights`: the floors, then the remainders drawn by weight, so
    every batch holds each source's share to within one row and the long-run mix is exact."""
    names = [k for k, w in weights.items() if w > 0]
    mass = sum(weights[k] for k in names)
    exact = {k: total * weights[k] / mass for k in names}
    counts = {k: int(v) for k, v in exact.items()}
    remainders = {k: exact[k] - counts[k] for k in names}
    for _ in range(total - sum(counts.values())):
        k = rng.choices(list(remainders), weights=list(remainders.values()))[0]
        counts[k] += 1
        remainders[k] = 0.0
    return counts


class MixtureSampler:
    """Batches mixed from named sources by weight, e.g. {"online": 0.5, "offline": 0.25, "mc": 0.25}.
    Each row is tagged with `mix_source`; a dry source's share goes to the others."""

    def __init__(self, sources: dict[str, Source], weights: dict[str, float], seed: int = 0):
        unknown = set(weights) - set(sources)
        if unknown:
            raise ValueError(f"weight for unknown source {sorted(unknown)[0]!r}; sources: {', '.join(sources)}")
        bad = {k: w for k, w in weights.items() if not w >= 0}
        if bad or not any(w > 0 for w in weights.values()):
            raise ValueError(f"source weights must be >= 0 with a positive sum, got {weights}")
        self.sources, self.weights, self.rng = sources, dict(weights), random.Random(seed)

    def sample(self, batch_size: int) -> list[dict[str, Any]]:
        weights, batch = dict(self.weights), []
        while len(batch) < batch_size and any(w > 0 for w in weights.values()):
            for name, count in split_counts(batch_size - len(batch), weights, self.rng).items():
                rows = self.sources[name].draw(count, self.rng) if count else []
                batch += [{**row, "mix_source": name} for row in rows]
                if len(rows) < count:
                    weights[name] = 0.0  # ran dry: the others fill its share
        if not batch:
            raise ValueError(f"every source is empty ({', '.join(self.sources)}): nothing to train on")
        return batch


class GroupSampler:
    """`groups` prompts (among those with at least n rows), n rows each, groups contiguous."""

    def __init__(self, pool: Pool, n: int, seed: int = 0):
        if n < 1:
            raise ValueError(f"group size n must be >= 1, got n={n}")
        self.pool, self.n, self.rng = pool, n, random.Random(seed)
        self.prompts = pool.prompts_with(n)

    def draw(self, n: int, rng: random.Random) -> list[dict[str, Any]]:
        """About n rows in whole groups (a Source; its own RNG, so its state can be saved)."""
        return self.sample(max(1, round(n / self.n))) if self.prompts else []

    def sample(self, groups: int) -> list[dict[str, Any]]:
        if not self.prompts:
            raise ValueError(f"no prompt has {self.n} stored responses; lower the group size or add data")
        chosen = [self.rng.choice(self.prompts) for _ in range(groups)]
        return [row for prompt_id in chosen for row in self.pool.of_prompt(prompt_id, self.n, self.rng)]


def replay(fresh: list[dict[str, Any]], buffer: Pool, p: float, rng: random.Random) -> list[dict[str, Any]]:
    """Each fresh row, with probability p, replaced by a stored row of the same prompt (if it has one)."""
    if not 0 <= p <= 1:
        raise ValueError(f"replay probability p must be in [0, 1], got p={p}")
    out = []
    for row in fresh:
        stored = buffer.of_prompt(row["prompt_id"], 1, rng) if rng.random() < p else []
        out.append({**stored[0], "replayed": True} if stored else row)
    return out


class ReplayBuffer:
    """The `replay` source of `data.mix`: this run's recent online groups, first in first out (at most `size`
    rows), each drawn at most `reuse` times, uniformly among those not used up. Arnal et al. (arXiv
    2604.08706) cut generation by up to 40% at equal accuracy with such a buffer. Rows keep their sampler's
    log-probs and policy version, so an objective that weighs by pi/mu, or SPO and AGRO that need no
    weights, learn from them correctly; whole groups (one step's samples of one prompt) are kept and
    drawn together, as group objectives need."""

    def __init__(self, size: int, reuse: int, seed: int = 0):
        if size < 1 or reuse < 1:
            raise ValueError(f"replay size and reuse must be >= 1, got size={size}, reuse={reuse}")
        self.size, self.reuse, self.rng = size, reuse, random.Random(seed)
        self.groups: list[list] = []  # [rows, times drawn], oldest first

    def __len__(self) -> int:
        return sum(len(rows) for rows, _ in self.groups)

    def add(self, rows: list[dict[str, Any]]) -> None:
        """One step's online rows, as groups of consecutive rows of one prompt; the oldest leave past `size`."""
        group: list[dict[str, Any]] = []
        for row in rows:
            if group and group[-1]["prompt_id"] != row["prompt_id"]:
                self.groups.append([group, 0])
                group = []
            group.append(row)
        if group:
            self.groups.append([group, 0])
        while len(self) > self.size:
            self.groups.pop(0)

    def draw(self, n: int) -> list[dict[str, Any]]:
        """About `n` rows in whole groups, each group once at most, counted as a use; fewer (or none) while
        the buffer holds less."""
        if not self.groups or n < 1:  # a group used `reuse` times has left
            return []
        per = max(1, round(len(self) / len(self.groups)))  # rows per group, about samples_per_prompt
        chosen = self.rng.sample(self.groups, min(len(self.groups), max(1, round(n / per))))
        for group in chosen:
            group[1] += 1
        self.groups = [g for g in self.groups if g[1] < self.reuse]
        return [{**row, "mix_source": "replay"} for rows, _ in chosen for row in rows]

    def state_dict(self) -> dict:
        return {"groups": [[list(rows), used] for rows, used in self.groups], "rng": self.rng.getstate()}

    def load_state_dict(self, state: dict) -> None:
        self.groups = [[list(rows), used] for rows, used in state["groups"]]
        self.rng.setstate(state["rng"])
