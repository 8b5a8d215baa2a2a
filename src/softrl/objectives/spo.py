"""SPO's registry entry (docs/ALGORITHMS.md, "SPO"): the one place that knows SPO works in `r - 1`."""

from __future__ import annotations

from typing import Literal

from pydantic import Field
from torch import Tensor

from softrl.algorithms import spo
from softrl.objectives.base import LossInputs, Objective, Options, register


class SPOOptions(Options):
    algorithm: Literal["spo"] = "spo"
    terminal: float = Field(1.0, ge=0, description="weight of the terminal Q-regression")
    reverse: float = Field(0.0, ge=0, description="weight of the reverse-Q (non-terminal) targets")
    advantage: float = Field(0.0, ge=0, description="weight of the sigmoid-warped advantage BCE")
    mc: float = Field(0.0, ge=0, description="weight of the Monte-Carlo (PTS) targets")
    loss: Literal["bce", "squared"] = Field("bce", description="regression loss")
    eps: float = Field(1e-4, gt=0, lt=1, description="BCE clip")


def spo_loss(o: SPOOptions, x: LossInputs) -> tuple[Tensor, dict[str, Tensor]]:
    # SPO's cross-entropy losses read exp(r / beta) as a probability, so they regress onto r - 1 <= 0
    # (0 solved, -1 failed); Q0 moves with it: beta log mean exp((r - 1) / beta) = Q0 - 1. Computed
    # in float64 first, as the soft value is.
    q0 = (x.q0.double() - 1).to(x.logp.dtype)  # [B]
    mc_prob = None if x.mc_success is None else spo.success_to_prob(x.mc_success, x.beta)  # [B, M]
    return spo.spo_loss(x.logp, x.ref_logp, x.mask, x.reward - 1, q0, x.beta, terminal=o.terminal,
                        reverse=o.reverse, advantage=o.advantage, mc=o.mc, loss=o.loss, eps=o.eps,
                        mc_positions=x.mc_positions, mc_target_prob=mc_prob, mc_mask=x.mc_mask, weights=x.weights)


register(Objective("spo", SPOOptions, spo_loss, "Soft Policy Optimization (Cohen et al. 2025): Q-regression through the "
                   "cumulative Q-parameterisation; any data, no value model"))
