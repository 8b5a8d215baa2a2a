"""AGRO: Any-Generation Reward Optimization (docs/ALGORITHMS.md, "AGRO").

AGRO drives the regularised reward `R(y) = r(y) - beta * l(y)` to be equal across generations:
    L_mu(pi) = E_x Var_{y~mu}[R(y)],
whose unique minimiser is pi* for any full-support mu. Every function here returns a *surrogate*
per trajectory `[B]` whose gradient is the estimator of the contract (the weights are detached).
"""

from __future__ import annotations

from torch import Tensor

from softrl.algorithms.common import (
    check_beta,
    check_group_size,
    check_shape,
    check_tokens,
    leave_one_out_mean,
    leave_one_out_var,
    masked_sum,
    reduce,
    reverse_cumsum,
)

ESTIMATORS = ("g1", "g2", "g3")


def regularised_reward(reward: Tensor, log_ratio: Tensor, beta: float) -> Tensor:
    """`R = r - beta * l`: `[B]`."""
    return reward - check_beta(beta) * log_ratio


def regulariser_surrogate(
    logp: Tensor, ref_logp: Tensor, mask: Tensor, estimator: str = "g1", token_kl: Tensor | None = None
) -> Tensor:
    """A `[B]` surrogate whose gradient estimates `E[l(y) grad log pi(y)]` (= grad KL(pi||pi0) on-policy).

    g1: `(sum_t l_t)(sum_t grad log pi_t)`;
    g2: `sum_t (sum_{s>=t} l_s) grad log pi_t` (drops terms that vanish in expectation on-policy);
    g3: `sum_t [grad KL_t + (sum_{s>t} l_s) grad log pi_t]`, with `token_kl` `[B, T]` the exact KL_t.
    """
    check_tokens(mask, logp=logp, ref_logp=ref_logp)
    l_t = ((logp - ref_logp) * mask).detach()  # [B, T]
    if estimator == "g1":
        return l_t.sum(-1) * masked_sum(logp, mask)
    if estimator == "g2":
        return masked_sum(reverse_cumsum(l_t) * logp, mask)
    if estimator == "g3":
        if token_kl is None:
            raise ValueError("estimator g3 needs token_kl, the exact per-token KL [B, T]")
        check_shape("token_kl", token_kl, mask.shape)
        return masked_sum(token_kl + (reverse_cumsum(l_t) - l_t) * logp, mask)
    raise ValueError(f"estimator must be one of {ESTIMATORS}, got estimator={estimator!r}")


