"""Stale data in the tabular problem, where the truth is known: why SPO's pass@1 can fall as the lag grows.

The policy cannot represent pi*: its logits are pi0's plus one offset row per position, shared by
every prefix (`SharedOffsets`), so which sequences the data covers decides where it lands. Each step
it learns from `samples` sequences drawn from its own weights of `lag` steps before (pi0's until
then), with SPO's terminal loss (`algorithms.spo.spo_loss`) and Adam; the success rate, KL(pi || pi0)
and KL(pi || pi*) are exact. `Setting` switches the candidate causes one at a time: the loss and its
BCE clip, Q0 estimated from K samples instead of exactly, the learning rate, gradient clipping, and
the fix the field points to, re-anchoring (pi0 and Q0 replaced by the policy of the moment every
`refresh` steps, the KL to the original pi0 still reported).
"""

from __future__ import annotations

import collections
from dataclasses import asdict, dataclass

import torch
from torch import Tensor, nn

from softrl.algorithms import spo
from softrl.tabular.problem import TabularProblem


class SharedOffsets(nn.Module):
    """`logits_t(prefix) = log pi0(.|prefix) + b_t`: one offset row `[V]` per position t, shared by all
    prefixes. It holds pi0 (b = 0) and every position-wise tilt of it, but not pi* in general."""

    def __init__(self, problem: TabularProblem):
        super().__init__()
        self.ref = [x.detach() for x in problem.ref_logits]
        self.offsets = nn.ParameterList([nn.Parameter(torch.zeros(problem.vocab, dtype=x.dtype)) for x in self.ref])

    def logits(self) -> list[Tensor]:
        return [r + b for r, b in zip(self.ref, self.offsets)]


@dataclass(frozen=True)
class Setting:
    lag: int = 0
    lr: float = 0.03
    loss: str = "bce"
    eps: float = 1e-4
    q0_samples: int = 0  # 0: Q0 exact; K: beta log mean exp(r/beta) over K samples of the anchor
    refresh: int = 0  # re-anchor every this many steps (0: never)
    max_grad_norm: float | None = None
    samples: int = 32
    steps: int = 400
    seed: int = 0


def soft_value(problem: TabularProblem, logits: list[Tensor], k: int, gen: torch.Generator) -> float:
    """`beta log E_anchor[exp(r / beta)]`, exactly (k = 0) or over k samples of the anchor."""
    seq_logp = problem.seq_logp(logits)  # [N]
    if not k:
        return problem.beta * torch.logsumexp(seq_logp + problem.reward / problem.beta, 0).item()
    index = torch.multinomial(seq_logp.exp(), k, replacement=True, generator=gen)
    return spo.q0_from_rewards(problem.reward[index], problem.beta).item()


