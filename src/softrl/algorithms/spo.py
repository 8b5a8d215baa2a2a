"""SPO: Soft Policy Optimization (docs/ALGORITHMS.md, "SPO").

The policy is a soft Q-function through the cumulative Q-parameterisation
    A_t = beta * (log pi(y_t|y_<t) - log pi0(y_t|y_<t)),   Q_t = Q0_hat + sum_{s<=t} A_s,
and every objective regresses some Q_t onto a target. No importance weights and no behaviour
log-probs appear: any trajectory from any source is valid data.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from softrl.algorithms.common import (
    check_beta,
    check_shape,
    check_tokens,
    log1mexp,
    masked_sum,
    reduce,
    reduce_tokens,
    reverse_cumsum,
    violates,
)

LOSS_KINDS = ("bce", "squared")


def advantages(logp: Tensor, ref_logp: Tensor, mask: Tensor, beta: float) -> Tensor:
    """`A_t = beta * (log pi_t - log pi0_t)` on real tokens, 0 on padding: `[B, T]`."""
    beta = check_beta(beta)
    check_tokens(mask, logp=logp, ref_logp=ref_logp)
    return beta * (logp - ref_logp) * mask


def cumulative_q(q0: Tensor, adv: Tensor) -> Tensor:
    """`Q_t = Q0_hat + sum_{s<=t} A_s` for `t = 0..T`: q0 `[B]`, adv `[B, T]` -> `[B, T+1]`.

    Padding has `A = 0`, so `Q[:, -1]` is `Q_T` of every trajectory whatever its length.
    """
    check_shape("q0", q0, adv.shape[:1])
    return torch.cat([q0[:, None], q0[:, None] + adv.cumsum(-1)], dim=-1)


def q0_from_rewards(rewards: Tensor, beta: float) -> Tensor:
    """`Q0_hat = beta * log mean_k exp(r_k / beta)` over the last axis `[..., K] -> [...]`, as
    `m + beta * log mean_k exp((r_k - m) / beta)` with `m = max_k r_k`: equal rewards give exactly `m`."""
    beta = check_beta(beta)
    if rewards.shape[-1] < 1:
        raise ValueError("rewards must hold at least one sample per prompt (last axis K >= 1)")
    m = rewards.max(dim=-1, keepdim=True).values  # [..., 1]
    return m.squeeze(-1) + beta * (torch.logsumexp((rewards - m) / beta, dim=-1) - math.log(rewards.shape[-1]))


Q0_CORRECTIONS = ("none", "jackknife")


def q0_from_samples(rewards: Tensor, log_w: Tensor, beta: float, correction: str = "none") -> Tensor:
    """Q0 of a reference pi0 from K samples of a policy mu, over the last axis `[..., K] -> [...]`:

        Q0_hat = beta * log (1/K) sum_k w_k exp(r_k / beta),   w_k = pi0(y_k) / mu(y_k)   (log_w = log w_k)

    (w = 1 where mu = pi0: `q0_from_rewards`). The mean inside the log is unbiased; its log is not: by
    Jensen the estimate is low on average, by about beta Var(w e^(r/beta)) / (2 K mean^2) for large K.
    `correction` "jackknife" removes that 1/K term, `K f(all) - (K - 1) mean_j f(all but y_j)` (K >= 2);
    where one rare sample carries the mean, the expansion fails and so may the correction
    (docs/ALGORITHMS.md, "A reference that moves", measures both)."""
    beta = check_beta(beta)
    if correction not in Q0_CORRECTIONS:
        raise ValueError(f"correction must be one of {', '.join(Q0_CORRECTIONS)}, got correction={correction!r}")
    check_shape("log_w", log_w, rewards.shape)
    k = rewards.shape[-1]
    terms = log_w + rewards / beta  # [..., K]
    whole = beta * (torch.logsumexp(terms, -1) - math.log(k))  # [...]
    if correction == "none" or k < 2:
        return whole
    left_out = torch.eye(k, dtype=torch.bool, device=terms.device)  # [K, K]: row j leaves y_j out
    others = terms.unsqueeze(-2).masked_fill(left_out, -math.inf)  # [..., K, K]
    leave_one_out = beta * (torch.logsumexp(others, -1) - math.log(k - 1))  # [..., K]
    return k * whole - (k - 1) * leave_one_out.mean(-1)


def success_to_prob(success: Tensor, beta: float) -> Tensor:
    """Target `exp(Q/beta)` for binary {0, -1} rewards with success rate S: `S + (1 - S) exp(-1/beta)`."""
    beta = check_beta(beta)
    if violates((success < 0) | (success > 1)):
        raise ValueError("success must be a probability in [0, 1]")
    return success + (1 - success) * math.exp(-1.0 / beta)


def value_to_prob(target: Tensor, beta: float) -> Tensor:
    """A value target read as a success probability: `p = exp(min(target / beta, 0))`."""
    return torch.exp(torch.clamp(target / beta, max=0.0))


def squared_loss(q: Tensor, target: Tensor) -> Tensor:
    """`(Q - target)^2`, in value units, elementwise."""
    return (q - target) ** 2


def log_prob_bce(log_prob: Tensor, target_prob: Tensor, eps: float = 1e-4) -> Tensor:
    """BCE between a predicted log-probability `y_hat` and a target probability `p`, elementwise:

        L = p * relu(-y_hat) - (1 - p) * log(1 - exp(y_c)),   y_c = min(y_hat, -eps)

    `y_c` is clipped on the forward pass only (straight-through gradient), so a prediction above
    log 1 still gets the strong downward push of the second term.
    """
    if eps <= 0:
        raise ValueError(f"eps must be > 0, got eps={eps!r}")
    y_c = log_prob - (log_prob - log_prob.clamp(max=-eps)).detach()
    return target_prob * torch.relu(-log_prob) - (1 - target_prob) * log1mexp(y_c)


def q_regression(q: Tensor, target: Tensor, beta: float, loss: str, eps: float) -> Tensor:
    """One regression of `Q` onto a value target, elementwise: squared, or BCE in log-probability units."""
    if loss == "squared":
        return squared_loss(q, target)
    if loss == "bce":
        return log_prob_bce(q / beta, value_to_prob(target, beta), eps)
    raise ValueError(f"loss must be one of {LOSS_KINDS}, got loss={loss!r}")


def _check_bce_reward(reward: Tensor, loss: str) -> None:
    if loss == "bce" and violates(reward > 0):
        raise ValueError(
            f"reward must be <= 0 for the BCE loss (exp(r/beta) is read as a probability); "
            f"got max reward {reward.max().item():.4g}: shift rewards in [0, 1] by -1"
        )


def terminal_q_loss(q: Tensor, reward: Tensor, beta: float, loss: str = "bce", eps: float = 1e-4) -> Tensor:
    """Terminal Q-regression, the paper's main SPO: `L(Q_T, r)`. q `[B, T+1]`, reward `[B]` -> `[B]`."""
    beta = check_beta(beta)
    check_shape("reward", reward, q.shape[:1])
    _check_bce_reward(reward, loss)
    return q_regression(q[:, -1], reward, beta, loss, eps)


