"""Training: batches of trajectories as tensors, the per-source objectives, and the Learner."""

from softrl.training.batch import Batch, make_batch
from softrl.training.learner import Learner, NonFiniteLossError

__all__ = ["Batch", "Learner", "NonFiniteLossError", "make_batch"]
