"""Shared tensor helpers for every objective: argument checks, masks, log1mexp, leave-one-out.

Conventions used throughout `softrl.algorithms`:
- per-token tensors are `[B, T]` (B trajectories, T response positions), with a float or bool
  `mask` `[B, T]` that is 1 on real response tokens and 0 on padding;
- per-trajectory tensors are `[B]`;
- group estimators (AGRO, RLOO, GRPO, KL-PG) take `group_size = n`: the batch holds `B / n`
  prompts with their `n` responses next to each other (`[y_1^1..y_1^n, y_2^1..]`).
Objectives return a per-trajectory loss `[B]`; `reduce` turns it into a scalar, optionally
weighted (the tabular ground truth weights trajectories by their exact probability).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

SPO_BETA = 1.0 / math.log(100_000)  # the SPO paper's default beta, ~0.0869


def violates(condition: Tensor) -> bool:
    """Whether any entry of a value check's `condition` is true. Read on the host only: on an
    accelerator the read would make the host wait for the device once per micro-batch (softrl's own
    data is checked where it enters, on the host)."""
    return condition.device.type == "cpu" and bool(condition.any())


def check_beta(beta: float) -> float:
    if not isinstance(beta, (int, float)) or not math.isfinite(beta) or beta <= 0:
        raise ValueError(f"beta must be a finite number > 0, got beta={beta!r}")
    return float(beta)


def check_shape(name: str, x: Tensor, shape: tuple[int, ...] | torch.Size) -> None:
    if tuple(x.shape) != tuple(shape):
        raise ValueError(f"{name} has shape {tuple(x.shape)}, expected {tuple(shape)}")


def check_tokens(mask: Tensor, **tensors: Tensor) -> tuple[int, int]:
    """Every per-token tensor must have the mask's `[B, T]` shape; returns (B, T)."""
    if mask.dim() != 2:
        raise ValueError(f"mask must be [B, T], got shape {tuple(mask.shape)}")
    for name, x in tensors.items():
        check_shape(name, x, mask.shape)
    return mask.shape[0], mask.shape[1]


def check_group_size(group_size: int, batch: int, minimum: int = 2) -> int:
    if not isinstance(group_size, int) or group_size < minimum:
        raise ValueError(f"group_size must be an integer >= {minimum}, got group_size={group_size!r}")
    if batch % group_size:
        raise ValueError(f"batch of {batch} trajectories is not a multiple of group_size={group_size}")
    return batch // group_size


def masked_sum(x: Tensor, mask: Tensor) -> Tensor:
    """Sum over the last (token) axis of the real tokens: `[B, T] -> [B]`."""
    return (x * mask).sum(-1)


def masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    """Mean over the real tokens of each trajectory: `[B, T] -> [B]` (0 for an empty response)."""
    return masked_sum(x, mask) / mask.sum(-1).clamp_min(1)


def reverse_cumsum(x: Tensor) -> Tensor:
    """`out[..., t] = sum_{s >= t} x[..., s]` along the last axis."""
    return x.flip(-1).cumsum(-1).flip(-1)


def log1mexp(x: Tensor) -> Tensor:
    """Stable `log(1 - exp(x))` for `x <= 0` (Maechler's two-branch form)."""
    return torch.where(x > -math.log(2.0), torch.log(-torch.expm1(x)), torch.log1p(-torch.exp(x)))


def leave_one_out_mean(values: Tensor, group_size: int) -> Tensor:
    """`b_i = mean_{j != i} v_j` within each group of `group_size` consecutive entries: `[B] -> [B]`."""
    groups = check_group_size(group_size, values.shape[0])
    v = values.view(groups, group_size)  # [G, n]
    return ((v.sum(-1, keepdim=True) - v) / (group_size - 1)).view(-1)


def leave_one_out_var(values: Tensor, group_size: int) -> Tensor:
    """Unbiased sample variance of the other `n - 1` entries of each group: `[B] -> [B]` (needs n >= 3)."""
    groups = check_group_size(group_size, values.shape[0], minimum=3)
    v = values.view(groups, group_size)  # [G, n]
    # others[i] = every index but i, made on the device (a host list copied there would wait for it)
    k = torch.arange(group_size - 1, device=values.device)[None, :]  # [1, n-1]
    others = k + (k >= torch.arange(group_size, device=values.device)[:, None]).long()  # [n, n-1]
    return v[:, others].var(dim=-1, unbiased=True).view(-1)  # [G, n, n-1] -> [B]


def token_kl(logits: Tensor, ref_logits: Tensor) -> Tensor:
    """Exact `KL_t = KL(pi(.|y_<t) || pi0(.|y_<t))` over the vocabulary: logits `[B, T, V]` -> `[B, T]`."""
    check_shape("ref_logits", ref_logits, logits.shape)
    logp = torch.log_softmax(logits, -1)
    return (logp.exp() * (logp - torch.log_softmax(ref_logits, -1))).sum(-1)


def clipped_surrogate(logp: Tensor, old_logp: Tensor, advantages: Tensor, clip: float) -> Tensor:
    """PPO's per-token `-min(rho * A, clip(rho, 1 - c, 1 + c) * A)`, `rho = pi / pi_old`: `[B, T]`."""
    if clip <= 0:
        raise ValueError(f"clip must be > 0, got clip={clip!r}")
    ratio = torch.exp(logp - old_logp)
    return -torch.minimum(ratio * advantages, ratio.clamp(1 - clip, 1 + clip) * advantages)


def importance_weighted(x: Tensor, mask: Tensor, is_weights: Tensor | None) -> Tensor:
    """Per-token `x * w` `[B, T]` for rows sampled by another policy (`is_weights`: detached, see
    `offpolicy.importance_weights`), or `x` itself when there are none."""
    if is_weights is None:
        return x
    check_tokens(mask, is_weights=is_weights)
    return x * is_weights


def reduce_tokens(x: Tensor, mask: Tensor, how: str) -> Tensor:
    """Per-token `[B, T]` -> per-trajectory `[B]` by `sum` or `mean` over the real tokens."""
    if how == "sum":
        return masked_sum(x, mask)
    if how == "mean":
        return masked_mean(x, mask)
    raise ValueError(f"token_reduction must be 'sum' or 'mean', got token_reduction={how!r}")


def reduce(per_trajectory: Tensor, weights: Tensor | None = None) -> Tensor:
    """Mean over trajectories, or the `weights`-weighted sum (weights need not sum to one)."""
    if weights is None:
        return per_trajectory.mean()
    check_shape("weights", weights, per_trajectory.shape)
    return (per_trajectory * weights).sum()