def _policy_difference(
    logp: Tensor, ref_logp: Tensor, mask: Tensor, reward: Tensor, beta: float, group_size: int,
    estimator: str, token_kl: Tensor | None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Surrogate `[B]` with gradient `-(R_i - b_i) grad log pi(y_i)` (leave-one-out `b_i`), the
    regulariser's `l_i grad log pi(y_i)` replaced by the chosen token-level estimator.
    Returns (surrogate, R, R - b), the last two detached."""
    beta = check_beta(beta)
    check_tokens(mask, logp=logp, ref_logp=ref_logp)
    check_shape("reward", reward, logp.shape[:1])
    seq_logp = masked_sum(logp, mask)  # [B]
    log_ratio = masked_sum(logp - ref_logp, mask).detach()  # [B]
    reward = reward.detach()
    base_r = leave_one_out_mean(reward, group_size)  # [B]
    base_l = leave_one_out_mean(log_ratio, group_size)  # [B]
    surrogate = -(reward - base_r + beta * base_l) * seq_logp + beta * regulariser_surrogate(
        logp, ref_logp, mask, estimator, token_kl
    )
    R = regularised_reward(reward, log_ratio, beta)
    return surrogate, R, R - (base_r - beta * base_l)


def agro_off_policy_loss(
    logp: Tensor,
    ref_logp: Tensor,
    mask: Tensor,
    reward: Tensor,
    beta: float,
    group_size: int,
    estimator: str = "g1",
    token_kl: Tensor | None = None,
    weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Off-policy AGRO, n >= 2 generations per prompt from any fixed mu:

        grad ~ (1/n) sum_i (R_i - b_i) grad log pi(y_i),  b_i = mean_{j != i} R_j,

    an unbiased estimate of `Cov_mu(R, grad log pi) = -grad L_mu / (2 beta)`; the surrogate to
    minimise is `-(1/n) sum_i stopgrad(R_i - b_i) log pi(y_i)`.
    """
    check_group_size(group_size, reward.shape[0])
    surrogate, R, _ = _policy_difference(logp, ref_logp, mask, reward, beta, group_size, estimator, token_kl)
    metrics = {"agro/var_R": reduce(_group_var(R, group_size), weights).detach()}
    return reduce(surrogate, weights), metrics


def agro_on_policy_loss(
    logp: Tensor,
    ref_logp: Tensor,
    mask: Tensor,
    reward: Tensor,
    beta: float,
    group_size: int,
    estimator: str = "g1",
    token_kl: Tensor | None = None,
    weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """On-policy AGRO (mu = pi), `grad L_on / (2 beta) = (PD + LR) / (2 beta)`, n >= 3 generations:

        weight of log pi(y_i) = -stopgrad(R_i - b_i) + stopgrad((R_i - b_i)^2 - c_i) / (2 beta),

    `c_i` the unbiased sample variance of the other n - 1 values of R (so n >= 3).
    """
    beta = check_beta(beta)
    check_group_size(group_size, reward.shape[0], minimum=3)
    surrogate, R, centred = _policy_difference(logp, ref_logp, mask, reward, beta, group_size, estimator, token_kl)
    likelihood_ratio = (centred**2 - leave_one_out_var(R, group_size)) / (2 * beta)  # [B]
    surrogate = surrogate + likelihood_ratio * masked_sum(logp, mask)
    metrics = {"agro/var_R": reduce(_group_var(R, group_size), weights).detach()}
    return reduce(surrogate, weights), metrics


def kl_pg_loss(
    logp: Tensor,
    ref_logp: Tensor,
    mask: Tensor,
    reward: Tensor,
    beta: float,
    group_size: int,
    kl: str = "sequence",
    token_kl: Tensor | None = None,
    weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """KL-regularised policy gradient (AGRO's baseline), leave-one-out baseline on the reward only:

    sequence: `(1/n) sum_i [(r_i - b^r_i) - beta * l(y_i)] grad log pi(y_i)`;
    token:    `(1/n) sum_i (r_i - b^r_i) grad log pi(y_i) - beta * grad sum_t KL_t(y_i)`.
    Off-policy it does not converge to pi* (its expected gradient at pi* is not zero).
    """
    beta = check_beta(beta)
    check_tokens(mask, logp=logp, ref_logp=ref_logp)
    check_shape("reward", reward, logp.shape[:1])
    seq_logp = masked_sum(logp, mask)  # [B]
    centred_r = (reward - leave_one_out_mean(reward, group_size)).detach()  # [B]
    if kl == "sequence":
        log_ratio = masked_sum(logp - ref_logp, mask).detach()
        surrogate = -(centred_r - beta * log_ratio) * seq_logp
    elif kl == "token":
        if token_kl is None:
            raise ValueError("kl='token' needs token_kl, the exact per-token KL [B, T]")
        check_shape("token_kl", token_kl, mask.shape)
        surrogate = -centred_r * seq_logp + beta * masked_sum(token_kl, mask)
    else:
        raise ValueError(f"kl must be 'sequence' or 'token', got kl={kl!r}")
    return reduce(surrogate, weights), {}


def _group_var(values: Tensor, group_size: int) -> Tensor:
    """Per-trajectory copy of its group's population variance `[B]` (the AGRO loss value)."""
    v = values.view(-1, group_size)
    return v.var(-1, unbiased=False, keepdim=True).expand_as(v).reshape(-1)
