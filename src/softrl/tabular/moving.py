"""A reference that moves, exactly: SPO's fixed points when its reference becomes the policy after each
convergence, and the bias of a Q0 estimated online from the groups a run samples (issue 51).

Round k trains against reference pi_(k-1) (the policy of round k - 1; pi0 first) on that reference's own
samples, from pi = pi_(k-1). Its optimum is pi_(k-1) exp(r / beta) / Z, so the rounds follow the closed
form pi_k ~ pi0 exp(k r / beta) (`TabularProblem.mirror_descent_seq_logp`). Each round needs the new
reference's Q0 = beta log E_pi_(k-1)[exp(r / beta)], which no store holds: `q0` "exact" gives the true
value, "group" and "jackknife" estimate it from each group of `group_size` samples (`train.batch_q0`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from softrl.algorithms.spo import q0_from_samples
from softrl.tabular.problem import TabularProblem, expectation
from softrl.tabular.train import LossFn, train


@dataclass(frozen=True)
class Round:
    round: int
    kl_to_closed_form: float  # KL(pi_k || pi0 exp(k r / beta) / Z_k)
    kl_to_round_optimum: float  # KL(pi_k || this round's own optimum, pi_(k-1) exp(r / beta) / Z)
    reward: float  # E_pi_k[r]


def reference_rounds(problem: TabularProblem, loss: LossFn, rounds: int, *, q0: str = "exact", group_size: int = 1,
                     samples: int | None = None, steps: int = 600, lr: float = 0.3, seed: int = 0,
                     max_grad_norm: float | None = None) -> list[Round]:
    """`rounds` rounds of training `loss`, the reference moved to the policy after each (see the module)."""
    current, out = problem, []
    for k in range(1, rounds + 1):
        result = train(current, loss, data="off-policy", behaviour_logits=current.ref_logits, steps=steps, lr=lr,
                       samples=samples, group_size=group_size, seed=seed + k, max_grad_norm=max_grad_norm, q0=q0,
                       start_logits=current.ref_logits)
        logits = [x.detach() for x in result.policy.policy_parameters()]
        logp = problem.seq_logp(logits)
        out.append(Round(k, max(expectation(logp, logp - problem.mirror_descent_seq_logp(k)).item(), 0.0),
                         result.kl[-1], problem.expected_reward(logits)))
        current = problem.with_reference(logits)
    return out


def q0_bias(success: float, k: int, beta: float, correction: str = "none") -> float:
    """E[Q0_hat] - Q0 for K samples of the reference with rewards 0 (probability `success`) or -1, exactly
    (a sum over the binomial count of successes): how far a group's own estimate is from the soft value."""
    true = beta * math.log(success + (1 - success) * math.exp(-1 / beta))
    mean = 0.0
    for s in range(k + 1):
        rewards = torch.tensor([0.0] * s + [-1.0] * (k - s), dtype=torch.float64)
        estimate = q0_from_samples(rewards, torch.zeros_like(rewards), beta, correction).item()
        mean += math.comb(k, s) * success**s * (1 - success) ** (k - s) * estimate
    return mean - true