def train_stale(problem: TabularProblem, s: Setting) -> list[dict]:
    """One run; the exact success rate and KLs every 10 steps (and at the end)."""
    torch.manual_seed(s.seed)
    gen = torch.Generator().manual_seed(s.seed)
    policy = SharedOffsets(problem)
    optimizer = torch.optim.Adam(policy.parameters(), lr=s.lr)
    snapshots: collections.deque[list[Tensor]] = collections.deque()
    anchor = [x.detach() for x in problem.ref_logits]
    q0 = soft_value(problem, anchor, s.q0_samples, gen)
    ref_seq = problem.seq_logp(problem.ref_logits)
    curve, clipped = [], []
    for step in range(s.steps + 1):
        logits = policy.logits()
        if step % 10 == 0 or step == s.steps:
            seq = problem.seq_logp([x.detach() for x in logits])
            p = seq.exp()
            curve.append({"step": step, "success": p[problem.reward == 0].sum().item(),
                          "kl_ref": (p * (seq - ref_seq)).sum().item(),
                          "kl_star": problem.kl_to_optimal([x.detach() for x in logits]),
                          # the share of the last 10 steps' rows that failed with Q_T past the BCE clip
                          "clipped": sum(clipped) / max(len(clipped), 1)})
            clipped = []
        if step == s.steps:
            break
        if s.refresh and step and step % s.refresh == 0:
            anchor = [x.detach().clone() for x in logits]
            q0 = soft_value(problem, anchor, s.q0_samples, gen)
        snapshots.append([x.detach().clone() for x in logits])
        behaviour = snapshots[0] if len(snapshots) > s.lag else [x.detach() for x in problem.ref_logits]
        if len(snapshots) > s.lag:
            snapshots.popleft()
        index = torch.multinomial(problem.seq_logp(behaviour).exp(), s.samples, replacement=True, generator=gen)
        logp = problem.token_logp(logits)[index]  # [B, L]
        ref_logp = problem.token_logp(anchor)[index]  # [B, L]
        reward = problem.reward[index]  # [B], 0 solved / -1 failed: SPO's r - 1
        loss, metrics = spo.spo_loss(logp, ref_logp, torch.ones_like(logp), reward, torch.full_like(reward, q0),
                                     problem.beta, loss=s.loss, eps=s.eps)
        clipped.append(metrics.get("spo/failed_past_clip", torch.zeros(())).item())
        optimizer.zero_grad()
        loss.backward()
        if s.max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(policy.parameters(), s.max_grad_norm)
        optimizer.step()
    return curve


def summary(curve: list[dict], s: Setting) -> dict:
    """The setting, the last point, the mean success over the last quarter (the plateau), and the share of
    rows that failed with Q_T past the BCE clip over the whole run."""
    tail = curve[-max(1, len(curve) // 4):]
    return {**asdict(s), **curve[-1], "success_plateau": sum(p["success"] for p in tail) / len(tail),
            "clipped": sum(p["clipped"] for p in curve[1:]) / max(len(curve) - 1, 1)}


# the candidate causes, one at a time, and the fixes; each a change to the paper's setting (BCE, eps 1e-4)
VARIANTS: dict[str, dict] = {
    "paper (BCE, eps 1e-4)": {},
    "BCE eps 1e-2": {"eps": 1e-2},
    "BCE eps 1e-1": {"eps": 1e-1},
    "squared loss": {"loss": "squared"},
    "Q0 from 32 samples": {"q0_samples": 32},
    "gradient norm clipped at 1": {"max_grad_norm": 1.0},
    "anchor refreshed every 20 steps": {"refresh": 20},
}
LAGS = (0, 1, 4, 16, 64)


def sweep(lrs: tuple[float, ...] = (0.01, 0.03, 0.1), lags: tuple[int, ...] = LAGS, seeds: int = 3,
          variants: dict[str, dict] | None = None, steps: int = 400, on_run=None) -> list[dict]:
    """Every variant x learning rate x lag, `seeds` seeds each, on one problem (vocab 3, length 4, pi0's
    success 0.22); one summary per (variant, lr, lag), seed-averaged."""
    problem = TabularProblem.make(vocab=3, length=4, success_rate=0.2, seed=0)
    rows = []
    for name, change in (variants or VARIANTS).items():
        for lr in lrs:
            for lag in lags:
                runs = [summary(train_stale(problem, Setting(lag=lag, lr=lr, seed=k, steps=steps, **change)),
                                Setting(lag=lag, lr=lr, seed=k, steps=steps, **change)) for k in range(seeds)]
                if on_run is not None:
                    on_run()
                row = {"variant": name, "lr": lr, "lag": lag, "seeds": seeds}
                for key in ("success_plateau", "success", "kl_ref", "kl_star", "clipped"):
                    values = [r[key] for r in runs]
                    row[key] = sum(values) / seeds
                    row[f"{key}_sd"] = (sum((v - row[key]) ** 2 for v in values) / max(seeds - 1, 1)) ** 0.5
                rows.append(row)
    return rows
