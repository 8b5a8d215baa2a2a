"""An exact sequence problem by enumeration: every quantity of docs/ALGORITHMS.md computed without sampling.

One prompt; responses are all `V**L` sequences of length `L` over a vocabulary of `V` tokens.
A tabular autoregressive policy holds one logit row per prefix: level `t` is a `[V**t, V]` table
(the next-token logits after every prefix of length `t`). Sequence `i` is the base-`V` number
`i = sum_t y_t V**(L-1-t)`, so its prefix of length `t` has index `i // V**(L-t)` at level `t`.

An episode of several turns (`TabularProblem.make(turns=2, env=...)`) gives some positions to the
environment: there the next token comes from the environment's table `env_logp[t]` whatever the policy
holds, as a tool's result or a test's feedback follows the policy's turn. A deterministic environment
answers each history with one token (the others have probability 0, and the sequences holding them
never occur); a stochastic one draws it. The soft optimum then takes an expectation at the
environment's positions and a log-sum-exp at the policy's (`optimal_q`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
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
    env_logp: dict[int, Tensor] = field(default_factory=dict)  # level t -> the environment's [V**t, V] log-probs

    @classmethod
    def make(
        cls,
        vocab: int = 3,
        length: int = 4,
        success_rate: float = 0.2,
        beta: float = SPO_BETA,
        ref_scale: float = 1.0,
        seed: int = 0,
        turns: int = 1,
        env: str = "deterministic",
    ) -> "TabularProblem":
        """Random reference logits ~ N(0, ref_scale^2); reward 0 (pass) on a random set of sequences
        whose reference probability first reaches `success_rate`, -1 (fail) elsewhere. `turns` > 1:
        an environment token after each policy turn but the last (`env_levels`), drawn from a random
        table: one token per history (`env` "deterministic") or softmax(N(0, 1)) ("stochastic")."""
        check_beta(beta)
        if vocab < 2 or length < 1:
            raise ValueError(f"need vocab >= 2 and length >= 1, got vocab={vocab}, length={length}")
        if not 0 < success_rate < 1:
            raise ValueError(f"success_rate must be in (0, 1), got success_rate={success_rate}")
        if env not in ENVIRONMENTS:
            raise ValueError(f"env must be one of {', '.join(ENVIRONMENTS)}, got env={env!r}")
        levels = env_levels(length, turns)
        g = torch.Generator().manual_seed(seed)
        ref = [ref_scale * torch.randn(vocab**t, vocab, generator=g, dtype=torch.float64) for t in range(length)]
        env_logp = {}
        for t in levels:
            if env == "deterministic":
                answer = torch.randint(vocab, (vocab**t,), generator=g)
                env_logp[t] = torch.full((vocab**t, vocab), -math.inf, dtype=torch.float64)
                env_logp[t][torch.arange(vocab**t), answer] = 0.0
            else:
                env_logp[t] = torch.log_softmax(torch.randn(vocab**t, vocab, generator=g, dtype=torch.float64), -1)
        p0 = cls(vocab, length, beta, ref, torch.empty(0), env_logp).seq_logp(ref).exp()
        order = torch.randperm(p0.shape[0], generator=g)
        order = order[p0[order] > 0]  # a sequence the environment never gives is never scored
        passing = order[: int((p0[order].cumsum(0) < success_rate).sum()) + 1]
        reward = -torch.ones_like(p0)
        reward[passing] = 0.0
        return cls(vocab, length, beta, ref, reward, env_logp)

    def with_reference(self, logits: list[Tensor]) -> "TabularProblem":
        """The same problem (rewards, environment) with `logits` as its reference: what SPO optimises
        after its reference moves to a snapshot of the policy."""
        return TabularProblem(self.vocab, self.length, self.beta, [x.detach().clone() for x in logits], self.reward,
                              self.env_logp)

    def mirror_descent_seq_logp(self, k: int) -> Tensor:
        """`log pi_k(y) = log pi0(y) + k r(y) / beta - log Z_k`: `[N]`. Where each reference is the soft
        optimum against the one before, `pi_k ~ pi_(k-1) exp(r / beta)` (mirror descent on the
        KL-regularised objective, step 1 / beta), so after k moves the policy is pi0 tilted k times as
        hard: the same fixed point as one optimum at beta / k. Deterministic environments (with a
        stochastic one a single optimum is not of this form: `optimal_seq_logp`)."""
        if self.stochastic:
            raise ValueError("the closed form holds with a deterministic environment (or none)")
        logp = self.seq_logp(self.ref_logits) + k * self.reward / self.beta
        return logp - torch.logsumexp(logp, 0)

    @property
    def policy_mask(self) -> Tensor:
        """`[L]`: 1 at the policy's positions, 0 at the environment's."""
        mask = torch.ones(self.length, dtype=torch.float64)
        mask[list(self.env_logp)] = 0.0
        return mask

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
        """Full next-token log-distributions at every position of every sequence: `[N, L, V]` (the
        environment's at its positions, whatever `logits` hold there)."""
        return torch.stack(
            [self.env_logp.get(t, torch.log_softmax(logits[t], -1))[self.prefix_indices[t]] for t in range(self.length)],
            dim=1)

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
        """`V*(x) = beta log E_pi0[exp(r/beta)]`, also the exact `Q0_hat` (with a stochastic environment,
        the soft value of the root of `optimal_q`, which is no longer that)."""
        return self.beta * self.log_z.item() if not self.stochastic else self.optimal_q()[0].item()

    @property
    def stochastic(self) -> bool:
        """Whether the environment draws (rather than answers each history with one token)."""
        return any(bool(((p > -math.inf).sum(-1) > 1).any()) for p in self.env_logp.values())

    @property
    def success_rate(self) -> float:
        """Reference probability of the passing sequences (reward 0)."""
        return self.seq_logp(self.ref_logits).exp()[self.reward == 0].sum().item()

    @cached_property
    def optimal_seq_logp(self) -> Tensor:
        """`log pi*(y) = log pi0(y) + r(y)/beta - log Z`: `[N]` (-inf where the environment never gives y;
        with a stochastic environment, the product of `optimal_logits`' turns and the environment's draws)."""
        if self.stochastic:
            return self.seq_logp(self.optimal_logits())
        return self.seq_logp(self.ref_logits) + self.reward / self.beta - self.log_z

    def optimal_q(self) -> list[Tensor]:
        """Exact soft Q per level, t = 0..L, level t `[V**t]`: `Q*_t(p) = beta log E_pi0[exp(Q*_{t+1}/beta) | p]`
        where the policy moves, `E_env[Q*_{t+1} | p]` where the environment does (an expectation, not a
        log-sum-exp: the policy does not choose the environment's token). With no environment, or a
        deterministic one, `Q*_t(p) = beta log E_pi0[exp(r/beta) | p]`."""
        q = [self.reward.clone()]  # level L: Q*_L = r
        for t in reversed(range(self.length)):
            after = q[-1].view(-1, self.vocab)  # [V**t, V]
            if t in self.env_logp:
                p = self.env_logp[t].exp()
                q.append((p * torch.where(p > 0, after, torch.zeros_like(after))).sum(-1))
            else:
                ref = torch.log_softmax(self.ref_logits[t], -1)  # [V**t, V]
                q.append(self.beta * torch.logsumexp(ref + after / self.beta, -1))
        return q[::-1]

    def optimal_logits(self) -> list[Tensor]:
        """Logit tables of pi*: `log pi0(a|p) + Q*_{t+1}(p + a) / beta` (softmax normalises)."""
        q = self.optimal_q()
        return [
            torch.log_softmax(self.ref_logits[t], -1) + q[t + 1].view(-1, self.vocab) / self.beta
            for t in range(self.length)
        ]

    def kl_to_optimal(self, logits: list[Tensor]) -> float:
        """`KL(pi || pi*)`, exactly (floored at 0: near pi* the float64 sum can round to -1e-16), over the
        sequences that occur (the environment's factors cancel)."""
        logp = self.seq_logp(logits)
        return max(expectation(logp, logp - self.optimal_seq_logp).item(), 0.0)

    def kl_to_reference(self, logits: list[Tensor]) -> Tensor:
        """`KL(pi || pi0)` (differentiable)."""
        logp = self.seq_logp(logits)
        return expectation(logp, logp - self.seq_logp(self.ref_logits))

    def expected_reward(self, logits: list[Tensor]) -> float:
        return (self.seq_logp(logits).exp() * self.reward).sum().item()


ENVIRONMENTS = ("deterministic", "stochastic")


def env_levels(length: int, turns: int) -> list[int]:
    """The environment's positions of an episode of `turns` policy turns in `length` tokens: one token
    after each policy turn but the last, the policy's `length - turns + 1` tokens split as evenly as
    can be (turns 2, length 5: policy 0-1, environment 2, policy 3-4)."""
    if turns < 1 or length < 2 * turns - 1:
        raise ValueError(f"{turns} turns need at least {2 * turns - 1} tokens (one a turn and one environment "
                         f"token between turns), got length={length}")
    policy = length - (turns - 1)
    sizes = [policy // turns + (i < policy % turns) for i in range(turns)]
    return [sum(sizes[: i + 1]) + i for i in range(turns - 1)]


def expectation(logp: Tensor, value: Tensor) -> Tensor:
    """`sum_y p(y) value(y)` over the sequences of probability > 0 (where `value` may be inf or nan)."""
    occurs = logp > -math.inf
    return (logp.exp() * torch.where(occurs, value, torch.zeros_like(value))).sum()
