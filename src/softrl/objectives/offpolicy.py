"""Baselines built for off-policy rows: CISPO and TOPR (docs/ALGORITHMS.md, "Off-policy baselines"), and
for rows many updates stale: decoupled PPO, M2PO, OAPL and GSPO ("Stale-data baselines")."""

from __future__ import annotations

from typing import Literal

from pydantic import Field
from torch import Tensor

from softrl.algorithms import grpo, stale
from softrl.algorithms.offpolicy import cispo_loss, topr_loss
from softrl.objectives.base import LossInputs, Objective, Options, register


class GroupNormalised(Options):
    """Options of the objectives with GRPO's group-normalised advantage."""

    std_eps: float = Field(1e-6, gt=0, description="added to the group's reward std")


def advantages(o: GroupNormalised, x: LossInputs) -> Tensor:
    return grpo.group_advantages(x.reward, x.group_size, eps=o.std_eps)  # [B]


class CISPOOptions(GroupNormalised):
    algorithm: Literal["cispo"] = "cispo"
    cap: float = Field(2.0, gt=0, description="upper clip of the detached token weight pi/mu (1 + eps_high^IS; "
                       "no lower clip, as in MiniMax-M1)")


class TOPROptions(Options):
    algorithm: Literal["topr"] = "topr"
    baseline: float = Field(0.5, description="subtracted from the reward: rows above it are positive (no importance "
                            "weight), rows below negative (weight min(pi/mu, 1))")


def always(options: Options) -> bool:
    """These options weigh (or anchor) rows by mu."""
    return True


def cispo(o: CISPOOptions, x: LossInputs) -> tuple[Tensor, dict[str, Tensor]]:
    behavior_logp, known = x.behavior()
    return cispo_loss(x.logp, behavior_logp, advantages(o, x), x.mask, known, o.cap, weights=x.weights)


def topr(o: TOPROptions, x: LossInputs) -> tuple[Tensor, dict[str, Tensor]]:
    behavior_logp, known = x.behavior()
    return topr_loss(x.logp, behavior_logp, x.reward, x.mask, known, o.baseline, weights=x.weights)


register(Objective("cispo", CISPOOptions, cispo, "CISPO (MiniMax-M1): REINFORCE with group-normalised advantages "
                   "and a clipped, detached token weight pi/mu; rows without mu are skipped", min_group=2,
                   behavior=always))
register(Objective("topr", TOPROptions, topr, "TOPR (Le Roux et al.): REINFORCE on any rows, positives without "
                   "importance weights, negatives tapered by min(pi/mu, 1) (skipped without mu)",
                   behavior=always, behavior_every_row=False, without_behavior="skipped when negative",
                   rewards="unit"))


# --- built for stale rollouts (algorithms/stale.py) ------------------------------------------------

class DecoupledPPOOptions(GroupNormalised):
    algorithm: Literal["decoupled-ppo"] = "decoupled-ppo"
    clip: float = Field(0.2, gt=0, description="clip of pi / pi_prox, the trust region around the proximal policy")
    cap: float = Field(5.0, gt=1, description="tokens whose behaviour weight pi_prox / mu exceeds it are masked "
                       "(AReaL's recommended 5)")


class M2POOptions(GroupNormalised):
    algorithm: Literal["m2po"] = "m2po"
    tau: float = Field(0.04, gt=0, description="bound on the batch's mean squared log-ratio (log pi - log mu)^2 "
                       "over the tokens kept: the largest are masked until it holds (the paper's 0.04)")


class OAPLOptions(Options):
    algorithm: Literal["oapl"] = "oapl"
    vstar_beta: float | None = Field(None, gt=0, description="temperature of V* = beta' log mean exp(r / beta') over "
                                     "the group (default: the run's beta; NeMo RL's example: 1 with beta 1e-3)")


class GSPOOptions(GroupNormalised):
    algorithm: Literal["gspo"] = "gspo"
    clip_low: float = Field(3e-4, gt=0, lt=1, description="lower clip of the sequence ratio (the paper's 3e-4)")
    clip_high: float = Field(4e-4, gt=0, description="upper clip of the sequence ratio (the paper's 4e-4)")


def decoupled_ppo(o: DecoupledPPOOptions, x: LossInputs) -> tuple[Tensor, dict[str, Tensor]]:
    behavior_logp, known = x.behavior()
    return stale.decoupled_ppo_loss(x.logp, x.old_logp, behavior_logp, x.ref_logp, advantages(o, x), x.mask, known,
                                    x.beta, o.clip, o.cap, weights=x.weights)


def m2po(o: M2POOptions, x: LossInputs) -> tuple[Tensor, dict[str, Tensor]]:
    behavior_logp, known = x.behavior()
    return stale.m2po_loss(x.logp, behavior_logp, advantages(o, x), x.mask, known, o.tau, weights=x.weights)


def oapl(o: OAPLOptions, x: LossInputs) -> tuple[Tensor, dict[str, Tensor]]:
    behavior_logp, known = x.behavior()
    return stale.oapl_loss(x.logp, behavior_logp, x.reward, x.mask, known, x.beta, x.group_size, o.vstar_beta,
                           weights=x.weights)


def gspo(o: GSPOOptions, x: LossInputs) -> tuple[Tensor, dict[str, Tensor]]:
    behavior_logp, known = x.behavior()
    return stale.gspo_loss(x.logp, behavior_logp, advantages(o, x), x.mask, known, o.clip_low, o.clip_high,
                           weights=x.weights)


register(Objective("decoupled-ppo", DecoupledPPOOptions, decoupled_ppo, "AReaL's decoupled PPO: the clip around "
                   "the proximal policy, the staleness corrected by pi_prox/mu (masked above a cap); rows without mu "
                   "skipped", min_group=2, behavior=always))
register(Objective("m2po", M2POOptions, m2po, "M2PO: REINFORCE with the ratio pi/mu and no clip; tokens with the "
                   "largest squared log-ratio masked until its batch mean is under tau", min_group=2, behavior=always))
register(Objective("oapl", OAPLOptions, oapl, "OAPL: regress beta log(pi/mu) onto r - V*, V* the group's soft "
                   "value: SPO's relative anchored to the lagged policy mu; rows without mu skipped", min_group=2,
                   behavior=always))
register(Objective("gspo", GSPOOptions, gspo, "GSPO: PPO's clip on the length-normalised sequence ratio "
                   "(pi/mu)^(1/|y|); rows without mu skipped", min_group=2, behavior=always))
