"""SPO's registry entry (docs/ALGORITHMS.md, "SPO"): the one place that knows SPO works in `r - 1`."""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field, model_validator
from torch import Tensor

from softrl.algorithms import spo
from softrl.algorithms.offpolicy import importance_weights, truncated_fraction
from softrl.objectives.base import LossInputs, MovingReferenceOptions, Objective, register


class SPOOptions(MovingReferenceOptions):
    algorithm: Literal["spo"] = "spo"
    terminal: float = Field(1.0, ge=0, description="weight of the terminal Q-regression")
    reverse: float = Field(0.0, ge=0, description="weight of the reverse-Q (non-terminal) targets")
    advantage: float = Field(0.0, ge=0, description="weight of the sigmoid-warped advantage BCE")
    mc: float = Field(0.0, ge=0, description="weight of the Monte-Carlo (PTS) targets")
    loss: Literal["bce", "squared"] = Field("bce", description="regression loss")
    eps: float = Field(1e-4, gt=0, lt=1, description="BCE clip")
    is_correction: Literal["none", "sequence_truncate", "sequence_mask"] = Field(
        "none", description="weigh each row's loss by pi(y)/mu(y), truncated at is_cap or masked above it, so that "
        "stale rows count as the current policy would sample them (SPO is valid on any data without it: this only "
        "moves the weight between sequences); rows without mu keep weight 1")
    is_cap: float = Field(2.0, gt=0, description="C of is_correction")
    is_rows: Literal["all", "failed"] = Field(
        "all", description="the rows is_correction weighs: all, or only the failed ones (reward below 1), a solved "
        "row keeping weight 1 whoever sampled it, as TOPR keeps its positive rows")

    @model_validator(mode="after")
    def _rows_need_a_correction(self) -> SPOOptions:
        if self.is_rows != "all" and self.is_correction == "none":
            raise ValueError(f"is_rows: {self.is_rows} picks the rows is_correction weighs; set is_correction "
                             "(sequence_truncate or sequence_mask)")
        return self


def spo_loss(o: SPOOptions, x: LossInputs) -> tuple[Tensor, dict[str, Tensor]]:
    # SPO's cross-entropy losses read exp(r / beta) as a probability, so they regress onto r - 1 <= 0
    # (0 solved, -1 failed); Q0 moves with it: beta log mean exp((r - 1) / beta) = Q0 - 1. Computed
    # in float64 first, as the soft value is.
    q0 = (x.q0.double() - 1).to(x.logp.dtype)  # [B]
    mc_prob = None if x.mc_success is None else spo.success_to_prob(x.mc_success, x.beta)  # [B, M]
    loss, metrics = spo.spo_loss(x.logp, x.ref_logp, x.mask, x.reward - 1, q0, x.beta, terminal=o.terminal,
                                 reverse=o.reverse, advantage=o.advantage, mc=o.mc, loss=o.loss, eps=o.eps,
                                 mc_positions=x.mc_positions, mc_target_prob=mc_prob, mc_mask=x.mc_mask,
                                 weights=x.weights, is_weights=row_weights(o, x))
    if o.is_correction != "none":
        behavior_logp, _ = x.behavior()
        metrics["tis/clipped_fraction"] = truncated_fraction(x.logp, behavior_logp, x.mask, weighed_rows(o, x),
                                                             o.is_correction, o.is_cap)
    return loss, metrics


def weighed_rows(o: SPOOptions, x: LossInputs) -> Tensor:
    """The rows `[B]` is_correction weighs: those with mu's log-probs, and of them only the failed ones under
    `is_rows: failed`."""
    _, known = x.behavior()
    return known & (x.reward < 1) if o.is_rows == "failed" else known


def row_weights(o: SPOOptions, x: LossInputs) -> Tensor | None:
    """Each row's weight `[B]`: its sequence ratio pi/mu truncated or masked at the cap (detached), 1 for
    a row without mu or one `is_rows` leaves out; None without is_correction."""
    if o.is_correction == "none":
        return None
    behavior_logp, _ = x.behavior()
    weighed = weighed_rows(o, x)
    w = importance_weights(x.logp, behavior_logp, x.mask, weighed, o.is_correction, o.is_cap)[:, 0]  # [B]
    return torch.where(weighed, w, torch.ones_like(w))


register(Objective("spo", SPOOptions, spo_loss, "Soft Policy Optimization (Cohen et al. 2025): Q-regression through the "
                   "cumulative Q-parameterisation; any data, no value model",
                   behavior=lambda o: o.is_correction != "none", behavior_every_row=False,
                   without_behavior="kept at weight 1", rewards="unit"))