def reverse_q_loss(
    q: Tensor,
    adv: Tensor,
    reward: Tensor,
    mask: Tensor,
    beta: float,
    loss: str = "bce",
    eps: float = 1e-4,
    token_reduction: str = "sum",
) -> Tensor:
    """Non-terminal reverse-Q targets: `sum_t L(Q_t, R_t)`, `R_t = stopgrad(r - sum_{s>t} A_s)`, t = 1..T.

    q `[B, T+1]`, adv `[B, T]`, reward `[B]`, mask `[B, T]` -> `[B]`.
    """
    beta = check_beta(beta)
    check_tokens(mask, adv=adv)
    check_shape("q", q, (adv.shape[0], adv.shape[1] + 1))
    check_shape("reward", reward, adv.shape[:1])
    _check_bce_reward(reward, loss)
    later = reverse_cumsum(adv) - adv  # [B, T]: sum_{s>t} A_s
    targets = (reward[:, None] - later).detach()  # [B, T]
    return reduce_tokens(q_regression(q[:, 1:], targets, beta, loss, eps), mask, token_reduction)


def advantage_bce_loss(log_ratio: Tensor, reward: Tensor, q0: Tensor, beta: float) -> Tensor:
    """Sigmoid-warped advantage regression: `BCEWithLogits(z, sigmoid(z*))`, `z = l`, `z* = (r - Q0_hat)/beta`.

    log_ratio `[B]` is the sequence log-ratio `l = sum_t A_t / beta`; reward, q0 `[B]` -> `[B]`.
    """
    beta = check_beta(beta)
    check_shape("reward", reward, log_ratio.shape)
    check_shape("q0", q0, log_ratio.shape)
    target = torch.sigmoid((reward - q0) / beta)
    return torch.nn.functional.binary_cross_entropy_with_logits(log_ratio, target, reduction="none")


