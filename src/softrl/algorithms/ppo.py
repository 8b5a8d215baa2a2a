"""PPO as the SPO paper compares against it: a separate value model, per-token KL-shaped reward,
GAE with gamma = 1, clipped policy and value losses (docs/ALGORITHMS.md, "PPO baseline")."""

from __future__ import annotations

import torch
from torch import Tensor

from softrl.algorithms.common import (check_beta, check_shape, check_tokens, clipped_surrogate, importance_weighted,
                                      reduce, reduce_tokens, violates)


def shaped_rewards(old_logp: Tensor, ref_logp: Tensor, reward: Tensor, mask: Tensor, beta: float) -> Tensor:
    """`-beta * (log pi_old - log pi0)` at every token plus `r` at the last real token: `[B, T]`. The mask
    may have holes (an episode's environment tokens): the last real token is the last one marked."""
    beta = check_beta(beta)
    check_tokens(mask, old_logp=old_logp, ref_logp=ref_logp)
    check_shape("reward", reward, mask.shape[:1])
    if violates(mask.sum(-1) < 1):
        raise ValueError("mask must mark at least one response token per trajectory")
    last_index = mask.shape[-1] - 1 - (mask.flip(-1) > 0).to(torch.uint8).argmax(-1)  # [B]
    per_token = -beta * (old_logp - ref_logp) * mask
    last = torch.zeros_like(per_token).scatter(1, last_index[:, None], reward[:, None].to(per_token.dtype))
    return per_token + last


def gae(rewards: Tensor, values: Tensor, mask: Tensor, gamma: float = 1.0, lam: float = 0.95) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation over right-padded responses; the value after the end is 0.

        delta_t = r_t + gamma * V_{t+1} - V_t,   A_t = delta_t + gamma * lam * A_{t+1},
    t and t+1 the policy's consecutive tokens: an unmarked token inside the response (an episode's
    environment turn) is no step of the policy's, so the recursion passes over it, as over padding.
    rewards, values, mask `[B, T]` -> (advantages, returns = advantages + values), both `[B, T]`.
    """
    check_tokens(mask, rewards=rewards, values=values)
    mask = mask.to(values.dtype)
    next_value = torch.zeros_like(values[:, 0])
    next_adv = torch.zeros_like(values[:, 0])
    adv = torch.zeros_like(values)
    for t in reversed(range(values.shape[1])):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        step = delta + gamma * lam * next_adv
        adv[:, t] = step * mask[:, t]
        marked = mask[:, t] > 0
        next_value = torch.where(marked, values[:, t], next_value)
        next_adv = torch.where(marked, step, next_adv)
    return adv, adv + values * mask


def ppo_advantages(
    old_logp: Tensor, ref_logp: Tensor, old_values: Tensor, reward: Tensor, mask: Tensor, beta: float, lam: float = 0.95
) -> tuple[Tensor, Tensor]:
    """Shaped rewards then GAE with gamma = 1, once per rollout: (advantages, returns), `[B, T]` each."""
    rewards = shaped_rewards(old_logp, ref_logp, reward, mask, beta)
    adv, returns = gae(rewards, old_values, mask, gamma=1.0, lam=lam)
    return adv.detach(), returns.detach()


def ppo_loss(
    logp: Tensor,
    old_logp: Tensor,
    values: Tensor,
    old_values: Tensor,
    advantages: Tensor,
    returns: Tensor,
    mask: Tensor,
    clip: float = 0.2,
    value_clip: float = 0.2,
    value_coef: float = 0.5,
    token_reduction: str = "sum",
    weights: Tensor | None = None,
    is_weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Clipped surrogate with ratio `pi / pi_old`, times the detached importance weights `is_weights`
    `[B, T]` of rows sampled by another policy (default 1), plus the clipped value loss
    `1/2 max((V - G)^2, (clip(V, V_old +- c) - G)^2)`."""
    check_tokens(mask, logp=logp, old_logp=old_logp, values=values, old_values=old_values,
                 advantages=advantages, returns=returns)
    surrogate = importance_weighted(clipped_surrogate(logp, old_logp, advantages, clip), mask, is_weights)
    policy = reduce_tokens(surrogate, mask, token_reduction)
    clipped_v = old_values + (values - old_values).clamp(-value_clip, value_clip)
    value = 0.5 * torch.maximum((values - returns) ** 2, (clipped_v - returns) ** 2)
    value = reduce_tokens(value, mask, token_reduction)
    ratio = torch.exp(logp - old_logp).detach()
    real = mask.float()  # a mask, not boolean indexing: that would wait for the device
    metrics = {
        "loss/policy": reduce(policy, weights).detach(),
        "loss/value": reduce(value, weights).detach(),
        "ppo/clip_fraction": (((ratio - 1).abs() > clip).float() * real).sum() / real.sum().clamp_min(1),
        "ppo/ratio_max": ratio.masked_fill(real == 0, float("-inf")).max(),
    }
    return reduce(policy + value_coef * value, weights), metrics
