"""One objective per data source: the configured algorithm applied to a (sub)batch's forward pass.
The math lives in `softrl.algorithms`; this only hands each loss the tensors it asks for."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from softrl.algorithms import agro, grpo, ppo, rloo, spo
from softrl.algorithms.common import token_kl
from softrl.config import ObjectiveConfig


@dataclass
class Forward:
    """What the learner computed for a (sub)batch: `[B, T]` tensors unless noted."""

    logp: Tensor  # policy, with gradients
    ref_logp: Tensor
    mask: Tensor
    log_dist: Tensor | None = None  # [B, T, V] policy log-distributions (token KL, g3)
    ref_log_dist: Tensor | None = None
    values: Tensor | None = None  # PPO's value model, with gradients


def needs_distributions(cfg: ObjectiveConfig) -> bool:
    return (cfg.algorithm in ("agro-off", "agro-on") and cfg.estimator == "g3") or (
        cfg.algorithm == "kl-pg" and cfg.kl == "token")


def old_logp(fw: Forward, batch) -> Tensor:
    """pi_old for the clipped ratio: the behaviour log-probs where the sample was drawn at temperature 1
    (stale rollouts get their importance weight), else the current policy (one update per rollout)."""
    current = fw.logp.detach()
    behavior = batch.behavior_logp[:, : current.shape[1]]
    return current.where(~batch.has_behavior[:, None], behavior)


def objective_loss(cfg: ObjectiveConfig, fw: Forward, batch, beta: float, group_size: int) -> tuple[Tensor, dict]:
    """(loss, metrics) of `cfg.algorithm` on `batch` (a Batch), rows of a group contiguous."""
    kl_t = token_kl(fw.log_dist, fw.ref_log_dist) if needs_distributions(cfg) else None
    if cfg.algorithm == "spo":
        # SPO's cross-entropy losses read exp(r / beta) as a probability, so r <= 0: 0 solved, -1 failed
        return spo.spo_loss(fw.logp, fw.ref_logp, fw.mask, batch.reward - 1, batch.q0, beta, terminal=cfg.terminal,
                            reverse=cfg.reverse, advantage=cfg.advantage, mc=cfg.mc, loss=cfg.loss, eps=cfg.eps,
                            mc_positions=batch.mc_positions, mc_target_prob=batch.mc_target_prob,
                            mc_mask=batch.mc_mask)
    if cfg.algorithm == "agro-off":
        return agro.agro_off_policy_loss(fw.logp, fw.ref_logp, fw.mask, batch.reward, beta, group_size,
                                         cfg.estimator, kl_t)
    if cfg.algorithm == "agro-on":
        return agro.agro_on_policy_loss(fw.logp, fw.ref_logp, fw.mask, batch.reward, beta, group_size,
                                        cfg.estimator, kl_t)
    if cfg.algorithm == "kl-pg":
        return agro.kl_pg_loss(fw.logp, fw.ref_logp, fw.mask, batch.reward, beta, group_size, cfg.kl, kl_t)
    if cfg.algorithm == "rloo":
        return rloo.rloo_loss(fw.logp, fw.ref_logp, fw.mask, batch.reward, beta, group_size)
    if cfg.algorithm == "grpo":
        advantages = grpo.group_advantages(batch.reward, group_size)
        return grpo.grpo_loss(fw.logp, old_logp(fw, batch), fw.ref_logp, advantages, fw.mask, beta, cfg.clip)
    if cfg.algorithm == "ppo":
        if fw.values is None:
            raise ValueError("ppo needs the value model's values")
        old, old_values = old_logp(fw, batch), fw.values.detach()
        advantages, returns = ppo.ppo_advantages(old, fw.ref_logp, old_values, batch.reward, fw.mask, beta, cfg.lam)
        return ppo.ppo_loss(fw.logp, old, fw.values, old_values, advantages, returns, fw.mask, cfg.clip,
                            value_coef=cfg.value_coef)
    raise ValueError(f"unknown algorithm {cfg.algorithm!r}")
