"""GRPO: group-normalised advantages, clipped ratio, k3 KL penalty to the reference."""

from __future__ import annotations

import torch
from torch import Tensor

from softrl.algorithms.common import (check_group_size, check_tokens, clipped_surrogate, importance_weighted, reduce,
                                      reduce_tokens)


def group_advantages(reward: Tensor, group_size: int, scale: bool = True, eps: float = 1e-6) -> Tensor:
    """`(r - mean_group) / (std_group + eps)` (sample std), or only centred when `scale=False`: `[B]`."""
    groups = check_group_size(group_size, reward.shape[0])
    r = reward.view(groups, group_size)  # [G, n]
    centred = r - r.mean(-1, keepdim=True)
    if scale:
        centred = centred / (r.std(-1, keepdim=True) + eps)
    return centred.view(-1)


def k3_kl(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """Schulman's k3 estimator of KL(pi || pi0) per token: `exp(d) - d - 1`, `d = log pi0 - log pi`."""
    d = ref_logp - logp
    return torch.exp(d) - d - 1


def grpo_loss(
    logp: Tensor,
    old_logp: Tensor,
    ref_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    beta: float,
    clip: float = 0.2,
    token_reduction: str = "mean",
    weights: Tensor | None = None,
    is_weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Per token `w_t * (-min(rho A, clip(rho) A) + beta * k3)`, averaged over each response's tokens
    (`token_reduction='mean'`, as in the GRPO paper), then over trajectories. advantages `[B]`;
    `is_weights` `[B, T]`: detached importance weights for rows of another policy (default 1)."""
    if beta < 0:
        raise ValueError(f"beta must be >= 0 for GRPO, got beta={beta!r}")
    check_tokens(mask, logp=logp, old_logp=old_logp, ref_logp=ref_logp)
    kl = k3_kl(logp, ref_logp)
    per_token = clipped_surrogate(logp, old_logp, advantages[:, None].expand_as(logp), clip) + beta * kl
    per_token = importance_weighted(per_token, mask, is_weights)
    metrics = {"grpo/k3_kl": reduce(reduce_tokens(kl, mask, "sum").detach(), weights).detach()}
    return reduce(reduce_tokens(per_token, mask, token_reduction), weights), metrics
