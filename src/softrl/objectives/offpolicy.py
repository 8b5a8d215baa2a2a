"""CISPO and TOPR: baselines built for off-policy rows (docs/ALGORITHMS.md, "Off-policy baselines")."""

from __future__ import annotations

from typing import Literal

from pydantic import Field
from torch import Tensor

from softrl.algorithms import grpo
from softrl.algorithms.offpolicy import cispo_loss, topr_loss
from softrl.objectives.base import LossInputs, Objective, Options, register


class CISPOOptions(Options):
    algorithm: Literal["cispo"] = "cispo"
    cap: float = Field(2.0, gt=0, description="upper clip of the detached token weight pi/mu (1 + eps_high^IS; "
                       "no lower clip, as in MiniMax-M1)")
    std_eps: float = Field(1e-6, gt=0, description="added to the group's reward std")


class TOPROptions(Options):
    algorithm: Literal["topr"] = "topr"
    baseline: float = Field(0.5, description="subtracted from the reward: rows above it are positive (no importance "
                            "weight), rows below negative (weight min(pi/mu, 1))")


def cispo(o: CISPOOptions, x: LossInputs) -> tuple[Tensor, dict[str, Tensor]]:
    advantages = grpo.group_advantages(x.reward, x.group_size, eps=o.std_eps)  # [B]
    behavior_logp, known = x.behavior()
    return cispo_loss(x.logp, behavior_logp, advantages, x.mask, known, o.cap, weights=x.weights)


def topr(o: TOPROptions, x: LossInputs) -> tuple[Tensor, dict[str, Tensor]]:
    behavior_logp, known = x.behavior()
    return topr_loss(x.logp, behavior_logp, x.reward, x.mask, known, o.baseline, weights=x.weights)


register(Objective("cispo", CISPOOptions, cispo, "CISPO (MiniMax-M1): REINFORCE with group-normalised advantages "
                   "and a clipped, detached token weight pi/mu; rows without mu are skipped", min_group=2,
                   behavior=lambda o: True))
register(Objective("topr", TOPROptions, topr, "TOPR (Le Roux et al.): REINFORCE on any rows, positives without "
                   "importance weights, negatives tapered by min(pi/mu, 1) (skipped without mu)",
                   behavior=lambda o: True, behavior_every_row=False))
