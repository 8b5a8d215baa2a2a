"""Exact tabular ground truth: pi*, Q*, V*, KL(pi || pi*), and training of any loss on it."""

from softrl.tabular.problem import SPO_BETA, TabularPolicy, TabularProblem
from softrl.tabular.train import DATA_KINDS, TabularBatch, TrainResult, exact_groups, make_batch, train

__all__ = [
    "DATA_KINDS", "SPO_BETA", "TabularBatch", "TabularPolicy", "TabularProblem", "TrainResult",
    "exact_groups", "make_batch", "train",
]
