"""The baselines people know: PPO, GRPO, Dr. GRPO, RLOO (docs/ALGORITHMS.md, "Baselines"), each with
truncated importance sampling for rows of an older or another policy (`is_correction`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field
from torch import Tensor

from softrl.algorithms import grpo, ppo, rloo
from softrl.algorithms.offpolicy import Correction, importance_weights, truncated_fraction
from softrl.objectives.base import LossInputs, Objective, Options, register

CLIP_HELP = "ratio clip"


class ISCorrection(Options):
    """Truncated importance sampling (Yao et al. 2025) for rows sampled by a policy mu other than the
    one trained (stale online rollouts, the reference's samples, an earlier run's)."""

    is_correction: Correction = Field(
        "none", description="importance weight pi/mu of each row: none (rows count as on-policy), "
        "token_truncate, token_mask, sequence_truncate or sequence_mask; rows without mu's log-probs are skipped")
    is_cap: float = Field(2.0, gt=0, description="C of is_correction: weights truncated at C, or tokens / rows beyond "
                          "C masked (2, as TRL's and verl's defaults)")


def is_weights(o: ISCorrection, x: LossInputs) -> Tensor | None:
    """The detached weights `[B, T]` the options ask for, or None (no correction)."""
    if o.is_correction == "none":
        return None
    behavior_logp, known = x.behavior()  # pi_old / mu: the loss's own ratio pi / pi_old does the rest
    return importance_weights(x.old_logp, behavior_logp, x.mask, known, o.is_correction, o.is_cap)


def with_tis_metrics(o: ISCorrection, x: LossInputs, result: tuple[Tensor, dict[str, Tensor]]
                     ) -> tuple[Tensor, dict[str, Tensor]]:
    """`result` (loss, metrics) with the share of tokens whose weight was truncated or masked, if corrected."""
    if o.is_correction == "none":
        return result
    behavior_logp, known = x.behavior()
    fraction = truncated_fraction(x.old_logp, behavior_logp, x.mask, known, o.is_correction, o.is_cap)
    return result[0], {**result[1], "tis/clipped_fraction": fraction}


def corrected(o: ISCorrection) -> bool:
    return o.is_correction != "none"


class PPOOptions(ISCorrection):
    algorithm: Literal["ppo"] = "ppo"
    clip: float = Field(0.2, gt=0, description=CLIP_HELP)
    value_coef: float = Field(0.5, ge=0, description="value-loss weight")
    lam: float = Field(0.95, ge=0, le=1, description="GAE lambda")


class GRPOOptions(ISCorrection):
    algorithm: Literal["grpo"] = "grpo"
    clip: float = Field(0.2, gt=0, description=CLIP_HELP)
    std_eps: float = Field(1e-6, gt=0, description="added to the group's reward std (TRL: 1e-4)")


class DrGRPOOptions(ISCorrection):
    algorithm: Literal["dr-grpo"] = "dr-grpo"
    clip: float = Field(0.2, gt=0, description=CLIP_HELP)
    length: float = Field(256.0, gt=0, description="constant each response's token sum is divided by "
                          "(Dr. GRPO uses the generation budget: set it to sampling.max_new_tokens)")


class RLOOOptions(ISCorrection):
    algorithm: Literal["rloo"] = "rloo"


def ppo_loss(o: PPOOptions, x: LossInputs) -> tuple[Tensor, dict[str, Tensor]]:
    if x.values is None or x.old_values is None:
        raise ValueError("ppo needs the value model's values")
    advantages, returns = ppo.ppo_advantages(x.old_logp, x.ref_logp, x.old_values, x.reward, x.mask, x.beta, o.lam)
    return with_tis_metrics(o, x, ppo.ppo_loss(x.logp, x.old_logp, x.values, x.old_values, advantages, returns, x.mask,
                                               o.clip, value_coef=o.value_coef, weights=x.weights,
                                               is_weights=is_weights(o, x)))


def grpo_loss(o: GRPOOptions, x: LossInputs) -> tuple[Tensor, dict[str, Tensor]]:
    advantages = grpo.group_advantages(x.reward, x.group_size, eps=o.std_eps)  # [B]
    return with_tis_metrics(o, x, grpo.grpo_loss(x.logp, x.old_logp, x.ref_logp, advantages, x.mask, x.beta, o.clip,
                                                 weights=x.weights, is_weights=is_weights(o, x)))


def dr_grpo_loss(o: DrGRPOOptions, x: LossInputs) -> tuple[Tensor, dict[str, Tensor]]:
    """Dr. GRPO (Liu et al. 2025): GRPO's advantage only centred (no division by the group's std, which
    up-weights near-uniform groups) and each response's token sum divided by one constant (dividing by
    its own length favours long wrong answers)."""
    advantages = grpo.group_advantages(x.reward, x.group_size, scale=False)  # [B]
    loss, metrics = grpo.grpo_loss(x.logp, x.old_logp, x.ref_logp, advantages, x.mask, x.beta, o.clip,
                                   token_reduction="sum", weights=x.weights, is_weights=is_weights(o, x))
    return with_tis_metrics(o, x, (loss / o.length, metrics))


def rloo_loss(o: RLOOOptions, x: LossInputs) -> tuple[Tensor, dict[str, Tensor]]:
    return with_tis_metrics(o, x, rloo.rloo_loss(x.logp, x.ref_logp, x.mask, x.reward, x.beta, x.group_size,
                                                 weights=x.weights, is_weights=is_weights(o, x)))


register(Objective("ppo", PPOOptions, ppo_loss, "PPO with a value model, GAE and the KL folded into the "
                   "reward; this run's rollouts only", data="online", value_model=True, behavior=corrected))
register(Objective("grpo", GRPOOptions, grpo_loss, "GRPO: group-normalised advantages, clipped ratio, "
                   "k3 KL penalty", data="on-policy", min_group=2, behavior=corrected))
register(Objective("dr-grpo", DrGRPOOptions, dr_grpo_loss, "Dr. GRPO: GRPO without the std scaling, token "
                   "sums over a constant length", data="on-policy", min_group=2, behavior=corrected))
register(Objective("rloo", RLOOOptions, rloo_loss, "REINFORCE leave-one-out with the KL folded into the "
                   "reward (= off-policy AGRO with g1)", min_group=2, behavior=corrected))
