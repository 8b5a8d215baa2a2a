"""The objective registry: one entry per algorithm (name, typed options, needs, adapter from
`LossInputs` to an `algorithms/` function). Importing this package registers every built-in one."""

# each module registers its entries; SPO first, the default
from softrl.objectives import spo  # noqa: F401, I001
from softrl.objectives import agro, baselines, offpolicy  # noqa: F401
from softrl.objectives.base import DEFAULT_ALGORITHM, REGISTRY, LossInputs, Objective, Options, get, objective_loss, options_union, register

__all__ = ["DEFAULT_ALGORITHM", "REGISTRY", "LossInputs", "Objective", "Options", "get", "objective_loss", "options_union", "register"]
