"""Objectives built for stale or foreign rollouts: truncated importance sampling (TIS) for the
on-policy baselines, CISPO and TOPR (docs/ALGORITHMS.md, "Off-policy baselines").

All three weigh a row by the likelihood ratio of the policy being trained to the behaviour policy
mu that sampled it, so all three need mu's log-probs. A row without them (`has_behavior` False:
human or imported data, or sampled at another temperature) gets weight 0 where its ratio would be
needed: it is skipped, never treated as on-policy.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor

from softrl.algorithms.common import check_shape, check_tokens, masked_sum, reduce

Correction = Literal["none", "token_truncate", "token_mask", "sequence_truncate", "sequence_mask"]
CORRECTIONS: tuple[str, ...] = Correction.__args__


def _log_ratios(logp: Tensor, behavior_logp: Tensor, mask: Tensor, how: str) -> Tensor:
    """`log(pi / mu)` `[B, T]` as `how` weighs it: per token, or the row's sequence sum at every token."""
    log_ratio = (logp.detach() - behavior_logp) * mask  # [B, T], 0 on padding
    return log_ratio if how.startswith("token") else log_ratio.sum(-1, keepdim=True).expand_as(mask)


def importance_weights(logp: Tensor, behavior_logp: Tensor, mask: Tensor, has_behavior: Tensor,
                       how: str, cap: float) -> Tensor:
    """Detached weights `[B, T]` for rows sampled by mu and trained as if by pi (`logp`: pi's, or PPO's
    pi_old where the loss has a ratio of its own):

        token_truncate:     w_t = min(pi(y_t|y_<t) / mu(y_t|y_<t), C)      (Yao et al. 2025)
        token_mask:         w_t = pi(y_t|y_<t) / mu(y_t|y_<t) * 1[that ratio <= C]   (AReaL's behaviour cap)
        sequence_truncate:  w_t = min(pi(y) / mu(y), C)          (the same for every token of a row)
        sequence_mask:      w_t = pi(y) / mu(y) * 1[pi(y) / mu(y) <= C]
        none:               w_t = 1 (no correction: every row, mu known or not)
    the sequence variants as TRL and verl ship them; otherwise w = 0 on a row without mu
    (`has_behavior` `[B]` False)."""
    check_tokens(mask, logp=logp, behavior_logp=behavior_logp)
    check_shape("has_behavior", has_behavior, mask.shape[:1])
    if how not in CORRECTIONS:
        raise ValueError(f"is_correction must be one of {', '.join(CORRECTIONS)}, got {how!r}")
    if how == "none":
        return torch.ones_like(logp).detach()
    if not cap > 0 or not math.isfinite(cap):
        raise ValueError(f"is_cap must be a finite number > 0, got {cap!r}")
    log_ratio = _log_ratios(logp, behavior_logp, mask, how)  # [B, T]
    log_cap = math.log(cap)
    w = log_ratio.clamp(max=log_cap).exp()  # in log space: a huge ratio never overflows
    if how.endswith("mask"):
        w = w * (log_ratio <= log_cap)  # e^1000 * 0 would be nan
    return w * has_behavior[:, None].to(w.dtype)


def truncated_fraction(logp: Tensor, behavior_logp: Tensor, mask: Tensor, has_behavior: Tensor, how: str,
                       cap: float) -> Tensor:
    """The fraction of the real tokens of rows with mu whose weight `importance_weights` truncated or
    masked (its ratio, per token or per sequence, above the cap)."""
    counted = mask * has_behavior[:, None].to(mask.dtype)  # [B, T]
    above = _log_ratios(logp, behavior_logp, mask, how) > math.log(cap)
    return (above * counted).sum() / counted.sum().clamp_min(1)


def cispo_loss(logp: Tensor, behavior_logp: Tensor, advantages: Tensor, mask: Tensor, has_behavior: Tensor,
               cap: float = 2.0, weights: Tensor | None = None) -> tuple[Tensor, dict[str, Tensor]]:
    """CISPO (MiniMax-M1, 2025): REINFORCE with a clipped, detached token importance weight,

        L = -sum_{i,t} sg(min(r_it, C)) A_i log pi(y_it | y_i<t) / sum_i |y_i|,   r_it = pi / mu,
    normalised by the tokens of the batch (the paper's token-level mean; with `weights`, the
    weighted tokens). No lower clip (the paper sets eps_low^IS large), no KL term. Unlike PPO's clip,
    a token whose ratio is beyond C still gets its gradient, only at weight C. advantages `[B]`."""
    check_tokens(mask, logp=logp, behavior_logp=behavior_logp)
    check_shape("advantages", advantages, mask.shape[:1])
    w = importance_weights(logp, behavior_logp, mask, has_behavior, "token_truncate", cap)  # [B, T]
    per_token = -w * advantages[:, None].detach() * logp  # [B, T]
    real = mask * has_behavior[:, None]  # [B, T]: the tokens that count, skipped rows left out
    tokens = reduce(real.sum(-1).to(logp.dtype), weights).clamp_min(1e-12)  # mean counted tokens per row
    loss = reduce(masked_sum(per_token, mask), weights) / tokens
    metrics = {"cispo/clipped_fraction": ((w >= cap) * real).sum() / real.sum().clamp_min(1),
               "cispo/skipped_fraction": (~has_behavior).to(logp.dtype).mean()}
    return loss, metrics


def topr_loss(logp: Tensor, behavior_logp: Tensor, reward: Tensor, mask: Tensor, has_behavior: Tensor,
              baseline: float = 0.5, weights: Tensor | None = None) -> tuple[Tensor, dict[str, Tensor]]:
    """TOPR (Le Roux et al., 2025), tapered off-policy REINFORCE on rows of any policy mu:

        L = -sum_{R_i >= 0} R_i log pi(y_i) - sum_{R_i < 0} sg(min(pi(y_i) / mu(y_i), 1)) R_i log pi(y_i),
    R = r - baseline (the paper's rewards are +-1: with r in {0, 1} and baseline 1/2 that is R / 2).
    Positive rows need no importance weight (SFT on them); a negative row without mu is skipped."""
    check_tokens(mask, logp=logp, behavior_logp=behavior_logp)
    check_shape("reward", reward, mask.shape[:1])
    advantage = (reward - baseline).detach()  # [B]
    seq_logp = masked_sum(logp, mask)  # [B]
    log_ratio = masked_sum(logp.detach() - behavior_logp, mask)  # [B]
    taper = log_ratio.clamp(max=0).exp() * has_behavior.to(logp.dtype)  # min(pi / mu, 1), 0 without mu
    positive = advantage >= 0
    w = torch.where(positive, torch.ones_like(taper), taper)  # [B]
    weighed = ~positive & has_behavior  # negative rows with mu
    metrics = {"topr/negative_weight": (w * weighed).sum() / weighed.sum().clamp_min(1),
               "topr/skipped_fraction": (~positive & ~has_behavior).to(logp.dtype).mean()}
    return reduce(-w * advantage * seq_logp, weights), metrics
