"""An exact sequence problem by enumeration: every quantity of docs/ALGORITHMS.md computed without sampling.

One prompt; responses are all `V**L` sequences of length `L` over a vocabulary of `V` tokens.
A tabular autoregressive policy holds one logit row per prefix: level `t` is a `[V**t, V]` table
(the next-token logits after every prefix of length `t`). Sequence `i` is the base-`V` number
`i = sum_t y_t V**(L-1-t)`, so its prefix of length `t` has index `i // V**(L-t)` at level `t`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch
from torch import Tensor, nn

from softrl.algorithms.common import SPO_BETA, check_beta



class TabularPolicy(nn.Module):
    """Logit tables `[V**t, V]` per level t, and (for PPO) value tables `[V**t]` per level."""

    def __init__(self, logits: list[Tensor]):
        super().__init__()
        self.logits = nn.ParameterList([nn.Parameter(x.detach().clone()) for x in logits])
        self.values = nn.ParameterList([nn.Parameter(torch.zeros(x.shape[0], dtype=x.dtype)) for x in logits])

    def policy_parameters(self) -> list[nn.Parameter]:
        return list(self.logits)


@dataclass
class TabularProblem:
    vocab: int
    length: int
    beta: float
    ref_logits: list[Tensor]  # level t: [V**t, V]
    reward: Tensor  # [N], one reward per sequence

    @classmethod
    def make(
        cls,
        vocab: int = 3,
        length: int = 4,
        success_rate: float = 0.2,
        beta: float = SPO_BETA,
        ref_scale: float = 1.0,
        seed: int = 0,
    ) -> "TabularProblem":
        """Random reference logits ~ N(0, ref_scale^2); reward 0 (pass) on a random set of sequences
        whose reference probability first reaches `success_rate`, -1 (fail) elsewhere."""
        check_beta(beta)
        if vocab < 2 or length < 1:
            raise ValueError(f"need vocab >= 2 and length >= 1, got vocab={vocab}, length={length}")
        if not 0 < success_rate < 1:
            raise ValueError(f"success_rate must be in (0, 1), got success_rate={success_rate}")
        g = torch.Generator().manual_seed(seed)
        ref = [ref_scale * torch.randn(vocab**t, vocab, generator=g, dtype=torch.float64) for t in range(length)]
        p0 = cls(vocab, length, beta, ref, torch.empty(0)).seq_logp(ref).exp()
        order = torch.randperm(p0.shape[0], generator=g)
        passing = order[: int((p0[order].cumsum(0) < success_rate).sum()) + 1]
        reward = -torch.ones_like(p0)
        reward[passing] = 0.0
        return cls(vocab, length, beta, ref, reward)

    # --- enumeration -------------------------------------------------------------------------
    @property
    def num_sequences(self) -> int:
        return self.vocab**self.length

    @cached_property
    def sequences(self) -> Tensor:
        """All sequences `[N, L]` (long), in index order."""
        i = torch.arange(self.num_sequences)
        powers = self.vocab ** torch.arange(self.length - 1, -1, -1)
        return (i[:, None] // powers) % self.vocab

    @cached_property
    def prefix_indices(self) -> list[Tensor]:
        """Per level `t`, the index at that level of every sequence's length-`t` prefix: `[N]` each."""
        return [torch.arange(self.num_sequences) // self.vocab ** (self.length - t) for t in range(self.length)]

    def next_token_logp(self, logits: list[Tensor]) -> Tensor:
        """Full next-token log-distributions at every position of every sequence: `[N, L, V]`."""
        return torch.stack(
            [torch.log_softmax(logits[t], -1)[self.prefix_indices[t]] for t in range(self.length)], dim=1
        )

    @cached_property
    def ref_next_token_logp(self) -> Tensor:
        """`log pi0(.|y_<t)` for every sequence and position: `[N, L, V]`."""
        return self.next_token_logp(self.ref_logits)

    def token_logp(self, logits: list[Tensor]) -> Tensor:
        """`log pi(y_t | y_<t)` for every sequence and position: `[N, L]`."""
        return self.next_token_logp(logits).gather(-1, self.sequences[..., None]).squeeze(-1)

    def seq_logp(self, logits: list[Tensor]) -> Tensor:
        """`log pi(y)` of every sequence: `[N]`."""
        return self.token_logp(logits).sum(-1)

    # --- the exact optimum -------------------------------------------------------------------
    @cached_property
    def log_z(self) -> Tensor:
        return torch.logsumexp(self.seq_logp(self.ref_logits) + self.reward / self.beta, 0)

    @property
    def v_star(self) -> float:
        """`V*(x) = beta log E_pi0[exp(r/beta)]`, also the exact `Q0_hat`."""
        return self.beta * self.log_z.item()

    @property
    def success_rate(self) -> float:
        """Reference probability of the passing sequences (reward 0)."""
        return self.seq_logp(self.ref_logits).exp()[self.reward == 0].sum().item()

    @cached_property
    def optimal_seq_logp(self) -> Tensor:
        """`log pi*(y) = log pi0(y) + r(y)/beta - log Z`: `[N]`."""
        return self.seq_logp(self.ref_logits) + self.reward / self.beta - self.log_z

    def optimal_q(self) -> list[Tensor]:
        """Exact soft Q per level: `Q*_t(p) = beta log E_pi0[exp(r/beta) | prefix p]`, level t `[V**t]`, t = 0..L."""
        q = [self.reward.clone()]  # level L: Q*_L = r
        for t in reversed(range(self.length)):
            ref = torch.log_softmax(self.ref_logits[t], -1)  # [V**t, V]
            q.append(self.beta * torch.logsumexp(ref + q[-1].view(-1, self.vocab) / self.beta, -1))
        return q[::-1]

    def optimal_logits(self) -> list[Tensor]:
        """Logit tables of pi*: `log pi0(a|p) + Q*_{t+1}(p + a) / beta` (softmax normalises)."""
        q = self.optimal_q()
        return [
            torch.log_softmax(self.ref_logits[t], -1) + q[t + 1].view(-1, self.vocab) / self.beta
            for t in range(self.length)
        ]

    def kl_to_optimal(self, logits: list[Tensor]) -> float:
        """`KL(pi || pi*)`, exactly (floored at 0: near pi* the float64 sum can round to -1e-16)."""
        logp = self.seq_logp(logits)
        return max((logp.exp() * (logp - self.optimal_seq_logp)).sum().item(), 0.0)

    def kl_to_reference(self, logits: list[Tensor]) -> Tensor:
        """`KL(pi || pi0)` (differentiable)."""
        logp = self.seq_logp(logits)
        return (logp.exp() * (logp - self.seq_logp(self.ref_logits))).sum()

    def expected_reward(self, logits: list[Tensor]) -> float:
        return (self.seq_logp(logits).exp() * self.reward).sum().item()
