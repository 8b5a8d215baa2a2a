"""RLOO as usually implemented: KL folded into the reward, leave-one-out baseline on that reward.

`r~ = r - beta * l`, advantage `r~_i - mean_{j != i} r~_j`. This is algebraically the off-policy
AGRO estimator with g1 (docs/ALGORITHMS.md); the name is kept for users who look for it.
"""

from __future__ import annotations

from torch import Tensor

from softrl.algorithms.common import (check_beta, check_shape, check_tokens, importance_weighted, leave_one_out_mean,
                                      masked_sum, reduce)


def rloo_advantages(reward: Tensor, log_ratio: Tensor, beta: float, group_size: int) -> Tensor:
    """`r~_i - mean_{j != i} r~_j` with `r~ = r - beta * l`: `[B]`."""
    check_shape("log_ratio", log_ratio, reward.shape)
    shaped = reward - check_beta(beta) * log_ratio
    return shaped - leave_one_out_mean(shaped, group_size)


def rloo_loss(
    logp: Tensor,
    ref_logp: Tensor,
    mask: Tensor,
    reward: Tensor,
    beta: float,
    group_size: int,
    weights: Tensor | None = None,
    is_weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """REINFORCE leave-one-out: surrogate `-stopgrad(A_i) * sum_t w_t log pi(y_it)` per trajectory,
    reduced; `is_weights` `[B, T]`: detached importance weights for rows of another policy (default 1)."""
    check_tokens(mask, logp=logp, ref_logp=ref_logp)
    log_ratio = masked_sum(logp - ref_logp, mask).detach()  # [B]
    adv = rloo_advantages(reward.detach(), log_ratio, beta, group_size)  # [B]
    seq_logp = masked_sum(importance_weighted(logp, mask, is_weights), mask)  # [B]
    return reduce(-adv * seq_logp, weights), {"rloo/adv_abs": adv.abs().mean().detach()}