def mc_target_loss(
    q: Tensor,
    positions: Tensor,
    target_prob: Tensor,
    target_mask: Tensor,
    beta: float,
    loss: str = "bce",
    eps: float = 1e-4,
) -> Tensor:
    """Monte-Carlo targets at annotated prefixes: `sum_m L(Q_{t_m}, p_m)` with `p = E[exp(r/beta)]`.

    q `[B, T+1]`; positions `[B, M]` prefix lengths `t_m` (0..T); target_prob `[B, M]` the target
    `exp(Q_t/beta)` (see `success_to_prob`); target_mask `[B, M]` marks real annotations -> `[B]`.
    BCE compares `Q_t/beta` with `p` (unbiased in p); squared compares `Q_t` with `beta * log p`.
    """
    beta = check_beta(beta)
    check_shape("target_prob", target_prob, positions.shape)
    check_shape("target_mask", target_mask, positions.shape)
    if violates((positions < 0) | (positions >= q.shape[1])):
        raise ValueError(f"positions must lie in 0..{q.shape[1] - 1} (prefix lengths)")
    if violates((target_prob < 0) | (target_prob > 1)):
        raise ValueError("target_prob must be a probability in [0, 1]")
    q_at = q.gather(1, positions.long())  # [B, M]
    if loss == "bce":
        per = log_prob_bce(q_at / beta, target_prob, eps)
    elif loss == "squared":
        per = squared_loss(q_at, beta * torch.log(target_prob.clamp_min(1e-30)))
    else:
        raise ValueError(f"loss must be one of {LOSS_KINDS}, got loss={loss!r}")
    return masked_sum(per, target_mask)


def spo_loss(
    logp: Tensor,
    ref_logp: Tensor,
    mask: Tensor,
    reward: Tensor,
    q0: Tensor,
    beta: float,
    *,
    terminal: float = 1.0,
    reverse: float = 0.0,
    advantage: float = 0.0,
    mc: float = 0.0,
    loss: str = "bce",
    eps: float = 1e-4,
    token_reduction: str = "sum",
    mc_positions: Tensor | None = None,
    mc_target_prob: Tensor | None = None,
    mc_mask: Tensor | None = None,
    weights: Tensor | None = None,
    is_weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Weighted combination of the SPO objectives, reduced over trajectories.

    logp, ref_logp, mask `[B, T]`; reward, q0 `[B]`; `terminal`, `reverse`, `advantage`, `mc`
    weigh the four objectives; `token_reduction` (sum | mean) reduces the reverse-Q terms within a
    trajectory; `weights` `[B]` optionally replaces the mean over trajectories; `is_weights` `[B]`
    (detached) multiply each trajectory's loss, not the metrics.
    """
    beta = check_beta(beta)
    for name, w in (("terminal", terminal), ("reverse", reverse), ("advantage", advantage), ("mc", mc)):
        if w < 0:
            raise ValueError(f"objective weight {name} must be >= 0, got {name}={w!r}")
    adv = advantages(logp, ref_logp, mask, beta)  # [B, T]
    q = cumulative_q(q0, adv)  # [B, T+1]
    parts: dict[str, Tensor] = {}
    if terminal:
        parts["terminal"] = terminal * terminal_q_loss(q, reward, beta, loss, eps)
    if reverse:
        parts["reverse"] = reverse * reverse_q_loss(q, adv, reward, mask, beta, loss, eps, token_reduction)
    if advantage:
        parts["advantage"] = advantage * advantage_bce_loss(adv.sum(-1) / beta, reward, q0, beta)
    if mc:
        if mc_positions is None or mc_target_prob is None:
            raise ValueError("mc > 0 needs mc_positions and mc_target_prob")
        keep = torch.ones_like(mc_target_prob) if mc_mask is None else mc_mask
        parts["mc"] = mc * mc_target_loss(q, mc_positions, mc_target_prob, keep, beta, loss, eps)
    if not parts:
        raise ValueError("spo_loss needs at least one objective with weight > 0")
    per_trajectory = torch.stack(list(parts.values())).sum(0)  # [B]
    metrics = {f"loss/{k}": reduce(v, weights).detach() for k, v in parts.items()}
    metrics["spo/q_terminal_minus_r"] = reduce((q[:, -1] - reward).abs().detach(), weights)
    # passed rows at their target, Q_T >= 0 (pi/pi0 >= 1/S): the terminal loss lifts them no higher, so the
    # pass rate grows only through the successes not sampled yet and the failures pushed down
    metrics["spo/passed_at_cap"] = reduce(((q[:, -1].detach() >= 0) & (reward >= 0)).to(q.dtype), weights)
    if loss == "bce":  # failed rows whose Q_T/beta is past the clip: BCE's straight-through gradient there is ~1/eps
        past = (q[:, -1].detach() / beta > -eps) & (reward < 0)
        metrics["spo/failed_past_clip"] = reduce(past.to(q.dtype), weights)
    if is_weights is not None:
        check_shape("is_weights", is_weights, per_trajectory.shape)
        per_trajectory = per_trajectory * is_weights.detach()
    return reduce(per_trajectory, weights), metrics
