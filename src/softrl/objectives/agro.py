"""AGRO's registry entries and its KL-regularised policy-gradient baseline (docs/ALGORITHMS.md, "AGRO")."""

from __future__ import annotations

from typing import Literal

from pydantic import Field
from torch import Tensor

from softrl.algorithms import agro
from softrl.objectives.base import LossInputs, MovingReferenceOptions, Objective, register

Estimator = Literal["g1", "g2", "g3"]
ESTIMATOR_HELP = "regulariser-gradient estimator (g3 needs full next-token distributions)"


class AgroOffOptions(MovingReferenceOptions):
    algorithm: Literal["agro-off"] = "agro-off"
    estimator: Estimator = Field("g1", description=ESTIMATOR_HELP)


class AgroOnOptions(MovingReferenceOptions):
    algorithm: Literal["agro-on"] = "agro-on"
    estimator: Estimator = Field("g1", description=ESTIMATOR_HELP)


class KLPGOptions(MovingReferenceOptions):
    algorithm: Literal["kl-pg"] = "kl-pg"
    kl: Literal["sequence", "token"] = Field("sequence", description="KL term: sequence log-ratio, or exact token KL")


def agro_off_loss(o: AgroOffOptions, x: LossInputs) -> tuple[Tensor, dict[str, Tensor]]:
    return agro.agro_off_policy_loss(x.logp, x.ref_logp, x.mask, x.reward, x.beta, x.group_size, o.estimator,
                                     x.token_kl, weights=x.weights)


def agro_on_loss(o: AgroOnOptions, x: LossInputs) -> tuple[Tensor, dict[str, Tensor]]:
    return agro.agro_on_policy_loss(x.logp, x.ref_logp, x.mask, x.reward, x.beta, x.group_size, o.estimator,
                                    x.token_kl, weights=x.weights)


def kl_pg_loss(o: KLPGOptions, x: LossInputs) -> tuple[Tensor, dict[str, Tensor]]:
    return agro.kl_pg_loss(x.logp, x.ref_logp, x.mask, x.reward, x.beta, x.group_size, o.kl, x.token_kl,
                           weights=x.weights)


def g3(o) -> bool:
    return o.estimator == "g3"


register(Objective("agro-off", AgroOffOptions, agro_off_loss, "off-policy AGRO: equal regularised reward "
                   "across n >= 2 generations from any fixed policy", min_group=2, distributions=g3))
register(Objective("agro-on", AgroOnOptions, agro_on_loss, "on-policy AGRO: adds the likelihood-ratio term "
                   "(n >= 3 generations of the current policy)", data="on-policy", min_group=3, distributions=g3))
register(Objective("kl-pg", KLPGOptions, kl_pg_loss, "KL-regularised policy gradient with a leave-one-out "
                   "baseline (biased off-policy: AGRO's baseline)", data="on-policy", min_group=2,
                   distributions=lambda o: o.kl == "token"))
