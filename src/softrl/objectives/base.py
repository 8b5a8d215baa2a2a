"""The registry's contract: what a learner (or the tabular toy) hands an objective, and what an
objective declares about itself.

An `Objective` is registered once, by name, with its typed options (a pydantic model whose
`algorithm` field is the name), what it needs from the data and the learner, and its adapter from
`LossInputs` to `(loss, metrics)` on top of a pure function of `softrl.algorithms`. Config
validation, the learner, the run assembly, `softrl toy` and the benchmarks read the registry; none
of them names an algorithm.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Union

import torch
from pydantic import Discriminator, Field, Tag, model_validator
from torch import Tensor

from softrl.limits import StrictModel


@dataclass
class LossInputs:
    """Tensors for B trajectories, T response positions, M Monte-Carlo annotations; rows of a group
    (`group_size` responses to one prompt) are contiguous."""

    logp: Tensor  # [B, T] log pi(y_t | y_<t), with gradients
    ref_logp: Tensor  # [B, T] log pi0, frozen
    old_logp: Tensor  # [B, T] the trained policy when the batch was made (detached): PPO's ratio denominator
    mask: Tensor  # [B, T] 1 on real response tokens
    reward: Tensor  # [B] the reward on the scale the objective asks (`Objective.rewards`)
    q0: Tensor  # [B] beta * log mean_k exp(r_k / beta) over reference samples of the row's prompt
    beta: float
    group_size: int = 1
    token_kl: Tensor | None = None  # [B, T] exact KL(pi || pi0) at each prefix, with gradients
    values: Tensor | None = None  # [B, T] value model V(y_<t), with gradients (PPO)
    old_values: Tensor | None = None  # [B, T] values when the rows were sampled (detached)
    mc_positions: Tensor | None = None  # [B, M] prefix lengths with Monte-Carlo targets
    mc_success: Tensor | None = None  # [B, M] success rate of rollouts from that prefix
    mc_mask: Tensor | None = None  # [B, M] 1 on real annotations
    weights: Tensor | None = None  # [B] replaces the mean over rows (exact expectations)
    behavior_logp: Tensor | None = None  # [B, T] log mu, the policy that sampled each row (0 where unknown)
    has_behavior: Tensor | None = None  # [B] bool: mu's log-probs are known (sampled at temperature 1, top-p 1)

    def behavior(self) -> tuple[Tensor, Tensor]:
        """(log mu `[B, T]`, known `[B]`): without them every row counts as of unknown origin."""
        if self.behavior_logp is None or self.has_behavior is None:
            return torch.zeros_like(self.logp).detach(), torch.zeros(self.logp.shape[0], dtype=torch.bool,
                                                                     device=self.logp.device)
        return self.behavior_logp, self.has_behavior


class Options(StrictModel):
    """Options every objective has; an objective's own options subclass this with
    `algorithm: Literal["its-name"] = "its-name"`."""

    algorithm: str
    weight: float = Field(1.0, ge=0, description="weight of this source's loss in the total")


class ReferenceUpdate(StrictModel):
    every: int | None = Field(None, ge=1, description="learner steps between moves of the reference to the policy")
    ema: float | None = Field(None, gt=0, lt=1, description="after every learner step the reference moves the "
                              "fraction 1 - ema of the way to the policy, weight by weight (ref <- ema ref + "
                              "(1 - ema) pi): an anchor about 1 / (1 - ema) steps behind, with no jumps")
    behavior: bool = Field(False, description="each online row's reference is its own sampler (its behaviour "
                           "log-probs), and its Q0 its own group's (SPO; docs/ALGORITHMS.md, 'The behaviour policy "
                           "as the reference')")

    @model_validator(mode="after")
    def _one_way(self) -> ReferenceUpdate:
        if (self.every is not None) + (self.ema is not None) + self.behavior != 1:
            raise ValueError("reference_update: give one of every: K (a snapshot of the policy every K steps), "
                             "ema: tau (a moving average of the policy) or behavior: true (each row's own sampler)")
        return self


class MovingReferenceOptions(Options):
    """Options of an objective regularised towards a reference that may move (SPO, AGRO, KL-PG)."""

    reference_update: ReferenceUpdate | None = Field(
        None, description="{every: K}: every K learner steps the reference becomes a snapshot of the policy (one "
        "more copy of the weights); {ema: tau}: the reference is a moving average of the policy, updated every step; "
        "SPO's Q0 of each new reference is estimated from the run's own samples "
        "(docs/ALGORITHMS.md, 'A reference that moves'). {behavior: true}: each online row's reference is the "
        "policy that sampled it (SPO only). null: the reference stays the starting model; set on data.objective, "
        "a source of data.objectives whose objective leaves it null keeps the starting model for its rows, with "
        "the store's Q0 of it")


Data = Literal["any", "on-policy", "online"]


@dataclass(frozen=True)
class Objective:
    name: str
    options: type[Options]
    loss: Callable[[Options, LossInputs], tuple[Tensor, dict[str, Tensor]]]
    summary: str  # one line for listings
    # "any": correct for rows from any behaviour policy; "on-policy": the estimator assumes samples
    # of (about) the current policy; "online": needs this run's own rollouts (e.g. a value model)
    data: Data = "any"
    min_group: int = 0  # responses per prompt it needs in a group (0: no groups)
    value_model: bool = False
    # whether these options weigh rows by pi / mu: rows without mu's log-probs are then skipped (a run
    # whose online samples cannot have them, or whose offline pool has none, is refused)
    behavior: Callable[[Options], bool] = lambda options: False
    behavior_every_row: bool = True  # False: only some rows need mu (TOPR's negatives), a pool without any is usable
    without_behavior: str = "skipped"  # what becomes of a row without mu's log-probs, for the run's log
    distributions: Callable[[Options], bool] = lambda options: False  # needs token_kl ([B, T, V] passes)
    # "unit": the reward mapped onto [0, 1] (1 = solved), as SPO's Q_T = r - 1 and its BCE need; "task":
    # the reward in the task's declared range (the same unless `task.reward_range` is set)
    rewards: Literal["unit", "task"] = "task"

    def group_size(self, samples_per_prompt: int) -> int:
        """Rows per group in a batch of this objective: the run's samples per prompt, or 1."""
        return samples_per_prompt if self.min_group else 1


