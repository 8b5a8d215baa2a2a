"""Losses built for rollouts many updates stale: AReaL's decoupled PPO, M2PO, OAPL and GSPO
(docs/ALGORITHMS.md, "Stale-data baselines").

Notation: pi the policy trained (`logp`, with gradients), pi_prox the same policy when the batch is
learned on (`prox_logp`, detached: softrl takes one update per batch, so pi / pi_prox is 1 in value
and only its gradient counts), mu the behaviour policy that sampled each row (`behavior_logp`), known
for the rows with `has_behavior` `[B]`. All four weigh or anchor rows by mu, so a row without mu's
log-probs is skipped: it adds nothing and is not counted in the normaliser.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from softrl.algorithms.common import (check_group_size, check_shape, check_tokens, clipped_surrogate, masked_sum,
                                      reduce)
from softrl.algorithms.grpo import k3_kl
from softrl.algorithms.offpolicy import importance_weights, truncated_fraction
from softrl.algorithms.spo import q0_from_rewards


def _known_tokens(mask: Tensor, has_behavior: Tensor) -> Tensor:
    """`[B, T]` float: the real tokens of the rows with mu."""
    return mask * has_behavior[:, None].to(mask.dtype)


def _token_mean(per_token: Tensor, counted: Tensor, weights: Tensor | None) -> Tensor:
    """sum_{i,t} x_it / sum_{i,t} counted_it over the batch (with `weights`, both sums row-weighted)."""
    return reduce(masked_sum(per_token, counted), weights) / reduce(counted.sum(-1), weights).clamp_min(1e-12)


def decoupled_ppo_loss(logp: Tensor, prox_logp: Tensor, behavior_logp: Tensor, ref_logp: Tensor, advantages: Tensor,
                       mask: Tensor, has_behavior: Tensor, beta: float = 0.0, clip: float = 0.2, cap: float = 5.0,
                       weights: Tensor | None = None) -> tuple[Tensor, dict[str, Tensor]]:
    """AReaL's decoupled PPO (Fu et al. 2025, `ppo_actor_loss_fn` with `use_decoupled_loss`), with
    GRPO's group advantages and k3 penalty to pi0:

        L = sum_{i,t} w_it (-min(u_it A_i, clip(u_it, 1 - c, 1 + c) A_i) + beta k3_it) / sum_i |y_i|,
        u = pi / pi_prox,   w = (pi_prox / mu) 1[pi_prox / mu <= cap]   (detached),
    the trust region around the proximal policy, the staleness corrected by the behaviour weight; a
    token whose weight exceeds the cap is masked (weight 0) and still counted in the normaliser, as
    AReaL does. advantages `[B]`."""
    check_tokens(mask, logp=logp, prox_logp=prox_logp, behavior_logp=behavior_logp, ref_logp=ref_logp)
    check_shape("advantages", advantages, mask.shape[:1])
    counted = _known_tokens(mask, has_behavior)  # [B, T]
    w = importance_weights(prox_logp, behavior_logp, mask, has_behavior, "token_mask", cap)  # [B, T]
    surrogate = clipped_surrogate(logp, prox_logp, advantages[:, None].expand_as(logp).detach(), clip)  # [B, T]
    per_token = w * (surrogate + beta * k3_kl(logp, ref_logp))
    metrics = {"decoupled/masked_fraction": truncated_fraction(prox_logp, behavior_logp, mask, has_behavior,
                                                               "token_mask", cap),
               "decoupled/skipped_fraction": (~has_behavior).to(logp.dtype).mean()}
    return _token_mean(per_token, counted, weights), metrics


def second_moment_mask(log_ratio: Tensor, counted: Tensor, tau: float) -> Tensor:
    """M2PO's token mask `[B, T]`: the tokens with the largest squared log-ratio are dropped, largest
    first, until the mean of d^2 over the tokens kept is at most tau (none dropped if it already is).
    Tokens tied at the cut are all dropped if keeping them all would break the bound. No value is read
    on the host."""
    d2 = log_ratio.detach() ** 2  # [B, T]
    real = counted > 0
    values = torch.where(real, d2, torch.full_like(d2, math.inf)).flatten().sort().values  # the real ones first
    k = torch.arange(1, values.numel() + 1, device=values.device, dtype=values.dtype)
    keep = (values.cumsum(0) / k <= tau).sum()  # the mean of the k smallest grows with k: a prefix fits
    threshold = torch.where(keep > 0, values[(keep - 1).clamp(min=0)], values.new_tensor(-1.0))
    below = (d2 <= threshold) & real
    return torch.where(below.sum() > keep, (d2 < threshold) & real, below).to(counted.dtype)


def m2po_loss(logp: Tensor, behavior_logp: Tensor, advantages: Tensor, mask: Tensor, has_behavior: Tensor,
              tau: float = 0.04, weights: Tensor | None = None) -> tuple[Tensor, dict[str, Tensor]]:
    """M2PO (Zheng et al. 2025, arXiv 2510.01161): no clip; the second moment of the log-ratio bounded by
    masking instead,

        L = -sum_{i,t} M_it (pi / mu)_it A_i / sum_{i,t} M_it,
        M: the tokens kept by `second_moment_mask(log pi - log mu, tau)` over the whole batch,
    the ratio pi / mu = sg(pi / mu) * exp(log pi - sg(log pi)) (its value the weight, its gradient
    through log pi). The paper's budget tau = 0.04. advantages `[B]`."""
    check_tokens(mask, logp=logp, behavior_logp=behavior_logp)
    check_shape("advantages", advantages, mask.shape[:1])
    counted = _known_tokens(mask, has_behavior)  # [B, T]
    log_ratio = (logp.detach() - behavior_logp) * counted  # [B, T]
    kept = second_moment_mask(log_ratio, counted, tau)  # [B, T]
    ratio = torch.exp(log_ratio * kept) * torch.exp(logp - logp.detach())  # [B, T], 1 in value where masked
    per_token = -ratio * advantages[:, None].detach()
    metrics = {"m2po/masked_fraction": ((1 - kept) * counted).sum() / counted.sum().clamp_min(1),
               "m2po/second_moment": ((log_ratio**2).sum() / counted.sum().clamp_min(1)).detach(),
               "m2po/skipped_fraction": (~has_behavior).to(logp.dtype).mean()}
    return _token_mean(per_token, kept, weights), metrics


def oapl_loss(logp: Tensor, behavior_logp: Tensor, reward: Tensor, mask: Tensor, has_behavior: Tensor, beta: float,
              group_size: int, vstar_beta: float | None = None,
              weights: Tensor | None = None) -> tuple[Tensor, dict[str, Tensor]]:
    """OAPL (arXiv 2602.19362; NeMo RL's `OAPLLossFn`): regress the policy's log-ratio to the lagged
    policy that sampled the group onto the group's soft advantage,

        L = mean_i (beta log(pi(y_i) / mu(y_i)) - (r_i - V*))^2,   V* = beta' log mean_j exp(r_j / beta'),
    the log-ratio a sum over the response's tokens, beta' = `vstar_beta` (default beta), mean over the
    rows with mu. SPO's closest relative: anchored to mu, not to pi0, so pi moves towards
    mu exp((r - V*) / beta) each round. reward `[B]` in groups of `group_size`."""
    check_tokens(mask, logp=logp, behavior_logp=behavior_logp)
    check_shape("reward", reward, mask.shape[:1])
    known = has_behavior.to(logp.dtype)  # [B]
    groups = check_group_size(group_size, reward.shape[0])
    v_star = q0_from_rewards(reward.double().view(groups, group_size), vstar_beta or beta)  # [G]
    target = (reward - v_star.repeat_interleave(group_size).to(reward.dtype)).detach()  # [B]
    log_ratio = masked_sum(logp - behavior_logp, mask)  # [B]
    per_row = (beta * log_ratio - target) ** 2 * known
    loss = reduce(per_row, weights) / reduce(known, weights).clamp_min(1e-12)
    metrics = {"oapl/log_ratio": (log_ratio.detach() * known).sum() / known.sum().clamp_min(1),
               "oapl/skipped_fraction": 1 - known.mean()}
    return loss, metrics


def gspo_loss(logp: Tensor, behavior_logp: Tensor, advantages: Tensor, mask: Tensor, has_behavior: Tensor,
              clip_low: float = 3e-4, clip_high: float = 4e-4,
              weights: Tensor | None = None) -> tuple[Tensor, dict[str, Tensor]]:
    """GSPO (Zheng et al. 2025, arXiv 2507.18071): PPO's clip on one length-normalised sequence ratio,

        L = -mean_i min(s_i A_i, clip(s_i, 1 - c_low, 1 + c_high) A_i),
        s_i = (pi(y_i) / mu(y_i))^(1 / |y_i|) = exp(mean_t (log pi - log mu)),
    taken against the behaviour policy that sampled the row: where the clip binds (s above 1 + c_high with
    A > 0, below 1 - c_low with A < 0) a stale row gives no gradient; on the other side the unclipped
    s A still counts, its weight s as large as e^10; mean over the rows with mu. The paper's c_low 3e-4, c_high 4e-4.
    advantages `[B]`."""
    check_tokens(mask, logp=logp, behavior_logp=behavior_logp)
    check_shape("advantages", advantages, mask.shape[:1])
    known = has_behavior.to(logp.dtype)  # [B]
    length = mask.sum(-1).clamp_min(1)  # [B]
    log_s = (masked_sum(logp - behavior_logp, mask) / length).clamp(max=10.0)  # [B], verl's cap on the ratio
    s = torch.exp(log_s)
    a = advantages.detach()
    per_row = -torch.minimum(s * a, s.clamp(1 - clip_low, 1 + clip_high) * a) * known
    clipped = ((s.detach() < 1 - clip_low) | (s.detach() > 1 + clip_high)).to(logp.dtype) * known
    metrics = {"gspo/clipped_fraction": clipped.sum() / known.sum().clamp_min(1),
               "gspo/skipped_fraction": 1 - known.mean()}
    return reduce(per_row, weights) / reduce(known, weights).clamp_min(1e-12), metrics