REGISTRY: dict[str, Objective] = {}
DEFAULT_ALGORITHM = "spo"  # the loss of a config that names none: its one home


def register(objective: Objective) -> Objective:
    if objective.name in REGISTRY:
        raise ValueError(f"objective {objective.name!r} is registered twice")
    if objective.options.model_fields["algorithm"].default != objective.name:
        raise ValueError(f"{objective.options.__name__}.algorithm must default to {objective.name!r}")
    REGISTRY[objective.name] = objective
    return objective


def get(name: str) -> Objective:
    try:
        return REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown algorithm {name!r} (use {', '.join(REGISTRY)})") from None


def objective_loss(options: Options, inputs: LossInputs) -> tuple[Tensor, dict[str, Tensor]]:
    """(loss, metrics) of the objective `options` configure; metrics are detached 0-d tensors (read once per
    step by the learner, so a loss never waits for the device)."""
    return get(options.algorithm).loss(options, inputs)


def _algorithm_of(value: Any) -> str | None:
    """The union's tag; options that name no algorithm are SPO's (the default loss)."""
    return value.get("algorithm", DEFAULT_ALGORITHM) if isinstance(value, dict) else getattr(value, "algorithm", None)


def options_union():
    """Every registered objective's options, told apart by `algorithm`: a discriminated union."""
    names = ", ".join(REGISTRY)
    return Annotated[Union[tuple(Annotated[o.options, Tag(o.name)] for o in REGISTRY.values())],
                     Discriminator(_algorithm_of, custom_error_type="unknown_algorithm",
                                   custom_error_message=f"must be one of {names}")]
